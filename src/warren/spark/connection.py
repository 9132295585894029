"""Opening connections for the data source, and its errors.

Every failure a user can fix names the option to fix (:class:`OptionError`
from options.py); the others (:class:`SourceError`) say what the broker did.
"""

from __future__ import annotations

import logging

from warren.amqp import spec
from warren.perf.client import AMQPError, Client
from warren.spark.options import OptionError, redact

__all__ = ["DataLossError", "SourceError", "connect", "data_loss", "queue_error"]

log = logging.getLogger("warren.spark")

#: Larger frames mean fewer frame headers to scan for big bodies; the broker may
#: offer less (RabbitMQ: 128 KiB by default).
FRAME_MAX = 1 << 20


class SourceError(RuntimeError):
    """The broker refused or dropped what a read or write needs."""


class DataLossError(SourceError):
    """Offsets a query still needed are gone (retention), and failOnDataLoss is true."""


def connect(url: str, timeout_s: float, name: str = "warren-spark") -> Client:
    """An open connection; failures name option 'url' (and never show the password)."""
    client = Client(url, timeout=timeout_s, name=name, frame_max=FRAME_MAX)
    try:
        return client.connect()
    except AMQPError as exc:
        raise OptionError("url", f"{redact(url)} refused the connection: {exc}") from None
    except (OSError, EOFError) as exc:
        raise OptionError("url", f"cannot connect to {redact(url)}: {exc}") from None


def queue_error(exc: AMQPError, queue: str, vhost: str) -> Exception:
    """The error to raise when the broker refused an operation on ``queue``."""
    if exc.reply_code == spec.NOT_FOUND:
        return OptionError("queue", f"queue {queue!r} not found in vhost {vhost!r}")
    if exc.reply_code == spec.ACCESS_REFUSED:
        return OptionError("queue", f"access to queue {queue!r} refused: {exc}")
    if exc.reply_code == spec.PRECONDITION_FAILED and "x-stream-offset" in str(exc):
        return OptionError(
            "queue", f"queue {queue!r} is not a stream queue (x-queue-type=stream): {exc}"
        )
    return SourceError(f"queue {queue!r}: {exc}")


def data_loss(queue: str, start: int, first: int, fail: bool) -> None:
    """Offsets ``[start, first)`` of ``queue`` are gone: raise DataLossError, or (with
    failOnDataLoss false) log a warning; the read goes on at ``first``."""
    what = (
        f"offsets [{start}, {first}) of queue {queue!r} are no longer in the stream "
        "(removed by retention)"
    )
    if fail:
        raise DataLossError(f"{what}; set option failOnDataLoss to false to skip them")
    log.warning("%s; skipping ahead to offset %d (failOnDataLoss=false)", what, first)
