"""One AMQP channel: method handlers that turn AMQP commands into core calls.

A channel is a delivery stream of its connection's client session
(core/deliveries.py's Deliveries: its consumers, delivery tags, unacked
deliveries, how they are settled, what its close gives back); the channel
says what that is in AMQP (basic.consume, get, qos, the prefetch a new
consumer gets) and its Settlement (amqp/settlement.py) what acks, nacks,
rejects and recover are (transactions, runs of acks read at once).
Publishes are the channel's publishing part (amqp/publishing.py's
Publishing, ``channel.publishing``), confirms its PublisherConfirms
(amqp/confirms.py), and the exchange and queue class methods are
amqp/declarations.py's.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.amqp import declarations, spec
from warren.amqp.ack_timeout import AckDeadlines
from warren.amqp.confirms import PublisherConfirms
from warren.amqp.consumer import AMQPConsumer
from warren.amqp.frames import message_frames
from warren.amqp.management import channel_event
from warren.amqp.publishing import EXPECTED_BODY, EXPECTED_HEADER, Publishing
from warren.amqp.settlement import Settlement
from warren.core.channel_counts import ChannelCounts
from warren.core.commit import NOT_STORED, NotStored
from warren.core.errors import (
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
from warren.core.exchange import Exchange
from warren.core.message import Message
from warren.core.names import shown
from warren.core.queue import Queue
from warren.core.stats import MessageStats, count_get
from warren.core.users import READ, User, UserStore
from warren.core.vhost_routing import REJECTED_BY_QUEUE, REPLY_TO

_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40

if TYPE_CHECKING:
    from warren.amqp.connection import AMQPConnection

log = logging.getLogger("warren.amqp")


def _random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class Channel:
    """One channel: its parts are a delivery stream of the client session
    (``deliveries``), its Settlement, its Publishing and its PublisherConfirms."""

    def __init__(self, connection: AMQPConnection, channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.vhost = connection.vhost
        assert self.vhost is not None
        user = connection.user
        assert user is not None
        self.user: User = user
        self._vhost_name = self.vhost.name
        #: RabbitMQ's topic permission variables for AMQP 0-9-1 (client_id is MQTT's).
        self.topic_variables = {"username": user.name, "vhost": self.vhost.name}
        self.vhost.channels_opened += 1
        # Counted per user for max-channels; given back once, in release().
        self._users: UserStore = connection.broker.users
        self._users.count_channel(user.name, 1)
        self._max_consumers = connection.config.max_consumers_per_channel
        self.closing = False
        self.flow_active = True
        #: Message counters (management API, metrics); folded into the vhost's at close.
        self.stats = MessageStats()
        #: Counts by exchange and queue (core/channel_counts.py; the metrics').
        self.counts = ChannelCounts()
        #: The channel's delivery stream in its client session: consumers,
        #: delivery tags, unacked deliveries, their settlement (core/deliveries.py).
        self.deliveries = connection.client_session.deliveries(
            self.stats, self.counts, self.vhost.base_stats
        )
        #: Its consumers by tag (the delivery stream's).
        self.consumers = self.deliveries.consumers
        # basic.qos(global=false): the prefetch of consumers started from now on
        # (the channel's global qos is the delivery stream's own prefetch).
        self.consumer_prefetch_count = 0
        self.consumer_prefetch_size = 0
        self.confirms = PublisherConfirms(self)
        self.closed = False
        self._ack_deadlines: AckDeadlines | None = None
        self.tx = False
        #: How acks, nacks, rejects, recover and tx.commit settle deliveries.
        self.settlement = Settlement(self, self.deliveries)
        self.last_queue = ""
        self.reply_token: str | None = None
        self.reply_consumer_tag: str | None = None
        #: basic.publish and its content, runs, routing, tx's publishes.
        self.publishing = Publishing(self)
        if connection.broker.events:
            connection.broker.events.emit("channel.created", channel_event(connection, self))

    def __repr__(self) -> str:
        return f"<Channel {self.id} of {self.connection.name}>"

    # -- frames -----------------------------------------------------------------------
    def on_method_frame(self, payload: bytes) -> None:
        conn = self.connection
        publishing = self.publishing
        if publishing.current is not None:
            # RabbitMQ's texts; the close names basic.publish, whose content was cut short.
            text = EXPECTED_HEADER if publishing.props is None else EXPECTED_BODY
            conn.connection_error(UnexpectedFrame(text), 60, 40)
            return
        if payload[:4] == _PUBLISH_IDS and not self.closing:
            # The hot path: basic.publish skips the generic dispatch. A publisher
            # mostly repeats one exchange and routing key: the last payload's
            # decoded method is reused (it is only ever read).
            publishing.start(payload)
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
        durable_change = type(method) in _DEFINITION_METHODS
        mark = conn.client_session.change_mark() if durable_change else (0, 0)
        output_mark = len(conn.pending)
        try:
            handler(self, method)
        except BrokerError as exc:
            if exc.hard:
                conn.connection_error(exc, method.CLASS_ID, method.METHOD_ID)
            else:
                self.channel_error(exc, method.CLASS_ID, method.METHOD_ID)
        if durable_change:
            # A durable change: its reply waits until it is on disk (and, in a
            # cluster, held by the followers).
            conn.hold_replies(mark, output_mark)

    # -- errors and closing -----------------------------------------------------------
    def channel_error(self, exc: BrokerError, class_id: int, method_id: int) -> None:
        log.warning(
            "%s channel %s: closing channel: %s %s",
            self.connection.name,
            self.id,
            exc.code,
            shown(exc.reply_text),  # a name a client sent may hold bytes that are not UTF-8
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
        self.publishing.abandon()
        self.release()

    def check_consumer_timeout(self, now: int, default: int) -> None:
        """Close the channel (406, RabbitMQ's text) when a delivery has waited for
        its acknowledgement longer than the consumer timeout."""
        if self.closing or self.closed:
            return
        unacked = self.deliveries.unsettled
        if not unacked:
            self._ack_deadlines = None
            return
        timeouts = [c.queue.consumer_timeout for c in self.consumers.values()]
        oldest_queue = next(unacked.by_age())[1]
        if oldest_queue is not None:
            timeouts.append(oldest_queue.consumer_timeout)
        floor = min([t for t in timeouts if t] + ([default] if default else []), default=0)
        if not floor:
            return
        if self._ack_deadlines is None:
            self._ack_deadlines = AckDeadlines()
        timeout = self._ack_deadlines.overdue(
            unacked.by_age(), self.deliveries.last_tag, now, default, floor
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
        """Give back everything the channel holds: its delivery stream closes
        (consumers cancelled, unacked messages and a transaction's held acks
        requeued, its counters to the vhost's), the reply-to consumer goes."""
        vhost = self.vhost
        first = not self.closed  # once, however often released
        if first:
            self._users.count_channel(self.user.name, -1)
            if vhost is not None:
                if self.publishing.confirm:  # received expecting confirmations (metrics)
                    vhost.received_confirm += self.stats.publish
                vhost.channels_closed += 1
        self.closed = True
        if self.reply_token is not None and vhost is not None:
            vhost.reply_targets.pop(self.reply_token, None)
            self.reply_token = None
        self.deliveries.close(self.settlement.held())
        if first:
            events = self.connection.broker.events
            if events:  # after its consumers' consumer.deleted, as RabbitMQ
                events.emit("channel.closed", channel_event(self.connection, self))
            # Its counters went to the vhost's: a channel still listed until its
            # close-ok shows none (the listings and metrics would count them twice).
            self.stats = MessageStats()

    # -- helpers ----------------------------------------------------------------------
    def check(self, kind: str, resource_type: str, name: str) -> None:
        """403 unless the user may (the client session's check, cached)."""
        self.connection.client_session.check(kind, resource_type, name)

    def check_topic(self, ex: Exchange | None, key: str, kind: str) -> None:
        """RabbitMQ's topic permission check (binds): topic exchanges only."""
        if ex is not None and ex.type == "topic" and self.user.topic_permissions:
            UserStore.check_topic(
                self.user, self._vhost_name, ex.name, key, kind, self.topic_variables
            )

    def queue_name(self, name: str) -> str:
        if name:
            return name
        if not self.last_queue:
            raise NotFound("no previously declared queue")
        return self.last_queue

    def get_queue(self, name: str) -> Queue:
        assert self.vhost is not None
        return self.vhost.get_queue(self.queue_name(name), self.connection)

    def reply(self, method: spec.Method) -> None:
        self.connection.send_method(self.id, method)

    def resume_delivery(self) -> None:
        self.deliveries.resume()

    # -- channel class ----------------------------------------------------------------
    def _channel_open(self, method: spec.ChannelOpen) -> None:
        raise ChannelError("second 'channel.open' seen")

    def _channel_close(self, method: spec.ChannelClose) -> None:
        self.release()
        self.connection.channels.pop(self.id, None)
        self.reply(spec.ChannelCloseOk())

    def _channel_flow(self, method: spec.ChannelFlow) -> None:
        self.flow_active = method.active
        self.reply(spec.ChannelFlowOk(active=method.active))
        if method.active:
            self.resume_delivery()

    def _channel_flow_ok(self, method: spec.ChannelFlowOk) -> None:
        pass

    def _access_request(self, method: spec.AccessRequest) -> None:
        # Deprecated in 0-9-1 but still sent by old clients; RabbitMQ grants ticket 1.
        self.reply(spec.AccessRequestOk(ticket=1))

    # -- basic class: consumers -------------------------------------------------------
    def _basic_qos(self, method: spec.BasicQos) -> None:
        if method.prefetch_size:  # RabbitMQ refuses byte limits outright
            raise NotImplemented_(f"prefetch_size!=0 ({method.prefetch_size})")
        glob = method.global_
        if glob:
            glob = self._global_qos_permitted()
        deliveries = self.deliveries
        if glob:
            deliveries.prefetch_count = method.prefetch_count
            deliveries.prefetch_size = method.prefetch_size
        else:
            self.consumer_prefetch_count = method.prefetch_count
            self.consumer_prefetch_size = method.prefetch_size
            # As in RabbitMQ, a per-consumer qos lifts the channel's global limit.
            deliveries.prefetch_count = deliveries.prefetch_size = 0
        self.reply(spec.BasicQosOk())
        self.resume_delivery()

    def _global_qos_permitted(self) -> bool:
        """RabbitMQ 4.x's deprecated feature global_qos: permitted, global=true keeps
        its meaning; not, it is taken as per-consumer (rabbit_channel's answer).
        Either way its use is logged, once per connection."""
        conn = self.connection
        permitted = conn.config.permit_global_qos
        if not conn.global_qos_logged:
            conn.global_qos_logged = True
            if permitted:
                log.warning(
                    "%s: channel %d uses global QoS (basic.qos global=true), a deprecated "
                    "feature (RabbitMQ 4.x's global_qos): use per-consumer prefetch; "
                    "[deprecated_features] permit.global_qos = false tries Warren without it",
                    conn.name,
                    self.id,
                )
            else:
                log.error(
                    "%s: channel %d asked for global QoS (basic.qos global=true), a "
                    "deprecated feature not permitted here ([deprecated_features] "
                    "permit.global_qos = false): its prefetch applies per consumer",
                    conn.name,
                    self.id,
                )
        return permitted

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
        limits = self.connection.broker.rate_limits
        if limits.max_subscriptions and not limits.allow_subscription(
            sum(len(ch.consumers) for ch in self.connection.channels.values())
        ):
            raise NotAllowed(
                f"reached maximum ({limits.max_subscriptions}) of consumers per connection"
            )
        q = self.get_queue(method.queue)
        self.check(READ, "queue", q.name)
        if self.deliveries.prefetch_count and q.queue_type == "quorum":  # as RabbitMQ 3.10-4.x
            raise NotImplemented_(
                f"queue '{q.name}' in vhost '{self.vhost.name}' does not support global qos"
            )
        args = method.arguments or {}
        priority = args.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise PreconditionFailed(
                f"invalid arg 'x-priority' for queue '{q.name}' in vhost '{self.vhost.name}': "
                f"expected an integer, got {priority!r}"
            )
        consumer = AMQPConsumer(self, tag, q, method.no_ack, method.exclusive, priority, args)
        self.deliveries.consume(tag, consumer)
        if not method.nowait:
            self.reply(spec.BasicConsumeOk(consumer_tag=tag))

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
            self.reply(spec.BasicConsumeOk(consumer_tag=tag))

    def deliver_reply(self, msg: Message) -> bool:
        """Direct reply-to: the reply goes straight to this channel's reply consumer."""
        if self.reply_consumer_tag is None or self.closing:
            return False
        deliver = spec.BasicDeliver(
            consumer_tag=self.reply_consumer_tag,
            # RabbitMQ stamps replies with the next tag without using it up.
            delivery_tag=self.deliveries.last_tag + 1,
            redelivered=False,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
        )
        self.send_message(deliver, msg)
        return True

    def send_message(self, method: spec.Method, msg: Message) -> None:
        """A content-carrying method (get-ok, return, reply) followed by its message."""
        conn = self.connection
        conn.send_many(
            message_frames(self.id, method.encode(), msg.properties, msg.body, conn.frame_max)
        )

    def _basic_cancel(self, method: spec.BasicCancel) -> None:
        tag = method.consumer_tag
        if (
            self.deliveries.cancel(tag) is None
            and tag == self.reply_consumer_tag
            and self.reply_token is not None
        ):
            assert self.vhost is not None
            self.vhost.reply_targets.pop(self.reply_token, None)
            self.reply_token = self.reply_consumer_tag = None
        if not method.nowait:
            self.reply(spec.BasicCancelOk(consumer_tag=tag))

    def consumer_cancelled_by_server(self, consumer: AMQPConsumer) -> None:
        if not self.deliveries.cancelled(consumer.tag, consumer):
            return  # cancelled by the client meanwhile, or the tag was reused
        if self.closing or self.closed:
            return
        if self.connection.capabilities.get("consumer_cancel_notify"):
            self.reply(spec.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    # -- basic class: pull, ack, reject -------------------------------------------------
    def _basic_get(self, method: spec.BasicGet) -> None:
        q = self.get_queue(method.queue)
        self.check(READ, "queue", q.name)
        item = self.deliveries.pull(q, method.no_ack)
        counts = self.counts.queue(q)
        if item is None:
            self.stats.get_empty += 1
            q.stats.get_empty += 1
            counts.get_empty += 1
            self.reply(spec.BasicGetEmpty())
            return
        tag, msg, redelivered = item
        count_get(self.stats, q.stats, method.no_ack, redelivered)
        if method.no_ack:
            counts.get_no_ack += 1
        else:
            counts.get += 1
        if redelivered:
            counts.redeliver += 1
        get_ok = spec.BasicGetOk(
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
            message_count=q.message_count,
        )
        self.send_message(get_ok, msg)

    def _basic_ack(self, method: spec.BasicAck) -> None:
        self.settlement.ack_like(method.delivery_tag, method.multiple, None)

    def takes_ack_run(self) -> bool:
        """Whether a run of single acks (amqp/ack_scan.py) may be settled at once
        here: not in a transaction (acks wait for the commit), nothing half
        received, not closing."""
        return not (self.closing or self.tx or self.publishing.current is not None)

    def _basic_nack(self, method: spec.BasicNack) -> None:
        self.settlement.ack_like(method.delivery_tag, method.multiple, method.requeue)

    def _basic_reject(self, method: spec.BasicReject) -> None:
        self.settlement.ack_like(method.delivery_tag, False, method.requeue)

    def _basic_recover(self, method: spec.BasicRecover) -> None:
        self._recover(method.requeue)
        self.reply(spec.BasicRecoverOk())

    def _basic_recover_async(self, method: spec.BasicRecoverAsync) -> None:
        self._recover(method.requeue)

    def _recover(self, requeue: bool) -> None:
        # Like RabbitMQ: requeue=false is refused (540), requeue=true requeues every
        # unacked message, so it may reach another consumer.
        if not requeue:
            raise NotImplemented_("requeue=false")
        self.deliveries.recover()

    # -- confirm class ------------------------------------------------------------------
    def _confirm_select(self, method: spec.ConfirmSelect) -> None:
        if self.tx:
            raise PreconditionFailed("cannot switch from tx to confirm mode")
        self.publishing.confirm = True
        if not method.nowait:
            self.reply(spec.ConfirmSelectOk())

    # -- tx class -----------------------------------------------------------------------
    def _tx_select(self, method: spec.TxSelect) -> None:
        if self.publishing.confirm:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        self.tx = True
        self.reply(spec.TxSelectOk())

    def _tx_commit(self, method: spec.TxCommit) -> None:
        if not self.tx:
            raise PreconditionFailed("channel is not transactional")
        settlement = self.settlement
        acks, settlement.tx_acks = settlement.tx_acks, []
        publishing = self.publishing
        publishes, publishing.tx_publishes = publishing.tx_publishes, []
        if not publishes:
            settlement.commit(acks)
            self.reply(spec.TxCommitOk())
            return
        # All or nothing (core/commit.py): the messages are appended with their
        # deliveries held back and written out now; a store that could not write
        # its part (a full disk) fails the whole commit, its messages taken back
        # out of every queue and its acks not applied.
        assert self.vhost is not None
        conn = self.connection
        commit = conn.client_session.commit(self.vhost, f"{conn.name} channel {self.id}: tx.commit")
        rejected = False
        for ex, msg, mandatory in publishes:
            if publishing.route(ex, msg, mandatory, None, None, commit) == REJECTED_BY_QUEUE:
                rejected = True
        if not commit.write_out():
            settlement.tx_acks = acks  # given back as unacked by the channel's close
            self.channel_error(
                NotStored(
                    f"tx.commit failed: {NOT_STORED}; nothing of the transaction was committed"
                ),
                90,
                20,
            )
            return
        settlement.commit(acks)
        # commit-ok promises the messages are on disk (sync = false: written
        # out), as a confirm does. A message a queue refused (x-overflow
        # reject-publish) makes it a partial commit: as RabbitMQ, what the other
        # queues took stays and the channel is closed with 406.
        commit.after_sync(self._commit_partial if rejected else self._commit_stored)

    def _commit_stored(self, ok: bool) -> None:
        if self.closed or self.closing:
            return
        if ok:
            self.reply(spec.TxCommitOk())
        else:
            self.channel_error(
                NotStored(f"tx.commit failed: {NOT_STORED}; its messages were taken back"), 90, 20
            )

    def _commit_partial(self, ok: bool) -> None:
        if not ok:
            self._commit_stored(ok)
        elif not (self.closed or self.closing):
            self.channel_error(PreconditionFailed("partial tx completion"), 90, 20)

    def _tx_rollback(self, method: spec.TxRollback) -> None:
        if not self.tx:
            raise PreconditionFailed("channel is not transactional")
        self.publishing.tx_publishes.clear()
        self.settlement.rollback()
        self.reply(spec.TxRollbackOk())


#: Methods that change definitions: their replies wait until the change is on
#: disk and, in a cluster, held by the in-sync followers (store/sync.py,
#: GroupSync.after_changes).
_DEFINITION_METHODS = frozenset(
    {
        spec.ExchangeDeclare,
        spec.ExchangeDelete,
        spec.ExchangeBind,
        spec.ExchangeUnbind,
        spec.QueueDeclare,
        spec.QueueBind,
        spec.QueueUnbind,
        spec.QueuePurge,
        spec.QueueDelete,
    }
)

_HANDLERS: dict[type[spec.Method], Callable[[Channel, Any], None]] = {
    spec.ChannelOpen: Channel._channel_open,
    spec.ChannelClose: Channel._channel_close,
    spec.ChannelFlow: Channel._channel_flow,
    spec.ChannelFlowOk: Channel._channel_flow_ok,
    spec.AccessRequest: Channel._access_request,
    spec.ExchangeDeclare: declarations.exchange_declare,
    spec.ExchangeDelete: declarations.exchange_delete,
    spec.ExchangeBind: declarations.exchange_bind,
    spec.ExchangeUnbind: declarations.exchange_unbind,
    spec.QueueDeclare: declarations.queue_declare,
    spec.QueueBind: declarations.queue_bind,
    spec.QueueUnbind: declarations.queue_unbind,
    spec.QueuePurge: declarations.queue_purge,
    spec.QueueDelete: declarations.queue_delete,
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
