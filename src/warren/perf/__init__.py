"""``warren perf``: load generators for AMQP 0-9-1 brokers (Warren, RabbitMQ, LavinMQ, ...)
and MQTT brokers (Warren, mosquitto, ...).

Modules:

* ``cli``                 the ``warren perf`` argument parser and dispatch
* ``coordinator``         parent side of ``throughput`` and ``mqtt``: worker processes,
                          live rates, end of a run, summary
* ``workers``             worker side of ``throughput`` and ``mqtt``: pipe protocol,
                          publishers' pacing, receivers' read loop, latency recording
* ``throughput``          ``warren perf throughput``: parameters, plan, setup, summary
* ``throughput_workers``  its AMQP publisher and consumer processes
* ``message``             the pre-encoded message publishers send (warren.client is the client)
* ``connections``         ``warren perf connection-count``: many connections, broker memory
* ``queues``              ``warren perf queue-count``: many queues, declare time, broker memory
* ``mqtt``                ``warren perf mqtt``: parameters, run, summary
* ``mqtt_workers``        its MQTT publisher and subscriber processes
* ``mqtt_client``         MQTT URIs, connection setup, packet boundaries
* ``mqtt_idle``           ``warren perf mqtt-idle``: many idle MQTT connections, broker memory
* ``stream``              ``warren perf stream``: RabbitMQ stream protocol, parameters, summary
* ``stream_workers``      its producer and consumer processes
* ``stream_client``       stream URIs, connection setup, Publish frames, Deliver chunk headers
* ``limits``              the open-file limit
* ``report``              rates, latency histogram and percentiles, /proc memory, JSON

Nothing here imports the broker: the tools talk to any broker over TCP.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``warren perf ...`` (``argv`` excludes the word ``perf``)."""
    from warren.perf.cli import main as cli_main

    return cli_main(argv)
