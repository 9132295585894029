"""The message as the core routes, stores and delivers it.

Properties stay in the AMQP content-header encoding the publisher sent (flags
word plus property list): most messages are never inspected, so decoding them
would be wasted work. Routing by headers and the store peek into them lazily.

A message published over AMQP 1.0 whose bare message the 0-9-1 form cannot
carry (typed ids or application properties, ``to``, ``subject``, a footer...)
also keeps that bare message as received in ``native`` (amqp1/mapping.py):
the 0-9-1 form still routes it and serves 0-9-1 and MQTT consumers, and a
1.0 consumer gets the original back. Anything that copies a message with new
properties (dead-lettering, a delivery count) passes ``native`` on.
"""

from __future__ import annotations

from typing import Any, Protocol

from warren.core import properties as props
from warren.core.clock import system_ms


class Message:
    __slots__ = (
        "exchange",
        "routing_key",
        "properties",
        "body",
        "timestamp",
        "native",
        "_headers",
        "_ex_rk",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        timestamp: int | None = None,
        native: bytes | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        # The broker's paths pass their clock's time (core/clock.py); the system
        # clock is for a message made outside a broker (tests, tools).
        self.timestamp = system_ms() if timestamp is None else timestamp
        # The AMQP 1.0 bare message (and footer) as published, when the 0-9-1
        # properties and body above lose something of it; None otherwise.
        self.native = native
        self._headers: dict[str, Any] | None | bool = False
        self._ex_rk: bytes | None = None

    @property
    def headers(self) -> dict[str, Any] | None:
        """Decoded once, on first use (headers exchange, CC/BCC, reply-to)."""
        h = self._headers
        if h is False:
            h = self._headers = props.peek_headers(self.properties)
        return h  # type: ignore[return-value]

    def exchange_and_key(self) -> bytes:
        """Exchange and routing key as two AMQP shortstrs, encoded once per message
        (deliveries, returns and get-ok all carry them)."""
        ex_rk = self._ex_rk
        if ex_rk is None:
            ex = self.exchange.encode("utf-8", "surrogateescape")
            rk = self.routing_key.encode("utf-8", "surrogateescape")
            ex_rk = self._ex_rk = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
        return ex_rk

    @property
    def persistent(self) -> bool:
        return props.peek_delivery_mode(self.properties) == 2

    def decoded_properties(self) -> props.BasicProperties:
        return props.decode_properties(self.properties)

    def __repr__(self) -> str:
        return f"Message({self.exchange!r}, {self.routing_key!r}, {len(self.body)} bytes)"


class RawRun(Protocol):
    """A protocol's run of received messages: their property lists and bodies."""

    def __len__(self) -> int: ...

    def properties(self, i: int) -> bytes: ...

    def body(self, i: int) -> bytes: ...


class MessageRun:
    """Messages published one after the other to one exchange with one routing
    key and simple properties, no expiration or reply-to, headers only as a flat
    table without CC/BCC (AMQP's publish runs, amqp/publish_run.py): a queue may
    take several at once (`Queue.publish_run`, a stream's `StreamQueue.publish_run`)
    and a consumer deliver them at once (`Consumer.deliver_run`). ``raw`` holds
    the bytes; a `Message` is made only for a message that needs one."""

    __slots__ = ("exchange", "routing_key", "ex_rk", "raw", "timestamp")

    def __init__(
        self, exchange: str, routing_key: str, ex_rk: bytes, raw: RawRun, timestamp: int
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.ex_rk = ex_rk  # exchange and routing key as two shortstrs
        self.raw = raw
        self.timestamp = timestamp

    def __len__(self) -> int:
        return len(self.raw)

    def message(self, i: int) -> Message:
        raw = self.raw
        msg = Message(self.exchange, self.routing_key, raw.properties(i), raw.body(i), self.timestamp)
        msg._ex_rk = self.ex_rk
        return msg
