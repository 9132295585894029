"""The sink's AMQP side: Arrow rows to pre-encoded publishes, with publisher confirms.

A task encodes a slice of rows into one ``bytes`` (basic.publish, content
header, body frames per row; in C when the rows are a body and nothing
else), writes it with one ``sendall``, and counts the
basic.ack/nack frames the broker sends back with warren.client's
ConfirmTracker, as ``warren perf``'s publishers do. At most ``max_unconfirmed`` messages are unconfirmed; a nack, a closed
channel or a lost connection raises :class:`SinkError`, which fails the task.

Every message carries a deduplication key, ``<write id>:<batch>:<partition>:<row>``,
in the header Warren's ``x-message-deduplication`` reads: a replayed
micro-batch produces the same keys, and a deduplicating queue drops them.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import select
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import warren
from warren.amqp import spec
from warren.client import AMQPError, Client
from warren.client.confirms import ConfirmTracker
from warren.core.table_encode import encode_field_value
from warren.spark.options import OptionError, SinkOptions, redact
from warren.spark.stream import connect

__all__ = ["Encoder", "Publisher", "SinkError", "SinkPlan", "check_exchange"]

_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CONTENT_HEADER = struct.Struct(">BHIHHQ")
_RETURN = spec.BasicReturn.INDEX

log = logging.getLogger("warren.spark")
_native = warren.native_module("_fastpath")
_encode_publishes: Callable[..., bytes] | None = (
    None if _native is None else getattr(_native, "encode_publishes", None)
)
_PUBLISH_ID = struct.pack(">HHH", 60, 40, 0)  # class, method, reserved-1
#: Rows encoded per sendall.
SLICE_ROWS = 512

#: Optional columns the sink reads, by AMQP property, with the property's flag bit.
PROPERTY_FLAGS: dict[str, int] = {
    "content_type": 0x8000,
    "content_encoding": 0x4000,
    "delivery_mode": 0x1000,
    "priority": 0x0800,
    "correlation_id": 0x0400,
    "reply_to": 0x0200,
    "expiration": 0x0100,
    "message_id": 0x0080,
    "timestamp": 0x0040,
    "type": 0x0020,
    "user_id": 0x0010,
    "app_id": 0x0008,
}
_F_HEADERS = 0x2000
_F_DELIVERY_MODE = 0x1000
_SHORTSTR = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
)
_OCTET = ("delivery_mode", "priority")


class SinkError(RuntimeError):
    """The broker refused a message or went away before confirming it."""


class ConnectionLost(SinkError):
    """The connection went away (a broker restart, a leader that moved): what was
    not confirmed can be published again on a new one."""


def _shortstr(text: str, what: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise SinkError(f"{what} is longer than 255 bytes: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


@dataclass(frozen=True)
class SinkPlan:
    """Which columns the sink reads, decided on the driver from the DataFrame's schema.

    Kafka's sink columns work as Kafka users expect: ``value`` is the body,
    ``key`` the routing key, ``topic`` the exchange (each row's; null: the
    options'). Warren's own ``body`` and ``routingKeyColumn`` work as before.
    """

    options: SinkOptions
    #: Property columns present, in flag-bit order.
    properties: tuple[str, ...]
    headers: bool
    body_is_string: bool
    #: The column holding the body: ``body`` or Kafka's ``value``.
    body_column: str = "body"
    #: The column holding each row's routing key (routingKeyColumn or ``key``).
    key_column: str | None = None
    #: Kafka's ``topic`` column: each row's exchange.
    topic_column: str | None = None

    @classmethod
    def from_schema(cls, options: SinkOptions, fields: Sequence[tuple[str, str]]) -> SinkPlan:
        """``fields`` are (name, Spark simpleString type); raises OptionError for a
        missing body or routing-key column, or a column of the wrong type."""
        types = dict(fields)
        if "body" in types and "value" in types:
            raise OptionError("body", "give a 'body' column or Kafka's 'value' column, not both")
        body_column = "value" if "value" in types else "body"
        body = types.get(body_column)
        if body not in ("binary", "string"):
            problem = "missing" if body is None else f"of type {body}"
            raise OptionError(
                "body",
                "the sink needs a 'body' (or Kafka's 'value') column of type binary or "
                f"string ({problem})",
            )
        column = options.routing_key_column
        if column is not None and types.get(column) != "string":
            problem = "missing" if column not in types else f"of type {types[column]}"
            raise OptionError("routingKeyColumn", f"column {column!r} must be a string ({problem})")
        if column is None and "key" in types:
            if types["key"] not in ("string", "binary"):
                raise OptionError(
                    "key", f"the 'key' column must be string or binary, not {types['key']}"
                )
            column = "key"
        topic = None
        if "topic" in types:
            if types["topic"] != "string":
                raise OptionError(
                    "topic", f"the 'topic' column must be a string, not {types['topic']}"
                )
            topic = "topic"
        if (
            options.exchange == ""
            and topic is None
            and options.routing_key is None
            and column is None
        ):
            raise OptionError(
                "routingKey",
                "required with the default exchange (it routes by queue name): "
                "set routingKey or routingKeyColumn, give a 'key' column, or set 'exchange'",
            )
        headers = types.get("headers")
        if headers is not None and not headers.startswith("map<string,"):
            raise OptionError(
                "headers", f"the 'headers' column must be a map<string,...>, not {headers}"
            )
        for name in PROPERTY_FLAGS:
            kind = types.get(name)
            if kind is None:
                continue
            want = (
                ("timestamp",)
                if name == "timestamp"
                else (("tinyint", "smallint", "int", "bigint") if name in _OCTET else ("string",))
            )
            if kind not in want:
                raise OptionError(
                    name, f"the {name!r} column must be {' or '.join(want)}, not {kind}"
                )
        return cls(
            options=options,
            properties=tuple(n for n in PROPERTY_FLAGS if n in types),
            headers=headers is not None,
            body_is_string=body == "string",
            body_column=body_column,
            key_column=column,
            topic_column=topic,
        )


def check_exchange(options: SinkOptions) -> None:
    """Fail on the driver, naming the option, when the exchange does not exist."""
    with contextlib.closing(
        connect(options.endpoint, 30.0, name="warren-spark sink check")
    ) as client:
        if options.exchange == "":
            return
        client.channel_open(1)
        try:
            client.rpc(
                1,
                spec.ExchangeDeclare(exchange=options.exchange, passive=True),
                spec.ExchangeDeclareOk,
            )
        except AMQPError as exc:
            if exc.reply_code == spec.NOT_FOUND:
                raise OptionError(
                    "exchange",
                    f"exchange {options.exchange!r} not found in vhost {client.uri.vhost!r}",
                ) from None
            raise OptionError("exchange", str(exc)) from None


class Encoder:
    """Turns rows of Arrow batches into publish frames; one per task."""

    def __init__(
        self, plan: SinkPlan, key_prefix: str, frame_max: int, native: bool = True
    ) -> None:
        o = plan.options
        self.plan = plan
        self.key_prefix = key_prefix.encode()
        self.chunk = frame_max - 8
        self.exchange = _shortstr(o.exchange, "exchange")
        self.method_prefix = _PUBLISH_ID + self.exchange
        # mandatory: a row no queue takes comes back (basic.return) and fails the task.
        self.bits = b"\x01" if o.fail_on_unroutable else b"\x00"
        self.routing_key = (
            _shortstr(o.routing_key, "routingKey") if o.routing_key is not None else None
        )
        fixed = plan.key_column is None and plan.topic_column is None
        self.fixed_method = self._method(self.routing_key or b"\x00") if fixed else b""
        self.dedup_entry = _shortstr(o.dedup_header, "deduplicationHeader") + b"S"
        #: The C encoder when rows are a body and nothing else (no key, topic, headers or
        #: property column); the Python loop of encode() is its reference and fallback.
        plain = fixed and not plan.headers and not plan.properties
        self.native = _encode_publishes if plain and native else None

    def _encode_native(self, body_col: pa.Array, first_row: int) -> list[tuple[bytes, int]]:
        """encode() in C, for a body column and nothing else (see __init__)."""
        assert self.native is not None
        _, ends, data = body_col.buffers()
        n = len(body_col)
        persistent = self.plan.options.persistent
        return [
            (
                self.native(
                    data if data is not None else b"",
                    ends,
                    body_col.offset,
                    lo,
                    min(n, lo + SLICE_ROWS),
                    self.fixed_method,
                    self.key_prefix,
                    first_row,
                    self.dedup_entry,
                    persistent,
                    self.chunk + 8,
                ),
                min(n, lo + SLICE_ROWS) - lo,
            )
            for lo in range(0, n, SLICE_ROWS)
        ]

    def _method(self, routing_key: bytes, prefix: bytes | None = None) -> bytes:
        payload = (prefix or self.method_prefix) + routing_key + self.bits
        return _HDR.pack(1, 1, len(payload)) + payload + b"\xce"

    def _row_method(self, row: int, key: Any, topic: Any) -> bytes:
        """A row's basic.publish: its ``key`` (else routingKey), its ``topic`` (else
        the exchange option)."""
        if key is None:
            if self.routing_key is None:
                raise SinkError(
                    f"row {row} has a null routing key (column {self.plan.key_column!r}) "
                    "and no routingKey option to fall back on"
                )
            rk = self.routing_key
        elif isinstance(key, bytes):
            if len(key) > 255:
                raise SinkError(f"routing key is longer than 255 bytes: {key[:40]!r}...")
            rk = bytes((len(key),)) + key
        else:
            rk = _shortstr(key, "routing key")
        prefix = None if topic is None else _PUBLISH_ID + _shortstr(topic, "topic (exchange)")
        return self._method(rk, prefix)

    def encode(self, batch: pa.RecordBatch, first_row: int) -> list[tuple[bytes, int]]:
        """The batch as (frames, message count) slices, keys numbered from ``first_row``."""
        plan = self.plan
        n = batch.num_rows
        if n == 0:
            return []
        names = batch.schema.names
        body_col = batch.column(names.index(plan.body_column))
        if plan.body_is_string:
            body_col = body_col.cast(pa.binary())
        if self.native is not None and body_col.null_count == 0:
            return self._encode_native(body_col, first_row)
        bodies: list[bytes | None] = body_col.to_pylist()
        keys: list[Any] | None = None
        column = plan.key_column
        if column is not None:
            keys = batch.column(names.index(column)).to_pylist()
        topics: list[Any] | None = None
        if plan.topic_column is not None:
            topics = batch.column(names.index(plan.topic_column)).to_pylist()
        headers: list[Any] | None = None
        if plan.headers:
            headers = batch.column(names.index("headers")).to_pylist()
        props = [(p, batch.column(names.index(p)).to_pylist()) for p in plan.properties]
        persistent = plan.options.persistent
        out: list[tuple[bytes, int]] = []
        for lo in range(0, n, SLICE_ROWS):
            hi = min(n, lo + SLICE_ROWS)
            parts: list[bytes] = []
            for i in range(lo, hi):
                body = bodies[i]
                if body is None:
                    raise SinkError(f"row {first_row + i} of this partition has a null body")
                if keys is not None or topics is not None:
                    parts.append(
                        self._row_method(
                            first_row + i,
                            keys[i] if keys is not None else None,
                            topics[i] if topics is not None else None,
                        )
                    )
                else:
                    parts.append(self.fixed_method)
                key = self.key_prefix + str(first_row + i).encode()
                table = self.dedup_entry + _U32.pack(len(key)) + key
                if headers is not None and headers[i]:
                    table = _user_headers(headers[i]) + table
                if props:
                    before, after, flags = _encode_properties(props, i, _F_HEADERS)
                    if persistent and not flags & _F_DELIVERY_MODE:
                        flags |= _F_DELIVERY_MODE
                        after = b"\x02" + after  # delivery-mode is the first after headers
                    raw = before + _U32.pack(len(table)) + table + after
                elif persistent:
                    flags = _F_HEADERS | _F_DELIVERY_MODE
                    raw = _U32.pack(len(table)) + table + b"\x02"
                else:
                    flags = _F_HEADERS
                    raw = _U32.pack(len(table)) + table
                size = len(body)
                parts.append(
                    _CONTENT_HEADER.pack(2, 1, 14 + len(raw), 60, 0, size)
                    + struct.pack(">H", flags)
                    + raw
                    + b"\xce"
                )
                if size <= self.chunk:
                    if size:
                        parts.append(_HDR.pack(3, 1, size))
                        parts.append(body)
                        parts.append(b"\xce")
                else:
                    for at in range(0, size, self.chunk):
                        piece = body[at : at + self.chunk]
                        parts.append(_HDR.pack(3, 1, len(piece)) + piece + b"\xce")
            out.append((b"".join(parts), hi - lo))
        return out


def _user_headers(pairs: list[tuple[str, Any]]) -> bytes:
    out = []
    for key, value in pairs:
        if value is None:
            continue
        raw = key.encode()
        if len(raw) > 255:
            raise SinkError(f"header name longer than 255 bytes: {key[:40]!r}...")
        if isinstance(value, str):
            encoded = value.encode()
            out.append(bytes((len(raw),)) + raw + b"S" + _U32.pack(len(encoded)) + encoded)
        else:
            out.append(bytes((len(raw),)) + raw + encode_field_value(value))
    return b"".join(out)


def _encode_properties(
    props: list[tuple[str, list[Any]]], i: int, flags: int
) -> tuple[bytes, bytes, int]:
    """Properties before the headers table (content type, encoding) and after it."""
    before: list[bytes] = []
    after: list[bytes] = []
    for name, values in props:
        value = values[i]
        if value is None:
            continue
        flags |= PROPERTY_FLAGS[name]
        target = before if name in ("content_type", "content_encoding") else after
        if name in _OCTET:
            if not 0 <= value <= 255:
                raise SinkError(f"{name} {value} is not an octet (0-255)")
            target.append(bytes((value,)))
        elif name == "timestamp":
            assert isinstance(value, datetime.datetime)
            target.append(_U64.pack(max(0, int(value.timestamp()))))
        else:
            target.append(_shortstr(value, name))
    return b"".join(before), b"".join(after), flags


class Publisher:
    """One confirm-mode channel; :meth:`send` keeps at most ``max_unconfirmed`` in flight.

    What is sent and not yet confirmed is kept (at most ``max_unconfirmed``
    messages' frames). When the connection is lost, a new one is made (connect()
    waits for a broker as the retry options say) and those messages are
    published again, in order, with the same deduplication keys: into a
    deduplicating queue each row still lands once; elsewhere a message the
    broker had stored without confirming it comes twice (at least once, as a
    retried task would give)."""

    def __init__(self, options: SinkOptions, timeout_s: float = 60.0) -> None:
        self.options = options
        self.timeout_s = timeout_s
        self.client: Client | None = None
        self.published = 0
        self.tracker = ConfirmTracker(self._stopped)
        self.buf = b""
        #: (last delivery tag, frames, count) of each send not yet wholly confirmed.
        self.unconfirmed: deque[tuple[int, bytes, int]] = deque()
        self.reconnects = 0

    @property
    def confirmed(self) -> int:
        return self.tracker.confirmed

    def open(self) -> Publisher:
        """Connect (connect() waits for a broker as the retry options say) and open
        the confirm-mode channel; a connection lost while opening the channel (a
        broker that is just stopping or starting) is tried again, counted
        against ``maxRetries``."""
        while True:
            client = connect(self.options.endpoint, self.timeout_s, name="warren-spark sink")
            try:
                client.channel_open(1)
                client.confirm_select(1)
            except (OSError, EOFError, AMQPError) as exc:
                client.abort()
                if isinstance(exc, AMQPError) and exc.reply_code not in (0, spec.CONNECTION_FORCED):
                    raise SinkError(f"the broker refused the sink's channel: {exc}") from None
                self.reconnects += 1
                if self.reconnects > self.options.endpoint.max_retries:
                    raise ConnectionLost(
                        f"lost the connection to {redact(self.options.url)} while opening "
                        f"a channel: {exc or type(exc).__name__}"
                    ) from None
                log.warning("the sink's connection was lost while opening (%s); again", exc)
                continue
            self.client = client
            self.buf = client.unread()
            return self

    @property
    def frame_max(self) -> int:
        assert self.client is not None
        return self.client.frame_max

    def close(self) -> None:
        if self.client is not None:
            self.client.push_back(self.buf)
            self.client.close()
            self.client = None

    def abort(self) -> None:
        if self.client is not None:
            self.client.abort()
            self.client = None

    def send(self, frames: bytes, count: int) -> None:
        limit = self.options.max_unconfirmed
        while self.published - self.confirmed + count > limit and self.published > self.confirmed:
            self._read_resuming()
        self._resuming(lambda: self._send(frames, count))
        self._resuming(lambda: self._read(block=False))

    def flush(self) -> None:
        """Wait until every message sent is confirmed."""
        while self.confirmed < self.published:
            self._read_resuming()

    def _send(self, frames: bytes, count: int) -> None:
        client = self.client
        assert client is not None and client.sock is not None
        try:
            client.sock.sendall(frames)
        except OSError as exc:
            raise ConnectionLost(
                f"lost the connection to {redact(self.options.url)}: {exc}"
            ) from None
        self.published += count
        self.unconfirmed.append((self.published, frames, count))

    def _read_resuming(self) -> None:
        self._resuming(lambda: self._read(block=True))

    def _resuming(self, step: Callable[[], None]) -> None:
        """``step``; a lost connection is replaced and the unconfirmed sent again
        (at most ``maxRetries`` times in a row without a confirm in between)."""
        while True:
            try:
                step()
                return
            except ConnectionLost as exc:
                self.reconnects += 1
                if self.reconnects > self.options.endpoint.max_retries:
                    raise
                log.warning(
                    "%s; connecting again to publish %d unconfirmed messages again",
                    exc,
                    self.published - self.confirmed,
                )
                self._republish()

    def _republish(self) -> None:
        pending = list(self.unconfirmed)
        while True:
            self.abort()
            self.unconfirmed.clear()
            self.published = 0
            self.tracker = ConfirmTracker(self._stopped)
            self.open()
            try:
                for _last, frames, count in pending:
                    self._send(frames, count)
                return
            except ConnectionLost as exc:
                self.reconnects += 1
                if self.reconnects > self.options.endpoint.max_retries:
                    raise
                log.warning("%s; connecting again", exc)

    def _read(self, block: bool) -> None:
        client = self.client
        assert client is not None and client.sock is not None
        sock = client.sock
        if not block:
            ready, _, _ = select.select([sock], [], [], 0)
            if not ready:
                return
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise ConnectionLost(
                f"no confirm from the broker for {self.timeout_s:g} s "
                f"({self.published - self.confirmed} messages unconfirmed)"
            ) from None
        except OSError as exc:
            raise ConnectionLost(
                f"lost the connection to {redact(self.options.url)}: {exc}"
            ) from None
        if not data:
            raise ConnectionLost(
                f"the broker closed the connection with {self.published - self.confirmed} "
                "messages unconfirmed"
            )
        buf = self.buf + data if self.buf else data
        tracker = self.tracker
        self.buf = buf[tracker.feed(buf) :]
        if tracker.last_nacked:
            raise SinkError(
                f"the broker nacked message {tracker.last_nacked} (queue full, rejected or "
                "failed); the task fails so that Spark can retry it"
            )
        unconfirmed = self.unconfirmed
        before = len(unconfirmed)
        while unconfirmed and unconfirmed[0][0] <= tracker.acked_upto:
            unconfirmed.popleft()
        if len(unconfirmed) < before:
            self.reconnects = 0  # progress

    def _stopped(self, idx: int, payload: bytes) -> None:
        """A basic.return, a close or a cancel among the confirms: the write stops."""
        method = spec.decode_method(payload)
        if idx == _RETURN:
            got = {
                k: getattr(method, k, "")
                for k in ("exchange", "routing_key", "reply_code", "reply_text")
            }
            raise SinkError(
                f"a row was unroutable: no queue took the message published to "
                f"exchange {got['exchange']!r} with routing key {got['routing_key']!r} "
                f"({got['reply_code']} {got['reply_text']}); bind a queue for it, or set "
                "option failOnUnroutable=false to drop such rows"
            )
        code = getattr(method, "reply_code", 0)
        text = getattr(method, "reply_text", "")
        # A broker shutting down (320) may be back soon: connect again.
        forced = idx == spec.ConnectionClose.INDEX and code == spec.CONNECTION_FORCED
        raise (ConnectionLost if forced else SinkError)(
            f"the broker closed the {method.NAME.split('.')[0]}: {code} {text}"
        )
