"""Stream reads from a cluster follower: a read-only AMQP 0-9-1 connection, sans-IO.

A follower holds the leader's stream segments byte for byte but runs no
broker. To spread the reading of streams (Spark's executors, replays) over
the cluster, a follower serves AMQP connections that may consume stream
queues, as RabbitMQ's stream replicas serve readers: the login, channels,
basic.qos, a passive queue.declare (the message count), basic.consume with
x-stream-offset and x-stream-filter, acks (credit), basic.cancel. What would
change anything (publishing, declaring, deleting, purging, classic queues,
offset tracking) is refused with a reply that names the leader.

Deliveries are what the leader would send: the stored properties (with the
x-stream-offset header) and body, read through the same StreamCursor. The
follower applies the leader's appends; the transport calls ``pump()`` after
each applied batch, and every consumer with credit reads on.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

from warren.amqp import spec
from warren.amqp.auth import MECHANISMS, parse_credentials
from warren.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    message_frames,
    method_frame,
)
from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.stream import FILTER_VALUE_HEADER, parse_start
from warren.core.users import READ, User, UserStore
from warren.store.replica_catalog import ReplicaCatalog
from warren.store.stream_store import StreamCursor

__all__ = ["ReplicaConnection"]

log = logging.getLogger("warren.amqp")

_FRAME = struct.Struct(">BHI")
#: Deliveries per consumer and pump: other connections' turns come between.
_BATCH = 256


class _Refused(Exception):
    """A channel error (soft) or a connection error (hard), with AMQP's reply."""

    def __init__(self, code: int, text: str, hard: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.hard = hard


class _Consumer:
    __slots__ = ("tag", "key", "cursor", "filters", "match_unfiltered", "in_flight")

    def __init__(
        self,
        tag: str,
        key: tuple[str, str],
        cursor: StreamCursor | None,
        filters: frozenset[str] | None,
        match_unfiltered: bool,
    ) -> None:
        self.tag = tag
        self.key = key
        self.cursor = cursor  # None until the stream's directory exists
        self.filters = filters
        self.match_unfiltered = match_unfiltered
        self.in_flight = 0


class _Channel:
    __slots__ = ("id", "prefetch", "consumers", "next_tag", "unacked", "closing")

    def __init__(self, channel_id: int) -> None:
        self.id = channel_id
        self.prefetch = 0
        self.consumers: dict[str, _Consumer] = {}
        self.next_tag = 1
        self.unacked: dict[int, _Consumer] = {}  # delivery tag -> consumer, in tag order
        self.closing = False


class ReplicaConnection:
    """One client of a follower's stream read service."""

    def __init__(
        self,
        catalog: ReplicaCatalog,
        peer: str,
        leader: Callable[[], str],
        now_ms: Callable[[], int],
        frame_max: int = 131072,
        heartbeat: int = 60,
    ) -> None:
        self.catalog = catalog
        self.name = peer
        self._leader = leader
        self._now_ms = now_ms
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.output: list[bytes] = []
        self.closed = False  # nothing more to read; close the socket after the output
        self.state = "header"
        self.user: User | None = None
        self.vhost = ""
        self.channels: dict[int, _Channel] = {}
        self._buf = b""
        self._start_pending: tuple[int, int] = (0, 0)

    # -- input ----------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        data = self._buf + data if self._buf else data
        self._buf = b""
        if self.state == "header":
            if len(data) < 8:
                self._buf = data
                return
            if data[:8] != PROTOCOL_HEADER:
                self.output.append(PROTOCOL_HEADER)
                self.closed = True
                return
            data = data[8:]
            self.state = "start-ok"
            self._send(
                0,
                spec.ConnectionStart(
                    version_major=0,
                    version_minor=9,
                    server_properties={
                        "product": "Warren",
                        "information": "a cluster follower's read-only stream service",
                        "capabilities": {"consumer_cancel_notify": True, "basic.nack": True},
                    },
                    mechanisms=MECHANISMS,
                    locales=b"en_US",
                ),
            )
        pos, n = 0, len(data)
        while n - pos >= 8 and not self.closed:
            ftype, ch, size = _FRAME.unpack_from(data, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if data[end] != 0xCE or (self.frame_max and size > self.frame_max):
                self._connection_error(spec.FRAME_ERROR, "bad frame", 0, 0)
                return
            payload = data[pos + 7 : end]
            pos = end + 1
            if ftype == FRAME_HEARTBEAT:
                continue
            if ftype in (FRAME_HEADER, FRAME_BODY):
                # Only a publish has content, and none is accepted.
                continue
            if ftype != FRAME_METHOD or len(payload) < 4:
                self._connection_error(spec.FRAME_ERROR, "unexpected frame", 0, 0)
                return
            try:
                method = spec.decode_method(payload)
            except Exception:
                self._connection_error(spec.FRAME_ERROR, "cannot decode method", 0, 0)
                return
            try:
                if ch == 0:
                    self._channel0(method)
                else:
                    self._on_channel(ch, method)
            except _Refused as exc:
                if exc.hard or ch == 0:
                    self._connection_error(exc.code, exc.text, method.CLASS_ID, method.METHOD_ID)
                else:
                    self._channel_error(ch, exc.code, exc.text, method.CLASS_ID, method.METHOD_ID)
            except BrokerError as exc:
                if exc.hard or ch == 0:
                    self._connection_error(
                        exc.code, exc.reply_text, method.CLASS_ID, method.METHOD_ID
                    )
                else:
                    self._channel_error(
                        ch, exc.code, exc.reply_text, method.CLASS_ID, method.METHOD_ID
                    )
        if pos < n:
            self._buf = data[pos:]
        self.pump()

    def _channel0(self, method: spec.Method) -> None:
        if isinstance(method, spec.ConnectionStartOk) and self.state == "start-ok":
            creds = parse_credentials(method.mechanism, bytes(method.response))
            user = self.catalog.users().authenticate(*creds) if creds else None
            if user is None:
                log.warning("%s: replica read login refused for %s", self.name, creds and creds[0])
                raise _Refused(spec.ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused", True)
            self.user = user
            self.state = "tune-ok"
            self._send(
                0,
                spec.ConnectionTune(
                    channel_max=2047, frame_max=self.frame_max, heartbeat=self.heartbeat
                ),
            )
        elif isinstance(method, spec.ConnectionTuneOk) and self.state == "tune-ok":
            if method.frame_max:
                self.frame_max = min(self.frame_max, method.frame_max)
            self.heartbeat = method.heartbeat
            self.state = "open-wait"
        elif isinstance(method, spec.ConnectionOpen) and self.state == "open-wait":
            assert self.user is not None
            if method.virtual_host not in self.catalog.vhosts():
                raise _Refused(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - vhost {method.virtual_host} not found",
                    True,
                )
            if method.virtual_host not in self.user.permissions:
                raise _Refused(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - access to vhost '{method.virtual_host}' refused for user "
                    f"'{self.user.name}'",
                    True,
                )
            self.vhost = method.virtual_host
            self.state = "open"
            self._send(0, spec.ConnectionOpenOk())
        elif isinstance(method, spec.ConnectionClose):
            self._send(0, spec.ConnectionCloseOk())
            self.closed = True
        elif isinstance(method, spec.ConnectionCloseOk) and self.state == "closing":
            self.closed = True
        elif self.state != "closing":
            raise _Refused(spec.COMMAND_INVALID, f"COMMAND_INVALID - unexpected {method.NAME}")

    # -- channels -------------------------------------------------------------------------
    def _on_channel(self, ch: int, method: spec.Method) -> None:
        if self.state != "open":
            if self.state == "closing":
                return
            raise _Refused(spec.COMMAND_INVALID, "COMMAND_INVALID - connection not open", True)
        channel = self.channels.get(ch)
        if channel is None:
            if not isinstance(method, spec.ChannelOpen):
                raise _Refused(spec.CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", True)
            self.channels[ch] = _Channel(ch)
            self._send(ch, spec.ChannelOpenOk())
            return
        if channel.closing:
            if isinstance(method, spec.ChannelCloseOk | spec.ChannelClose):
                if isinstance(method, spec.ChannelClose):
                    self._send(ch, spec.ChannelCloseOk())
                del self.channels[ch]
            return
        if isinstance(method, spec.ChannelClose):
            self._close_channel(channel)
            self._send(ch, spec.ChannelCloseOk())
        elif isinstance(method, spec.BasicQos):
            channel.prefetch = method.prefetch_count
            self._send(ch, spec.BasicQosOk())
        elif isinstance(method, spec.QueueDeclare):
            self._declare(channel, method)
        elif isinstance(method, spec.BasicConsume):
            self._consume(channel, method)
        elif isinstance(method, spec.BasicCancel):
            consumer = channel.consumers.pop(method.consumer_tag, None)
            if consumer is not None and consumer.cursor is not None:
                consumer.cursor.close()
            if not method.nowait:
                self._send(ch, spec.BasicCancelOk(consumer_tag=method.consumer_tag))
        elif isinstance(method, spec.BasicAck | spec.BasicNack | spec.BasicReject):
            self._settle(channel, method)
        elif isinstance(method, spec.ChannelFlow):
            self._send(ch, spec.ChannelFlowOk(active=method.active))
        else:
            raise _Refused(
                spec.ACCESS_REFUSED,
                f"ACCESS_REFUSED - {method.NAME} is refused by a cluster follower, which "
                f"only serves stream reads; the leader is {self._leader()}",
            )

    def _stream_record(self, name: str) -> dict[str, Any]:
        assert self.user is not None
        record = self.catalog.queue(self.vhost, name)
        if record is None:
            raise _Refused(spec.NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '{self.vhost}'")
        UserStore.check(self.user, self.vhost, READ, "queue", name)
        if record["arguments"].get("x-queue-type") != "stream":
            raise _Refused(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - queue '{name}' in vhost '{self.vhost}' is not a "
                f"stream queue: a cluster follower serves stream reads only; the leader is "
                f"{self._leader()}",
            )
        return record

    def _declare(self, channel: _Channel, method: spec.QueueDeclare) -> None:
        if not method.passive:
            raise _Refused(
                spec.ACCESS_REFUSED,
                "ACCESS_REFUSED - queue.declare is refused by a cluster follower (use "
                f"passive=true, or declare on the leader {self._leader()})",
            )
        self._stream_record(method.queue)
        store = self.catalog.stream(self.vhost, method.queue)
        if store is not None:
            store.refresh()
        count = store.ready_count if store is not None else 0
        if not method.nowait:
            self._send(
                channel.id,
                spec.QueueDeclareOk(queue=method.queue, message_count=count, consumer_count=0),
            )

    def _consume(self, channel: _Channel, method: spec.BasicConsume) -> None:
        what = f"queue '{method.queue}' in vhost '{self.vhost}'"
        self._stream_record(method.queue)
        args = method.arguments or {}
        if method.no_ack:
            raise _Refused(
                spec.NOT_IMPLEMENTED,
                f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream "
                f"queues {what}",
            )
        if not channel.prefetch:
            raise _Refused(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'",
            )
        if args.get("x-stream-automatic-offset-tracking") is True or (
            "x-stream-offset" in args and args["x-stream-offset"] is None
        ):
            raise _Refused(
                spec.NOT_IMPLEMENTED,
                "NOT_IMPLEMENTED - offset tracking is kept by the leader "
                f"{self._leader()}; a follower serves reads from an explicit x-stream-offset",
            )
        start = parse_start(args.get("x-stream-offset", "next"), self._now_ms(), what)
        filters = _filters(args.get("x-stream-filter"), what)
        tag = method.consumer_tag or f"amq.ctag-replica-{channel.id}-{len(channel.consumers) + 1}"
        if tag in channel.consumers:
            raise _Refused(spec.NOT_ALLOWED, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'")
        key = (self.vhost, method.queue)
        store = self.catalog.stream(*key)
        cursor = None
        if store is not None:
            store.refresh()
            cursor = store.cursor(start.resolve(store))
        elif start.kind == "offset" and start.value > 0:
            # Nothing here yet: a cursor is made once the stream's files appear.
            pass
        consumer = _Consumer(
            tag, key, cursor, filters, args.get("x-stream-match-unfiltered") is True
        )
        channel.consumers[tag] = consumer
        if not method.nowait:
            self._send(channel.id, spec.BasicConsumeOk(consumer_tag=tag))

    def _settle(
        self, channel: _Channel, method: spec.BasicAck | spec.BasicNack | spec.BasicReject
    ) -> None:
        tag = method.delivery_tag
        multiple = getattr(method, "multiple", False)
        if multiple:
            done = [t for t in channel.unacked if t <= tag] if tag else list(channel.unacked)
        elif tag in channel.unacked:
            done = [tag]
        else:
            raise _Refused(
                spec.PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )
        for t in done:
            consumer = channel.unacked.pop(t)
            consumer.in_flight -= 1

    def _close_channel(self, channel: _Channel) -> None:
        for consumer in channel.consumers.values():
            if consumer.cursor is not None:
                consumer.cursor.close()
        channel.consumers.clear()
        channel.unacked.clear()
        self.channels.pop(channel.id, None)

    # -- delivering -----------------------------------------------------------------------
    def pump(self) -> bool:
        """Deliver what the consumers have credit for; True when some could take more
        and have more to read (call again on the next loop turn)."""
        more = False
        for channel in list(self.channels.values()):
            if channel.closing:
                continue
            for consumer in list(channel.consumers.values()):
                if self._deliver(channel, consumer):
                    more = True
        return more

    def _deliver(self, channel: _Channel, consumer: _Consumer) -> bool:
        cursor = consumer.cursor
        if cursor is None:
            store = self.catalog.stream(*consumer.key)
            if store is None:
                return False
            store.refresh()
            cursor = consumer.cursor = store.cursor(store.first_offset)
        budget = _BATCH
        while budget:
            if len(channel.unacked) >= channel.prefetch:
                return False
            item = cursor.next()
            if consumer.filters is not None:
                while item is not None and not _wanted(consumer, item[1]):
                    item = cursor.next()
            if item is None:
                return False
            _offset, msg = item
            tag = channel.next_tag
            channel.next_tag = tag + 1
            channel.unacked[tag] = consumer
            consumer.in_flight += 1
            deliver = spec.BasicDeliver(
                consumer_tag=consumer.tag,
                delivery_tag=tag,
                redelivered=False,
                exchange=msg.exchange,
                routing_key=msg.routing_key,
            )
            self.output.extend(
                message_frames(
                    channel.id, deliver.encode(), msg.properties, msg.body, self.frame_max
                )
            )
            budget -= 1
        return True

    def consumers_of(self, keys: set[tuple[str, str]]) -> bool:
        return any(
            consumer.key in keys
            for channel in self.channels.values()
            for consumer in channel.consumers.values()
        )

    def tick(self) -> None:
        """A heartbeat, when the client asked for them."""
        if self.heartbeat and self.state == "open":
            self.output.append(HEARTBEAT_FRAME)

    # -- output and errors ----------------------------------------------------------------
    def take_output(self) -> list[bytes]:
        out, self.output = self.output, []
        return out

    def _send(self, ch: int, method: spec.Method) -> None:
        self.output.append(method_frame(ch, method))

    def _channel_error(self, ch: int, code: int, text: str, class_id: int, method_id: int) -> None:
        log.warning("%s channel %d: closing channel: %s", self.name, ch, text)
        channel = self.channels.get(ch)
        if channel is None:
            return
        self._close_channel(channel)
        channel.closing = True
        self.channels[ch] = channel
        self._send(
            ch,
            spec.ChannelClose(
                reply_code=code, reply_text=text, class_id=class_id, method_id=method_id
            ),
        )

    def _connection_error(self, code: int, text: str, class_id: int, method_id: int) -> None:
        log.warning("%s: closing connection: %s", self.name, text)
        for channel in list(self.channels.values()):
            self._close_channel(channel)
        self.state = "closing"
        self._send(
            0,
            spec.ConnectionClose(
                reply_code=code, reply_text=text, class_id=class_id, method_id=method_id
            ),
        )

    def close(self) -> None:
        for channel in list(self.channels.values()):
            self._close_channel(channel)
        self.closed = True


def _filters(value: Any, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out = set()
    for item in items:
        if isinstance(item, bytes):
            item = item.decode("utf-8", "surrogateescape")
        if not isinstance(item, str):
            raise _Refused(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - Invalid x-stream-filter: {value!r} for {what}",
            )
        out.add(item)
    return frozenset(out)


def _wanted(consumer: _Consumer, msg: Message) -> bool:
    value = (msg.headers or {}).get(FILTER_VALUE_HEADER)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if value is None:
        return consumer.match_unfiltered
    assert consumer.filters is not None
    return isinstance(value, str) and value in consumer.filters
