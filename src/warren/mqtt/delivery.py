"""Messages from core queues to an MQTT client: PUBLISH out, PUBACK/PUBREC/PUBCOMP in.

A session consumes its own queue (every non-shared subscription is a binding
of it) and the queue of each ``$share`` group it belongs to, through one
`MQTTConsumer` per queue. Deliveries at QoS 1 and 2 are in flight under a
packet id until the client settles them, at most ``window`` at a time (the
client's Receive Maximum, capped by ``mqtt_prefetch``); the queue message is
acknowledged on PUBACK, or on PUBREC for QoS 2 (then the PUBREL/PUBCOMP
exchange is the session's). When the connection ends, messages still in
flight go back to their queue in their original order, and the session
remembers their packet ids so a resumed session re-sends them with the same
id and DUP set.

Consuming and settling are the client session's (core/deliveries.py): the
consumers are attached through the connection's delivery stream, which
keeps every delivery the queue wants settled. A QoS 1/2 delivery's delivery
tag is its packet id (unique among those in flight), so one map holds what is
in flight and a PUBACK finds its delivery with one lookup; the deliveries that
get no packet id (QoS 0 to a consumer that acknowledges, dropped ones) take
the stream's own numbers, above every packet id, and are settled at once.
Retained messages in flight have a packet id but no queue: ``unqueued`` holds
those. What is MQTT's stays here: packet ids, the window, QoS
2's release, the retained backlog, and which acks wait for the end of the
loop turn (one settlement per turn).
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from warren.core.consumer import Consumer
from warren.core.message import Message
from warren.core.stats import count_delivery
from warren.mqtt import properties as P
from warren.mqtt.codec import _e_props, _e_vbi, encode
from warren.mqtt.mapping import from_message
from warren.mqtt.packets import MQTT_5, PubRel
from warren.mqtt.retained import RetainedMessage, filter_matches
from warren.mqtt.session import Session, SubscriptionOptions
from warren.mqtt.topics import amqp_to_mqtt, is_valid_topic_name

if TYPE_CHECKING:
    from warren.core.queue import Queue
    from warren.core.session import ClientSession
    from warren.core.stats import MessageStats
    from warren.core.unsettled import Unsettled
    from warren.core.vhost import VHost
    from warren.mqtt.state import MQTTState

__all__ = ["Delivery", "MQTTConsumer"]

log = logging.getLogger("warren.mqtt")

_U16 = struct.Struct("!H").pack
#: The largest packet id: the delivery stream numbers the deliveries that get
#: none above it.
_PID_MAX = 0xFFFF
_TOPIC_CACHE_LIMIT = 4096


class MQTTConsumer(Consumer):
    """The session's subscription to one queue (its own, or a share group's)."""

    __slots__ = ("conn", "shared")

    def __init__(self, conn: Delivery, queue: Queue, shared: SubscriptionOptions | None) -> None:
        super().__init__(conn.deliveries, f"mqtt-{conn.client_id}", queue, no_ack=False)
        self.conn = conn
        #: For a share group's queue: that subscription's options.
        self.shared = shared

    def can_take(self) -> bool:
        conn = self.conn
        if not conn.writable or conn.closed:
            return False
        if self.no_ack:
            return True
        # Retained messages for a SUBSCRIBE go first.
        return not conn.window_full() and not conn._retained_backlog

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        self.conn.deliver(self, seq, msg, redelivered)

    def cancelled(self) -> None:
        """The queue was deleted under the session (by an operator): it goes on
        without it; a later SUBSCRIBE declares it again."""
        self.conn.deliveries.cancelled(self.queue.name, self)


class Delivery:
    """The outgoing half of one MQTT connection: the session's consumers, PUBLISH
    out, the in-flight window and the client's PUBACK/PUBREC/PUBCOMP.

    What it needs from the connection is given, not reached for: ``send`` (the
    connection's output), the MQTT state, the connection's message stats and
    client session at construction, and the vhost, session, client id and
    protocol level once CONNECT has chosen them (`start`). The connection calls
    `stop` when it closes (nothing more is sent) and `set_writable` for the
    transport's flow control."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        state: MQTTState,
        stats: MessageStats,
        client_session: ClientSession,
    ) -> None:
        self.send = send
        self.state = state
        self.stats = stats
        self.client_session = client_session
        #: The connection's delivery stream in its client session (core/deliveries.py).
        self.deliveries = client_session.deliveries(stats)
        self.vhost: VHost | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        #: The connection is closing or closed: no more deliveries.
        self.closed = False
        self.writable = True
        #: Unsettled QoS 1/2 deliveries at most (the client's Receive Maximum).
        self.window = 100
        self.client_max_packet = 0
        self.alias_max_out = 0
        self._aliases_out: dict[str, int] = {}
        # Queue deliveries in flight are the stream's unsettled ones under their
        # packet id; its own numbers start above every packet id.
        self.deliveries.last_tag = _PID_MAX
        #: Packet ids in flight that no queue waits for (retained messages).
        self.unqueued: set[int] = set()
        #: The consumers by queue name (the delivery stream's).
        self.consumers = self.deliveries.consumers
        self._next_pid = 0
        # Deliveries the client settled, acked at the end of the loop turn.
        self._acks: list[Unsettled] = []
        self._topics: dict[str, bytes] = {}
        #: Retained QoS 1/2 messages for a SUBSCRIBE waiting for room in the window.
        self._retained_backlog: deque[tuple[RetainedMessage, SubscriptionOptions]] = deque()

    def start(
        self,
        vhost: VHost,
        session: Session,
        client_id: str,
        level: int,
        window: int,
        client_max_packet: int,
        alias_max_out: int,
    ) -> None:
        """CONNECT chose the session: deliver for it, within the client's limits."""
        self.vhost = vhost
        self.session = session
        self.client_id = client_id
        self.level = level
        self.window = window
        self.client_max_packet = client_max_packet
        self.alias_max_out = alias_max_out

    def stop(self) -> None:
        """The connection closes: its consumers take nothing more."""
        self.closed = True

    def __str__(self) -> str:
        return f"MQTT client '{self.client_id}'"

    # -- consumers ------------------------------------------------------------------------
    def ensure_consumer(self, queue: Queue, shared: SubscriptionOptions | None = None) -> None:
        """Consume ``queue`` (a share group's when ``shared`` gives its subscription)."""
        if queue.name in self.consumers:
            return
        consumer = MQTTConsumer(self, queue, shared)
        self.update_no_ack(consumer)
        self.deliveries.consume(queue.name, consumer)

    def set_shared(self, queue: str, opts: SubscriptionOptions) -> None:
        """The share group's consumer of ``queue`` delivers with these options."""
        consumer = self.consumers.get(queue)
        if isinstance(consumer, MQTTConsumer):
            consumer.shared = opts

    def drop_shared_consumer(self, opts: SubscriptionOptions) -> None:
        """Leave a share group: what is in flight from its queue goes back (to
        any member, under a new packet id), and the consumer is cancelled."""
        name = f"mqtt-shared-{opts.group}-{opts.binding_key}"
        consumer = self.consumers.get(name)
        if consumer is not None:
            self._return_inflight(consumer.queue)
            self.deliveries.cancel(name)

    def consumers_changed(self, queue: str | None = None) -> None:
        """After a change to the session's subscriptions: whether the consumer of
        ``queue`` (None: every consumer) acknowledges. O(1) for one queue (the
        session's counts are kept as they change)."""
        if queue is None:
            for consumer in self.consumers.values():
                if isinstance(consumer, MQTTConsumer):
                    self.update_no_ack(consumer)
        else:
            one = self.consumers.get(queue)
            if isinstance(one, MQTTConsumer):
                self.update_no_ack(one)

    def update_no_ack(self, consumer: MQTTConsumer) -> None:
        """Only QoS 0 subscriptions: nothing is ever acknowledged, so the queue may
        forget a message as it hands it over (and skip storing it)."""
        if consumer.shared is not None:
            consumer.no_ack = consumer.shared.qos == 0
            return
        session = self.session
        assert session is not None
        subs = session.subscriptions
        consumer.no_ack = bool(subs.own) and subs.own_qos == 0

    def detach_consumers(self) -> None:
        """Stop consuming: the delivery stream closes, whatever is in flight goes
        back to its queue, in order; the session keeps the packet ids of its own
        queue's messages for their resend."""
        session = self.session
        if session is not None:
            self._remember_ids(None)
        self.unqueued.clear()
        self.deliveries.close()

    def _remember_ids(self, queue: Queue | None) -> list[tuple[int, int]]:
        """The (seq, packet id) of the messages in flight from ``queue`` (None:
        every queue); the session remembers those of its own queue (a share
        group's message may go to any member: a new id then)."""
        session = self.session
        assert session is not None
        found: list[tuple[int, int]] = []
        for pid, entry in self.deliveries.unsettled.singles.items():
            if pid > _PID_MAX or entry[0].deleted:
                continue  # not in flight, or its queue is gone
            if queue is not None and entry[0] is not queue:
                continue
            seq = entry[1]
            found.append((seq, pid))
            if entry[0].name == session.queue:
                session.redeliver[seq] = pid
        return found

    def _return_inflight(self, queue: Queue) -> None:
        """What is in flight from ``queue`` goes back to it, in queue order."""
        back = sorted(self._remember_ids(queue))
        if back:
            take = self.deliveries.take_one
            self.deliveries.settle([take(tag) for _seq, tag in back], [], True, explicit=False)

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            self.deliveries.resume()

    # -- acknowledgements from the client ----------------------------------------------------
    def settle(self, pid: int) -> None:
        """PUBACK: the client has the QoS 1 message."""
        entry = self.deliveries.take_entry(pid)
        if entry is not None:
            self._ack_taken(entry)
        elif pid in self.unqueued:
            self.unqueued.discard(pid)
            self._window_opened()  # a retained message: no queue ack to do it
        else:
            log.debug("%s: PUBACK for unknown packet id %d", self, pid)

    def received(self, pid: int, reason_code: int) -> None:
        """PUBREC: the client has the QoS 2 message; release it (PUBREL)."""
        entry = self.deliveries.take_entry(pid)
        known = entry is not None
        if not known and pid in self.unqueued:
            self.unqueued.discard(pid)
            known = True
        session = self.session
        assert session is not None
        if reason_code >= 0x80 or (not known and pid not in session.released):
            if entry is not None:
                self._ack_taken(entry)
            if reason_code < 0x80:
                self.send(encode(PubRel(pid, P.PACKET_IDENTIFIER_NOT_FOUND), self.level))
            return  # refused (or unknown): the exchange ends here
        session.released.add(pid)
        if session.persistent and self.vhost is not None:
            store = self.state.sessions(self.vhost.name)
            store.save(session)
            if entry is not None and store.log is not None:
                # The queue message goes only once the release is on disk: an ack
                # that a power cut kept without it loses the message, which the
                # client holds until a PUBREL the broker would no longer send.
                # Taken out meanwhile: a close does not requeue it.
                taken = entry
                entry = None
                if not self.client_session.when_synced(
                    [store.log], lambda ok: self._released(taken, ok)
                ):
                    self._ack_taken(taken)
        if entry is not None:
            self._ack_taken(entry)
        self.send(encode(PubRel(pid), self.level))

    def _released(self, taken: Unsettled, synced: bool) -> None:
        """The release of a QoS 2 delivery is on disk: acknowledge its queue message
        (if the sync failed, put it back rather: a resend, never a loss)."""
        if synced:
            self._ack_taken(taken)
        else:
            self.deliveries.settle([(0, taken)], [], True, explicit=False)

    def completed(self, pid: int) -> None:
        """PUBCOMP: the QoS 2 exchange is over."""
        session = self.session
        assert session is not None
        if pid in session.released:
            session.released.discard(pid)
            if session.persistent and self.vhost is not None:
                self.state.sessions(self.vhost.name).save(session)
            self._window_opened()

    def _ack_taken(self, taken: Unsettled) -> None:
        """Ack a delivery taken out at the end of the loop turn (apply_acks)."""
        acks = self._acks
        if not acks and self.vhost is not None:
            self.vhost.call_soon(self.apply_acks)
        acks.append(taken)

    def _ack_at_once(self, queue: Queue, seq: int, msg: Message, consumer: MQTTConsumer) -> None:
        """A delivery that is settled as it goes out (QoS 0, dropped): numbered
        by the stream above the packet ids, and acked at the end of the turn."""
        deliveries = self.deliveries
        tag = deliveries.next_tag()
        deliveries.track(tag, queue, seq, msg, consumer)
        self._ack_taken(deliveries.unsettled.singles.pop(tag))

    def apply_acks(self) -> None:
        """Acknowledge what the client settled, one call per queue (the delivery
        stream's settle), then let the queues deliver into the window that
        opened."""
        if not self._acks:
            return
        acks, self._acks = self._acks, []
        self.deliveries.ack_entries(acks)
        self._window_opened()

    def _window_opened(self) -> None:
        backlog = self._retained_backlog
        if backlog:
            now = self.state.clock.now_ms()
            while backlog and not self.window_full():
                msg, opts = backlog.popleft()
                self.send_retained(msg, opts, now)
        self.deliveries.resume()

    # -- PUBLISH to the client ---------------------------------------------------------------
    def window_full(self) -> bool:
        """No room for another QoS 1/2 PUBLISH: the client's Receive Maximum counts
        each until PUBACK, or PUBCOMP for QoS 2."""
        session = self.session
        released = len(session.released) if session is not None else 0
        return self.in_flight() + released >= self.window

    def in_flight(self) -> int:
        """QoS 1/2 messages sent and not yet acknowledged (PUBACK or PUBREC)."""
        return len(self.deliveries.unsettled.singles) + len(self.unqueued)

    def _in_use(self, pid: int) -> bool:
        session = self.session
        return (
            pid in self.deliveries.unsettled.singles
            or pid in self.unqueued
            or (session is not None and pid in session.released)
        )

    def _pid(self) -> int:
        singles = self.deliveries.unsettled.singles
        unqueued = self.unqueued
        session = self.session
        released: Collection[int] = session.released if session is not None else ()
        pid = self._next_pid
        for _ in range(_PID_MAX + 1):
            pid = pid % _PID_MAX + 1
            if pid not in singles and pid not in unqueued and pid not in released:
                self._next_pid = pid
                return pid
        raise RuntimeError("no free packet identifier")

    def deliver(self, consumer: MQTTConsumer, seq: int, msg: Message, redelivered: bool) -> None:
        out = from_message(msg)
        shared = consumer.shared
        session = self.session
        assert session is not None
        subs: Collection[SubscriptionOptions] = (
            (shared,) if shared is not None else session.subscriptions.own.values()
        )
        drop = False
        if len(subs) == 1 and msg.routing_key[:1] != "$":
            sub = next(iter(subs))
            qos = min(out.qos, sub.qos)
            retain = out.retain and sub.retain_as_published
            ids = [sub.identifier] if sub.identifier else None
            if sub.no_local and out.client_id == self.client_id:
                drop = True
        elif not subs:
            # Unsubscribed with messages still queued for the session: they go out
            # as published (MQTT-3.10.4-5 lets the server deliver what it buffered).
            qos, retain, ids = out.qos, False, None
        else:
            topic = amqp_to_mqtt(msg.routing_key)
            matching: Collection[SubscriptionOptions] = (
                session.subscriptions.index.matching(topic)
                if shared is None
                else [o for o in subs if _matches(o, topic)]
            )
            if not matching:
                # A wildcard first level does not match a $ topic (MQTT-4.7.2-1),
                # though the AMQP binding it became does; other routes still count.
                if topic[:1] == "$":
                    drop = True
                matching = subs
            qos = min(out.qos, max((o.qos for o in matching), default=0))
            retain = out.retain and any(o.retain_as_published for o in matching)
            ids = [o.identifier for o in matching if o.identifier] or None
            if out.client_id == self.client_id and all(o.no_local for o in matching):
                drop = True
        if not drop and out.expires_at is not None and out.expires_at <= self.state.clock.now_ms():
            drop = True  # expired on the way (the queue's TTL usually sees it first)
        queue = consumer.queue
        no_ack = consumer.no_ack
        count_delivery(self.stats, queue.stats, no_ack, redelivered)
        if drop:
            if not no_ack:
                self._ack_at_once(queue, seq, msg, consumer)
            return
        pid = 0
        dup = redelivered
        if qos:
            # Not gated on ``redelivered``: the queue forgets that flag over a
            # restart, the session's record of what was in flight does not. Only
            # the session's own queue is recorded (queues number alike).
            if session.redeliver and seq in session.redeliver and queue.name == session.queue:
                pid = session.redeliver.pop(seq)
                dup = True
                if self._in_use(pid):
                    pid = self._pid()
            else:
                pid = self._pid()
        packet = self._publish_packet(
            msg.routing_key, msg.body, qos, dup and qos > 0, retain, out, ids, pid
        )
        if packet is None or not qos:
            # Settled as it goes (or is not sent): the queue may forget it.
            if not no_ack:
                self._ack_at_once(queue, seq, msg, consumer)
        elif no_ack:
            self.unqueued.add(pid)
        else:
            # In flight until PUBACK (PUBREC): kept under its packet id.
            self.deliveries.track(pid, queue, seq, msg, consumer)
        if packet is not None:
            self.send(packet)

    def send_retained(self, msg: RetainedMessage, opts: SubscriptionOptions, now: int) -> None:
        """A retained message on SUBSCRIBE: retain flag set, QoS at most the subscription's."""
        qos = min(msg.qos, opts.qos)
        if qos and self.window_full():
            # Receive Maximum holds for retained messages too (MQTT-3.3.4-9).
            self._retained_backlog.append((msg, opts))
            return
        out = from_message(Message("", "", msg.properties, msg.payload, msg.timestamp))
        pid = self._pid() if qos else 0
        ids = [opts.identifier] if opts.identifier else None
        packet = self._publish_packet(
            "", msg.payload, qos, False, True, out, ids, pid, topic=msg.topic, now=now
        )
        if packet is None:
            return
        if qos:
            self.unqueued.add(pid)
        self.send(packet)

    def _publish_packet(
        self,
        routing_key: str,
        payload: bytes,
        qos: int,
        dup: bool,
        retain: bool,
        out: Any,
        ids: list[int] | None,
        pid: int,
        topic: str | None = None,
        now: int = 0,
    ) -> bytes | None:
        """PUBLISH bytes built by hand (the codec's dataclasses are for the rare packets);
        None when the client's Maximum Packet Size is too small for it."""
        if topic is None:
            raw_topic = self._topics.get(routing_key)
            if raw_topic is None:
                if len(self._topics) > _TOPIC_CACHE_LIMIT:
                    self._topics.clear()
                name = amqp_to_mqtt(routing_key)
                if is_valid_topic_name(name):
                    t = name.encode("utf-8")
                    raw_topic = _U16(len(t)) + t
                else:
                    # Published over AMQP ("", a "*" or "#", U+0000, invalid UTF-8): no
                    # MQTT client may be sent that, and a persistent session would get
                    # it again on every reconnect. Not sent (b"": known not to be).
                    log.warning(
                        "MQTT client '%s': routing key %r is not a valid MQTT topic name: "
                        "its messages are not sent to MQTT clients",
                        self.client_id,
                        routing_key,
                    )
                    raw_topic = b""
                self._topics[routing_key] = raw_topic
            if not raw_topic:
                return None
        else:
            t = topic.encode("utf-8", "surrogateescape")
            raw_topic = _U16(len(t)) + t
        v5 = self.level == MQTT_5
        if not v5 or (
            not out.properties and out.expires_at is None and not ids and not self.alias_max_out
        ):
            # The common case: no properties to send, one join.
            size = len(raw_topic) + len(payload) + (2 if qos else 0) + (1 if v5 else 0)
            first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
            head = bytes((first,)) + _e_vbi(size) + raw_topic
            if (
                self.client_max_packet
                and len(head) - len(raw_topic) + size > self.client_max_packet
            ):
                log.debug("%s: message over the client's maximum packet size dropped", self)
                return None
            if qos:
                head += _U16(pid)
            return head + (b"\x00" if v5 else b"") + payload
        body = [raw_topic]
        if qos:
            body.append(_U16(pid))
        if v5:
            props: P.Properties = {}
            if out.properties:
                props.update(out.properties)
            if out.expires_at is not None:
                left = out.expires_at - (now or self.state.clock.now_ms())
                props[P.MESSAGE_EXPIRY_INTERVAL] = max((left + 999) // 1000, 0)
            if ids:
                props[P.SUBSCRIPTION_IDENTIFIER] = ids
            if self.alias_max_out:
                name = amqp_to_mqtt(routing_key) if topic is None else topic
                alias = self._aliases_out.get(name)
                if alias is not None:
                    body[0] = b"\x00\x00"
                    props[P.TOPIC_ALIAS] = alias
                elif len(self._aliases_out) < self.alias_max_out:
                    alias = self._aliases_out[name] = len(self._aliases_out) + 1
                    props[P.TOPIC_ALIAS] = alias
            body.append(_e_props(props) if props else b"\x00")
        body.append(payload)
        size = sum(len(b) for b in body)
        first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
        head = bytes((first,)) + _e_vbi(size)
        if self.client_max_packet and len(head) + size > self.client_max_packet:
            log.debug("%s: message over the client's maximum packet size dropped", self)
            return None
        return head + b"".join(body)


def _matches(opts: SubscriptionOptions, topic: str) -> bool:
    return filter_matches(opts.binding_key.replace(".", "/").replace("*", "+"), topic)
