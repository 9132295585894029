"""PUBLISH from an MQTT client: the publishing part of its connection.

A PUBLISH is parsed straight from the read buffer when it can be (its topic's
validated name and routing key cached per topic bytes, no packet object), or
by the codec (MQTT 5 properties, a new topic); topic aliases are resolved,
the write permission on the MQTT exchange is checked once and topic
permissions per message, and the message goes to the exchange as an AMQP
message (mapping.py) and, with RETAIN, to the retained store. Its QoS 1 or 2
acknowledgement goes out once what it went to is settled (sync_acks.py, the
client session's rule); a QoS 2 publish then awaits its PUBREL (``release``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.users import WRITE, UserStore
from warren.mqtt import properties as P
from warren.mqtt.codec import _publish as decode_publish
from warren.mqtt.codec import encode
from warren.mqtt.errors import ProtocolViolation
from warren.mqtt.mapping import plain_properties, to_properties
from warren.mqtt.packets import MQTT_5, PubAck, PubComp, Publish, PubRec
from warren.mqtt.retained import RetainedMessage
from warren.mqtt.session import MAX_AWAITING_RELEASE
from warren.mqtt.topics import MAX_TOPIC_BYTES, mqtt_to_amqp, too_long

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.mqtt.connection import MQTTConnection

__all__ = ["Publishing", "TOPIC_CACHE_LIMIT"]

log = logging.getLogger("warren.mqtt")

#: Distinct topics whose validated name and routing key a connection keeps.
TOPIC_CACHE_LIMIT = 4096


class Publishing:
    """One connection's PUBLISH (and PUBREL) from its client.

    It holds the connection (``conn``: its level, vhost, session, user, clock
    reading and output, as the connection's CONNECT set them) and keeps its
    own state: the topic cache, the client's topic aliases and whether the
    user may publish at all."""

    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn
        #: The highest topic alias the client may use (CONNACK said so; 0: none).
        self.alias_max_in = 0
        self._aliases: dict[int, str] = {}
        # Topic bytes -> (topic, routing key), validated once per topic.
        self._topics: dict[bytes, tuple[str, str]] = {}
        # Whether the user may write to the MQTT exchange (None: not asked yet).
        self._can_publish: bool | None = None
        self._exchange: Exchange | None = None
        self._refusals = 0

    def permissions_changed(self) -> None:
        """The user's permissions changed (MQTT 5 re-authentication): ask again."""
        self._can_publish = None

    def publish_raw(self, first: int, buf: bytes, pos: int, end: int) -> None:
        """A PUBLISH straight from the read buffer: topic bytes looked up in a cache
        (validated and mapped once per topic), no packet object; packets with MQTT 5
        properties or an empty topic take the codec's full path."""
        v5 = self.conn.level == MQTT_5
        qos = (first >> 1) & 3
        if qos == 3 or (first & 8 and not qos) or end - pos < 2:
            self.publish(decode_publish(first, buf, pos, end, v5))
            return
        tstop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
        if tstop > end:
            self.publish(decode_publish(first, buf, pos, end, v5))
            return
        raw_topic = buf[pos + 2 : tstop]
        names = self._topics.get(raw_topic)
        p = tstop
        pid = None
        if qos:
            if p + 2 > end:
                self.publish(decode_publish(first, buf, pos, end, v5))
                return
            pid = buf[p] << 8 | buf[p + 1]
            p += 2
        if names is None or not pid and qos or (v5 and (p >= end or buf[p])):
            # New topic, packet id 0, or MQTT 5 properties: the codec decodes and checks.
            pkt = decode_publish(first, buf, pos, end, v5)
            if names is None and pkt.topic and not pkt.properties and not too_long(pkt.topic):
                if len(self._topics) >= TOPIC_CACHE_LIMIT:
                    self._topics.clear()
                self._topics[raw_topic] = (pkt.topic, mqtt_to_amqp(pkt.topic))
            self.publish(pkt)
            return
        if v5:
            p += 1  # the property length, 0
        self._route(
            names[0], names[1], buf[p:end], qos, bool(first & 8), bool(first & 1), pid, None
        )

    def publish(self, pkt: Publish) -> None:
        """A PUBLISH the codec decoded: its topic alias resolved, its topic checked."""
        if self.conn.vhost is None:
            raise ProtocolViolation(P.PROTOCOL_ERROR, "PUBLISH before CONNECT")
        topic = pkt.topic
        props = pkt.properties
        if props:
            alias = props.get(P.TOPIC_ALIAS)
            if alias is not None:
                assert isinstance(alias, int)
                if alias > self.alias_max_in:
                    raise ProtocolViolation(
                        P.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range"
                    )
                if topic:
                    self._aliases[alias] = topic
                else:
                    known = self._aliases.get(alias)
                    if known is None:
                        raise ProtocolViolation(P.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                    topic = known
                props = {k: v for k, v in props.items() if k != P.TOPIC_ALIAS}
        if too_long(topic):
            raise ProtocolViolation(
                P.TOPIC_NAME_INVALID, f"topic name longer than {MAX_TOPIC_BYTES} bytes"
            )
        self._route(
            topic,
            mqtt_to_amqp(topic),
            pkt.payload,
            pkt.qos,
            pkt.dup,
            pkt.retain,
            pkt.packet_id,
            props or None,
        )

    def _route(
        self,
        topic: str,
        routing_key: str,
        payload: bytes,
        qos: int,
        dup: bool,
        retain: bool,
        pid: int | None,
        props: P.Properties | None,
    ) -> None:
        conn = self.conn
        vhost = conn.vhost
        assert vhost is not None
        session = conn.session
        assert session is not None
        level = conn.level
        state = conn.state
        if qos == 2 and pid in session.awaiting_release:
            # A resent QoS 2 PUBLISH we already have: acknowledge again, route nothing.
            conn.send(encode(PubRec(pid), level))
            return
        if qos == 2 and len(session.awaiting_release) >= MAX_AWAITING_RELEASE:
            raise ProtocolViolation(
                P.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than {MAX_AWAITING_RELEASE} QoS 2 messages awaiting PUBREL",
            )
        exchange = self._exchange
        if self._can_publish is None:
            self._can_publish = conn.user is not None and conn.allowed(WRITE, "exchange")
            try:
                exchange = self._exchange = vhost.get_exchange(state.config.mqtt_exchange)
            except BrokerError:
                self._can_publish = False
        if not self._can_publish or exchange is None:
            self._refuse(qos, pid, topic, P.NOT_AUTHORIZED)
            return
        user = conn.user
        if user is not None and user.topic_permissions and exchange.type == "topic":
            try:
                UserStore.check_topic(
                    user,
                    vhost.name,
                    exchange.name,
                    routing_key,
                    WRITE,
                    conn.subscriptions.variables(),
                )
            except BrokerError:
                self._refuse(qos, pid, topic, P.NOT_AUTHORIZED)
                return
        if conn.node.alarms:
            conn.set_blocked(True)
        now = conn.now_ms or state.clock.now_ms()
        no_local = conn.subscriptions.no_local
        if props is None and not no_local:
            amqp_props = plain_properties(qos, dup, retain)
        else:
            amqp_props = to_properties(
                qos,
                dup,
                retain,
                props or {},
                conn.client_id if no_local else None,
            )
        msg = Message(exchange.name, routing_key, amqp_props, payload, now)
        stats = conn.stats
        stats.publish += 1
        durable: list[Any] | None = [] if qos else None
        if retain:
            expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL) if props else None
            retained = state.retained(vhost.name)
            retained.put(RetainedMessage.published(topic, payload, qos, amqp_props, now, expiry))
            if durable is not None and retained.log is not None:
                durable.append(retained.log)
        routed = vhost.router.publish(exchange, msg, durable)
        if not routed:
            stats.drop_unroutable += 1
        if not qos:
            return
        assert pid is not None
        code = 0
        if routed < 0:
            code = P.QUOTA_EXCEEDED
        elif routed == 0 and level == MQTT_5:
            code = P.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = encode(PubAck(pid, code), level) if code else _puback(pid)
        else:
            ack = encode(PubRec(pid, code), level)
            if code < 0x80:
                session.awaiting_release.add(pid)
                if session.persistent:
                    store = state.sessions(vhost.name)
                    store.save(session)
                    if durable is not None and store.log is not None:
                        durable.append(store.log)
        conn.synced_acks.after_settled(ack, durable or [])

    def _refuse(self, qos: int, pid: int | None, topic: str, code: int) -> None:
        # A warning for the first refusal, debug lines after it: a client retrying in
        # a loop must not flood the log.
        conn = self.conn
        self._refusals += 1
        log.log(
            logging.WARNING if self._refusals == 1 else logging.DEBUG,
            "%s: MQTT client '%s' may not publish to '%s' (exchange '%s')",
            conn.name,
            conn.client_id,
            topic,
            conn.state.config.mqtt_exchange,
        )
        if conn.level != MQTT_5:
            conn.close()  # 3.1.1 has no way to say no (RabbitMQ closes too)
        elif qos == 1:
            conn.send(encode(PubAck(pid or 0, code), MQTT_5))
        elif qos == 2:
            conn.send(encode(PubRec(pid or 0, code), MQTT_5))

    def release(self, pid: int) -> None:
        """PUBREL: the QoS 2 publish ``pid`` is released; PUBCOMP."""
        conn = self.conn
        session = conn.session
        assert session is not None
        if pid in session.awaiting_release:
            session.awaiting_release.discard(pid)
            comp = encode(PubComp(pid), conn.level)
            if session.persistent:
                assert conn.vhost is not None
                store = conn.state.sessions(conn.vhost.name)
                store.save(session)
                if store.log is not None:
                    # PUBCOMP frees the packet id for a new message: if the release were
                    # lost to a power cut, the id would still await release after the
                    # restart and that new message would be taken for a resend, dropped.
                    conn.synced_acks.after_settled(comp, [store.log])
                    return
            conn.synced_acks.send(comp)
        else:
            conn.send(encode(PubComp(pid, P.PACKET_IDENTIFIER_NOT_FOUND), conn.level))


def _puback(pid: int) -> bytes:
    return bytes((0x40, 2, pid >> 8, pid & 0xFF))
