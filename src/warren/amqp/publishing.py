"""The publishing part of an AMQP channel (``channel.publishing``).

A publish arrives as basic.publish, a content header and body frames, assembled
here, or as a run of whole messages a socket read holds (amqp/publish_run.py),
taken at once. Either way RabbitMQ's checks run (immediate, write and topic
permissions, internal, the property checks of amqp/publish_checks.py, which a
run's simple properties skip) and the message is routed, held for tx.commit or
numbered for a confirm (amqp/confirms.py). The frame loop hands content frames
and runs straight to this part; the channel hands it basic.publish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.amqp.frames import split_header_payload
from warren.amqp.publish_checks import check_message, validate_publish_properties
from warren.amqp.publish_run import PLAIN_PROPERTIES, PublishRun
from warren.core.codec_errors import DecodeError
from warren.core.errors import (
    AccessRefused,
    BrokerError,
    FrameError,
    NotImplemented_,
    PreconditionFailed,
    UnexpectedFrame,
)
from warren.core.exchange import Exchange
from warren.core.message import Message, MessageRun
from warren.core.queue import Queue
from warren.core.store import MessageStore
from warren.core.users import WRITE, topic_refused

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.core.commit import Commit

# RabbitMQ's texts for frames out of a publish's method/header/body order.
EXPECTED_METHOD = "expected method frame, got non method frame instead"
EXPECTED_HEADER = "expected content header for class 60, got non content header frame instead"
EXPECTED_BODY = "expected content body, got non content body frame instead"


class Publishing:
    """One channel's publishes: content assembly, runs, checks, routing, the
    numbering for confirms and the publishes a transaction holds."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        # What does not change over the channel's life, held for the hot path.
        self.connection = channel.connection
        vhost = channel.vhost
        assert vhost is not None
        self.vhost = vhost
        self.user = channel.user
        self.stats = channel.stats
        self.counts = channel.counts
        self.confirms = channel.confirms
        self._vhost_name = vhost.name
        self._topic_variables = channel.topic_variables
        #: confirm.select was seen: publishes are numbered (publish_seq) and confirmed.
        self.confirm = False
        self.publish_seq = 0
        #: In a transaction: the publishes waiting for tx.commit.
        self.tx_publishes: list[tuple[Exchange, Message, bool]] = []
        #: The basic.publish whose content is being assembled (None: none).
        self.current: spec.BasicPublish | None = None
        #: Its content header's properties, once received.
        self.props: bytes | None = None
        self._last_publish: spec.BasicPublish | None = None
        self._last_publish_payload = b""
        self._publish_ex_rk = b""
        self._body_size = 0
        self._body: list[bytes] = []
        self._received = 0
        self._exchange_cache: dict[str, Exchange] = {}

    # -- frames -----------------------------------------------------------------------
    def start(self, payload: bytes) -> None:
        """basic.publish (its method frame's payload): its content follows.
        The payload already holds exchange and routing key as the two shortstrs
        every delivery of the message will carry."""
        self.current = self._publish_method(payload)
        self._publish_ex_rk = payload[6:-1]

    def abandon(self) -> None:
        """The channel closes: a publish half received is dropped."""
        self.current = self.props = None
        self._body = []

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
        return self.current is None and not self.channel.closing

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
                self.confirms.reordered()
        except BrokerError as exc:
            if exc.hard:
                self.connection.connection_error(exc, 60, 40)
            else:
                self.channel.channel_error(exc, 60, 40)

    def _publish_uniform(self, run: PublishRun, indexes: list[int] | None, base: int) -> None:
        """A run with one routing key; message ``i`` is the publish numbered
        ``base + 1 + (indexes[i] if indexes else i)`` for confirms."""
        method = self._publish_method(run.method)
        ex = self._checked_exchange(method)
        conn = self.connection
        conn.has_published = True
        if conn.blocked:
            conn.block_now()
        now = conn.now_ms or conn.broker.clock.now_ms()
        mrun = MessageRun(ex.name, method.routing_key, run.method[6:-1], run, now)
        mandatory = method.mandatory
        n = len(run)
        if self.channel.tx:
            for i in range(n):
                self.stats.publish += 1
                self.tx_publishes.append((ex, mrun.message(i), mandatory))
            return
        msg = mrun.message(0)
        queues = self.vhost.router.route_run(ex, msg)
        confirm = self.confirm
        counts = self.counts.exchange(ex)
        if confirm:
            self.confirms.marks.mark(base + 1, counts)
        start = 0
        taken: list[int] = []
        durable: list[MessageStore] = []
        lost: list[int] = []
        if queues:
            # Queues whose consumers take the run's first messages as they come
            # take them at once; the rest go message by message.
            taken = self.vhost.router.publish_run_to(queues, mrun, durable, lost)
            start = min(taken)
            if start:
                ex.stats.count_publishes(start, len(queues))
                self.stats.publish += start
                if confirm:
                    self.confirms.run(base, indexes, start, durable, lost)
        most = max(taken, default=0)
        gone = set(lost) if lost and start < most else None
        for i in range(start, n):
            if i:
                msg = mrun.message(i)
            self.stats.publish += 1
            if confirm:
                self.publish_seq = base + 1 + (indexes[i] if indexes is not None else i)
            if queues and i < most:  # some queues took this one with the run
                rest = [q for q, t in zip(queues, taken, strict=True) if t <= i]
                ex.stats.publish_out += len(taken) - len(rest)
                self.route(ex, msg, False, list(durable), rest, lost=gone is not None and i in gone)
            else:
                self.route(ex, msg, mandatory, None, queues)
        if queues is not None:  # else _route counted each message
            self.counts.published(counts, queues, n)
        if confirm and indexes is None:
            self.publish_seq = base + n

    def on_header_frame(self, payload: bytes) -> None:
        if self.channel.closing:
            return
        method = self.current
        if method is None:
            raise UnexpectedFrame(EXPECTED_METHOD)
        if self.props is not None:
            self.connection.connection_error(UnexpectedFrame(EXPECTED_BODY), 60, 40)
            return
        if payload[2:4] != b"\x00\x00":
            # RabbitMQ only takes a header whose weight is zero as a content header.
            self.connection.connection_error(UnexpectedFrame(EXPECTED_HEADER), 60, 40)
            return
        try:
            class_id, body_size, props = split_header_payload(payload)
        except DecodeError as exc:
            raise FrameError(
                f"malformed content header on channel {self.channel.id}: {exc}"
            ) from None
        if class_id != 60:
            text = f"expected content header for class 60, got one for class {class_id} instead"
            self.connection.connection_error(UnexpectedFrame(text), 60, 40)
            return
        max_size = self.connection.config.max_message_size
        if body_size > max_size:
            self.current = None
            self.channel.channel_error(
                PreconditionFailed(
                    f"message size {body_size} is larger than configured max size {max_size}"
                ),
                60,
                40,
            )
            return
        if body_size == 0:
            self.current = None
            self._handle_publish(method, props, b"")
            return
        self.props = props
        self._body_size = body_size
        self._received = 0

    def on_body_frame(self, payload: bytes) -> None:
        if self.channel.closing:
            return
        method = self.current
        if method is None:
            raise UnexpectedFrame(EXPECTED_METHOD)
        if self.props is None:
            self.connection.connection_error(UnexpectedFrame(EXPECTED_HEADER), 60, 40)
            return
        received = self._received + len(payload)
        if received > self._body_size:
            # RabbitMQ notices only when the next frame is not more body, and then
            # says it expected more body; a client sees the same close either way.
            self.connection.connection_error(UnexpectedFrame(EXPECTED_BODY), 60, 40)
            return
        if received == self._body_size:
            if self._body:
                self._body.append(payload)
                body = b"".join(self._body)
                self._body = []
            else:
                body = payload
            props = self.props
            self.current = self.props = None
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
                self.channel.channel_error(exc, 60, 40)

    # -- checks and routing -------------------------------------------------------------
    def _checked_exchange(self, method: spec.BasicPublish) -> Exchange:
        """The exchange a publish goes to, once RabbitMQ's checks passed: immediate,
        write permission, internal, topic permission."""
        if method.immediate:
            raise NotImplemented_("immediate=true")
        ex = self._exchange(method.exchange)
        self.connection.client_session.check(WRITE, "exchange", ex.name)
        if ex.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange '{ex.name}' in vhost '{ex.vhost_name}'"
            )
        topic_perms = self.user.topic_permissions
        if topic_perms and ex.type == "topic":  # empty for most users: one truth test
            # UserStore.check_topic inlined: this runs for every message.
            table = topic_perms.get(self._vhost_name)
            perm = None if table is None else table.get(ex.name)
            if perm is None and self.user.topic_resolver is not None:  # a token's user
                perm = self.user.topic_permission(self._vhost_name, ex.name)
            if perm is not None and not perm.allows(
                WRITE, method.routing_key, self._topic_variables
            ):
                raise topic_refused(self.user, self._vhost_name, ex.name, method.routing_key)
        return ex

    def _publish_message(self, method: spec.BasicPublish, props: bytes, body: bytes) -> None:
        ex = self._checked_exchange(method)
        plain = props in PLAIN_PROPERTIES
        if not plain:
            validate_publish_properties(props)
        conn = self.connection
        now = conn.now_ms or conn.broker.clock.now_ms()
        msg = Message(ex.name, method.routing_key, props, body, now)
        msg._ex_rk = self._publish_ex_rk
        conn.has_published = True
        if conn.blocked:
            conn.block_now()
        if not plain:
            msg = check_message(msg, self.connection.user, self.channel.reply_token)
        self.stats.publish += 1
        if self.confirm:
            self.publish_seq += 1
        if self.channel.tx:
            self.tx_publishes.append((ex, msg, method.mandatory))
            return
        self.route(ex, msg, method.mandatory)

    def route(
        self,
        ex: Exchange,
        msg: Message,
        mandatory: bool,
        durable: list[MessageStore] | None = None,
        queues: list[Queue] | None = None,
        commit: Commit | None = None,
        lost: bool = False,
    ) -> int:
        """Route one message. ``queues``: already routed (a run's
        `Router.route_run`, which counts them for the run); ``commit``: a
        tx.commit's unit (core/commit.py); ``lost``: a queue took it with the
        run and lost it (its confirm is a nack). Returns what Router.publish
        does (REJECTED_BY_QUEUE: a queue refused it)."""
        confirm = self.confirm
        if confirm and durable is None:
            durable = []
        counts = self.counts.exchange(ex)
        if queues is None:
            routed_to: list[Queue] = []
            if commit is not None:
                routed = commit.publish(ex, msg, routed_to)
            else:
                routed = self.vhost.router.publish(ex, msg, durable, None, routed_to)
            self.counts.published(counts, routed_to, 1)
        else:
            routed = self.vhost.router.enqueue(ex, queues, msg, durable)
        if not routed:
            if mandatory:
                counts.return_unroutable += 1
                self.stats.return_unroutable += 1
                returned = spec.BasicReturn(
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=msg.exchange,
                    routing_key=msg.routing_key,
                )
                self.channel.send_message(returned, msg)
            else:
                counts.drop_unroutable += 1
                self.stats.drop_unroutable += 1
        if confirm:
            self.confirms.marks.mark(self.publish_seq, counts)
            self.confirms.routed(self.publish_seq, -1 if lost else routed, durable)
        return routed

    def _exchange(self, name: str) -> Exchange:
        ex = self._exchange_cache.get(name)
        if ex is None or ex.deleted:
            ex = self.vhost.get_exchange(name)
            self._exchange_cache[name] = ex
        return ex

    def forget_exchange(self, name: str) -> None:
        """The exchange was deleted: the next publish to the name looks it up again."""
        self._exchange_cache.pop(name, None)

