"""Rate limits every protocol applies the same way (issue 33; FluxMQ has them).

Three rules, all on the node's clock so that tests move time with a
ManualClock:

- connections per source address per second (``[main] connection_rate_limit``):
  counted in fixed one-second windows of the clock; a connection beyond the
  limit is refused by its protocol (AMQP: the socket closed before the
  handshake, as max_connections; MQTT: CONNACK quota exceeded; stream: the
  socket closed), with a log line and a count. The management listener's
  connections are counted apart (``[mgmt] connection_rate_limit``, else
  [main]'s; http/admission.py answers 429): a browser's parallel requests
  leave an address's AMQP connections alone.
- publishes per connection per second (``[main] publish_rate_limit``): a
  token bucket of one second's worth. Work already read is never dropped: a
  publisher over its rate has its socket's reading paused (the protocol's own
  flow control, TCP's window) until the bucket has paid for what it sent.
- subscriptions per client (``[main] max_subscriptions_per_client``): consumers
  of an AMQP connection, topic filters of an MQTT session, subscriptions of a
  stream connection; one more is refused as the protocol refuses a limit.

The address is the connection's peer as the listener sees it: the PROXY
header's client when proxy_protocol is on (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warren.core.clock import Clock

__all__ = ["PublishBucket", "RateLimitCounts", "RateLimits"]

_WINDOW_MS = 1000


@dataclass
class RateLimitCounts:
    """What the limits turned away or slowed (Prometheus' warren_rate_limit_*)."""

    connections_refused: int = 0
    publishers_paused: int = 0
    subscriptions_refused: int = 0
    http_connections_refused: int = 0


@dataclass
class _Window:
    """Connections by address in the clock's current one-second window."""

    second: int = -1
    by_address: dict[str, int] = field(default_factory=dict)

    def count(self, now_ms: int, address: str) -> int:
        """One more connection from ``address`` now: how many this second."""
        second = now_ms // _WINDOW_MS
        if second != self.second:  # a new second: last one's counts are moot
            self.second = second
            self.by_address.clear()
        seen = self.by_address.get(address, 0) + 1
        self.by_address[address] = seen
        return seen


class PublishBucket:
    """One connection's publish rate: a token bucket kept as the time its
    sends are paid up to (GCRA), one second of burst."""

    __slots__ = ("_cost_ms", "_paid_until")

    def __init__(self, per_second: int) -> None:
        self._cost_ms = _WINDOW_MS / per_second
        self._paid_until = 0.0

    def spend(self, now_ms: int, messages: int) -> int:
        """``messages`` were just published at ``now_ms``: ms to stop reading
        for so the connection stays within its rate (0: go on)."""
        self._paid_until = max(self._paid_until, now_ms) + messages * self._cost_ms
        ahead = self._paid_until - now_ms - _WINDOW_MS
        return int(ahead) + 1 if ahead > 0 else 0


@dataclass
class RateLimits:
    """The node's limits (0: none) and what they counted."""

    clock: Clock
    connections_per_second: int = 0
    publishes_per_second: int = 0
    max_subscriptions: int = 0
    #: The management listener's connections per address per second.
    http_connections_per_second: int = 0
    counts: RateLimitCounts = field(default_factory=RateLimitCounts)
    _connections: _Window = field(default_factory=_Window)
    _http_connections: _Window = field(default_factory=_Window)

    def allow_connection(self, address: str | None) -> bool:
        """A connection from ``address`` (None: not a network one, never limited)
        starts: whether it is within the address's rate. A refusal is counted;
        the caller refuses and logs."""
        limit = self.connections_per_second
        if not limit or address is None:
            return True
        if self._connections.count(self.clock.now_ms(), address) > limit:
            self.counts.connections_refused += 1
            return False
        return True

    def allow_http_connection(self, address: str | None) -> bool:
        """allow_connection for the management listener (its own count and limit)."""
        limit = self.http_connections_per_second
        if not limit or address is None:
            return True
        if self._http_connections.count(self.clock.now_ms(), address) > limit:
            self.counts.http_connections_refused += 1
            return False
        return True

    def publish_bucket(self) -> PublishBucket | None:
        """A new connection's publish rate, None without a limit."""
        if not self.publishes_per_second:
            return None
        return PublishBucket(self.publishes_per_second)

    def paused(self) -> None:
        """A publisher was paused for its rate."""
        self.counts.publishers_paused += 1

    def allow_subscription(self, held: int) -> bool:
        """Whether a client holding ``held`` subscriptions may add one; a refusal
        is counted."""
        limit = self.max_subscriptions
        if not limit or held < limit:
            return True
        self.counts.subscriptions_refused += 1
        return False
