"""Opening connections for the data source, and its errors.

Every failure a user can fix names the option to fix (:class:`OptionError`
from options.py); the others (:class:`SourceError`) say what the broker did.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable

from warren.amqp import spec
from warren.client import AMQPError, Client
from warren.spark.endpoint import Endpoint, redact
from warren.spark.option_values import OptionError

__all__ = ["DataLossError", "SourceError", "connect", "data_loss", "queue_error"]

log = logging.getLogger("warren.spark")

#: Larger frames mean fewer frame headers to scan for big bodies; the broker may
#: offer less (RabbitMQ: 128 KiB by default).
FRAME_MAX = 1 << 20


class SourceError(RuntimeError):
    """The broker refused or dropped what a read or write needs."""


class DataLossError(SourceError):
    """Offsets a query still needed are gone (retention), and failOnDataLoss is true."""


#: Refusals that no retry changes: wrong credentials or permissions, a missing vhost.
_FINAL_CODES = (spec.ACCESS_REFUSED, spec.NOT_ALLOWED)


def connect(
    endpoint: Endpoint | str,
    timeout_s: float,
    name: str = "warren-spark",
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Client:
    """An open connection to the first of the endpoint's URLs that answers.

    A round tries every URL in turn; after a round in which none answered, the
    next starts after a backoff (``retryBackoffMs``, doubled each round up to
    ``retryMaxBackoffMs``), up to ``maxRetries`` rounds more: a broker that
    restarts, or a cluster whose leader moves, is waited for rather than
    failing the query. A refusal no retry can change (credentials,
    permissions, a missing vhost, a certificate that does not check out) fails
    at once. Failures name option 'url' and never show a password."""
    if isinstance(endpoint, str):
        endpoint = Endpoint(urls=(endpoint,), max_retries=0)
    backoff = endpoint.retry_backoff_ms / 1000
    failures: list[str] = []
    for attempt in range(endpoint.max_retries + 1):
        if attempt:
            log.warning(
                "%s: no broker answered (%s); retry %d of %d in %.1f s",
                name,
                "; ".join(failures),
                attempt,
                endpoint.max_retries,
                backoff,
            )
            sleep(backoff)
            backoff = min(backoff * 2, endpoint.retry_max_backoff_ms / 1000)
        failures = []
        for index, url in enumerate(endpoint.urls):
            try:
                uri = endpoint.uri(index)
            except ValueError as exc:
                raise OptionError("url", f"{exc} ({redact(url)})") from None
            client = Client(uri, timeout=timeout_s, name=name, frame_max=FRAME_MAX)
            try:
                return client.connect()
            except AMQPError as exc:
                if exc.reply_code in _FINAL_CODES or not exc.reply_code:
                    raise OptionError(
                        "url", f"{redact(url)} refused the connection: {exc}"
                    ) from None
                failures.append(f"{redact(url)}: {exc}")
            except ssl.SSLCertVerificationError as exc:
                raise OptionError(
                    "url",
                    f"{redact(url)}: TLS: certificate verify failed: {exc.verify_message or exc}",
                ) from None
            except ssl.SSLError as exc:
                raise OptionError("url", f"{redact(url)}: TLS: {exc}") from None
            except (OSError, EOFError) as exc:
                failures.append(f"{redact(url)}: {exc or type(exc).__name__}")
    after = f" (after {endpoint.max_retries} retries)" if endpoint.max_retries else ""
    if len(failures) == 1:
        raise OptionError("url", f"cannot connect to {failures[0]}{after}")
    raise OptionError("url", f"cannot connect to any of {'; '.join(failures)}{after}")


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
