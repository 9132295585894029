"""The sans-IO MQTT 3.1.1 / 5.0 connection: packets in, core calls, packets out.

`MQTTConnection.feed(data)` decodes every complete packet and acts on it; what
is to be sent is gathered in ``pending`` and announced once through
``on_output`` (the asyncio layer writes it all in one call). No socket, no
clock of its own: ``now_ms`` is set by the caller per read, and keepalive is
checked by `tick`. Deliveries (core queue -> PUBLISH) are in delivery.py; the
state shared between connections (takeover, stored sessions, retained
messages, wills) in state.py; SUBSCRIBE and UNSUBSCRIBE in subscriptions.py.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.stats import MessageStats, OctetStats
from warren.core.users import WRITE, User, UserStore
from warren.mqtt import properties as P
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.codec import _publish as decode_publish
from warren.mqtt.errors import MQTTCodecError, ProtocolViolation, UnsupportedProtocolVersion
from warren.mqtt.mapping import plain_properties, to_properties
from warren.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    Will,
)
from warren.mqtt.retained import RetainedMessage
from warren.mqtt.session import NEVER_EXPIRES, Session, queue_name
from warren.mqtt.subscriptions import Subscriptions
from warren.mqtt.topics import mqtt_to_amqp

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.mqtt.state import MQTTState

__all__ = ["MQTTConnection"]

log = logging.getLogger("warren.mqtt")

#: Largest CONNECT accepted before the client is authenticated (RabbitMQ's
#: max_packet_size_unauthenticated).
MAX_UNAUTHENTICATED_PACKET = 65536
#: Room for a PUBLISH's topic and properties above max_message_size.
PACKET_OVERHEAD = 65536 + 16
#: Distinct topics whose validated name and routing key a connection keeps.
TOPIC_CACHE_LIMIT = 4096
#: Longest client id: the session queue's name must fit an AMQP shortstr.
MAX_CLIENT_ID_BYTES = 255 - len(queue_name(""))
#: Longest topic name a client may publish to (or name its will's topic): it
#: becomes the message's AMQP routing key, a shortstr.
MAX_TOPIC_BYTES = 255
#: Incoming QoS 2 messages awaiting PUBREL per session at most (MQTT 5 clients are
#: told so as the server's Receive Maximum): each is in the session's record.
MAX_AWAITING_RELEASE = 1024

_V3_CONNACK = {
    P.UNSUPPORTED_PROTOCOL_VERSION: P.V311_UNACCEPTABLE_PROTOCOL_VERSION,
    P.CLIENT_IDENTIFIER_NOT_VALID: P.V311_IDENTIFIER_REJECTED,
    P.BAD_USER_NAME_OR_PASSWORD: P.V311_BAD_USER_NAME_OR_PASSWORD,
    P.NOT_AUTHORIZED: P.V311_NOT_AUTHORIZED,
    P.SERVER_UNAVAILABLE: P.V311_SERVER_UNAVAILABLE,
    P.CONNECTION_RATE_EXCEEDED: P.V311_SERVER_UNAVAILABLE,
    P.QUOTA_EXCEEDED: P.V311_SERVER_UNAVAILABLE,
}


class MQTTConnection(Subscriptions):
    """One client's connection (any transport). Also a ClientConnection for the broker."""

    def __init__(
        self,
        state: MQTTState,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
        on_output: Callable[[], None],
        on_close: Callable[[], None],
        transport_name: str = "MQTT",
    ) -> None:
        super().__init__()
        self.state = state
        self.node = state.node
        self.peer = peer
        self.local = local
        self.on_output = on_output
        self.on_close = on_close
        #: Pause/resume reading from the socket (the free-disk alarm).
        self.reading_control: Callable[[bool], None] | None = None
        self.transport_name = transport_name
        #: The user a verified TLS client certificate names (set by the transport,
        #: warren.tls.cert_login): None without one, "" when it has no usable name.
        self.cert_login: str | None = None
        self.decoder = Decoder(max_packet_size=MAX_UNAUTHENTICATED_PACKET)
        self.octets = OctetStats()
        self.stats = MessageStats()
        self.now_ms = 0
        self.last_rx_ms = 0
        self.connected_at = int(time.time() * 1000)
        self.closed = False
        self.keepalive = 0
        self.user: User | None = None
        self._will: Will | None = None
        self._clean_exit = False
        self._can_publish: bool | None = None
        self._exchange: Exchange | None = None
        self._aliases_in: dict[int, str] = {}
        self._topics_in: dict[bytes, tuple[str, str]] = {}
        self._refusals = 0
        #: A refused CONNECT waiting out its delay: input is ignored meanwhile.
        self._refusing = False
        self._alias_max_in = 0
        # Publish acknowledgements waiting for a disk sync, in arrival order.
        self._sync_batch: list[bytes] | None = None
        self._sync_round = -1
        self._waiting_batches = 0

    # -- the sans-IO surface ----------------------------------------------------------------
    @property
    def name(self) -> str:
        peer = f"{self.peer[0]}:{self.peer[1]}" if self.peer else "local"
        local = f"{self.local[0]}:{self.local[1]}" if self.local else "local"
        return f"{peer} -> {local}"

    def send(self, data: bytes) -> None:
        pending = self.pending
        pending.append(data)
        if len(pending) == 1:
            self.on_output()

    def take_output(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out

    def feed(self, data: bytes) -> None:
        """Act on every complete packet in ``data``: one framing pass, PUBLISH bodies
        parsed here without building packet objects, the rest decoded by the codec."""
        if self.closed or self._refusing:
            return
        decoder = self.decoder
        try:
            buf, frames = decoder.frames(data)
        except MQTTCodecError as exc:
            self._codec_error(exc)
            return
        if frames:
            # Keep alive counts control packets (MQTT-3.1.2-24), not bytes: a client
            # trickling a partial packet is still closed on time.
            self.last_rx_ms = self.now_ms
        connected = self.vhost is not None
        for first, start, end in frames:
            if self.closed:
                break
            try:
                kind = first >> 4
                if kind == 3 and connected:
                    self._publish_raw(first, buf, start, end)
                    continue
                pkt = decoder.decode(first, buf, start, end)
                if type(pkt) is PubAck:
                    self.settle(pkt.packet_id)
                elif not connected:
                    self._before_connect(pkt)
                    connected = self.vhost is not None
                else:
                    self._control(pkt)
            except MQTTCodecError as exc:
                self._codec_error(exc)
                break
            except ProtocolViolation as exc:
                self.disconnect(exc.reason_code, str(exc))
            except BrokerError as exc:
                log.warning("%s: %s", self.name, exc)
                self.disconnect(P.IMPLEMENTATION_SPECIFIC_ERROR, str(exc))
        self.apply_acks()

    def tick(self, now_ms: int) -> int:
        """Keepalive: close a client silent for 1.5 keep alive periods. Returns the
        milliseconds until the next check is due (0: none)."""
        if self.closed or not self.keepalive:
            return 0
        deadline = self.last_rx_ms + self.keepalive * 1500
        if now_ms >= deadline:
            log.warning(
                "%s: MQTT client '%s' silent for %.1f s (keep alive %d s): closing",
                self.name,
                self.client_id,
                (now_ms - self.last_rx_ms) / 1000,
                self.keepalive,
            )
            self.disconnect(P.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            return 0
        return deadline - now_ms

    # -- errors and closing ---------------------------------------------------------------
    def _codec_error(self, exc: MQTTCodecError) -> None:
        log.warning("%s: malformed MQTT input, closing: %s", self.name, exc)
        if self.vhost is None:
            if isinstance(exc, UnsupportedProtocolVersion):
                # 3.1.1 clients understand return code 1; a 5 client reads 0x84.
                self.send(b"\x20\x02\x00\x01")
            elif self.decoder.level == MQTT_5:
                self.send(encode(ConnAck(False, exc.reason_code), MQTT_5))
            self.close()
            return
        self.disconnect(exc.reason_code, str(exc))

    def disconnect(self, reason_code: int, reason: str = "") -> None:
        """Server-side close: MQTT 5 gets a DISCONNECT with the reason first."""
        if self.closed:
            return
        if self.level == MQTT_5 and self.vhost is not None:
            props: P.Properties = {}
            if reason and self._problem_information:
                props[P.REASON_STRING] = reason[:200]
            self.send(encode(Disconnect(reason_code, props), MQTT_5))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.on_close()

    def taken_over(self) -> None:
        """Another connection CONNECTed with this client id: end this one now."""
        log.info("%s: MQTT client '%s' taken over by a new connection", self.name, self.client_id)
        self.disconnect(P.SESSION_TAKEN_OVER, "session taken over")
        self.connection_lost()

    def force_close(self, reason: str) -> None:
        log.info("%s: closed by an operator: %s", self.name, reason)
        self.disconnect(P.ADMINISTRATIVE_ACTION, reason)

    def connection_lost(self) -> None:
        """The transport is gone (or the connection was taken over): detach the
        session, publish the will unless the client disconnected normally."""
        self.closed = True
        vhost, session = self.vhost, self.session
        if vhost is None or session is None or self._detached:
            return
        self._detached = True
        self.apply_acks()
        self.detach_consumers()
        self.state.released(self, vhost.name, session.client_id)
        self.node.connection_closed(self)
        if self._will is not None and not self._clean_exit and self.user is not None:
            try:
                self.state.schedule_will(vhost, session, self._will, self.user)
            except Exception:  # the session must still be put away below
                log.exception("%s: publishing the will of '%s' failed", self.name, self.client_id)
        if session.persistent:
            self.state.session_ended(vhost, session)
        else:
            # Made non-persistent by DISCONNECT, it is still stored: no longer a
            # share group's member when the groups count theirs.
            self.state.sessions(vhost.name).forget(session.client_id)
            for opts in session.subscriptions.values():
                if opts.group is not None:
                    self.state.release_shared(
                        vhost, opts.group, opts.binding_key, session.client_id
                    )
            session.subscriptions.clear()
            self.state.discard_session(vhost, session.client_id)

    # -- CONNECT --------------------------------------------------------------------------
    def _before_connect(self, pkt: object) -> None:
        if not isinstance(pkt, Connect):
            raise ProtocolViolation(P.PROTOCOL_ERROR, "the first packet must be CONNECT")
        self.level = pkt.protocol_level
        code = self._connect(pkt)
        if code:
            log.warning(
                "%s: MQTT CONNECT of client '%s' refused (reason 0x%02x)",
                self.name,
                pkt.client_id,
                code,
            )
            if self.level == MQTT_5:
                connack = encode(ConnAck(False, code), MQTT_5)
            else:
                connack = encode(ConnAck(False, _V3_CONNACK.get(code, P.V311_NOT_AUTHORIZED)))
            delay = 0.0
            if code in (P.BAD_USER_NAME_OR_PASSWORD, P.NOT_AUTHORIZED, P.CONNECTION_RATE_EXCEEDED):
                delay = self.node.auth_guard.failed(self.peer[0] if self.peer else None)
            if delay > 0:
                # Held (core/auth_guard.py): repeated guesses slow down. Nothing more is
                # read from this client meanwhile.
                self._refusing = True
                self.node.call_later(delay, lambda: self._refuse_connect(connack))
            else:
                self._refuse_connect(connack)

    def _refuse_connect(self, connack: bytes) -> None:
        if not self.closed:
            self.send(connack)
            self.close()

    def _connect(self, pkt: Connect) -> int:
        """Act on CONNECT; a non-zero MQTT 5 reason code refuses it."""
        v5 = self.level == MQTT_5
        props = pkt.properties
        self._problem_information = props.get(P.REQUEST_PROBLEM_INFORMATION, 1) == 1
        if P.AUTHENTICATION_METHOD in props:
            return P.BAD_AUTHENTICATION_METHOD
        client_id = pkt.client_id
        assigned = None
        if not client_id:
            if not pkt.clean_start and not v5:
                return P.CLIENT_IDENTIFIER_NOT_VALID
            client_id = assigned = "warren-" + secrets.token_hex(8)
        if len(client_id.encode("utf-8", "surrogateescape")) > MAX_CLIENT_ID_BYTES:
            return P.CLIENT_IDENTIFIER_NOT_VALID
        if self.node.at_connection_max():
            log.warning(
                "%s: MQTT connection refused: max_connections (%d) reached",
                self.name,
                self.state.config.max_connections,
            )
            return P.QUOTA_EXCEEDED
        auth = self.state.authenticate(
            pkt.username, pkt.password, self.peer[0] if self.peer else None, self.cert_login
        )
        if isinstance(auth, int):
            return auth
        user, vhost_name = auth
        vhost = self.node.vhosts[vhost_name]
        config = self.state.config
        if pkt.will is not None and not self._allowed(user, vhost_name, WRITE, "exchange"):
            return P.NOT_AUTHORIZED
        if pkt.will is not None and _too_long(pkt.will.topic):
            return P.TOPIC_NAME_INVALID
        self.user = user
        # Session expiry: 3.1.1's clean session flag, or MQTT 5's interval (capped).
        if v5:
            asked = props.get(P.SESSION_EXPIRY_INTERVAL, 0)
            assert isinstance(asked, int)
            expiry = min(asked, config.mqtt_max_session_expiry) if asked else 0
        else:
            asked = expiry = 0 if pkt.clean_start else NEVER_EXPIRES
        self.state.take_over(vhost_name, client_id, self)
        self.vhost = vhost
        self.client_id = client_id
        stored = None if pkt.clean_start else self.state.stored_session(vhost_name, client_id)
        if stored is None:
            # A clean start ends whatever was kept (queue, subscriptions, QoS 2 state).
            if self.state.stored_session(vhost_name, client_id) is not None or pkt.clean_start:
                self.state.discard_session(vhost, client_id)
            session = Session(client_id, vhost_name, expiry)
        else:
            session = stored
            session.expiry = expiry
            session.disconnected_at = None
        self.session = session
        if not session.persistent:
            self.state.sessions(vhost_name).forget(client_id)
        # Keep alive, receive maximum, sizes, aliases.
        self.keepalive = pkt.keep_alive
        connack: P.Properties = {}
        if config.mqtt_max_keepalive and (
            not self.keepalive or self.keepalive > config.mqtt_max_keepalive
        ):
            self.keepalive = config.mqtt_max_keepalive
            if v5:
                connack[P.SERVER_KEEP_ALIVE] = self.keepalive
        receive_max = props.get(P.RECEIVE_MAXIMUM, 65535)
        assert isinstance(receive_max, int)
        self.window = min(receive_max, config.mqtt_prefetch)
        client_max = props.get(P.MAXIMUM_PACKET_SIZE)
        self.client_max_packet = client_max if isinstance(client_max, int) else 0
        alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
        self.alias_max_out = alias_max if isinstance(alias_max, int) else 0
        self._alias_max_in = config.mqtt_topic_alias_maximum if v5 else 0
        self.decoder.max_packet_size = config.max_message_size + PACKET_OVERHEAD
        self._will = pkt.will
        if v5:
            if assigned is not None:
                connack[P.ASSIGNED_CLIENT_IDENTIFIER] = assigned
            if asked != expiry:
                connack[P.SESSION_EXPIRY_INTERVAL] = expiry
            if self._alias_max_in:
                connack[P.TOPIC_ALIAS_MAXIMUM] = self._alias_max_in
            connack[P.MAXIMUM_PACKET_SIZE] = self.decoder.max_packet_size
            connack[P.RECEIVE_MAXIMUM] = MAX_AWAITING_RELEASE
        self.send(encode(ConnAck(stored is not None, 0, connack), self.level))
        self.node.connection_opened(self)
        log.debug(
            "%s: MQTT %s client '%s' connected as '%s' to vhost '%s' (session %s)",
            self.name,
            "5" if v5 else "3.1.1",
            client_id,
            user.name,
            vhost_name,
            "resumed" if stored is not None else "new",
        )
        if session.persistent:
            self.state.sessions(vhost_name).save(session)
        # Resume: outgoing QoS 2 releases first, then the queued messages.
        for pid in sorted(session.released):
            self.send(encode(PubRel(pid), self.level))
        self.attach_consumers()
        return 0

    def _allowed(self, user: User, vhost: str, kind: str, resource: str) -> bool:
        name = self.state.config.mqtt_exchange if resource == "exchange" else resource
        try:
            self.node.users.check(user, vhost, kind, resource, name)
        except BrokerError:
            return False
        return True

    # -- packets after CONNECT --------------------------------------------------------------
    def _control(self, pkt: object) -> None:
        if isinstance(pkt, PingReq):
            self.send(b"\xd0\x00")
        elif isinstance(pkt, Subscribe):
            self._subscribe(pkt)
        elif isinstance(pkt, Unsubscribe):
            self._unsubscribe(pkt)
        elif isinstance(pkt, PubRec):
            self.received(pkt.packet_id, pkt.reason_code)
        elif isinstance(pkt, PubComp):
            self.completed(pkt.packet_id)
        elif isinstance(pkt, PubRel):
            self._release(pkt.packet_id)
        elif isinstance(pkt, Disconnect):
            self._disconnect(pkt)
        elif isinstance(pkt, Connect):
            raise ProtocolViolation(P.PROTOCOL_ERROR, "a second CONNECT")
        else:
            raise ProtocolViolation(P.PROTOCOL_ERROR, f"unexpected {type(pkt).__name__}")

    def _disconnect(self, pkt: Disconnect) -> None:
        session = self.session
        assert session is not None
        expiry = pkt.properties.get(P.SESSION_EXPIRY_INTERVAL)
        if isinstance(expiry, int):
            if not session.expiry and expiry:
                raise ProtocolViolation(
                    P.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 on CONNECT"
                )
            session.expiry = min(expiry, self.state.config.mqtt_max_session_expiry)
        self._clean_exit = pkt.reason_code != P.DISCONNECT_WITH_WILL_MESSAGE
        self.close()

    # -- PUBLISH from the client -------------------------------------------------------------
    def _publish_raw(self, first: int, buf: bytes, pos: int, end: int) -> None:
        """A PUBLISH straight from the read buffer: topic bytes looked up in a cache
        (validated and mapped once per topic), no packet object; packets with MQTT 5
        properties or an empty topic take the codec's full path."""
        qos = (first >> 1) & 3
        if qos == 3 or (first & 8 and not qos) or end - pos < 2:
            self._publish(decode_publish(first, buf, pos, end, self.level == MQTT_5))
            return
        tstop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
        if tstop > end:
            self._publish(decode_publish(first, buf, pos, end, self.level == MQTT_5))
            return
        raw_topic = buf[pos + 2 : tstop]
        names = self._topics_in.get(raw_topic)
        p = tstop
        pid = None
        if qos:
            if p + 2 > end:
                self._publish(decode_publish(first, buf, pos, end, self.level == MQTT_5))
                return
            pid = buf[p] << 8 | buf[p + 1]
            p += 2
        if names is None or not pid and qos or (self.level == MQTT_5 and (p >= end or buf[p])):
            # New topic, packet id 0, or MQTT 5 properties: the codec decodes and checks.
            pkt = decode_publish(first, buf, pos, end, self.level == MQTT_5)
            if names is None and pkt.topic and not pkt.properties and not _too_long(pkt.topic):
                if len(self._topics_in) >= TOPIC_CACHE_LIMIT:
                    self._topics_in.clear()
                self._topics_in[raw_topic] = (pkt.topic, mqtt_to_amqp(pkt.topic))
            self._publish(pkt)
            return
        if self.level == MQTT_5:
            p += 1  # the property length, 0
        self._route_publish(
            names[0], names[1], buf[p:end], qos, bool(first & 8), bool(first & 1), pid, None
        )

    def _publish(self, pkt: Publish) -> None:
        vhost = self.vhost
        if vhost is None:
            raise ProtocolViolation(P.PROTOCOL_ERROR, "PUBLISH before CONNECT")
        topic = pkt.topic
        props = pkt.properties
        if props:
            alias = props.get(P.TOPIC_ALIAS)
            if alias is not None:
                assert isinstance(alias, int)
                if alias > self._alias_max_in:
                    raise ProtocolViolation(
                        P.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range"
                    )
                if topic:
                    self._aliases_in[alias] = topic
                else:
                    known = self._aliases_in.get(alias)
                    if known is None:
                        raise ProtocolViolation(P.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                    topic = known
                props = {k: v for k, v in props.items() if k != P.TOPIC_ALIAS}
        if _too_long(topic):
            raise ProtocolViolation(
                P.TOPIC_NAME_INVALID, f"topic name longer than {MAX_TOPIC_BYTES} bytes"
            )
        self._route_publish(
            topic,
            mqtt_to_amqp(topic),
            pkt.payload,
            pkt.qos,
            pkt.dup,
            pkt.retain,
            pkt.packet_id,
            props or None,
        )

    def _route_publish(
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
        vhost = self.vhost
        assert vhost is not None
        session = self.session
        assert session is not None
        if qos == 2 and pid in session.awaiting_release:
            # A resent QoS 2 PUBLISH we already have: acknowledge again, route nothing.
            self.send(encode(PubRec(pid), self.level))
            return
        if qos == 2 and len(session.awaiting_release) >= MAX_AWAITING_RELEASE:
            raise ProtocolViolation(
                P.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than {MAX_AWAITING_RELEASE} QoS 2 messages awaiting PUBREL",
            )
        exchange = self._exchange
        if self._can_publish is None:
            self._can_publish = self.user is not None and self._allowed(
                self.user, vhost.name, WRITE, "exchange"
            )
            try:
                exchange = self._exchange = vhost.get_exchange(self.state.config.mqtt_exchange)
            except BrokerError:
                self._can_publish = False
        if not self._can_publish or exchange is None:
            self._refuse_publish(qos, pid, topic, P.NOT_AUTHORIZED)
            return
        user = self.user
        if user is not None and user.topic_permissions and exchange.type == "topic":
            try:
                UserStore.check_topic(
                    user, vhost.name, exchange.name, routing_key, WRITE, self._variables()
                )
            except BrokerError:
                self._refuse_publish(qos, pid, topic, P.NOT_AUTHORIZED)
                return
        if self.node.alarms:
            self.set_blocked(True)
        now = self.now_ms or int(time.time() * 1000)
        if props is None and not self.no_local_subscriptions:
            amqp_props = plain_properties(qos, dup, retain)
        else:
            amqp_props = to_properties(
                qos,
                dup,
                retain,
                props or {},
                self.client_id if self.no_local_subscriptions else None,
            )
        msg = Message(exchange.name, routing_key, amqp_props, payload, now)
        self.stats.publish += 1
        durable: list[Any] | None = [] if qos else None
        if retain:
            expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL) if props else None
            retained = self.state.retained(vhost.name)
            retained.put(RetainedMessage.published(topic, payload, qos, amqp_props, now, expiry))
            if durable is not None and retained.log is not None:
                durable.append(retained.log)
        routed = vhost.publish(exchange, msg, durable)
        if not routed:
            self.stats.drop_unroutable += 1
        if not qos:
            return
        assert pid is not None
        code = 0
        if routed < 0:
            code = P.QUOTA_EXCEEDED
        elif routed == 0 and self.level == MQTT_5:
            code = P.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = encode(PubAck(pid, code), self.level) if code else _puback(pid)
        else:
            ack = encode(PubRec(pid, code), self.level)
            if code < 0x80:
                session.awaiting_release.add(pid)
                if session.persistent:
                    store = self.state.sessions(vhost.name)
                    store.save(session)
                    if durable is not None and store.log is not None:
                        durable.append(store.log)
        syncer = self.node.syncer
        if durable and syncer is not None and syncer.enabled:
            self._ack_after_sync(ack, durable, syncer)
        elif self._sync_batch is not None:
            self._sync_batch.append(ack)  # after those still waiting: acks keep their order
        else:
            self.send(ack)

    def _refuse_publish(self, qos: int, pid: int | None, topic: str, code: int) -> None:
        # A warning for the first refusal, debug lines after it: a client retrying in
        # a loop must not flood the log.
        self._refusals += 1
        log.log(
            logging.WARNING if self._refusals == 1 else logging.DEBUG,
            "%s: MQTT client '%s' may not publish to '%s' (exchange '%s')",
            self.name,
            self.client_id,
            topic,
            self.state.config.mqtt_exchange,
        )
        if self.level != MQTT_5:
            self.close()  # 3.1.1 has no way to say no (RabbitMQ closes too)
        elif qos == 1:
            self.send(encode(PubAck(pid or 0, code), MQTT_5))
        elif qos == 2:
            self.send(encode(PubRec(pid or 0, code), MQTT_5))

    def _ack_after_sync(self, ack: bytes, stores: list[Any], syncer: Any) -> None:
        round_id = syncer.next_round
        if self._sync_batch is None or self._sync_round != round_id:
            batch: list[bytes] = [ack]
            self._sync_batch = batch
            self._sync_round = round_id
            self._waiting_batches += 1
            syncer.after_sync(stores, lambda ok: self._synced(batch, ok))
        else:
            syncer.add(stores)
            self._sync_batch.append(ack)

    def _synced(self, batch: list[bytes], ok: bool) -> None:
        self._waiting_batches -= 1
        if self._sync_batch is batch:
            self._sync_batch = None
        if self.closed:
            return
        if not ok:
            log.error("%s: the disk sync behind a publish failed: closing", self.name)
            self.disconnect(P.UNSPECIFIED_ERROR, "could not sync to disk")
            return
        for ack in batch:
            self.send(ack)

    def _release(self, pid: int) -> None:
        session = self.session
        assert session is not None
        if pid in session.awaiting_release:
            session.awaiting_release.discard(pid)
            if session.persistent:
                assert self.vhost is not None
                self.state.sessions(self.vhost.name).save(session)
            self.send(encode(PubComp(pid), self.level))
        else:
            self.send(encode(PubComp(pid, P.PACKET_IDENTIFIER_NOT_FOUND), self.level))

    # -- ClientConnection (what the broker and the management API use) ------------------------
    def set_blocked(self, blocked: bool) -> None:
        if self.reading_control is not None:
            self.reading_control(not blocked)

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """MQTT has no consumer timeout: unacknowledged messages wait for the client."""

    def info(self) -> dict[str, Any]:
        from warren.mqtt.management import connection_info

        return connection_info(self)

    def channels_info(self) -> list[dict[str, Any]]:
        from warren.mqtt.management import channels_info

        return channels_info(self)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        return [(self.vhost.name, self.stats)] if self.vhost is not None else []


def _too_long(topic: str) -> bool:
    """Over MAX_TOPIC_BYTES in UTF-8 (at most 4 bytes a character: short ones pass)."""
    return len(topic) > MAX_TOPIC_BYTES // 4 and (
        len(topic.encode("utf-8", "surrogateescape")) > MAX_TOPIC_BYTES
    )


def _puback(pid: int) -> bytes:
    return bytes((0x40, 2, pid >> 8, pid & 0xFF))
