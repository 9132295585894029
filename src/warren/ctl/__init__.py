"""``warren ctl`` (also ``warrenctl``): an operator's command line over the
RabbitMQ-compatible management HTTP API of Warren (or RabbitMQ, LavinMQ).

Modules:

* ``main``      the argument parser, global options and exit statuses
* ``commands``  one handler per command (status, vhosts, users, queues, ...)
* ``client``    a blocking HTTP client on urllib; errors carry the exit status
* ``output``    aligned tables and key/value blocks

Standard library only, and nothing here imports the broker: the tool starts
fast and talks to any broker over HTTP. docs/ctl.md describes the commands.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``warren ctl ...`` (``argv`` excludes the word ``ctl``)."""
    from warren.ctl.main import main as ctl_main

    return ctl_main(argv)
