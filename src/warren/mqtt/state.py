"""What the MQTT side of the broker keeps between connections.

One `MQTTState` per broker, shared by the TCP, TLS and WebSocket transports:
the connected sessions by (vhost, client id) for takeover, each vhost's
persistent sessions and retained messages (on disk under
``<data_dir>/mqtt/<sha1(vhost)>/``), wills waiting out their delay, and the
timers that end expired sessions. Time and timers are the broker's clock
(``node.clock``, core/clock.py).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warren.core.codec_errors import DecodeError
from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.users import WRITE, User, UserStore
from warren.mqtt import properties as P
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.mapping import to_properties
from warren.mqtt.packets import Connect, Will
from warren.mqtt.retained import RetainedMessage, RetainedStore
from warren.mqtt.session import (
    NEVER_EXPIRES,
    Session,
    SessionStore,
    queue_name,
    shared_queue_name,
)
from warren.mqtt.topics import mqtt_to_amqp
from warren.mqtt.unfinished import UnfinishedPackets
from warren.store.layout import write_file

if TYPE_CHECKING:
    from warren.core.clock import TimerHandle
    from warren.core.vhost import VHost
    from warren.mqtt.connection import MQTTConnection
    from warren.node import Node

__all__ = ["MQTTState"]

log = logging.getLogger("warren.mqtt")

Key = tuple[str, str]


class MQTTState:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.clock = node.clock
        self.live: dict[Key, MQTTConnection] = {}
        self._retained: dict[str, RetainedStore] = {}
        self._sessions: dict[str, SessionStore] = {}
        self._wills: dict[Key, TimerHandle] = {}
        self._expiries: dict[Key, TimerHandle] = {}
        self._pending_wills: dict[Key, tuple[Will, User, str]] = {}
        #: The data directory (its budget and mirror go to the MQTT logs).
        self.data = node.layout
        self._root: Path | None = node.layout.root / "mqtt"
        #: Bytes in unfinished packets, against [mqtt] partial_packet_memory.
        self.unfinished = UnfinishedPackets(node.config.mqtt_partial_packet_memory)

    # -- per-vhost stores ---------------------------------------------------------------
    def _dir(self, vhost: str) -> Path | None:
        if self._root is None:
            return None
        return self._root / hashlib.sha1(vhost.encode("utf-8", "surrogateescape")).hexdigest()

    def retained(self, vhost: str) -> RetainedStore:
        store = self._retained.get(vhost)
        if store is None:
            d = self._dir(vhost)
            store = self._retained[vhost] = RetainedStore(
                d / "retained.log" if d is not None else None,
                self.config.damaged_metadata,
                budget=self.data.budget,
                mirror=self.data.mirror,
            )
        return store

    def sessions(self, vhost: str) -> SessionStore:
        store = self._sessions.get(vhost)
        if store is None:
            d = self._dir(vhost)
            store = self._sessions[vhost] = SessionStore(
                vhost,
                d / "sessions.log" if d is not None else None,
                self.config.damaged_metadata,
                budget=self.data.budget,
                mirror=self.data.mirror,
            )
            if d is not None:
                name = vhost.encode("utf-8", "surrogateescape")
                write_file(d / "vhost", name, mirror=self.data.mirror)
        return store

    def start(self) -> None:
        """Load the stored sessions and retained messages of every vhost and arm the
        sessions' expiry timers. A damaged file refuses the start here (DamagedFile),
        not at the first client that needs it; with damaged_metadata = set-aside it
        is kept aside and what could be read goes on (store/damage.py)."""
        now = self.clock.now_ms()
        for name in list(self.node.vhosts):
            d = self._dir(name)
            if d is not None and (d / "retained.log").exists():
                self.retained(name)
            if d is not None and (d / "sessions.log").exists():
                for session in list(self.sessions(name).sessions.values()):
                    if session.disconnected_at is None:
                        # Connected when the broker died: its expiry counts from now.
                        session.disconnected_at = now
                    self._rearm_will(self.node.vhosts[name], session, now)
                    self._arm_expiry(session)

    def forget_vhost(self, vhost: str) -> None:
        """The vhost is deleted (its clients are gone): its sessions, wills and
        retained messages go with it (the broker removes the directory), so a
        new vhost of the same name starts without them."""
        for table in (self._wills, self._expiries):
            for key in [k for k in table if k[0] == vhost]:
                table.pop(key).cancel()
        for key in [k for k in self._pending_wills if k[0] == vhost]:
            del self._pending_wills[key]
        retained = self._retained.pop(vhost, None)
        if retained is not None:
            retained.close()
        sessions = self._sessions.pop(vhost, None)
        if sessions is not None:
            sessions.close()

    def close(self) -> None:
        for timer in [*self._wills.values(), *self._expiries.values()]:
            timer.cancel()
        self._wills.clear()
        self._expiries.clear()
        for store in self._retained.values():
            store.close()
        for sstore in self._sessions.values():
            sstore.close()
        self._retained.clear()
        self._sessions.clear()

    # -- authentication -------------------------------------------------------------------
    # -- sessions -------------------------------------------------------------------------
    def take_over(self, vhost: str, client_id: str, conn: MQTTConnection) -> None:
        """Register ``conn`` as the client id's connection; an earlier one is closed
        first (MQTT 5: DISCONNECT 0x8E), its session detached."""
        key = (vhost, client_id)
        old = self.live.get(key)
        if old is not None and old is not conn:
            old.taken_over()
        self.live[key] = conn
        self.cancel_will(key)
        timer = self._expiries.pop(key, None)
        if timer is not None:
            timer.cancel()

    def released(self, conn: MQTTConnection, vhost: str, client_id: str) -> None:
        key = (vhost, client_id)
        if self.live.get(key) is conn:
            del self.live[key]

    def stored_session(self, vhost: str, client_id: str) -> Session | None:
        return self.sessions(vhost).sessions.get(client_id)

    def discard_session(self, vhost: VHost, client_id: str) -> None:
        """End a stored session: forget it, delete its queue, drop its shared
        subscriptions' queues if nobody else subscribes to them."""
        store = self.sessions(vhost.name)
        session = store.sessions.get(client_id)
        store.forget(client_id)
        try:
            vhost.delete_queue(queue_name(client_id))
        except BrokerError as exc:
            log.warning("MQTT session '%s': deleting its queue failed: %s", client_id, exc)
        if session is not None:
            for opts in session.subscriptions.values():
                if opts.group is not None:
                    self.release_shared(vhost, opts.group, opts.binding_key, client_id)

    def session_ended(self, vhost: VHost, session: Session) -> None:
        """A persistent session's connection is gone: store it, arm its expiry."""
        session.disconnected_at = self.clock.now_ms()
        self.sessions(vhost.name).save(session)
        self._arm_expiry(session)

    def _arm_expiry(self, session: Session) -> None:
        if session.expiry == NEVER_EXPIRES or session.disconnected_at is None:
            return
        key = (session.vhost, session.client_id)
        if key in self.live:
            return
        vhost = self.node.vhosts.get(session.vhost)
        if vhost is None:
            return
        left = session.disconnected_at + session.expiry * 1000 - self.clock.now_ms()
        old = self._expiries.pop(key, None)
        if old is not None:
            old.cancel()
        self._expiries[key] = self.clock.call_later(left, lambda: self._expire(key, session))

    def _expire(self, key: Key, session: Session) -> None:
        self._expiries.pop(key, None)
        if key in self.live:
            return
        vhost = self.node.vhosts.get(key[0])
        if vhost is None:
            return
        log.info("MQTT session '%s' in vhost '%s' expired", key[1], key[0])
        # A will delayed beyond the session's end is published now (MQTT-3.1.3-9).
        timer = self._wills.pop(key, None)
        if timer is not None:
            timer.cancel()
            will = self._pending_wills.pop(key, None)
            if will is not None:
                self.publish_will(vhost, *will)
        self.discard_session(vhost, session.client_id)

    def shared_members(self, vhost: str, group: str, binding_key: str) -> int:
        """Sessions (connected or stored) subscribed to the shared queue."""
        n = 0
        seen: set[str] = set()
        for (vh, cid), conn in self.live.items():
            if vh == vhost and conn.has_shared(group, binding_key):
                n += 1
                seen.add(cid)
        for cid, session in self.sessions(vhost).sessions.items():
            if cid in seen:
                continue
            if session.subscriptions.has_shared(group, binding_key):
                n += 1
        return n

    def release_shared(self, vhost: VHost, group: str, binding_key: str, leaving: str) -> None:
        """``leaving`` no longer subscribes to the shared queue: delete it when no one does."""
        members = self.shared_members(vhost.name, group, binding_key)
        conn = self.live.get((vhost.name, leaving))
        if conn is not None and conn.has_shared(group, binding_key):
            members -= 1
        if members <= 0:
            vhost.delete_queue(shared_queue_name(group, binding_key))

    # -- wills ------------------------------------------------------------------------------
    def schedule_will(self, vhost: VHost, session: Session, will: Will, user: User) -> None:
        """Publish the will now, or after its MQTT 5 Will Delay Interval (cut short by
        the session's end) unless the client id reconnects first. A delayed will is
        kept in the (persistent) session's record, so a restart still publishes it."""
        delay = will.properties.get(P.WILL_DELAY_INTERVAL, 0)
        assert isinstance(delay, int)
        delay = min(delay, session.expiry)
        if delay <= 0:
            self.publish_will(vhost, will, user, session.client_id)
            return
        self._arm_will(vhost, session.client_id, will, user, delay * 1000)
        session.pending_will = {
            "connect": base64.b64encode(
                encode(Connect(session.client_id, 5, will=will), 5)
            ).decode(),
            "user": user.name,
            "due": self.clock.now_ms() + delay * 1000,
        }  # after _arm_will, whose cancel_will clears an older one

    def _arm_will(
        self, vhost: VHost, client_id: str, will: Will, user: User, delay_ms: int
    ) -> None:
        key = (vhost.name, client_id)
        self.cancel_will(key)
        self._pending_wills[key] = (will, user, client_id)

        def fire() -> None:
            self._wills.pop(key, None)
            pending = self._pending_wills.pop(key, None)
            if pending is not None:
                self.publish_will(vhost, *pending)
            stored = self.sessions(vhost.name).sessions.get(client_id)
            if stored is not None and stored.pending_will is not None:
                stored.pending_will = None
                self.sessions(vhost.name).save(stored)

        self._wills[key] = self.clock.call_later(delay_ms, fire)

    def _rearm_will(self, vhost: VHost, session: Session, now: int) -> None:
        """After a restart: the stored delayed will, published when it is due."""
        pending = session.pending_will
        if pending is None:
            return
        user = self.node.users.users.get(str(pending.get("user")))
        try:
            raw = base64.b64decode(str(pending["connect"]))
            connect = Decoder().feed(raw)[0]
            will = connect.will if isinstance(connect, Connect) else None
            due = int(pending["due"])
        except (KeyError, ValueError, TypeError, IndexError, DecodeError) as exc:
            log.warning(
                "MQTT session '%s': unreadable delayed will dropped: %s", session.client_id, exc
            )
            will = None
            due = 0
        if will is None or user is None:
            session.pending_will = None
            return
        self._arm_will(vhost, session.client_id, will, user, max(due - now, 0))
        session.pending_will = pending  # kept over another restart until it fires

    def cancel_will(self, key: Key) -> None:
        timer = self._wills.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._pending_wills.pop(key, None)
        stored = self.sessions(key[0]).sessions.get(key[1]) if key[0] in self._sessions else None
        if stored is not None:
            stored.pending_will = None

    def publish_will(self, vhost: VHost, will: Will, user: User, client_id: str) -> None:
        """Checked as RabbitMQ checks a will when it sends it: the exchange's write
        permission and the topic permission of its topic."""
        try:
            name = self.config.mqtt_exchange
            self.node.users.check(user, vhost.name, WRITE, "exchange", name)
            if user.topic_permissions and vhost.get_exchange(name).type == "topic":
                variables = {"username": user.name, "vhost": vhost.name, "client_id": client_id}
                key = mqtt_to_amqp(will.topic)
                UserStore.check_topic(user, vhost.name, name, key, WRITE, variables)
            self.publish(vhost, will.topic, will.payload, will.qos, will.retain, will.properties)
        except BrokerError as exc:
            log.warning(
                "MQTT client '%s': will on '%s' not published: %s", client_id, will.topic, exc
            )

    def publish(
        self,
        vhost: VHost,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        props: dict[int, Any],
    ) -> int:
        """Route one message from MQTT (a will, or a publish made for a client)."""
        exchange = vhost.get_exchange(self.config.mqtt_exchange)
        now = self.clock.now_ms()
        amqp_props = to_properties(qos, False, retain, props)
        if retain:
            expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL)
            self.retained(vhost.name).put(
                RetainedMessage.published(topic, payload, qos, amqp_props, now, expiry)
            )
        return vhost.router.publish(
            exchange, Message(exchange.name, mqtt_to_amqp(topic), amqp_props, payload, now)
        )
