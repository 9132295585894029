"""The sans-IO MQTT 3.1.1 / 5.0 connection: packets in, core calls, packets out.

`MQTTConnection.feed(data)` decodes every complete packet and acts on it, a
budget of work per call (the rest is ``backlog`` for the next loop turn); what
is to be sent is gathered in ``pending`` and announced once through
``on_output`` (the asyncio layer writes it all in one call). No socket, no
clock of its own: ``now_ms`` is set by the caller per read, and keep alive and
the unfinished packet's deadline are checked by `tick` (its bytes count
against the broker's budget, unfinished.py). CONNECT is handled in
connect.py. The connection holds three parts: ``publishing`` (PUBLISH and
PUBREL from the client: publishing.py), ``delivery`` (core queue -> PUBLISH,
the in-flight window, the client's acks: delivery.py) and ``subscriptions``
(SUBSCRIBE and UNSUBSCRIBE: subscriptions.py). The state shared between
connections (takeover, stored sessions, retained messages, wills) is in
state.py; the acknowledgements that wait for the disk sync in sync_acks.py.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.client_listing import connection_name
from warren.core.errors import BrokerError
from warren.core.session import ClientSession
from warren.core.stats import Ages, MessageStats, OctetStats
from warren.core.users import User
from warren.mqtt import properties as P
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.connect import MAX_UNAUTHENTICATED_PACKET, before_connect, reauthenticate
from warren.mqtt.delivery import Delivery
from warren.mqtt.errors import MQTTCodecError, ProtocolViolation, UnsupportedProtocolVersion
from warren.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    Will,
)
from warren.mqtt.publishing import Publishing
from warren.mqtt.session import Session
from warren.mqtt.subscriptions import Subscriptions
from warren.mqtt.sync_acks import SyncedAcks

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.vhost import VHost
    from warren.mqtt.state import MQTTState

__all__ = ["MQTTConnection"]

log = logging.getLogger("warren.mqtt")

#: Work a connection does per loop turn before the rest of its input waits for
#: the next one (the protocol stops reading meanwhile), so that one client's
#: burst never stalls the others: a packet costs 1, a SUBSCRIBE's or
#: UNSUBSCRIBE's topic filter FILTER_COST (subscriptions.py).
WORK_BUDGET = 512


class MQTTConnection:
    """One client's connection (any transport). Also a ClientConnection for the broker.

    Packets in, keep alive and closing are its own; the client's publishes are
    its `publishing` part, what goes out to the client its `delivery` part, the
    session's subscriptions its `subscriptions` part."""

    def __init__(
        self,
        state: MQTTState,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
        on_output: Callable[[], None],
        on_close: Callable[[], None],
        transport_name: str = "MQTT",
    ) -> None:
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
        self.connected_at = state.clock.now_ms()
        self.pending: list[bytes] = []
        self.vhost: VHost | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.closed = False
        self.problem_information = True
        self._detached = False
        self.keepalive = 0
        self.user: User | None = None
        #: The CONNECT's Authentication Method (connect.py's TOKEN_METHOD), None: none.
        self.auth_method: str | None = None
        self.will: Will | None = None
        self._clean_exit = False
        #: A refused CONNECT waiting out its delay: input is ignored meanwhile.
        self.refusing = False
        #: ms to hold the refusal of a failed login (core/auth_guard.py).
        self.refusal_delay = 0.0
        #: The client's session with the core: when answers may go out.
        self.client_session = ClientSession(state.node, self)
        #: What goes out to the client: PUBLISH, the in-flight window (delivery.py).
        self.delivery = Delivery(self.send, state, self.stats, self.client_session)
        #: SUBSCRIBE/UNSUBSCRIBE, bindings, share groups (subscriptions.py).
        self.subscriptions = Subscriptions(self, self.delivery)
        #: Publish acknowledgements waiting for their messages (sync_acks.py).
        self.synced_acks = SyncedAcks(self)
        #: PUBLISH and PUBREL from the client (publishing.py).
        self.publishing = Publishing(self)
        #: Bytes of an unfinished packet the decoder holds (state.unfinished counts
        #: them against the broker's budget), and since when (ms; None: none).
        self._unfinished = 0
        self._unfinished_since: int | None = None
        #: Packets read and not yet acted on: (buffer, frames, index of the next).
        self._input: deque[tuple[bytes, list[tuple[int, int, int]], int]] = deque()
        #: Input is left for the next loop turn (the protocol then calls feed(b"")).
        self.backlog = False
        #: Asks the transport to call feed(b"") on the next loop turns while
        #: ``backlog`` (after held replies went out).
        self.request_drain: Callable[[], None] | None = None

    # -- the sans-IO surface ----------------------------------------------------------------
    @property
    def name(self) -> str:
        return connection_name(self.peer, self.local)

    def send(self, data: bytes) -> None:
        pending = self.pending
        pending.append(data)
        if len(pending) == 1:
            self.on_output()

    def output_mark(self) -> int:
        """Where the output not yet taken ends now: what is sent after it can be
        held back (hold_output)."""
        return len(self.pending)

    def hold_output(self, mark: int) -> list[bytes]:
        """Take back what was sent since ``mark`` (a reply that must wait until
        what it reports is durable); send it again with send() in order."""
        held = self.pending[mark:]
        del self.pending[mark:]
        return held

    def take_output(self) -> list[bytes]:
        if self.synced_acks.write_out_due:
            # sync = false: acks promise the message reached at least the OS.
            if self.vhost is not None:
                self.vhost.flush_written()
            self.synced_acks.written()
        out, self.pending = self.pending, []
        return out

    def feed(self, data: bytes) -> None:
        """Act on the complete packets in ``data`` (after any still waiting from
        earlier reads), at most WORK_BUDGET's worth: the rest waits for the next
        loop turn (``backlog``; the protocol calls feed(b"") again). PUBLISH bodies
        are parsed here without building packet objects, the rest by the codec."""
        if self.closed or self.refusing:
            return
        if data:
            try:
                buf, frames = self.decoder.frames(data)
            except MQTTCodecError as exc:
                self._codec_error(exc)
                return
            if frames:
                # Keep alive counts control packets (MQTT-3.1.2-24), not bytes: a
                # client trickling a partial packet is still closed on time.
                self.last_rx_ms = self.now_ms
                self._input.append((buf, frames, 0))
            held = self.decoder.held()
            if held:
                if frames or self._unfinished_since is None:
                    self._unfinished_since = self.now_ms  # a packet started
            else:
                self._unfinished_since = None
            if held != self._unfinished:
                self._unfinished = held
                self.state.unfinished.changed(self, held)
                if self.closed:
                    return  # over the broker's budget
        self._work()

    def _work(self) -> None:
        """Process waiting input until it is done, the budget is spent, or replies
        are held (subscriptions.py)."""
        budget = WORK_BUDGET
        pending = self._input
        subs = self.subscriptions
        while not self.closed and subs.held is None:
            if subs.batch is not None:
                budget = self._advance(budget)
                if subs.batch is not None:
                    break  # out of budget, or its reply is held
            elif pending and budget > 0:
                buf, frames, index = pending[0]
                index, budget = self._packets(buf, frames, index, budget)
                if self.closed:
                    break  # its input is gone with it
                if index < len(frames):
                    pending[0] = (buf, frames, index)
                else:
                    pending.popleft()
            else:
                break
        if self.closed:
            pending.clear()
            subs.batch = None
        self.backlog = subs.held is None and (subs.batch is not None or bool(pending))
        self.delivery.apply_acks()

    def _packets(
        self, buf: bytes, frames: list[tuple[int, int, int]], index: int, budget: int
    ) -> tuple[int, int]:
        """Act on frames[index:] until the budget is spent or a SUBSCRIBE or
        UNSUBSCRIBE starts (its filters take the budget next); the next index and
        the budget left."""
        decoder = self.decoder
        publishing = self.publishing
        delivery = self.delivery
        connected = self.vhost is not None
        n = len(frames)
        while index < n and budget > 0 and not self.closed:
            first, start, end = frames[index]
            index += 1
            budget -= 1
            try:
                kind = first >> 4
                if kind == 3 and connected:
                    publishing.publish_raw(first, buf, start, end)
                    continue
                if first == 0x40 and end - start == 2 and connected:
                    # A PUBACK with only its packet id (every 3.1.1 one, a 5.0
                    # Success): no packet object for the commonest packet in.
                    delivery.settle((buf[start] << 8) | buf[start + 1])
                    continue
                pkt = decoder.decode(first, buf, start, end)
                if type(pkt) is PubAck:
                    delivery.settle(pkt.packet_id)
                elif not connected:
                    before_connect(self, pkt)
                    connected = self.vhost is not None
                else:
                    self._control(pkt)
                    if self.subscriptions.batch is not None:
                        break
            except MQTTCodecError as exc:
                self._codec_error(exc)
                break
            except ProtocolViolation as exc:
                self.disconnect(exc.reason_code, str(exc))
            except BrokerError as exc:
                log.warning("%s: %s", self.name, exc)
                self.disconnect(P.IMPLEMENTATION_SPECIFIC_ERROR, str(exc))
            except OSError as exc:  # a retained message or session not written: disk full
                log.warning("%s: cannot write to disk (%s): closing", self.name, exc)
                self.disconnect(P.QUOTA_EXCEEDED, "could not write to disk")
        return index, budget

    def _advance(self, budget: int) -> int:
        """Go on with the SUBSCRIBE or UNSUBSCRIBE under way; the budget left."""
        subs = self.subscriptions
        steps = subs.batch
        assert steps is not None
        try:
            while budget > 0 and subs.held is None and not self.closed:
                budget -= next(steps)
        except StopIteration:
            subs.batch = None
        except ProtocolViolation as exc:
            subs.batch = None
            self.disconnect(exc.reason_code, str(exc))
        except BrokerError as exc:
            subs.batch = None
            log.warning("%s: %s", self.name, exc)
            self.disconnect(P.IMPLEMENTATION_SPECIFIC_ERROR, str(exc))
        return budget

    def resume(self) -> None:
        """Held replies are out: go on with the input, and reading (subscriptions.py)."""
        self._work()
        if self.backlog and self.request_drain is not None:
            self.request_drain()
        if self.reading_control is not None:
            self.reading_control(not self.node.alarms)

    def tick(self, now_ms: int) -> int:
        """Keep alive: close a client silent for 1.5 keep alive periods; close one
        whose unfinished packet is older than [mqtt] packet_timeout (with any keep
        alive, 0 too). Returns the milliseconds until the next check is due (0:
        none)."""
        if self.closed:
            return 0
        due = 0
        deadline = self.unfinished_deadline()
        if deadline is not None:
            if now_ms >= deadline:
                since = self._unfinished_since
                assert since is not None
                log.warning(
                    "%s: MQTT client '%s' closed: a packet of %d bytes started %.1f s "
                    "ago is still unfinished (%d bytes arrived; [mqtt] packet_timeout %g s)",
                    self.name,
                    self.client_id,
                    self.decoder.announced(),
                    (now_ms - since) / 1000,
                    self._unfinished,
                    self.state.config.mqtt_packet_timeout,
                )
                self.disconnect(P.KEEP_ALIVE_TIMEOUT, "packet not completed in time")
                return 0
            due = deadline - now_ms
        if self.keepalive:
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
            due = min(due, deadline - now_ms) if due else deadline - now_ms
        return due

    def unfinished_deadline(self) -> int | None:
        """When the unfinished packet must be complete (ms), None: no such limit."""
        since = self._unfinished_since
        timeout = self.state.config.mqtt_packet_timeout
        if since is None or not timeout:
            return None
        return since + int(timeout * 1000)

    # -- what unfinished.py's budget asks -------------------------------------------------
    def announced(self) -> int:
        return self.decoder.announced()

    def over_budget(self, reason: str) -> None:
        self.disconnect(P.QUOTA_EXCEEDED, reason)

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
            if reason and self.problem_information:
                props[P.REASON_STRING] = reason[:200]
            self.send(encode(Disconnect(reason_code, props), MQTT_5))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.delivery.stop()
            self._let_go_of_input()
            self.on_close()

    def _let_go_of_input(self) -> None:
        """A closed connection keeps no unfinished packet (nor its share of the
        broker's budget) for as long as its transport lingers."""
        self.decoder.discard()
        self._input.clear()
        self._unfinished_since = None
        if self._unfinished:
            self._unfinished = 0
            self.state.unfinished.changed(self, 0)

    def taken_over(self) -> None:
        """Another connection CONNECTed with this client id: end this one now."""
        log.info("%s: MQTT client '%s' taken over by a new connection", self.name, self.client_id)
        self.disconnect(P.SESSION_TAKEN_OVER, "session taken over")
        self.connection_lost()

    def force_close(self, reason: str) -> None:
        log.info("%s: closed by an operator: %s", self.name, reason)
        self.disconnect(P.ADMINISTRATIVE_ACTION, reason)

    def credential_expired(self) -> None:
        """Its OAuth 2 token expired (core/session.py): MQTT 5 DISCONNECT 0xA0
        Maximum connect time, as RabbitMQ's plugin; 3.1.1: the socket closes."""
        self.disconnect(P.MAXIMUM_CONNECT_TIME, "credential expired")

    def connection_lost(self) -> None:
        """The transport is gone (or the connection was taken over): detach the
        session, publish the will unless the client disconnected normally."""
        self.closed = True
        self.delivery.stop()
        self._let_go_of_input()
        vhost, session = self.vhost, self.session
        if vhost is None or session is None or self._detached:
            return
        self._detached = True
        self.delivery.apply_acks()
        self.delivery.detach_consumers()
        self.state.released(self, vhost.name, session.client_id)
        self.client_session.closed(self, vhost)
        if vhost.deleted:  # its sessions, wills and retained messages went with it
            return
        if self.will is not None and not self._clean_exit and self.user is not None:
            try:
                self.state.schedule_will(vhost, session, self.will, self.user)
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

    # -- permissions ------------------------------------------------------------------------
    def allowed(self, kind: str, resource: str) -> bool:
        """Whether the user has ``kind`` permission on ``resource`` (the MQTT
        exchange when ``resource`` is "exchange"): for the will and PUBLISH."""
        name = self.state.config.mqtt_exchange if resource == "exchange" else resource
        return self.client_session.allowed(kind, resource, name)

    # -- packets after CONNECT --------------------------------------------------------------
    def _control(self, pkt: object) -> None:
        if isinstance(pkt, PingReq):
            self.send(b"\xd0\x00")
        elif isinstance(pkt, Subscribe):
            self.subscriptions.subscribe(pkt)
        elif isinstance(pkt, Unsubscribe):
            self.subscriptions.unsubscribe(pkt)
        elif isinstance(pkt, PubRec):
            self.delivery.received(pkt.packet_id, pkt.reason_code)
        elif isinstance(pkt, PubComp):
            self.delivery.completed(pkt.packet_id)
        elif isinstance(pkt, PubRel):
            self.publishing.release(pkt.packet_id)
        elif isinstance(pkt, Disconnect):
            self._disconnect(pkt)
        elif isinstance(pkt, Auth):
            reauthenticate(self, pkt)
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

    # -- ClientConnection (what the broker and the management API use) ------------------------
    @property
    def writable(self) -> bool:
        """The transport takes more output (deliveries wait while it does not)."""
        return self.delivery.writable

    def set_writable(self, writable: bool) -> None:
        self.delivery.set_writable(writable)

    def has_shared(self, group: str, binding_key: str) -> bool:
        """Whether this connection's session is in the share group (state.py asks)."""
        session = self.session
        return session is not None and session.subscriptions.has_shared(group, binding_key)

    def set_blocked(self, blocked: bool) -> None:
        if self.reading_control is not None:
            self.reading_control(not blocked)

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """MQTT has no consumer timeout: unacknowledged messages wait for the client."""

    def info(self) -> dict[str, Any]:
        from warren.mqtt.management import connection_info

        return connection_info(self)

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        from warren.mqtt.management import channels_info

        return channels_info(self, ages)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        return [(self.vhost.name, self.stats)] if self.vhost is not None else []

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        return []  # RabbitMQ 3.13's MQTT keeps no channel_* series either

