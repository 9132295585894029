"""The x-message-deduplication exchange, as the rabbitmq-message-deduplication plugin.

A fanout exchange that drops a message whose ``x-deduplication-header``
header value it has seen before (the plugin's fixed header name). Arguments:
``x-cache-size`` (required, the most keys remembered), ``x-cache-ttl``
(optional, ms a key is remembered), ``x-cache-persistence`` ("memory" or
"disk"). A durable exchange's cache is on disk (core/exchange.py) unless
``x-cache-persistence`` is given as "memory" (the plugin's default is
memory; keeping the keys is the safer default for a broker that keeps
confirmed messages). A message's own ``x-cache-ttl`` header overrides the
TTL for its key.

Any other exchange type deduplicates the LavinMQ way, with the argument
``x-message-deduplication: true`` (see dedup.py); both drop a duplicate as
unroutable: a mandatory one comes back with basic.return, a confirm is an ack.
"""

from __future__ import annotations

from typing import Any

from warren.core.dedup import DEFAULT_HEADER, Deduplicator
from warren.core.errors import PreconditionFailed
from warren.core.exchange import FanoutExchange

__all__ = ["DeduplicationExchange"]


def _positive(value: Any) -> int | None:
    """The plugin takes an integer or a string holding one."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        value = int(value) if value.isdigit() else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


class DeduplicationExchange(FanoutExchange):
    type = "x-message-deduplication"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        arguments = self.arguments
        # The plugin's checks (validate/1), in its order, with its texts.
        size = _positive(arguments.get("x-cache-size"))
        if size is None:
            raise PreconditionFailed(
                "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"
            )
        ttl = None
        if "x-cache-ttl" in arguments:
            ttl = _positive(arguments["x-cache-ttl"])
            if ttl is None:
                raise PreconditionFailed(
                    "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"
                )
        persistence = arguments.get("x-cache-persistence", "memory")
        if isinstance(persistence, bytes):
            persistence = persistence.decode("utf-8", "replace")
        if persistence not in ("memory", "disk"):
            raise PreconditionFailed(
                "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"
            )
        self.deduplicator = Deduplicator(size, ttl, DEFAULT_HEADER)
        self._persistence = arguments.get("x-cache-persistence")

    def durable_cache(self) -> bool:
        return self._persistence not in ("memory", b"memory")
