"""One AMQP channel: method handlers that turn AMQP commands into core calls.

Publishes are assembled here from method, header and body frames; deliveries,
acknowledgements, prefetch, confirms and transactions are tracked per channel.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.amqp import spec
from warren.amqp.ack_timeout import AckDeadlines
from warren.amqp.consumer import AMQPConsumer
from warren.amqp.frames import message_frames, method_frame, split_header_payload
from warren.amqp.publish_checks import check_message, validate_publish_properties
from warren.amqp.publish_run import PLAIN_PROPERTIES, PublishRun
from warren.amqp.unacked import Unacked, UnackedDeliveries, UnackedRun
from warren.core.codec_errors import DecodeError
from warren.core.errors import (
    AccessRefused,
    BrokerError,
    ChannelError,
    CommandInvalid,
    FrameError,
    InternalError,
    NotAllowed,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    UnexpectedFrame,
    clip_reply_text,
)
from warren.core.exchange import Exchange
from warren.core.message import Message, MessageRun
from warren.core.queue import Queue
from warren.core.stats import MessageStats, count_get
from warren.core.store import MessageStore, StoredRun
from warren.core.users import CONFIGURE, READ, WRITE, User, UserStore, topic_refused
from warren.core.vhost_routing import REPLY_TO, REPLY_TO_PREFIX

_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40

if TYPE_CHECKING:
    from warren.amqp.connection import AMQPConnection
    from warren.store.sync import GroupSync

log = logging.getLogger("warren.amqp")


# RabbitMQ's texts for frames out of a publish's method/header/body order.
_EXPECTED_METHOD = "expected method frame, got non method frame instead"
_EXPECTED_HEADER = "expected content header for class 60, got non content header frame instead"
_EXPECTED_BODY = "expected content body, got non content body frame instead"


def _random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class Channel:
    def __init__(self, connection: AMQPConnection, channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.vhost = connection.vhost
        assert self.vhost is not None
        user = connection.user
        assert user is not None
        self.user: User = user
        self._vhost_name = self.vhost.name
        # RabbitMQ's topic permission variables for AMQP 0-9-1 (client_id is MQTT's).
        self._topic_variables = {"username": user.name, "vhost": self.vhost.name}
        self.vhost.channels_opened += 1
        # Counted per user for max-channels; given back once, in release().
        self._users: UserStore = connection.broker.users
        self._users.count_channel(user.name, 1)
        self._max_consumers = connection.config.max_consumers_per_channel
        self.closing = False
        self.flow_active = True
        self.consumers: dict[str, AMQPConsumer] = {}
        self.unacked = UnackedDeliveries()
        self.unacked_bytes = 0
        # Unacked consumer deliveries: what global prefetch limits (basic.get's are not
        # counted, as in RabbitMQ).
        self.consumer_unacked = 0
        self._delivery_tag = 0
        self.consumer_prefetch_count = 0
        self.consumer_prefetch_size = 0
        self.global_prefetch_count = 0
        self.global_prefetch_size = 0
        self.confirm = False
        self.publish_seq = 0
        self._confirms: list[tuple[int, bool]] = []
        # Confirms still waiting for a disk sync, in publish order (a dict as an
        # ordered set): a multiple ack must never cover one of them.
        self._unconfirmed: dict[int, None] = {}
        # Whether _unconfirmed's order is publish order (its first key the oldest):
        # a keyed run's routing keys may add their numbers out of order.
        self._unconfirmed_in_order = True
        self._sync_batch: list[int] | None = None
        self._sync_round = 0
        self.closed = False
        self._ack_deadlines: AckDeadlines | None = None
        self.tx = False
        self._tx_publishes: list[tuple[Exchange, Message, bool]] = []
        self._tx_acks: list[tuple[int, Unacked, str, bool]] = []
        self.last_queue = ""
        self.reply_token: str | None = None
        self.reply_consumer_tag: str | None = None
        #: Message counters (management API, metrics); folded into the vhost's at close.
        self.stats = MessageStats()
        # Content assembly for the publish in progress.
        self._publish: spec.BasicPublish | None = None
        self._last_publish: spec.BasicPublish | None = None
        self._last_publish_payload = b""
        self._publish_ex_rk = b""
        self._props: bytes | None = None
        self._body_size = 0
        self._body: list[bytes] = []
        self._received = 0
        self._exchange_cache: dict[str, Exchange] = {}

    def __repr__(self) -> str:
        return f"<Channel {self.id} of {self.connection.name}>"

    # -- frames -----------------------------------------------------------------------
    def on_method_frame(self, payload: bytes) -> None:
        conn = self.connection
        if self._publish is not None:
            # RabbitMQ's texts; the close names basic.publish, whose content was cut short.
            text = _EXPECTED_HEADER if self._props is None else _EXPECTED_BODY
            conn.connection_error(UnexpectedFrame(text), 60, 40)
            return
        if payload[:4] == _PUBLISH_IDS and not self.closing:
            # The hot path: basic.publish skips the generic dispatch. Its payload
            # already holds exchange and routing key as the two shortstrs every
            # delivery of the message will carry.
            # A publisher mostly repeats one exchange and routing key: the last
            # payload's decoded method is reused (it is only ever read).
            self._publish = self._publish_method(payload)
            self._publish_ex_rk = payload[6:-1]
            return
        method = conn._decode(payload)
        if self.closing:
            if isinstance(method, spec.ChannelCloseOk):
                conn.channels.pop(self.id, None)
            elif isinstance(method, spec.ChannelClose):
                conn.send_method(self.id, spec.ChannelCloseOk())
                conn.channels.pop(self.id, None)
            return
        handler = _HANDLERS.get(type(method))
        if handler is None:  # e.g. a connection-class or server-to-client method
            raise CommandInvalid("unimplemented method")
        try:
            handler(self, method)
        except BrokerError as exc:
            if exc.hard:
                conn.connection_error(exc, method.CLASS_ID, method.METHOD_ID)
            else:
                self.channel_error(exc, method.CLASS_ID, method.METHOD_ID)

    def _publish_method(self, payload: bytes) -> spec.BasicPublish:
        """basic.publish decoded; the last payload's method is reused (it is only
        ever read)."""
        if payload == self._last_publish_payload:
            method = self._last_publish
            assert method is not None
            return method
        try:
            method = spec.BasicPublish.decode(payload)
        except DecodeError:
            self.connection._decode(payload)  # raises the connection error RabbitMQ sends
            raise
        self._last_publish_payload = payload
        self._last_publish = method
        return method

    def takes_publish_run(self) -> bool:
        """Whether a run of publishes (amqp/publish_run.py) may start here: no
        message half received, the channel not closing."""
        return self._publish is None and not self.closing

    def publish_run(self, run: PublishRun) -> None:
        """Every message of a run: one exchange, simple properties, each body
        in one frame. What ``_publish_message`` does per message is done once per
        routing key (exchange lookup, permissions, the route), then each message
        is enqueued and confirmed as it would be alone. A keyed run (several
        routing keys) goes one routing key at a time, each key's messages in
        order (in publish order across keys for a topic exchange, whose topic
        permissions may refuse one key). An error stops the run where a
        message-by-message publish would have stopped (the channel or
        connection closes, and the rest of its frames are ignored)."""
        try:
            if run.uniform:
                self._publish_uniform(run, None, self.publish_seq)
                return
            base = self.publish_seq
            ex = self._checked_exchange(self._publish_method(run.method))
            for sub, indexes in run.groups(ex.type == "topic"):
                self._publish_uniform(sub, indexes, base)
            if self.confirm:
                self.publish_seq = base + len(run)
                if self._unconfirmed:
                    self._unconfirmed_in_order = False
        except BrokerError as exc:
            if exc.hard:
                self.connection.connection_error(exc, 60, 40)
            else:
                self.channel_error(exc, 60, 40)

    def _publish_uniform(self, run: PublishRun, indexes: list[int] | None, base: int) -> None:
        """A run with one routing key; message ``i`` is the publish numbered
        ``base + 1 + (indexes[i] if indexes else i)`` for confirms."""
        method = self._publish_method(run.method)
        ex = self._checked_exchange(method)
        conn = self.connection
        conn.has_published = True
        if conn.blocked:
            conn.block_now()
        mrun = MessageRun(ex.name, method.routing_key, run.method[6:-1], run, conn.now_ms or None)
        mandatory = method.mandatory
        n = len(run)
        if self.tx:
            for i in range(n):
                self.stats.publish += 1
                self._tx_publishes.append((ex, mrun.message(i), mandatory))
            return
        assert self.vhost is not None
        msg = mrun.message(0)
        queues = self.vhost.route_run(ex, msg)
        confirm = self.confirm
        start = 0
        taken: list[int] = []
        durable: list[MessageStore] = []
        if queues:
            # Queues whose consumers take the run's first messages as they come
            # take them at once; the rest go message by message.
            taken = [q.publish_run(mrun, durable) for q in queues]
            start = min(taken)
            if start:
                ex.stats.count_publishes(start, len(queues))
                self.stats.publish += start
                if confirm:
                    self._confirm_run(base, indexes, start, durable)
        most = max(taken, default=0)
        for i in range(start, n):
            if i:
                msg = mrun.message(i)
            self.stats.publish += 1
            if confirm:
                self.publish_seq = base + 1 + (indexes[i] if indexes is not None else i)
            if queues and i < most:  # some queues took this one with the run
                rest = [q for q, t in zip(queues, taken, strict=True) if t <= i]
                ex.stats.publish_out += len(taken) - len(rest)
                self._route(ex, msg, False, list(durable), rest)
            else:
                self._route(ex, msg, mandatory, None, queues)
        if confirm and indexes is None:
            self.publish_seq = base + n

    def on_header_frame(self, payload: bytes) -> None:
        if self.closing:
            return
        method = self._publish
        if method is None:
            raise UnexpectedFrame(_EXPECTED_METHOD)
        if self._props is not None:
            self.connection.connection_error(UnexpectedFrame(_EXPECTED_BODY), 60, 40)
            return
        if payload[2:4] != b"\x00\x00":
            # RabbitMQ only takes a header whose weight is zero as a content header.
            self.connection.connection_error(UnexpectedFrame(_EXPECTED_HEADER), 60, 40)
            return
        try:
            class_id, body_size, props = split_header_payload(payload)
        except DecodeError as exc:
            raise FrameError(f"malformed content header on channel {self.id}: {exc}") from None
        if class_id != 60:
            text = f"expected content header for class 60, got one for class {class_id} instead"
            self.connection.connection_error(UnexpectedFrame(text), 60, 40)
            return
        max_size = self.connection.config.max_message_size
        if body_size > max_size:
            self._publish = None
            self.channel_error(
                PreconditionFailed(
                    f"message size {body_size} is larger than configured max size {max_size}"
                ),
                60,
                40,
            )
            return
        if body_size == 0:
            self._publish = None
            self._handle_publish(method, props, b"")
            return
        self._props = props
        self._body_size = body_size
        self._received = 0

    def on_body_frame(self, payload: bytes) -> None:
        if self.closing:
            return
        method = self._publish
        if method is None:
            raise UnexpectedFrame(_EXPECTED_METHOD)
        if self._props is None:
            self.connection.connection_error(UnexpectedFrame(_EXPECTED_HEADER), 60, 40)
            return
        received = self._received + len(payload)
        if received > self._body_size:
            # RabbitMQ notices only when the next frame is not more body, and then
            # says it expected more body; a client sees the same close either way.
            self.connection.connection_error(UnexpectedFrame(_EXPECTED_BODY), 60, 40)
            return
        if received == self._body_size:
            if self._body:
                self._body.append(payload)
                body = b"".join(self._body)
                self._body = []
            else:
                body = payload
            props = self._props
            self._publish = self._props = None
            self._handle_publish(method, props, body)
        else:
            self._body.append(payload)
            self._received = received

    def _handle_publish(self, method: spec.BasicPublish, props: bytes, body: bytes) -> None:
        try:
            self._publish_message(method, props, body)
        except BrokerError as exc:
            if exc.hard:
                self.connection.connection_error(exc, 60, 40)
            else:
                self.channel_error(exc, 60, 40)

    # -- errors and closing -----------------------------------------------------------
    def channel_error(self, exc: BrokerError, class_id: int, method_id: int) -> None:
        log.warning(
            "%s channel %s: closing channel: %s %s",
            self.connection.name,
            self.id,
            exc.code,
            exc.reply_text,
        )
        self.connection.send_method(
            self.id,
            spec.ChannelClose(
                reply_code=exc.code,
                reply_text=clip_reply_text(exc.reply_text),
                class_id=class_id,
                method_id=method_id,
            ),
        )
        self.closing = True
        self._publish = self._props = None
        self._body = []
        self.release()

    def check_consumer_timeout(self, now: int, default: int) -> None:
        """Close the channel (406, RabbitMQ's text) when a delivery has waited for
        its acknowledgement longer than the consumer timeout."""
        if self.closing or self.closed:
            return
        if not self.unacked:
            self._ack_deadlines = None
            return
        timeouts = [c.queue.consumer_timeout for c in self.consumers.values()]
        oldest_queue = next(self.unacked.by_age())[1]
        if oldest_queue is not None:
            timeouts.append(oldest_queue.consumer_timeout)
        floor = min([t for t in timeouts if t] + ([default] if default else []), default=0)
        if not floor:
            return
        if self._ack_deadlines is None:
            self._ack_deadlines = AckDeadlines()
        timeout = self._ack_deadlines.overdue(
            self.unacked.by_age(), self._delivery_tag, now, default, floor
        )
        if timeout is not None:
            self.channel_error(
                PreconditionFailed(
                    f"delivery acknowledgement on channel {self.id} timed out. Timeout value "
                    f"used: {timeout} ms. This timeout value can be configured, see consumers "
                    "doc guide to learn more"
                ),
                0,
                0,
            )

    def release(self) -> None:
        """Give back everything the channel holds: consumers, unacked messages."""
        vhost = self.vhost
        if not self.closed:
            self._users.count_channel(self.user.name, -1)
        if vhost is not None and not self.closed:  # once, however often released
            vhost.base_stats.add(self.stats)
            self.stats = MessageStats()
            vhost.channels_closed += 1
        self.closed = True
        for consumer in list(self.consumers.values()):
            if consumer.queue is not None:
                consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        if self.reply_token is not None and vhost is not None:
            vhost.reply_targets.pop(self.reply_token, None)
            self.reply_token = None
        unacked = [e for _, e in self.unacked.entries()] + [e for _, e, _, _ in self._tx_acks]
        self.unacked.clear()
        self.consumer_unacked = 0
        self._tx_acks.clear()
        unacked.sort(key=lambda e: e[1])
        for queue, seq, msg, _, _ in unacked:
            queue.reject(seq, msg, True)

    # -- helpers ----------------------------------------------------------------------
    def _check(self, kind: str, resource_type: str, name: str) -> None:
        conn = self.connection
        key = (kind, resource_type, name)
        if key not in conn.permission_cache:
            assert conn.user is not None and self.vhost is not None
            try:
                UserStore.check(conn.user, self.vhost.name, kind, resource_type, name)
                conn.permission_cache[key] = None
            except AccessRefused as exc:
                conn.permission_cache[key] = exc
        refused = conn.permission_cache[key]
        if refused is not None:
            raise AccessRefused(refused.text)

    def _check_topic(self, ex: Exchange | None, key: str, kind: str) -> None:
        """RabbitMQ's topic permission check (binds): topic exchanges only."""
        if ex is not None and ex.type == "topic" and self.user.topic_permissions:
            UserStore.check_topic(
                self.user, self._vhost_name, ex.name, key, kind, self._topic_variables
            )

    def _queue_name(self, name: str) -> str:
        if name:
            return name
        if not self.last_queue:
            raise NotFound("no previously declared queue")
        return self.last_queue

    def _queue(self, name: str) -> Queue:
        assert self.vhost is not None
        return self.vhost.get_queue(self._queue_name(name), self.connection)

    def _exchange(self, name: str) -> Exchange:
        ex = self._exchange_cache.get(name)
        if ex is None or ex.deleted:
            assert self.vhost is not None
            ex = self.vhost.get_exchange(name)
            self._exchange_cache[name] = ex
        return ex

    def _reply(self, method: spec.Method) -> None:
        self.connection.send_method(self.id, method)

    def next_delivery_tag(self) -> int:
        self._delivery_tag += 1
        return self._delivery_tag

    def next_delivery_tags(self, n: int) -> int:
        """Reserve ``n`` delivery tags; the first of them."""
        first = self._delivery_tag + 1
        self._delivery_tag += n
        return first

    def track_unacked(
        self, tag: int, queue: Queue, seq: int, msg: Message, consumer: AMQPConsumer | None
    ) -> None:
        size = len(msg.body)
        self.unacked.add(tag, (queue, seq, msg, consumer, size))
        self.unacked_bytes += size
        if consumer is not None:
            self.consumer_unacked += 1

    def track_unacked_run(
        self, first: int, queue: Queue, stored: StoredRun, consumer: AMQPConsumer, size: int
    ) -> None:
        """A run's deliveries, tags ``first ..``, ``size`` body bytes in all."""
        self.unacked.add_run(
            UnackedRun(first, queue, consumer, stored.segment, stored.offsets, stored.sizes)
        )
        self.unacked_bytes += size
        self.consumer_unacked += len(stored)

    def has_global_capacity(self) -> bool:
        if self.global_prefetch_count and self.consumer_unacked >= self.global_prefetch_count:
            return False
        return not (self.global_prefetch_size and self.unacked_bytes >= self.global_prefetch_size)

    def resume_delivery(self) -> None:
        for consumer in self.consumers.values():
            consumer.queue.schedule_delivery()

    # -- channel class ----------------------------------------------------------------
    def _channel_open(self, method: spec.ChannelOpen) -> None:
        raise ChannelError("second 'channel.open' seen")

    def _channel_close(self, method: spec.ChannelClose) -> None:
        self.release()
        self.connection.channels.pop(self.id, None)
        self._reply(spec.ChannelCloseOk())

    def _channel_flow(self, method: spec.ChannelFlow) -> None:
        self.flow_active = method.active
        self._reply(spec.ChannelFlowOk(active=method.active))
        if method.active:
            self.resume_delivery()

    def _channel_flow_ok(self, method: spec.ChannelFlowOk) -> None:
        pass

    def _access_request(self, method: spec.AccessRequest) -> None:
        # Deprecated in 0-9-1 but still sent by old clients; RabbitMQ grants ticket 1.
        self._reply(spec.AccessRequestOk(ticket=1))

    # -- exchange class ---------------------------------------------------------------
    def _exchange_declare(self, method: spec.ExchangeDeclare) -> None:
        assert self.vhost is not None
        if not method.passive:
            self._check(CONFIGURE, "exchange", method.exchange)
        self.vhost.declare_exchange(
            method.exchange,
            method.type,
            durable=method.durable,
            auto_delete=method.auto_delete,
            internal=method.internal,
            arguments=method.arguments,
            passive=method.passive,
        )
        if not method.nowait:
            self._reply(spec.ExchangeDeclareOk())

    def _exchange_delete(self, method: spec.ExchangeDelete) -> None:
        assert self.vhost is not None
        self._check(CONFIGURE, "exchange", method.exchange)
        self.vhost.delete_exchange(method.exchange, if_unused=method.if_unused)
        self._exchange_cache.pop(method.exchange, None)
        if not method.nowait:
            self._reply(spec.ExchangeDeleteOk())

    def _exchange_bind(self, method: spec.ExchangeBind) -> None:
        assert self.vhost is not None
        self._check(WRITE, "exchange", method.destination)
        if "" in (method.destination, method.source):
            raise AccessRefused("operation not permitted on the default exchange")
        self._check(READ, "exchange", method.source)
        self._check_topic(self.vhost.exchanges.get(method.source), method.routing_key, READ)
        # As RabbitMQ: when both are missing, the source is the one named.
        src = self.vhost.get_exchange(method.source)
        dest = self.vhost.get_exchange(method.destination)
        self.vhost.bind(src, dest, method.routing_key, method.arguments)
        if not method.nowait:
            self._reply(spec.ExchangeBindOk())

    def _exchange_unbind(self, method: spec.ExchangeUnbind) -> None:
        assert self.vhost is not None
        self._check(WRITE, "exchange", method.destination)
        self._check(READ, "exchange", method.source)
        # Like RabbitMQ, unbinding from or to a missing exchange succeeds.
        dest = self.vhost.exchanges.get(method.destination)
        src = self.vhost.exchanges.get(method.source)
        if self.vhost.default_exchange in (src, dest):
            raise AccessRefused("operation not permitted on the default exchange")
        self._check_topic(src, method.routing_key, READ)
        if dest is not None and src is not None:
            self.vhost.unbind(src, dest, method.routing_key, method.arguments)
        if not method.nowait:
            self._reply(spec.ExchangeUnbindOk())

    # -- queue class ------------------------------------------------------------------
    def _queue_declare(self, method: spec.QueueDeclare) -> None:
        assert self.vhost is not None
        name = method.queue
        if name.startswith(REPLY_TO):
            # As RabbitMQ: the pseudo-queue (passive or not) and the address of a live
            # reply consumer "exist" with one consumer; other such names do not.
            token = name[len(REPLY_TO_PREFIX) :] if name.startswith(REPLY_TO_PREFIX) else None
            if name != REPLY_TO and token not in self.vhost.reply_targets:
                raise NotFound(f"no queue '{name}' in vhost '{self.vhost.name}'")
            self.last_queue = name
            if not method.nowait:
                self._reply(spec.QueueDeclareOk(queue=name, message_count=0, consumer_count=1))
            return
        if name and not method.passive:
            self._check(CONFIGURE, "queue", name)
        q = self.vhost.declare_queue(
            name,
            durable=method.durable,
            exclusive=method.exclusive,
            auto_delete=method.auto_delete,
            arguments=method.arguments,
            passive=method.passive,
            owner=self.connection,
        )
        self.last_queue = q.name
        if not method.nowait:
            self._reply(
                spec.QueueDeclareOk(
                    queue=q.name, message_count=q.message_count, consumer_count=q.consumer_count
                )
            )

    def _queue_bind(self, method: spec.QueueBind) -> None:
        assert self.vhost is not None
        qname = self._queue_name(method.queue)
        routing_key = method.routing_key
        if not method.queue and not routing_key:
            routing_key = qname
        self._check(WRITE, "queue", qname)
        if not method.exchange:
            raise AccessRefused("operation not permitted on the default exchange")
        self._check(READ, "exchange", method.exchange)
        # Before the queue's existence, as RabbitMQ (a missing exchange: 404 below).
        self._check_topic(self.vhost.exchanges.get(method.exchange), routing_key, READ)
        # RabbitMQ's order: the exchange, then the queue must exist; then the binding
        # must be valid; only then is the queue's exclusivity checked.
        ex = self.vhost.get_exchange(method.exchange)
        if qname not in self.vhost.queues:
            raise NotFound(f"no queue '{qname}' in vhost '{self.vhost.name}'")
        ex.validate_binding(routing_key, method.arguments)
        q = self.vhost.get_queue(qname, self.connection)
        self.vhost.bind(ex, q, routing_key, method.arguments)
        if not method.nowait:
            self._reply(spec.QueueBindOk())

    def _queue_unbind(self, method: spec.QueueUnbind) -> None:
        assert self.vhost is not None
        qname = self._queue_name(method.queue)
        routing_key = method.routing_key
        if not method.queue and not routing_key:
            routing_key = qname
        self._check(WRITE, "queue", qname)
        self._check(READ, "exchange", method.exchange)
        # Like RabbitMQ, unbinding a missing queue or exchange succeeds (aio-pika's
        # RPC.close unbinds its auto-deleted reply queue and relies on this).
        ex = self.vhost.exchanges.get(method.exchange)
        if ex is self.vhost.default_exchange:
            raise AccessRefused("operation not permitted on the default exchange")
        self._check_topic(ex, routing_key, READ)
        q = self.vhost.queues.get(qname)
        # An exclusive queue of another connection is refused (405) only when the
        # binding exists: removing a missing one succeeds, as in RabbitMQ.
        if (
            q is not None
            and ex is not None
            and ex.find_binding(q, routing_key, method.arguments) is not None
        ):
            self.vhost.get_queue(qname, self.connection)
            self.vhost.unbind(ex, q, routing_key, method.arguments)
        self._reply(spec.QueueUnbindOk())

    def _queue_purge(self, method: spec.QueuePurge) -> None:
        q = self._queue(method.queue)
        self._check(READ, "queue", q.name)
        count = q.purge()
        if not method.nowait:
            self._reply(spec.QueuePurgeOk(message_count=count))

    def _queue_delete(self, method: spec.QueueDelete) -> None:
        assert self.vhost is not None
        name = self._queue_name(method.queue)
        self._check(CONFIGURE, "queue", name)
        count = self.vhost.delete_queue(
            name, if_unused=method.if_unused, if_empty=method.if_empty, owner=self.connection
        )
        if not method.nowait:
            self._reply(spec.QueueDeleteOk(message_count=count))

    # -- basic class: consumers -------------------------------------------------------
    def _basic_qos(self, method: spec.BasicQos) -> None:
        if method.prefetch_size:  # RabbitMQ refuses byte limits outright
            raise NotImplemented_(f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.global_prefetch_count = method.prefetch_count
            self.global_prefetch_size = method.prefetch_size
        else:
            self.consumer_prefetch_count = method.prefetch_count
            self.consumer_prefetch_size = method.prefetch_size
            # As in RabbitMQ, a per-consumer qos lifts the channel's global limit.
            self.global_prefetch_count = self.global_prefetch_size = 0
        self._reply(spec.BasicQosOk())
        self.resume_delivery()

    def _basic_consume(self, method: spec.BasicConsume) -> None:
        assert self.vhost is not None
        tag = method.consumer_tag or _random_tag("amq.ctag-")
        if tag in self.consumers or tag == self.reply_consumer_tag:
            raise NotAllowed(f"attempt to reuse consumer tag '{tag}'")
        if method.queue == REPLY_TO:
            self._consume_reply_to(method, tag)
            return
        if self._max_consumers and len(self.consumers) >= self._max_consumers:
            # RabbitMQ's consumer_max_per_channel (rabbit_channel), a connection error.
            raise NotAllowed(f"reached maximum ({self._max_consumers}) of consumers per channel")
        q = self._queue(method.queue)
        self._check(READ, "queue", q.name)
        args = method.arguments or {}
        priority = args.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise PreconditionFailed(
                f"invalid arg 'x-priority' for queue '{q.name}' in vhost '{self.vhost.name}': "
                f"expected an integer, got {priority!r}"
            )
        consumer = AMQPConsumer(self, tag, q, method.no_ack, method.exclusive, priority, args)
        q.add_consumer(consumer)
        self.consumers[tag] = consumer
        if not method.nowait:
            self._reply(spec.BasicConsumeOk(consumer_tag=tag))

    def _consume_reply_to(self, method: spec.BasicConsume, tag: str) -> None:
        assert self.vhost is not None
        if not method.no_ack:
            raise PreconditionFailed("reply consumer cannot acknowledge")
        if self.reply_token is not None:
            raise PreconditionFailed("reply consumer already set")
        self.reply_token = _random_tag("")
        self.reply_consumer_tag = tag
        self.vhost.reply_targets[self.reply_token] = self
        if not method.nowait:
            self._reply(spec.BasicConsumeOk(consumer_tag=tag))

    def deliver_reply(self, msg: Message) -> bool:
        """Direct reply-to: the reply goes straight to this channel's reply consumer."""
        if self.reply_consumer_tag is None or self.closing:
            return False
        deliver = spec.BasicDeliver(
            consumer_tag=self.reply_consumer_tag,
            # RabbitMQ stamps replies with the next tag without using it up.
            delivery_tag=self._delivery_tag + 1,
            redelivered=False,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
        )
        self._send_message(deliver, msg)
        return True

    def _send_message(self, method: spec.Method, msg: Message) -> None:
        """A content-carrying method (get-ok, return, reply) followed by its message."""
        conn = self.connection
        conn.send_many(
            message_frames(self.id, method.encode(), msg.properties, msg.body, conn.frame_max)
        )

    def _basic_cancel(self, method: spec.BasicCancel) -> None:
        tag = method.consumer_tag
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
        elif tag == self.reply_consumer_tag and self.reply_token is not None:
            assert self.vhost is not None
            self.vhost.reply_targets.pop(self.reply_token, None)
            self.reply_token = self.reply_consumer_tag = None
        if not method.nowait:
            self._reply(spec.BasicCancelOk(consumer_tag=tag))

    def consumer_cancelled_by_server(self, consumer: AMQPConsumer) -> None:
        if self.consumers.get(consumer.tag) is not consumer:
            return  # cancelled by the client meanwhile, or the tag was reused
        del self.consumers[consumer.tag]
        if self.closing or self.closed:
            return
        if self.connection.capabilities.get("consumer_cancel_notify"):
            self._reply(spec.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    # -- basic class: publishing --------------------------------------------------------
    def _checked_exchange(self, method: spec.BasicPublish) -> Exchange:
        """The exchange a publish goes to, once RabbitMQ's checks passed: immediate,
        write permission, internal, topic permission."""
        if method.immediate:
            raise NotImplemented_("immediate=true")
        ex = self._exchange(method.exchange)
        self._check(WRITE, "exchange", ex.name)
        if ex.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange '{ex.name}' in vhost '{ex.vhost_name}'"
            )
        topic_perms = self.user.topic_permissions
        if topic_perms:  # empty for most users: this truth test is all they pay
            # UserStore.check_topic inlined: this runs for every message.
            table = topic_perms.get(self._vhost_name)
            perm = None if table is None else table.get(ex.name)
            if (
                perm is not None
                and ex.type == "topic"
                and not perm.allows(WRITE, method.routing_key, self._topic_variables)
            ):
                raise topic_refused(self.user, self._vhost_name, ex.name, method.routing_key)
        return ex

    def _publish_message(self, method: spec.BasicPublish, props: bytes, body: bytes) -> None:
        ex = self._checked_exchange(method)
        plain = props in PLAIN_PROPERTIES
        if not plain:
            validate_publish_properties(props)
        conn = self.connection
        msg = Message(ex.name, method.routing_key, props, body, conn.now_ms or None)
        msg._ex_rk = self._publish_ex_rk
        conn.has_published = True
        if conn.blocked:
            conn.block_now()
        if not plain:
            msg = check_message(msg, self.connection.user, self.reply_token)
        self.stats.publish += 1
        if self.confirm:
            self.publish_seq += 1
        if self.tx:
            self._tx_publishes.append((ex, msg, method.mandatory))
            return
        self._route(ex, msg, method.mandatory)

    def _route(
        self,
        ex: Exchange,
        msg: Message,
        mandatory: bool,
        durable: list[MessageStore] | None = None,
        queues: list[Queue] | None = None,
    ) -> None:
        """Route one message; ``durable`` collects stores a tx.commit must sync.
        ``queues``: already routed (a run's `VHost.route_run`)."""
        assert self.vhost is not None
        confirm = self.confirm
        if confirm and durable is None:
            durable = []
        if queues is None:
            routed = self.vhost.publish(ex, msg, durable)
        else:
            routed = self.vhost.enqueue(ex, queues, msg, durable)
        if not routed:
            if mandatory:
                self.stats.return_unroutable += 1
                returned = spec.BasicReturn(
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=msg.exchange,
                    routing_key=msg.routing_key,
                )
                self._send_message(returned, msg)
            else:
                self.stats.drop_unroutable += 1
        if confirm:
            syncer = self.connection.broker.syncer
            if routed < 0:  # a queue refused it (x-overflow reject-publish)
                self._confirm(self.publish_seq, False)
            elif durable and syncer is not None and syncer.enabled:
                self._confirm_after_sync(self.publish_seq, durable, syncer)
            else:
                self._confirm(self.publish_seq, True)

    def _confirm_run(
        self, base: int, indexes: list[int] | None, n: int, durable: list[MessageStore]
    ) -> None:
        """Confirms for a run's first ``n`` messages (publish numbers as in
        _publish_uniform), taken at once: after ``durable`` is synced, when it
        holds anything."""
        syncer = self.connection.broker.syncer
        wait = bool(durable) and syncer is not None and syncer.enabled
        for i in range(n):
            seq = base + 1 + (indexes[i] if indexes is not None else i)
            if wait:
                assert syncer is not None
                self._confirm_after_sync(seq, durable, syncer)
            else:
                self._confirm(seq, True)

    def _confirm_after_sync(self, seq: int, stores: list[MessageStore], syncer: GroupSync) -> None:
        """Confirm once the stores are synced; one callback per channel per sync round."""
        self._unconfirmed[seq] = None
        round_id = syncer.next_round
        if self._sync_batch is None or self._sync_round != round_id:
            batch: list[int] = []
            self._sync_batch = batch
            self._sync_round = round_id
            syncer.after_sync(stores, lambda ok: self._confirm_batch(batch, ok))
        else:
            syncer.add(stores)
        self._sync_batch.append(seq)

    def _confirm_batch(self, seqs: list[int], ok: bool) -> None:
        if self._sync_batch is seqs:
            self._sync_batch = None
        for seq in seqs:
            self._confirm(seq, ok)

    # -- confirms -----------------------------------------------------------------------
    def _confirm_select(self, method: spec.ConfirmSelect) -> None:
        if self.tx:
            raise PreconditionFailed("cannot switch from tx to confirm mode")
        self.confirm = True
        if not method.nowait:
            self._reply(spec.ConfirmSelectOk())

    def _confirm(self, seq: int, ok: bool) -> None:
        if self.closed:
            return
        self._unconfirmed.pop(seq, None)
        if not self._confirms:
            self.connection.mark_dirty(self)
        self._confirms.append((seq, ok))
        if ok:
            self.stats.confirm += 1

    def flush_confirms(self) -> None:
        """Send the confirms gathered since the last write, acks coalesced.

        Acks below the oldest confirm still waiting for a sync become one ack with
        multiple=true (nothing unconfirmed lies below them); acks above it go out
        one by one, and nacks always individually, before the coalesced ack.
        """
        results, self._confirms = self._confirms, []
        if self.closing or self.closed:
            return
        unconfirmed = self._unconfirmed
        if self._unconfirmed_in_order:
            floor = next(iter(unconfirmed), None)
        else:
            floor = min(unconfirmed, default=None)
            if floor is None:
                self._unconfirmed_in_order = True
        out: list[bytes] = []
        below: list[int] = []
        for seq, ok in results:
            if not ok:
                out.append(
                    method_frame(
                        self.id, spec.BasicNack(delivery_tag=seq, multiple=False, requeue=False)
                    )
                )
            elif floor is None or seq < floor:
                below.append(seq)
            else:
                out.append(method_frame(self.id, spec.BasicAck(delivery_tag=seq, multiple=False)))
        if below:
            top = max(below)
            out.append(
                method_frame(self.id, spec.BasicAck(delivery_tag=top, multiple=len(below) > 1))
            )
        if out:
            self.connection.send_many(out)

    # -- basic class: pull, ack, reject -------------------------------------------------
    def _basic_get(self, method: spec.BasicGet) -> None:
        q = self._queue(method.queue)
        self._check(READ, "queue", q.name)
        item = q.get(method.no_ack)
        if item is None:
            self.stats.get_empty += 1
            q.stats.get_empty += 1
            self._reply(spec.BasicGetEmpty())
            return
        seq, msg, redelivered = item
        count_get(self.stats, q.stats, method.no_ack, redelivered)
        tag = self.next_delivery_tag()
        if not method.no_ack:
            self.track_unacked(tag, q, seq, msg, None)
        get_ok = spec.BasicGetOk(
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
            message_count=q.message_count,
        )
        self._send_message(get_ok, msg)

    def _take_unacked(
        self, tag: int, multiple: bool, credit: bool = True
    ) -> tuple[list[tuple[int, Unacked]], list[UnackedRun]]:
        taken, runs = self.unacked.take(tag, multiple)
        if credit:
            self._credit(taken, runs)
        return taken, runs

    def _credit(self, taken: list[tuple[int, Unacked]], runs: list[UnackedRun]) -> None:
        """Give the prefetch capacity these deliveries held back to their consumers."""
        for _, entry in taken:
            size = entry[4]
            self.unacked_bytes -= size
            consumer = entry[3]
            if consumer is not None:
                self.consumer_unacked -= 1
                consumer.unacked_count -= 1
                consumer.unacked_bytes -= size
        for run in runs:
            n = len(run)
            size = sum(run.sizes)
            self.unacked_bytes -= size
            consumer = run.consumer
            if consumer is not None:
                self.consumer_unacked -= n
                consumer.unacked_count -= n
                consumer.unacked_bytes -= size

    def _settle(
        self, taken: list[tuple[int, Unacked]], runs: list[UnackedRun], requeue: bool | None
    ) -> None:
        """Ack (requeue None) or reject the taken deliveries, then refill consumers."""
        queues: dict[int, Queue] = {}
        if requeue is None:
            # One store call and one flush registration per queue (or run), not
            # per message.
            seqs: dict[int, list[int]] = {}
            for _, (queue, seq, _msg, _consumer, _size) in taken:
                key = id(queue)
                if key in queues:
                    seqs[key].append(seq)
                else:
                    queues[key] = queue
                    seqs[key] = [seq]
            acked = len(taken)
            for key, queue in queues.items():
                queue.stats.ack += len(seqs[key])
                queue.ack_many(seqs[key])
            for run in runs:
                queue = run.queue
                n = len(run)
                acked += n
                queue.stats.ack += n
                queue.ack_run(run.segment, run.offsets)
                queues[id(queue)] = queue
            self.stats.ack += acked
        else:
            if runs:
                taken = sorted(
                    [*taken, *(item for run in runs for item in run.entries())],
                    key=lambda item: item[0],
                )
            for _, (queue, seq, msg, _consumer, _size) in taken:
                queue.reject(seq, msg, requeue)
                queues[id(queue)] = queue
        if self.global_prefetch_count or self.global_prefetch_size:
            self.resume_delivery()
        else:
            for q in queues.values():
                q.schedule_delivery()

    def _ack_like(self, tag: int, multiple: bool, requeue: bool | None) -> None:
        if requeue is not None:
            self._check_reject(tag, multiple)
        # In a transaction the deliveries keep their prefetch slots until commit,
        # as in RabbitMQ.
        taken, runs = self._take_unacked(tag, multiple, credit=not self.tx)
        if self.tx:
            kind = "ack" if requeue is None else "reject"
            for run in runs:
                taken.extend(run.entries())
            taken.sort(key=lambda item: item[0])
            for t, entry in taken:
                self._tx_acks.append((t, entry, kind, bool(requeue)))
            return
        self._settle(taken, runs, requeue)

    def _check_reject(self, tag: int, multiple: bool) -> None:
        """Let the queues of the deliveries a nack or reject names refuse it (streams
        do, with 540) before anything is settled."""
        unacked = self.unacked
        if multiple:
            queues = [e[0] for t, e in unacked.singles.items() if tag == 0 or t <= tag]
            queues += [r.queue for r in unacked.runs if tag == 0 or r.first <= tag]
        else:
            entry = unacked.singles.get(tag)
            if entry is not None:
                queues = [entry[0]]
            else:
                queues = [r.queue for r in unacked.runs if r.first <= tag <= r.last]
        checked: set[int] = set()
        for queue in queues:
            if id(queue) not in checked:
                checked.add(id(queue))
                queue.check_reject()

    def _basic_ack(self, method: spec.BasicAck) -> None:
        self._ack_like(method.delivery_tag, method.multiple, None)

    def _basic_nack(self, method: spec.BasicNack) -> None:
        self._ack_like(method.delivery_tag, method.multiple, method.requeue)

    def _basic_reject(self, method: spec.BasicReject) -> None:
        self._ack_like(method.delivery_tag, False, method.requeue)

    def _basic_recover(self, method: spec.BasicRecover) -> None:
        self._recover(method.requeue)
        self._reply(spec.BasicRecoverOk())

    def _basic_recover_async(self, method: spec.BasicRecoverAsync) -> None:
        self._recover(method.requeue)

    def _recover(self, requeue: bool) -> None:
        # Like RabbitMQ: requeue=false is refused (540), requeue=true requeues every
        # unacked message, so it may reach another consumer.
        if not requeue:
            raise NotImplemented_("requeue=false")
        taken, runs = self._take_unacked(0, True)
        self._settle(taken, runs, True)

    # -- tx class -----------------------------------------------------------------------
    def _tx_select(self, method: spec.TxSelect) -> None:
        if self.confirm:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        self.tx = True
        self._reply(spec.TxSelectOk())

    def _tx_commit(self, method: spec.TxCommit) -> None:
        if not self.tx:
            raise PreconditionFailed("channel is not transactional")
        acks, self._tx_acks = self._tx_acks, []
        publishes, self._tx_publishes = self._tx_publishes, []
        durable: list[MessageStore] = []
        for ex, msg, mandatory in publishes:
            self._route(ex, msg, mandatory, durable)
        self._credit([(tag, entry) for tag, entry, _kind, _requeue in acks], [])
        for tag, entry, kind, requeue in acks:
            self._settle([(tag, entry)], [], None if kind == "ack" else requeue)
        syncer = self.connection.broker.syncer
        if durable and syncer is not None and syncer.enabled:
            # commit-ok promises the messages are on disk, as a confirm does.
            syncer.after_sync(durable, self._commit_synced)
        else:
            self._reply(spec.TxCommitOk())

    def _commit_synced(self, ok: bool) -> None:
        if self.closed or self.closing:
            return
        if ok:
            self._reply(spec.TxCommitOk())
        else:
            self.channel_error(
                InternalError("could not sync the committed messages to disk"), 90, 20
            )

    def _tx_rollback(self, method: spec.TxRollback) -> None:
        if not self.tx:
            raise PreconditionFailed("channel is not transactional")
        self._tx_publishes.clear()
        acks, self._tx_acks = self._tx_acks, []
        if acks:
            # Rolled-back acks make those deliveries unacked again, in tag order.
            # Their prefetch slots were never given back (see _ack_like).
            self.unacked.restore([(tag, entry) for tag, entry, _kind, _requeue in acks])
        self._reply(spec.TxRollbackOk())


_HANDLERS: dict[type[spec.Method], Callable[[Channel, Any], None]] = {
    spec.ChannelOpen: Channel._channel_open,
    spec.ChannelClose: Channel._channel_close,
    spec.ChannelFlow: Channel._channel_flow,
    spec.ChannelFlowOk: Channel._channel_flow_ok,
    spec.AccessRequest: Channel._access_request,
    spec.ExchangeDeclare: Channel._exchange_declare,
    spec.ExchangeDelete: Channel._exchange_delete,
    spec.ExchangeBind: Channel._exchange_bind,
    spec.ExchangeUnbind: Channel._exchange_unbind,
    spec.QueueDeclare: Channel._queue_declare,
    spec.QueueBind: Channel._queue_bind,
    spec.QueueUnbind: Channel._queue_unbind,
    spec.QueuePurge: Channel._queue_purge,
    spec.QueueDelete: Channel._queue_delete,
    spec.BasicQos: Channel._basic_qos,
    spec.BasicConsume: Channel._basic_consume,
    spec.BasicCancel: Channel._basic_cancel,
    spec.BasicGet: Channel._basic_get,
    spec.BasicAck: Channel._basic_ack,
    spec.BasicNack: Channel._basic_nack,
    spec.BasicReject: Channel._basic_reject,
    spec.BasicRecover: Channel._basic_recover,
    spec.BasicRecoverAsync: Channel._basic_recover_async,
    spec.ConfirmSelect: Channel._confirm_select,
    spec.TxSelect: Channel._tx_select,
    spec.TxCommit: Channel._tx_commit,
    spec.TxRollback: Channel._tx_rollback,
}
