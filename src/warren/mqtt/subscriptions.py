"""SUBSCRIBE and UNSUBSCRIBE: an MQTT subscription is a binding of a queue.

A subscription binds the session's queue (``mqtt-subscription-<id>qos1``), or
for ``$share/<group>/<filter>`` the group's queue, to the MQTT exchange with the
filter as an AMQP binding key, after RabbitMQ's permission checks (configure
and read to declare the queue, write on it and read on the exchange to bind it,
topic permissions on the key). Retained messages follow the SUBACK.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from warren.core.errors import BrokerError
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
    from warren.node import Node

__all__ = ["Subscriptions"]

log = logging.getLogger("warren.mqtt")


class Subscriptions(Delivery):
    """The subscription half of an MQTT connection (MQTTConnection builds on it)."""

    node: Node
    user: User | None

    @property
    def name(self) -> str:
        raise NotImplementedError

    def _variables(self) -> dict[str, str]:
        """RabbitMQ's topic permission variables for this client."""
        assert self.user is not None and self.vhost is not None
        return {"username": self.user.name, "vhost": self.vhost.name, "client_id": self.client_id}

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------------
    def _subscribe(self, pkt: Subscribe) -> None:
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        v5 = self.level == MQTT_5
        raw_ident = pkt.properties.get(P.SUBSCRIPTION_IDENTIFIER, 0)
        ident = 0
        if isinstance(raw_ident, int):
            ident = raw_ident
        elif isinstance(raw_ident, list) and raw_ident and isinstance(raw_ident[0], int):
            ident = raw_ident[0]
        codes: list[int] = []
        fresh: list[tuple[str, SubscriptionOptions, bool]] = []
        for sub in pkt.subscriptions:
            tf = sub.topic_filter
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
            except BrokerError as exc:
                log.warning("%s: subscription to %r refused: %s", self.name, tf, exc)
                codes.append(P.NOT_AUTHORIZED if v5 else P.V311_SUBACK_FAILURE)
                continue
            codes.append(sub.qos)
            fresh.append((tf, opts, existed))
        if session.persistent:
            store = self.state.sessions(vhost.name)
            store.save(session)
            store.sync()
        self.send(encode(SubAck(pkt.packet_id, codes), self.level))
        # Retained messages after the SUBACK (MQTT-3.3.1-6), not for shared ones.
        now = self.now_ms or int(time.time() * 1000)
        for tf, opts, existed in fresh:
            if opts.group is not None or opts.retain_handling == 2:
                continue
            if opts.retain_handling == 1 and existed:
                continue
            for retained in self.state.retained(vhost.name).matching(tf, now):
                self.send_retained(retained, opts, now)

    def add_subscription(self, topic_filter: str, opts: SubscriptionOptions) -> bool:
        """Bind the session's (or the share group's) queue; True if it existed already."""
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        users = self.node.users
        exchange_name = self.state.config.mqtt_exchange
        exchange = vhost.get_exchange(exchange_name)
        # Every check before the queue is consumed: a refused subscription must not
        # leave a consumer on it (a share group's queue may exist already).
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        users.check(user, vhost.name, WRITE, "queue", name)
        users.check(user, vhost.name, READ, "exchange", exchange_name)
        users.check(user, vhost.name, READ, "queue", name)
        if user.topic_permissions and exchange.type == "topic":
            UserStore.check_topic(
                user, vhost.name, exchange_name, opts.binding_key, READ, self._variables()
            )
        queue = self.subscription_queue(opts)
        existed = topic_filter in session.subscriptions
        vhost.bind(exchange, queue, opts.binding_key)
        session.subscriptions[topic_filter] = opts
        if opts.group is not None and queue.name in self.consumers:
            # Its consumer was made before the subscription was recorded (or with a
            # replaced subscription's options): it delivers with these.
            self.consumers[queue.name].shared = opts
        self.subscriptions_changed()
        return existed

    def subscription_queue(self, opts: SubscriptionOptions) -> Queue:
        """The queue a subscription binds: declared (configure, read) on first use."""
        vhost, session, user = self.vhost, self.session, self.user
        assert vhost is not None and session is not None and user is not None
        name = (
            session.queue if opts.group is None else shared_queue_name(opts.group, opts.binding_key)
        )
        queue = vhost.queues.get(name)
        if queue is None:
            self.node.users.check(user, vhost.name, CONFIGURE, "queue", name)
            self.node.users.check(user, vhost.name, READ, "queue", name)
            if opts.group is not None or session.persistent:
                queue = vhost.declare_queue(name, durable=True)
            else:
                queue = vhost.declare_queue(name, durable=False, exclusive=True, owner=self)
        self.ensure_consumer(queue, opts if opts.group is not None else None)
        return queue

    def _unsubscribe(self, pkt: Unsubscribe) -> None:
        vhost, session = self.vhost, self.session
        assert vhost is not None and session is not None
        codes: list[int] = []
        exchange = vhost.exchanges.get(self.state.config.mqtt_exchange)
        for tf in pkt.topic_filters:
            opts = session.subscriptions.pop(tf, None)
            if opts is None:
                codes.append(P.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(0)
            if opts.group is not None:
                self.drop_shared_consumer(opts)
                self.state.release_shared(vhost, opts.group, opts.binding_key, session.client_id)
                continue
            still_bound = any(
                o.binding_key == opts.binding_key and o.group is None
                for o in session.subscriptions.values()
            )
            queue = vhost.queues.get(session.queue)
            if exchange is not None and queue is not None and not still_bound:
                vhost.unbind(exchange, queue, opts.binding_key)
        self.subscriptions_changed()
        if session.persistent:
            store = self.state.sessions(vhost.name)
            store.save(session)
            store.sync()
        self.send(
            encode(UnsubAck(pkt.packet_id, codes if self.level == MQTT_5 else []), self.level)
        )
