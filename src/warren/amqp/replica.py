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

from warren.amqp import handshake, spec
from warren.amqp.auth import MECHANISMS
from warren.amqp.channel import Channel
from warren.amqp.frame_loop import FrameHandler, FrameLoop, decode_method, unexpected_frame
from warren.amqp.frames import HEARTBEAT_FRAME, message_frames, method_frame
from warren.amqp.handshake import State
from warren.core.errors import (
    AccessRefused,
    BrokerError,
    ChannelError,
    CommandInvalid,
    NotAllowed,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    UnexpectedFrame,
    clip_reply_text,
)
from warren.core.message import Message
from warren.core.stream import filter_wants, parse_start
from warren.core.users import READ, User, UserStore
from warren.store.replica_catalog import ReplicaCatalog
from warren.store.stream_store import StreamCursor

__all__ = ["ReplicaConnection"]

log = logging.getLogger("warren.amqp")

_FRAME = struct.Struct(">BHI")
#: Deliveries per consumer and pump: other connections' turns come between.
_BATCH = 256


class NotAllowedOnChannel(BrokerError):
    """RabbitMQ's 530 for a reused consumer tag, which closes only the channel."""

    code = 530
    name = "NOT_ALLOWED"


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


class ReplicaGate:
    """A follower's side of the handshake: its catalog's users and vhosts, no limits
    but frame_max and heartbeat, no EXTERNAL."""

    def __init__(self, conn: ReplicaConnection) -> None:
        self.conn = conn

    def server_properties(self) -> dict[str, Any]:
        return {
            "product": "Warren",
            "information": "a cluster follower's read-only stream service",
            "capabilities": {"consumer_cancel_notify": True, "basic.nack": True},
        }

    def mechanisms(self) -> bytes:
        return MECHANISMS

    def limits(self) -> tuple[int, int, int]:
        return 2047, self.conn.frame_max_offered, self.conn.heartbeat_offered

    def login(
        self, mechanism: str, creds: tuple[str, str] | None, external: bool, refusal: str
    ) -> User | None:
        conn = self.conn
        user = conn.catalog.users().authenticate(*creds) if creds else None
        if user is None:
            log.warning("%s: replica read login refused for %s", conn.name, creds and creds[0])
            handshake.refuse_login(conn, refusal)
        return user

    def open_vhost(self, name: str) -> bool:
        conn = self.conn
        assert conn.user is not None
        if name not in conn.catalog.vhosts():
            raise NotAllowed(f"vhost {name} not found")
        if name not in conn.user.permissions:
            raise NotAllowed(f"access to vhost '{name}' refused for user '{conn.user.name}'")
        conn.vhost = name
        return True

    def opened(self) -> None:
        pass

    def update_secret(self, secret: str) -> str | None:
        return "a follower's read service takes no new secrets"


class ReplicaConnection(FrameHandler):
    """One client of a follower's stream read service: the shared frame loop
    (amqp/frame_loop.py) and handshake (amqp/handshake.py), its own channels."""

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
        self.peer: tuple[str, int] | None = None
        self._leader = leader
        self._now_ms = now_ms
        self.frame_max_offered = frame_max
        self.heartbeat_offered = heartbeat
        self.frame_max = frame_max
        self.channel_max = 2047
        self.heartbeat = heartbeat
        self.output: list[bytes] = []
        self.closed = False  # nothing more to read; close the socket after the output
        self.state = State.HEADER
        self.user: User | None = None
        self.vhost = ""
        self.cert_login: str | None = None
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.auth_mechanism = ""
        self._received = True
        #: The frame loop's fast path is the broker's channels': none here.
        self.channels: dict[int, Channel] = {}
        self.readers: dict[int, _Channel] = {}
        self.gate = ReplicaGate(self)
        self.frames = FrameLoop(self, 0)

    # -- input (amqp/frame_loop.py calls these) --------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        self.frames.feed(data)
        self.pump()

    def send(self, data: bytes) -> None:
        self.output.append(data)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.output.append(method_frame(channel, method))

    def send_start(self) -> None:
        handshake.send_start(self)

    def holding(self) -> bool:
        return False

    def channel0(self, payload: bytes) -> None:
        handshake.channel0(self, decode_method(self.name, payload))

    def method_on_unopened_channel(self, ch: int, payload: bytes) -> None:
        method = decode_method(self.name, payload)
        try:
            self._on_channel(ch, method)
        except BrokerError as exc:
            if exc.hard:
                raise
            self._channel_error(ch, exc, method.CLASS_ID, method.METHOD_ID)

    def content_frame(self, ch: int, ftype: int, payload: bytes) -> None:
        """Only a publish has content, and none is accepted: its channel is closing."""
        if not ch:
            raise unexpected_frame(ftype, payload)
        if ch not in self.readers:
            raise UnexpectedFrame("expected method frame, got non method frame instead")

    # -- channels -------------------------------------------------------------------------
    def _on_channel(self, ch: int, method: spec.Method) -> None:
        channel = self.readers.get(ch)
        if channel is None:
            if not isinstance(method, spec.ChannelOpen):
                raise ChannelError("expected 'channel.open'")
            self.readers[ch] = _Channel(ch)
            self._send(ch, spec.ChannelOpenOk())
            return
        if channel.closing:
            if isinstance(method, spec.ChannelCloseOk | spec.ChannelClose):
                if isinstance(method, spec.ChannelClose):
                    self._send(ch, spec.ChannelCloseOk())
                del self.readers[ch]
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
            raise AccessRefused(
                f"{method.NAME} is refused by a cluster follower, which "
                f"only serves stream reads; the leader is {self._leader()}"
            )

    def _stream_record(self, name: str) -> dict[str, Any]:
        assert self.user is not None
        record = self.catalog.queue(self.vhost, name)
        if record is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.vhost}'")
        UserStore.check(self.user, self.vhost, READ, "queue", name)
        if record["arguments"].get("x-queue-type") != "stream":
            raise PreconditionFailed(
                f"queue '{name}' in vhost '{self.vhost}' is not a "
                f"stream queue: a cluster follower serves stream reads only; the leader is "
                f"{self._leader()}"
            )
        return record

    def _declare(self, channel: _Channel, method: spec.QueueDeclare) -> None:
        if not method.passive:
            raise AccessRefused(
                "queue.declare is refused by a cluster follower (use "
                f"passive=true, or declare on the leader {self._leader()})"
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
            raise NotImplemented_(
                f"automatic acknowledgement not supported by stream queues {what}"
            )
        if not channel.prefetch:
            raise PreconditionFailed(f"consumer prefetch count is not set for '{what}'")
        if args.get("x-stream-automatic-offset-tracking") is True or (
            "x-stream-offset" in args and args["x-stream-offset"] is None
        ):
            raise NotImplemented_(
                "offset tracking is kept by the leader "
                f"{self._leader()}; a follower serves reads from an explicit x-stream-offset"
            )
        start = parse_start(args.get("x-stream-offset", "next"), self._now_ms(), what)
        filters = _filters(args.get("x-stream-filter"), what)
        tag = method.consumer_tag or f"amq.ctag-replica-{channel.id}-{len(channel.consumers) + 1}"
        if tag in channel.consumers:
            raise NotAllowedOnChannel(f"attempt to reuse consumer tag '{tag}'")
        key = (self.vhost, method.queue)
        store = self.catalog.stream(*key)
        cursor = None
        if store is not None:
            store.refresh()
            cursor = store.cursor(start.resolve(store, messages=True))
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
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        for t in done:
            consumer = channel.unacked.pop(t)
            consumer.in_flight -= 1

    def _close_channel(self, channel: _Channel) -> None:
        for consumer in channel.consumers.values():
            if consumer.cursor is not None:
                consumer.cursor.close()
        channel.consumers.clear()
        channel.unacked.clear()
        self.readers.pop(channel.id, None)

    # -- delivering -----------------------------------------------------------------------
    def pump(self) -> bool:
        """Deliver what the consumers have credit for; True when some could take more
        and have more to read (call again on the next loop turn)."""
        more = False
        for channel in list(self.readers.values()):
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
            for channel in self.readers.values()
            for consumer in channel.consumers.values()
        )

    def tick(self) -> None:
        """A heartbeat, when the client asked for them."""
        if self.heartbeat and self.state == State.OPEN:
            self.output.append(HEARTBEAT_FRAME)

    # -- output and errors ----------------------------------------------------------------
    def take_output(self) -> list[bytes]:
        out, self.output = self.output, []
        return out

    def _send(self, ch: int, method: spec.Method) -> None:
        self.output.append(method_frame(ch, method))

    def _channel_error(self, ch: int, exc: BrokerError, class_id: int, method_id: int) -> None:
        log.warning("%s channel %d: closing channel: %s", self.name, ch, exc.reply_text)
        channel = self.readers.get(ch)
        if channel is None:
            return
        self._close_channel(channel)
        channel.closing = True
        self.readers[ch] = channel
        self._send(
            ch,
            spec.ChannelClose(
                reply_code=exc.code,
                reply_text=clip_reply_text(exc.reply_text),
                class_id=class_id,
                method_id=method_id,
            ),
        )

    def connection_error(self, exc: BrokerError, class_id: int = 0, method_id: int = 0) -> None:
        if self.state >= State.CLOSING:
            return
        if not exc.hard:
            exc = CommandInvalid(exc.reply_text)
        log.warning("%s: closing connection: %s", self.name, exc.reply_text)
        if self.state < State.OPEN_WAIT and self.state != State.TUNE_OK:
            self.close_transport()
            return
        self._release()
        self.state = State.CLOSING
        self._send(
            0,
            spec.ConnectionClose(
                reply_code=exc.code,
                reply_text=clip_reply_text(exc.reply_text),
                class_id=class_id,
                method_id=method_id,
            ),
        )

    def close_transport(self) -> None:
        """Nothing more is read; the transport closes the socket after the output."""
        self._release()
        self.state = State.CLOSED
        self.closed = True

    def _release(self) -> None:
        for channel in list(self.readers.values()):
            self._close_channel(channel)

    def close(self) -> None:
        self.close_transport()


def _filters(value: Any, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out = set()
    for item in items:
        if isinstance(item, bytes):
            item = item.decode("utf-8", "surrogateescape")
        if not isinstance(item, str):
            raise PreconditionFailed(f"Invalid x-stream-filter: {value!r} for {what}")
        out.add(item)
    return frozenset(out)


def _wanted(consumer: _Consumer, msg: Message) -> bool:
    assert consumer.filters is not None
    return filter_wants(consumer.filters, consumer.match_unfiltered, msg.headers)
