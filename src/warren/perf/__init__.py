"""``warren perf``: load generators for AMQP 0-9-1 brokers (Warren, RabbitMQ, LavinMQ, ...).

Modules:

* ``cli``          the ``warren perf`` argument parser and dispatch
* ``client``       a minimal blocking AMQP client on a raw socket (Warren's own codec)
* ``throughput``   ``warren perf throughput``: publisher/consumer processes, live rates
* ``connections``  ``warren perf connection-count``: many connections, broker memory
* ``queues``       ``warren perf queue-count``: many queues, declare time, broker memory
* ``report``       rates, latency histogram and percentiles, /proc memory, JSON

Nothing here imports the broker: the tools talk to any broker over TCP.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``warren perf ...`` (``argv`` excludes the word ``perf``)."""
    from warren.perf.cli import main as cli_main

    return cli_main(argv)
