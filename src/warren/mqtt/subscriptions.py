"""SUBSCRIBE and UNSUBSCRIBE: an MQTT subscription is a binding of a queue.

A subscription binds the session's queue (``mqtt-subscription-<id>qos1``), or
for ``$share/<group>/<filter>`` the group's queue, to the MQTT exchange with the
filter as an AMQP binding key, after RabbitMQ's permission checks (configure
and read to declare the queue, write on it and read on the exchange to bind it,
topic permissions on the key). Retained messages follow the SUBACK.

A queue the vhost's ``max-queues`` does not allow refuses its filter and every
later one of the SUBSCRIBE (MQTT 5: 0x97 Quota exceeded, 3.1.1: 0x80), and the
connection is closed after the SUBACK, as RabbitMQ 3.13 and 4.x do (3.10
closes it without a SUBACK); the session's other subscriptions, and other
connections, go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from warren.core.errors import BrokerError, QueueLimitReached
from warren.core.users import CONFIGURE, READ, WRITE, User, UserStore
from warren.mqtt import properties as P
from warren.mqtt.codec import encode
from warren.mqtt.delivery import Delivery
from warren.mqtt.errors import ProtocolViolation
from warren.mqtt.packets import MQTT_5, SubAck, Subscribe, UnsubAck, Unsubscribe
from warren.mqtt.session import SubscriptionOptions, shared_queue_name
from warren.mqtt.topics import is_valid_topic_filter, mqtt_to_amqp, parse_shared

if TYPE_CHECKING:
    from warren.core.queue import Queue
    from warren.core.session import ChangeMark, ClientSession
    from warren.core.vhost import VHost
    from warren.mqtt.session import Session
    from warren.mqtt.state import MQTTState

__all__ = ["SubscriptionHost", "Subscriptions"]

log = logging.getLogger("warren.mqtt")

#: What one topic filter of a SUBSCRIBE or UNSUBSCRIBE costs against the
#: connection's budget per loop turn (connection.py's WORK_BUDGET, where a packet
#: costs 1), so 32 filters a turn: each is permission checks, a binding (for a
#: persistent session a line in the definitions log) and a session record.
FILTER_COST = 16


class SubscriptionHost(Protocol):
    """What the subscription part reads and calls on its connection."""

    state: MQTTState
    client_session: ClientSession
    vhost: VHost | None
    session: Session | None
    user: User | None
    client_id: str
    level: int
    now_ms: int
    closed: bool
    reading_control: Callable[[bool], None] | None

    @property
    def name(self) -> str: ...

    def send(self, data: bytes) -> None: ...

    def output_mark(self) -> int:
        """Where the output not yet taken ends now."""
        ...

    def hold_output(self, mark: int) -> list[bytes]:
        """Take back what was sent since ``mark`` (a reply to hold)."""
        ...

    def close(self) -> None: ...

    def disconnect(self, reason_code: int, reason: str = "") -> None: ...

    def resume(self) -> None:
        """Held replies are out: go on with the input and reading."""
        ...


class Subscriptions:
    """The subscriptions of one MQTT connection's session: SUBSCRIBE and
    UNSUBSCRIBE paced by the connection's budget, bindings, share groups, and
    the consumers (through its `Delivery`) that they need."""

    def __init__(self, conn: SubscriptionHost, delivery: Delivery) -> None:
        self.conn = conn
        self.delivery = delivery
        #: The SUBSCRIBE or UNSUBSCRIBE under way: its steps, each yielding its cost
        #: (the connection advances it within its budget per loop turn).
        self.batch: Iterator[int] | None = None
        #: Its reply (and what followed it) held until what it changed is durable.
        self.held: list[bytes] | None = None
        #: The connection ends once the held reply is out (a quota refused a filter).
        self._close_after_held = False
        #: Some subscription has No Local: publishes carry the client id.
        self.no_local = False

    def variables(self) -> dict[str, str]:
        """RabbitMQ's topic permission variables for this client."""
        conn = self.conn
        assert conn.user is not None and conn.vhost is not None
        return {"username": conn.user.name, "vhost": conn.vhost.name, "client_id": conn.client_id}

    def changed(self, queue: str | None = None) -> None:
        """After a change to the session's subscriptions: what the consumer of
        ``queue`` (None: every consumer) and publishing need to know."""
        session = self.conn.session
        assert session is not None
        self.no_local = session.subscriptions.no_local > 0
        self.delivery.consumers_changed(queue)

    def attach_consumers(self) -> None:
        """Consume the session's queues (on CONNECT of a resumed session)."""
        conn = self.conn
        session, vhost = conn.session, conn.vhost
        assert session is not None and vhost is not None
        self.changed()
        if not session.subscriptions:
            return
        if session.queue in vhost.queues:
            self.delivery.ensure_consumer(vhost.queues[session.queue])
        else:
            # The queue went away while the session was stored: bind a new one
            # (whose messages are numbered afresh).
            session.redeliver.clear()
            for tf, opts in list(session.subscriptions.items()):
                if opts.group is None:
                    self.add_subscription(tf, opts)
                    break
            queue = vhost.queues.get(session.queue)
            exchange = vhost.exchanges.get(conn.state.config.mqtt_exchange)
            if queue is not None and exchange is not None:
                for opts in session.subscriptions.values():
                    if opts.group is None:
                        vhost.bind(exchange, queue, opts.binding_key)
        for opts in session.subscriptions.values():
            if opts.group is not None:
                self.subscription_queue(opts)

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------------
    def subscribe(self, pkt: Subscribe) -> None:
        self.batch = self._subscribe_steps(pkt)

    def _subscribe_steps(self, pkt: Subscribe) -> Iterator[int]:
        """Bind each filter, reply when the session and bindings are durable, then
        the retained messages: one step per filter and per retained message."""
        vhost, session, user = self.conn.vhost, self.conn.session, self.conn.user
        assert vhost is not None and session is not None and user is not None
        change_mark = self._change_mark()
        v5 = self.conn.level == MQTT_5
        raw_ident = pkt.properties.get(P.SUBSCRIPTION_IDENTIFIER, 0)
        ident = 0
        if isinstance(raw_ident, int):
            ident = raw_ident
        elif isinstance(raw_ident, list) and raw_ident and isinstance(raw_ident[0], int):
            ident = raw_ident[0]
        codes: list[int] = []
        fresh: list[tuple[str, SubscriptionOptions, bool]] = []
        quota: int | None = None  # once a filter exceeded a quota, the code of the rest
        for sub in pkt.subscriptions:
            yield FILTER_COST
            tf = sub.topic_filter
            if quota is not None:
                codes.append(quota)
                continue
            if not is_valid_topic_filter(tf):
                log.warning("%s: invalid topic filter %r refused", self.conn.name, tf)
                codes.append(P.TOPIC_FILTER_INVALID if v5 else P.V311_SUBACK_FAILURE)
                continue
            group, inner = parse_shared(tf)
            if group is not None and sub.no_local:
                raise ProtocolViolation(P.PROTOCOL_ERROR, "No Local on a shared subscription")
            opts = SubscriptionOptions(
                sub.qos,
                sub.no_local,
                sub.retain_as_published,
                sub.retain_handling,
                ident,
                mqtt_to_amqp(inner),
                group,
            )
            limits = self.conn.state.node.rate_limits
            if tf not in session.subscriptions and not limits.allow_subscription(
                len(session.subscriptions)
            ):
                log.warning(
                    "%s: subscription to %r refused: max_subscriptions_per_client (%d)",
                    self.conn.name,
                    tf,
                    limits.max_subscriptions,
                )
                codes.append(P.QUOTA_EXCEEDED if v5 else P.V311_SUBACK_FAILURE)
                continue
            try:
                existed = self.add_subscription(tf, opts)
            except QueueLimitReached as exc:
                log.warning(
                    "%s: subscription to %r refused: %s; closing the connection after the "
                    "SUBACK, as RabbitMQ does",
                    self.conn.name,
                    tf,
                    exc,
                )
                quota = P.QUOTA_EXCEEDED if v5 else P.V311_SUBACK_FAILURE
                codes.append(quota)
                continue
            except BrokerError as exc:
                log.warning("%s: subscription to %r refused: %s", self.conn.name, tf, exc)
                codes.append(P.NOT_AUTHORIZED if v5 else P.V311_SUBACK_FAILURE)
                continue
            codes.append(sub.qos)
            fresh.append((tf, opts, existed))
        output_mark = self.conn.output_mark()
        self.conn.send(encode(SubAck(pkt.packet_id, codes), self.conn.level))
        self._reply_when_durable(output_mark, change_mark)
        if quota is not None:
            if self.held is None:
                self.conn.close()
            else:
                self._close_after_held = True
            return
        yield 1
        # Retained messages after the SUBACK (MQTT-3.3.1-6), not for shared ones.
        retained = self.conn.state.retained(vhost.name)
        for tf, opts, existed in fresh:
            if opts.group is not None or opts.retain_handling == 2:
                continue
            if opts.retain_handling == 1 and existed:
                continue
            now = self.conn.now_ms or self.conn.state.clock.now_ms()
            for msg in retained.matching(tf, now):
                self.delivery.send_retained(msg, opts, now)
                yield 1

    def add_subscription(self, topic_filter: str, opts: SubscriptionOptions) -> bool:
        """Bind the session's (or the share group's) queue; True if it existed already."""
        vhost, session, user = self.conn.vhost, self.conn.session, self.conn.user
        assert vhost is not None and session is not None and user is not None
        exchange_name = self.conn.state.config.mqtt_exchange
        exchange = vhost.get_exchange(exchange_name)
        # Every check before the queue is consumed: a refused subscription must not
        # leave a consumer on it (a share group's queue may exist already).
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        check = self.conn.client_session.check
        check(WRITE, "queue", name)
        check(READ, "exchange", exchange_name)
        check(READ, "queue", name)
        if user.topic_permissions and exchange.type == "topic":
            UserStore.check_topic(
                user, vhost.name, exchange_name, opts.binding_key, READ, self.variables()
            )
        queue = self.subscription_queue(opts)
        old = session.subscriptions.get(topic_filter)
        vhost.bind(exchange, queue, opts.binding_key)
        session.subscriptions.set(topic_filter, opts)
        if session.persistent:
            self.conn.state.sessions(vhost.name).subscription_changed(session, topic_filter)
        if opts.group is not None:
            # Its consumer was made before the subscription was recorded (or with a
            # replaced subscription's options): it delivers with these.
            self.delivery.set_shared(queue.name, opts)
        self.changed(queue.name)
        return old is not None

    def subscription_queue(self, opts: SubscriptionOptions) -> Queue:
        """The queue a subscription binds: declared (configure, read) on first use."""
        vhost, session, user = self.conn.vhost, self.conn.session, self.conn.user
        assert vhost is not None and session is not None and user is not None
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        queue = vhost.queues.get(name)
        if queue is None:
            self.conn.client_session.check(CONFIGURE, "queue", name)
            self.conn.client_session.check(READ, "queue", name)
            if opts.group is not None or session.persistent:
                queue = vhost.declare_queue(name, durable=True)
            else:
                queue = vhost.declare_queue(name, durable=False, exclusive=True, owner=self.conn)
        self.delivery.ensure_consumer(queue, opts if opts.group is not None else None)
        return queue

    def unsubscribe(self, pkt: Unsubscribe) -> None:
        self.batch = self._unsubscribe_steps(pkt)

    def _unsubscribe_steps(self, pkt: Unsubscribe) -> Iterator[int]:
        vhost, session = self.conn.vhost, self.conn.session
        assert vhost is not None and session is not None
        change_mark = self._change_mark()
        codes: list[int] = []
        exchange = vhost.exchanges.get(self.conn.state.config.mqtt_exchange)
        sessions = self.conn.state.sessions(vhost.name) if session.persistent else None
        for tf in pkt.topic_filters:
            yield FILTER_COST
            opts = session.subscriptions.pop(tf)
            if opts is None:
                codes.append(P.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(0)
            if sessions is not None:
                sessions.subscription_changed(session, tf)
            if opts.group is not None:
                self.delivery.drop_shared_consumer(opts)
                self.conn.state.release_shared(vhost, opts.group, opts.binding_key, session.client_id)
                continue
            queue = vhost.queues.get(session.queue)
            if (
                exchange is not None
                and queue is not None
                and not session.subscriptions.binds(opts.binding_key)
            ):
                vhost.unbind(exchange, queue, opts.binding_key)
            self.changed(session.queue)
        output_mark = self.conn.output_mark()
        self.conn.send(
            encode(UnsubAck(pkt.packet_id, codes if self.conn.level == MQTT_5 else []), self.conn.level)
        )
        self._reply_when_durable(output_mark, change_mark)
        yield 1

    # -- replies after what they report is durable ------------------------------------------
    def _change_mark(self) -> ChangeMark:
        return self.conn.client_session.change_mark()

    def _reply_when_durable(self, output_mark: int, change_mark: ChangeMark) -> None:
        """Hold the output since ``output_mark`` (a SUBACK or UNSUBACK) and the input
        after it until the session's records and the bindings and queues made
        since ``change_mark`` are durable (the client session's rule: on disk
        and, in a cluster, held by the followers). Nothing held when nothing
        needs to wait."""
        vhost, session = self.conn.vhost, self.conn.session
        assert vhost is not None and session is not None
        sessions = self.conn.state.sessions(vhost.name) if session.persistent else None
        stores: list[object] = []
        if sessions is not None:
            sessions.save(session)
            if sessions.log is not None:
                stores.append(sessions.log)
        if self.conn.closed:
            return
        self.held = self.conn.hold_output(output_mark)
        if not self.conn.client_session.when_changes_durable(change_mark, self._durable, stores):
            held, self.held = self.held, None
            for chunk in held:
                self.conn.send(chunk)
            return
        if self.held is not None and self.conn.reading_control is not None:
            self.conn.reading_control(False)

    def _durable(self, ok: bool) -> None:
        if not ok and not self.conn.closed:
            log.error("%s: the disk sync behind a subscription failed: closing", self.conn.name)
            self.conn.disconnect(P.UNSPECIFIED_ERROR, "could not sync to disk")
        self._release_held()

    def _release_held(self) -> None:
        held = self.held
        self.held = None
        if held is None or self.conn.closed:
            return
        for chunk in held:
            self.conn.send(chunk)
        if self._close_after_held:
            self.conn.close()
            return
        self.conn.resume()
