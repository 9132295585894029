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
from typing import TYPE_CHECKING

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
    from warren.node import Node

__all__ = ["Subscriptions"]

log = logging.getLogger("warren.mqtt")

#: What one topic filter of a SUBSCRIBE or UNSUBSCRIBE costs against the
#: connection's budget per loop turn (connection.py's WORK_BUDGET, where a packet
#: costs 1), so 32 filters a turn: each is permission checks, a binding (for a
#: persistent session a line in the definitions log) and a session record.
FILTER_COST = 16


class Subscriptions(Delivery):
    """The subscription half of an MQTT connection (MQTTConnection builds on it)."""

    node: Node
    user: User | None
    client_session: ClientSession
    reading_control: Callable[[bool], None] | None

    def __init__(self) -> None:
        super().__init__()
        #: The SUBSCRIBE or UNSUBSCRIBE under way: its steps, each yielding its cost
        #: (the connection advances it within its budget per loop turn).
        self._batch: Iterator[int] | None = None
        #: Its reply (and what followed it) held until what it changed is durable.
        self._held: list[bytes] | None = None
        #: The connection ends once the held reply is out (a quota refused a filter).
        self._close_after_held = False

    @property
    def name(self) -> str:
        raise NotImplementedError

    def _variables(self) -> dict[str, str]:
        """RabbitMQ's topic permission variables for this client."""
        assert self.user is not None and self.vhost is not None
        return {"username": self.user.name, "vhost": self.vhost.name, "client_id": self.client_id}

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------------
    def _subscribe(self, pkt: Subscribe) -> None:
        self._batch = self._subscribe_steps(pkt)

    def _subscribe_steps(self, pkt: Subscribe) -> Iterator[int]:
        """Bind each filter, reply when the session and bindings are durable, then
        the retained messages: one step per filter and per retained message."""
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        change_mark = self._change_mark()
        v5 = self.level == MQTT_5
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
                log.warning("%s: invalid topic filter %r refused", self.name, tf)
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
            try:
                existed = self.add_subscription(tf, opts)
            except QueueLimitReached as exc:
                log.warning(
                    "%s: subscription to %r refused: %s; closing the connection after the "
                    "SUBACK, as RabbitMQ does",
                    self.name,
                    tf,
                    exc,
                )
                quota = P.QUOTA_EXCEEDED if v5 else P.V311_SUBACK_FAILURE
                codes.append(quota)
                continue
            except BrokerError as exc:
                log.warning("%s: subscription to %r refused: %s", self.name, tf, exc)
                codes.append(P.NOT_AUTHORIZED if v5 else P.V311_SUBACK_FAILURE)
                continue
            codes.append(sub.qos)
            fresh.append((tf, opts, existed))
        output_mark = len(self.pending)
        self.send(encode(SubAck(pkt.packet_id, codes), self.level))
        self._reply_when_durable(output_mark, change_mark)
        if quota is not None:
            if self._held is None:
                self.close()
            else:
                self._close_after_held = True
            return
        yield 1
        # Retained messages after the SUBACK (MQTT-3.3.1-6), not for shared ones.
        retained = self.state.retained(vhost.name)
        for tf, opts, existed in fresh:
            if opts.group is not None or opts.retain_handling == 2:
                continue
            if opts.retain_handling == 1 and existed:
                continue
            now = self.now_ms or self.state.clock.now_ms()
            for msg in retained.matching(tf, now):
                self.send_retained(msg, opts, now)
                yield 1

    def add_subscription(self, topic_filter: str, opts: SubscriptionOptions) -> bool:
        """Bind the session's (or the share group's) queue; True if it existed already."""
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        exchange_name = self.state.config.mqtt_exchange
        exchange = vhost.get_exchange(exchange_name)
        # Every check before the queue is consumed: a refused subscription must not
        # leave a consumer on it (a share group's queue may exist already).
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        check = self.client_session.check
        check(WRITE, "queue", name)
        check(READ, "exchange", exchange_name)
        check(READ, "queue", name)
        if user.topic_permissions and exchange.type == "topic":
            UserStore.check_topic(
                user, vhost.name, exchange_name, opts.binding_key, READ, self._variables()
            )
        queue = self.subscription_queue(opts)
        old = session.subscriptions.get(topic_filter)
        vhost.bind(exchange, queue, opts.binding_key)
        session.subscriptions.set(topic_filter, opts)
        if session.persistent:
            self.state.sessions(vhost.name).subscription_changed(session, topic_filter)
        if opts.group is not None and queue.name in self.consumers:
            # Its consumer was made before the subscription was recorded (or with a
            # replaced subscription's options): it delivers with these.
            self.consumers[queue.name].shared = opts
        self.subscriptions_changed(queue.name)
        return old is not None

    def subscription_queue(self, opts: SubscriptionOptions) -> Queue:
        """The queue a subscription binds: declared (configure, read) on first use."""
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        queue = vhost.queues.get(name)
        if queue is None:
            self.client_session.check(CONFIGURE, "queue", name)
            self.client_session.check(READ, "queue", name)
            if opts.group is not None or session.persistent:
                queue = vhost.declare_queue(name, durable=True)
            else:
                queue = vhost.declare_queue(name, durable=False, exclusive=True, owner=self)
        self.ensure_consumer(queue, opts if opts.group is not None else None)
        return queue

    def _unsubscribe(self, pkt: Unsubscribe) -> None:
        self._batch = self._unsubscribe_steps(pkt)

    def _unsubscribe_steps(self, pkt: Unsubscribe) -> Iterator[int]:
        vhost, session = self.vhost, self.session
        assert vhost is not None and session is not None
        change_mark = self._change_mark()
        codes: list[int] = []
        exchange = vhost.exchanges.get(self.state.config.mqtt_exchange)
        sessions = self.state.sessions(vhost.name) if session.persistent else None
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
                self.drop_shared_consumer(opts)
                self.state.release_shared(vhost, opts.group, opts.binding_key, session.client_id)
                continue
            queue = vhost.queues.get(session.queue)
            if (
                exchange is not None
                and queue is not None
                and not session.subscriptions.binds(opts.binding_key)
            ):
                vhost.unbind(exchange, queue, opts.binding_key)
            self.subscriptions_changed(session.queue)
        output_mark = len(self.pending)
        self.send(
            encode(UnsubAck(pkt.packet_id, codes if self.level == MQTT_5 else []), self.level)
        )
        self._reply_when_durable(output_mark, change_mark)
        yield 1

    # -- replies after what they report is durable ------------------------------------------
    def _change_mark(self) -> ChangeMark:
        return self.client_session.change_mark()

    def _reply_when_durable(self, output_mark: int, change_mark: ChangeMark) -> None:
        """Hold the output since ``output_mark`` (a SUBACK or UNSUBACK) and the input
        after it until the session's records and the bindings and queues made
        since ``change_mark`` are durable (the client session's rule: on disk
        and, in a cluster, held by the followers). Nothing held when nothing
        needs to wait."""
        vhost, session = self.vhost, self.session
        assert vhost is not None and session is not None
        sessions = self.state.sessions(vhost.name) if session.persistent else None
        stores: list[object] = []
        if sessions is not None:
            sessions.save(session)
            if sessions.log is not None:
                stores.append(sessions.log)
        if self.closed:
            return
        self._held = self.pending[output_mark:]
        del self.pending[output_mark:]
        if not self.client_session.when_changes_durable(change_mark, self._durable, stores):
            held, self._held = self._held, None
            if held:
                self.pending.extend(held)
            return
        if self._held is not None and self.reading_control is not None:
            self.reading_control(False)

    def _durable(self, ok: bool) -> None:
        if not ok and not self.closed:
            log.error("%s: the disk sync behind a subscription failed: closing", self.name)
            self.disconnect(P.UNSPECIFIED_ERROR, "could not sync to disk")
        self._release_held()

    def _release_held(self) -> None:
        held = self._held
        self._held = None
        if held is None or self.closed:
            return
        for chunk in held:
            self.send(chunk)
        if self._close_after_held:
            self.close()
            return
        self.resume()

    def resume(self) -> None:
        raise NotImplementedError

    def disconnect(self, reason_code: int, reason: str = "") -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
