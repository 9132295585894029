"""MQTT durability: sessions, in-flight QoS 1/2 state, retained messages and wills
across reconnects and broker restarts on the same data dir.

Moved from tests/protocol/mqtt/ to the in-memory harness (issue 29): none of this needs
a socket. A broker restart is a new Harness on the same data dir; session
expiry, will delays and message expiry run on a ManualClock. `RawClient` is
harness.RawMQTT (the test writes every byte; the broker's are read by
harness.mqtt_decode, not by Warren's codec), `paho_publish` paho's own client
in memory. The kill -9 tests need a process: tests/protocol/mqtt/test_mqtt_kill9.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mqttraw
import pytest
from harness import Harness
from memclients import (
    BrokerThread,
    Factory,
    RawClient,
    harnesses,
    mqtt_port,
    paho_publish,
    wait_for,
)

from warren.core.clock import ManualClock
from warren.mqtt import properties as P
from warren.mqtt.packets import (
    MQTT_5,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from warren.mqtt.session import queue_name
from warren.mqtt.state import MQTTState

pytestmark = pytest.mark.timeout(60)

LEVELS = [pytest.param(4, id="3.1.1"), pytest.param(MQTT_5, id="5")]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Factory]:
    yield from harnesses(tmp_path)


@pytest.fixture
def broker(broker_factory: Factory) -> Harness:
    return broker_factory()


def state(b: Harness) -> MQTTState:
    return b.mqtt_listener().state


def persistent(level: int) -> dict[str, Any]:
    """CONNECT arguments for a session that outlives its connection."""
    if level == MQTT_5:
        return {"clean": False, "properties": {P.SESSION_EXPIRY_INTERVAL: 3600}}
    return {"clean": False}


def has_queue(b: BrokerThread, name: str) -> bool:
    return b.call(lambda: name in b.broker.vhosts["/"].queues)


def queue_count(b: BrokerThread, name: str) -> int:
    """Messages in the queue: ready plus delivered and not yet acknowledged."""

    def count() -> int:
        q = b.broker.vhosts["/"].queues[name]
        return q.message_count + q.unacked

    return b.call(count)


def gone(b: BrokerThread, client_id: str) -> bool:
    """The broker no longer has a live connection for the client id."""
    return b.call(lambda: ("/", client_id) not in state(b).live)


def restart(factory: Factory, b: BrokerThread) -> BrokerThread:
    """The same broker again (on its ManualClock, if it had one)."""
    b.stop()
    clock = b.broker.clock
    return factory(clock=clock) if isinstance(clock, ManualClock) else factory()


@pytest.fixture
def clocked(broker_factory: Factory) -> BrokerThread:
    """A broker on a ManualClock: session expiry, delayed wills and message expiry
    happen when the test moves the clock."""
    return broker_factory(clock=ManualClock())


# -- persistent sessions -------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_persistent_session_survives_restart(broker_factory: Factory, level: int) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as sub:
        ack = sub.connect("keeper", **persistent(level))
        assert not ack.session_present and ack.reason_code == 0
        assert sub.subscribe("news/#", qos=1).reason_codes == [1]
        sub.disconnect()
    paho_publish(mqtt_port(b), "news/a", [b"before-1", b"before-2"], level=level)
    b = restart(broker_factory, b)
    assert has_queue(b, queue_name("keeper"))
    assert queue_count(b, queue_name("keeper")) == 2
    # The binding survived too: a message published after the restart is routed.
    paho_publish(mqtt_port(b), "news/b", [b"after-restart"], level=level)
    with RawClient(mqtt_port(b), level) as sub:
        ack = sub.connect("keeper", **persistent(level))
        assert ack.session_present and ack.reason_code == 0
        got = sub.publishes(3)
        assert [(p.topic, p.payload, p.qos) for p in got] == [
            ("news/a", b"before-1", 1),
            ("news/a", b"before-2", 1),
            ("news/b", b"after-restart", 1),
        ]
        sub.send(*(PubAck(p.packet_id or 0) for p in got))
        # Live delivery on the resumed session.
        paho_publish(mqtt_port(b), "news/c", [b"live"], level=level)
        live = sub.expect(Publish)
        assert (live.topic, live.payload) == ("news/c", b"live")
        sub.send(PubAck(live.packet_id or 0))
        sub.disconnect()
    wait_for(lambda: queue_count(b, queue_name("keeper")) == 0, what="acks applied")


# -- QoS 1 in flight -----------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_qos1_in_flight_redelivered_with_dup_and_same_packet_id(
    broker_factory: Factory, level: int
) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as sub:
        sub.connect("inflight", **persistent(level))
        sub.subscribe("f/#", qos=1)
        paho_publish(mqtt_port(b), "f/x", [b"m%d" % i for i in range(5)], level=level)
        first = sub.publishes(5)
        assert [p.payload for p in first] == [b"m%d" % i for i in range(5)]
        assert not any(p.dup for p in first)
        pids = [p.packet_id for p in first]
        assert len(set(pids)) == 5
        # Settle one in the middle: it must not come back.
        sub.send(PubAck(pids[2] or 0))
        wait_for(lambda: queue_count(b, queue_name("inflight")) == 4, what="PUBACK applied")
        sub.close()  # abrupt: no DISCONNECT
    expected = [(pids[i], b"m%d" % i) for i in (0, 1, 3, 4)]

    wait_for(lambda: gone(b, "inflight"), what="the first connection to end")
    with RawClient(mqtt_port(b), level) as sub:
        assert sub.connect("inflight", **persistent(level)).session_present
        again = sub.publishes(4)
        assert [(p.packet_id, p.payload) for p in again] == expected
        assert all(p.dup and p.qos == 1 for p in again)
        # Still not acknowledged, and the broker restarts under the connection.
        b = restart(broker_factory, b)
        tail = sub.wait_closed()
        if level == MQTT_5:
            assert [(type(p), p.reason_code) for p in tail] == [
                (Disconnect, P.SERVER_SHUTTING_DOWN)
            ]

    with RawClient(mqtt_port(b), level) as sub:
        assert sub.connect("inflight", **persistent(level)).session_present
        after = sub.publishes(4)
        assert [(p.packet_id, p.payload) for p in after] == expected
        assert all(p.dup and p.qos == 1 for p in after)
        sub.send(*(PubAck(p.packet_id or 0) for p in after))
        # Acknowledged now: a new message is the next (and only) thing delivered.
        paho_publish(mqtt_port(b), "f/x", [b"fresh"], level=level)
        fresh = sub.expect(Publish)
        assert (fresh.payload, fresh.dup) == (b"fresh", False)
        sub.send(PubAck(fresh.packet_id or 0))
        sub.disconnect()
    wait_for(lambda: queue_count(b, queue_name("inflight")) == 0, what="acks applied")


# -- QoS 2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_inbound_exactly_once_across_restart(broker_factory: Factory, level: int) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as watcher:
        watcher.connect("q2-watcher", **persistent(level))
        watcher.subscribe("q2/#", qos=1)
        watcher.disconnect()
    with RawClient(mqtt_port(b), level) as pub:
        pub.connect("q2-pub", **persistent(level))
        pub.send(Publish("q2/t", b"once", qos=2, packet_id=77))
        rec = pub.expect(PubRec)
        assert (rec.packet_id, rec.reason_code) == (77, 0)
        pub.close()  # before PUBREL
    b = restart(broker_factory, b)
    with RawClient(mqtt_port(b), level) as pub:
        assert pub.connect("q2-pub", **persistent(level)).session_present
        # The client resends the PUBLISH (DUP): acknowledged again, not routed again.
        pub.send(Publish("q2/t", b"once", qos=2, dup=True, packet_id=77))
        rec = pub.expect(PubRec)
        assert (rec.packet_id, rec.reason_code) == (77, 0)
        pub.send(PubRel(77))
        comp = pub.expect(PubComp)
        assert (comp.packet_id, comp.reason_code) == (77, 0)
        # The id is free again: a PUBLISH reusing it is a new message.
        pub.send(Publish("q2/t", b"marker", qos=2, packet_id=77))
        assert pub.expect(PubRec).packet_id == 77
        pub.send(PubRel(77))
        assert pub.expect(PubComp).packet_id == 77
        pub.disconnect()
    with RawClient(mqtt_port(b), level) as watcher:
        assert watcher.connect("q2-watcher", **persistent(level)).session_present
        got = watcher.publishes(2)
        assert [p.payload for p in got] == [b"once", b"marker"], "delivered twice or lost"
        watcher.send(*(PubAck(p.packet_id or 0) for p in got))
        watcher.disconnect()


def test_pubrel_for_unknown_packet_id(broker: BrokerThread) -> None:
    with RawClient(mqtt_port(broker), MQTT_5) as c:
        c.connect("stray-rel")
        c.send(PubRel(9))
        comp = c.expect(PubComp)
        assert (comp.packet_id, comp.reason_code) == (9, P.PACKET_IDENTIFIER_NOT_FOUND)
        c.disconnect()


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_outbound_pubrel_resent_after_reconnect_and_restart(
    broker_factory: Factory, level: int
) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as sub:
        sub.connect("q2-sub", **persistent(level))
        assert sub.subscribe("out/#", qos=2).reason_codes == [2]
        paho_publish(mqtt_port(b), "out/x", [b"two"], qos=2, level=level)
        msg = sub.expect(Publish)
        assert (msg.payload, msg.qos, msg.dup) == (b"two", 2, False)
        pid = msg.packet_id
        sub.send(PubRec(pid or 0))
        assert sub.expect(PubRel).packet_id == pid
        sub.close()  # before PUBCOMP
    wait_for(lambda: gone(b, "q2-sub"), what="the connection to end")
    with RawClient(mqtt_port(b), level) as sub:
        assert sub.connect("q2-sub", **persistent(level)).session_present
        assert sub.expect(PubRel).packet_id == pid
        sub.close()  # still no PUBCOMP
    wait_for(lambda: gone(b, "q2-sub"), what="the connection to end")
    # A stop at once: the PUBREC's settlement (the message acked once the
    # session's record of the release is synced) must happen before the stores
    # close, or "two" comes back after the restart (Broker.stop drains the
    # group commit).
    b = restart(broker_factory, b)
    with RawClient(mqtt_port(b), level) as sub:
        assert sub.connect("q2-sub", **persistent(level)).session_present
        assert sub.expect(PubRel).packet_id == pid
        sub.send(PubComp(pid or 0))
        # The message itself was settled by PUBREC: the next delivery is a new one.
        paho_publish(mqtt_port(b), "out/x", [b"next"], qos=1, level=level)
        nxt = sub.expect(Publish)
        assert (nxt.payload, nxt.dup) == (b"next", False)
        sub.send(PubAck(nxt.packet_id or 0))
        sub.disconnect()
    with RawClient(mqtt_port(b), level) as sub:
        assert sub.connect("q2-sub", **persistent(level)).session_present
        # The PUBREL is not sent again once completed (it would come with the CONNACK).
        sub.send(PingReq())
        sub.expect(PingResp)
        sub.disconnect()


# -- retained messages ---------------------------------------------------------------------


def retained_on(port: int, topic_filter: str, level: int = MQTT_5) -> dict[str, bytes]:
    """The retained messages a fresh subscription gets (mqttraw.retained_on)."""
    return mqttraw.retained_on(RawClient(port, level), topic_filter)


@pytest.mark.parametrize("level", LEVELS)
def test_retained_messages_survive_restart_and_clear(broker_factory: Factory, level: int) -> None:
    b = broker_factory()
    port = mqtt_port(b)
    paho_publish(port, "r/a", [b"A"], retain=True, level=level)
    paho_publish(port, "r/b", [b"B1", b"B2"], retain=True, level=level)
    paho_publish(port, "r/c", [b"C"], qos=0, retain=True, level=level)
    b = restart(broker_factory, b)
    assert retained_on(mqtt_port(b), "r/#", level) == {"r/a": b"A", "r/b": b"B2", "r/c": b"C"}
    paho_publish(mqtt_port(b), "r/a", [b""], retain=True, level=level)  # clears r/a
    assert retained_on(mqtt_port(b), "r/#", level) == {"r/b": b"B2", "r/c": b"C"}
    b = restart(broker_factory, b)
    assert retained_on(mqtt_port(b), "r/#", level) == {"r/b": b"B2", "r/c": b"C"}
    paho_publish(mqtt_port(b), "r/b", [b""], retain=True, level=level)
    b = restart(broker_factory, b)
    assert retained_on(mqtt_port(b), "r/#", level) == {"r/c": b"C"}


# -- clean sessions and session expiry ------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_clean_session_leaves_nothing_behind(broker_factory: Factory, level: int) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as c:
        assert not c.connect("cleaner").session_present
        c.subscribe("clean/#", qos=1)
        assert has_queue(b, queue_name("cleaner"))
        c.disconnect()
    wait_for(lambda: not has_queue(b, queue_name("cleaner")), what="the queue to go")
    assert b.call(lambda: "cleaner" not in state(b).sessions("/").sessions)
    b = restart(broker_factory, b)
    assert not has_queue(b, queue_name("cleaner"))
    with RawClient(mqtt_port(b), level) as c:
        assert not c.connect("cleaner", **persistent(level)).session_present
        c.disconnect()


@pytest.mark.parametrize("level", LEVELS)
def test_clean_start_discards_a_stored_session(broker_factory: Factory, level: int) -> None:
    b = broker_factory()
    with RawClient(mqtt_port(b), level) as c:
        c.connect("reset", **persistent(level))
        c.subscribe("reset/#", qos=1)
        c.disconnect()
    paho_publish(mqtt_port(b), "reset/x", [b"old"], level=level)
    assert queue_count(b, queue_name("reset")) == 1
    with RawClient(mqtt_port(b), level) as c:
        assert not c.connect("reset", clean=True).session_present
        c.subscribe("reset/#", qos=1)
        paho_publish(mqtt_port(b), "reset/x", [b"new"], level=level)
        assert c.expect(Publish).payload == b"new"  # "old" went with the old session
        c.disconnect()


def test_session_expiry_ends_the_session(clocked: BrokerThread) -> None:
    broker = clocked
    with RawClient(mqtt_port(broker)) as c:
        c.connect("short", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 1})
        c.subscribe("short/#", qos=1)
        c.disconnect()
    wait_for(lambda: gone(broker, "short"), what="the connection to end")
    # Kept while the interval runs...
    broker.advance(999)
    assert broker.call(lambda: "short" in state(broker).sessions("/").sessions)
    assert has_queue(broker, queue_name("short"))
    # ...and gone after it: the stored session and its queue.
    broker.advance(1)
    assert not has_queue(broker, queue_name("short"))
    assert broker.call(lambda: "short" not in state(broker).sessions("/").sessions)
    with RawClient(mqtt_port(broker)) as c:
        ack = c.connect("short", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 1})
        assert not ack.session_present
        c.disconnect()


def test_session_expiry_runs_across_a_restart(broker_factory: Factory) -> None:
    clock = ManualClock()
    b = broker_factory(clock=clock)
    with RawClient(mqtt_port(b)) as c:
        c.connect("short-r", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 2})
        c.subscribe("short/#", qos=1)
        c.disconnect()
    wait_for(lambda: gone(b, "short-r"), what="the connection to end")
    b.stop()
    clock.advance(500)  # down for half a second: it counts
    b = restart(broker_factory, b)
    b.advance(1499)
    assert b.call(lambda: "short-r" in state(b).sessions("/").sessions)
    b.advance(1)  # 2 s after the disconnect, not after the restart
    assert not has_queue(b, queue_name("short-r"))
    assert b.call(lambda: "short-r" not in state(b).sessions("/").sessions)


def test_session_expiry_set_on_disconnect(broker: BrokerThread) -> None:
    """MQTT 5: DISCONNECT may shorten the interval (here to 0: the session ends now)."""
    with RawClient(mqtt_port(broker)) as c:
        c.connect("shorten", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})
        c.subscribe("shorten/#", qos=1)
        c.disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0})
    wait_for(lambda: not has_queue(broker, queue_name("shorten")), what="the queue to go")
    assert broker.call(lambda: "shorten" not in state(broker).sessions("/").sessions)


# -- wills -------------------------------------------------------------------------------


def watcher(port: int, topic_filter: str = "will/#") -> RawClient:
    w = RawClient(port)
    w.connect("will-watcher-" + topic_filter.strip("/#"))
    w.subscribe(topic_filter, qos=1)
    return w


def next_payload(w: RawClient, timeout: float = 5.0) -> bytes:
    p = w.expect(Publish, timeout)
    if p.qos:
        w.send(PubAck(p.packet_id or 0))
    return p.payload


def mark(port: int, topic: str) -> None:
    """Publish a marker: the watcher's next message shows whether a will came before it."""
    paho_publish(port, topic, [b"marker"])


@pytest.mark.parametrize("level", LEVELS)
def test_will_published_on_abrupt_close_not_on_disconnect(broker: BrokerThread, level: int) -> None:
    port = mqtt_port(broker)
    with watcher(port) as w:
        c = RawClient(port, level)
        c.connect("willer", will=Will("will/a", b"gone", qos=1))
        c.close()
        assert next_payload(w) == b"gone"

        c = RawClient(port, level)
        c.connect("willer", will=Will("will/a", b"should-not", qos=1))
        c.disconnect()
        wait_for(lambda: gone(broker, "willer"), what="the connection to end")
        mark(port, "will/a")
        assert next_payload(w) == b"marker"


def test_will_retained(broker_factory: Factory) -> None:
    b = broker_factory()
    c = RawClient(mqtt_port(b))
    c.connect("ret-willer", will=Will("will/ret", b"offline", qos=1, retain=True))
    c.close()
    wait_for(lambda: gone(b, "ret-willer"), what="the connection to end")
    b = restart(broker_factory, b)
    assert retained_on(mqtt_port(b), "will/#") == {"will/ret": b"offline"}


def test_disconnect_with_will_message_publishes_it(broker: BrokerThread) -> None:
    port = mqtt_port(broker)
    with watcher(port) as w:
        c = RawClient(port)
        c.connect("willer4", will=Will("will/d", b"by-request"))
        c.disconnect(P.DISCONNECT_WITH_WILL_MESSAGE)
        assert next_payload(w) == b"by-request"


def delayed_will(delay: int, payload: bytes) -> Will:
    return Will("will/delayed", payload, 1, False, {P.WILL_DELAY_INTERVAL: delay})


def test_will_delay_cancelled_by_reconnect(clocked: BrokerThread) -> None:
    broker = clocked
    port = mqtt_port(broker)
    props = {P.SESSION_EXPIRY_INTERVAL: 60}
    with watcher(port) as w:
        c = RawClient(port)
        c.connect("delayer", clean=False, properties=props, will=delayed_will(1, b"late"))
        c.close()
        wait_for(lambda: gone(broker, "delayer"), what="the connection to end")
        assert broker.call(lambda: ("/", "delayer") in state(broker)._pending_wills)
        with RawClient(port) as again:  # back within the delay
            assert again.connect("delayer", clean=False, properties=props).session_present
            assert broker.call(lambda: ("/", "delayer") not in state(broker)._pending_wills)
            broker.advance(1500)  # well past the delay: still no will
            mark(port, "will/delayed")
            assert next_payload(w) == b"marker"
            again.disconnect()


def test_will_delay_published_after_the_delay(clocked: BrokerThread) -> None:
    broker = clocked
    port = mqtt_port(broker)
    with watcher(port) as w:
        c = RawClient(port)
        c.connect(
            "delayer2",
            clean=False,
            properties={P.SESSION_EXPIRY_INTERVAL: 60},
            will=delayed_will(1, b"late"),
        )
        c.close()
        wait_for(lambda: gone(broker, "delayer2"), what="the connection to end")
        broker.advance(999)
        mark(port, "will/delayed")
        assert next_payload(w) == b"marker"  # not published before its delay
        broker.advance(1)
        assert next_payload(w, 5) == b"late"


def test_delayed_will_survives_a_restart(broker_factory: Factory) -> None:
    """A will waiting out its delay when the broker stops is published after the
    restart, when due; one whose client came back first is not."""
    clock = ManualClock()
    b = broker_factory(clock=clock)
    port = mqtt_port(b)
    with RawClient(port) as w:  # a persistent watcher, so it hears the will later
        w.connect("will-keeper", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 600})
        w.subscribe("will/#", qos=1)
        w.disconnect()
    for client_id, payload in (("gone-for-good", b"late"), ("comes-back", b"never")):
        c = RawClient(port)
        c.connect(
            client_id,
            clean=False,
            properties={P.SESSION_EXPIRY_INTERVAL: 600},
            will=delayed_will(2, payload),
        )
        c.close()
        wait_for(lambda cid=client_id: gone(b, cid), what="the connection to end")
    b.stop()
    clock.advance(500)  # down for half a second: it counts
    b = restart(broker_factory, b)
    port = mqtt_port(b)
    with RawClient(port) as back:  # returns within the delay: its will is cancelled
        assert back.connect(
            "comes-back", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 600}
        ).session_present
        with RawClient(port) as w:
            assert w.connect(
                "will-keeper", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 600}
            ).session_present
            b.advance(1499)
            mark(port, "will/marker")
            assert next_payload(w, 5) == b"marker"  # not published before its delay
            b.advance(1)
            assert next_payload(w, 5) == b"late"
            mark(port, "will/marker")
            assert next_payload(w, 5) == b"marker"  # and no b"never" before it
        back.disconnect()


def test_will_delay_cut_short_by_session_expiry(broker: BrokerThread) -> None:
    """A clean session ends at the disconnect: its will is not delayed (MQTT-3.1.3-9)."""
    port = mqtt_port(broker)
    with watcher(port) as w:
        c = RawClient(port)
        c.connect("delayer3", will=delayed_will(30, b"now"))
        c.close()
        assert next_payload(w, 5) == b"now"


# -- takeover --------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_session_takeover(broker: BrokerThread, level: int) -> None:
    port = mqtt_port(broker)
    first = RawClient(port, level)
    first.connect("twin", **persistent(level))
    first.subscribe("twin/#", qos=1)
    paho_publish(port, "twin/x", [b"for-first"])
    unacked = first.expect(Publish)
    with RawClient(port, level) as second:
        ack = second.connect("twin", **persistent(level))
        assert ack.session_present and ack.reason_code == 0
        tail = first.wait_closed()
        if level == MQTT_5:
            assert len(tail) == 1 and isinstance(tail[0], Disconnect), tail
            assert tail[0].reason_code == P.SESSION_TAKEN_OVER
        else:
            assert tail == []
        first.close()
        # The session goes on here: the unacknowledged message, then new ones.
        again = second.expect(Publish)
        assert (again.payload, again.dup, again.packet_id) == (
            b"for-first",
            True,
            unacked.packet_id,
        )
        second.send(PubAck(again.packet_id or 0))
        paho_publish(port, "twin/y", [b"for-second"])
        p = second.expect(Publish)
        assert (p.topic, p.payload) == ("twin/y", b"for-second")
        second.send(PubAck(p.packet_id or 0))
        assert broker.call(lambda: state(broker).live[("/", "twin")] is not None)
        second.disconnect()


def test_in_flight_ids_are_per_queue_with_a_shared_subscription(broker_factory: Factory) -> None:
    """The session's queue and a share group's queue number their messages alike: a
    message of one must not take the packet id (and DUP) recorded for the other."""
    b = broker_factory()
    with RawClient(mqtt_port(b)) as sub:
        sub.connect("mixed", **persistent(MQTT_5))
        sub.subscribe("own/#", qos=1, pid=1)
        sub.subscribe("$share/g/sh/#", qos=1, pid=2)
        paho_publish(mqtt_port(b), "sh/x", [b"shr"])
        first = sub.expect(Publish)
        assert (first.payload, first.dup) == (b"shr", False)
        sub.disconnect()  # in flight when the connection ended
    paho_publish(mqtt_port(b), "own/x", [b"own"])  # same size: the same place in its queue
    b = restart(broker_factory, b)
    with RawClient(mqtt_port(b)) as sub:
        assert sub.connect("mixed", **persistent(MQTT_5)).session_present
        got = {p.payload: p for p in sub.publishes(2)}
        assert got[b"own"].dup is False, "a new message sent as a duplicate"
        assert got[b"own"].packet_id != got[b"shr"].packet_id
        sub.send(*(PubAck(p.packet_id or 0) for p in got.values()))
        sub.disconnect()


# -- message expiry ----------------------------------------------------------------------------


def test_message_expiry_interval_forwarded_counts_down(clocked: BrokerThread) -> None:
    """MQTT-3.3.2-6: the interval sent on is the received one minus the time waited,
    for a listening subscriber and for one that comes back for stored messages."""
    broker = clocked
    port = mqtt_port(broker)
    with RawClient(port) as live, RawClient(port) as pub:
        live.connect("exp-live")
        live.subscribe("exp/#", qos=1)
        with RawClient(port) as away:
            away.connect("exp-away", **persistent(MQTT_5))
            away.subscribe("exp/#", qos=1)
            away.disconnect()
        pub.connect("exp-pub")
        pub.send(Publish("exp/a", b"x", 1, packet_id=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 30}))
        pub.expect(PubAck)
        p = live.expect(Publish)
        assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 30, p
        live.send(PubAck(p.packet_id or 0))
        broker.advance(10_000)  # 10 s in the queue
        with RawClient(port) as away:
            away.connect("exp-away", **persistent(MQTT_5))
            p = away.expect(Publish)
            assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 20, p
            away.send(PubAck(p.packet_id or 0))
            away.disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0})
        pub.disconnect()


def test_takeover_publishes_the_old_connections_will(broker: BrokerThread) -> None:
    """The first connection did not DISCONNECT: its will goes out (no delay), while a
    delayed will is cancelled by the new connection."""
    port = mqtt_port(broker)
    with watcher(port) as w:
        first = RawClient(port)
        first.connect("twin-will", will=Will("will/tk", b"first gone"))
        with RawClient(port) as second:
            second.connect("twin-will")
            first.wait_closed()
            first.close()
            assert next_payload(w) == b"first gone"
            second.disconnect()
        props = {P.SESSION_EXPIRY_INTERVAL: 60}
        first = RawClient(port)
        first.connect("twin-will", clean=False, properties=props, will=delayed_will(1, b"x"))
        with RawClient(port) as second:
            assert second.connect("twin-will", clean=False, properties=props).session_present
            first.wait_closed()
            first.close()
            assert broker.call(lambda: ("/", "twin-will") not in state(broker)._pending_wills)
            second.disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0})
        mark(port, "will/delayed")
        assert next_payload(w) == b"marker"


@pytest.mark.parametrize("ended_by", ["disconnect", "expiry"])
def test_subscription_options_and_shares_survive_restart(
    broker_factory: Factory, ended_by: str
) -> None:
    """MQTT 5 subscription options (identifier, QoS, No Local) and a share group
    membership are part of the stored session."""
    b = broker_factory(clock=ManualClock())
    with RawClient(mqtt_port(b)) as c:
        c.connect("opts", **persistent(MQTT_5))
        c.send(
            Subscribe(
                1,
                [Subscription("o/q0", 0), Subscription("o/mine", 1, no_local=True)],
                {P.SUBSCRIPTION_IDENTIFIER: 42},
            )
        )
        assert c.expect(SubAck).reason_codes == [0, 1]
        assert c.subscribe("$share/grp/s/#", qos=1, pid=2).reason_codes == [1]
        c.disconnect()
    paho_publish(mqtt_port(b), "s/x", [b"shared-while-away"])
    b = restart(broker_factory, b)
    assert has_queue(b, "mqtt-shared-grp-s.#")
    with RawClient(mqtt_port(b)) as c:
        assert c.connect("opts", **persistent(MQTT_5)).session_present
        p = c.expect(Publish)
        assert (p.topic, p.payload, p.qos) == ("s/x", b"shared-while-away", 1)
        c.send(PubAck(p.packet_id or 0))
        c.send(Publish("o/q0", b"downgraded", qos=1, packet_id=1))
        # (The delivery may overtake the PUBACK, which waits for the disk.)
        got = [c.recv(), c.recv()]
        assert [x.packet_id for x in got if isinstance(x, PubAck)] == [1]
        p = next(x for x in got if isinstance(x, Publish))
        assert (p.topic, p.qos, p.properties.get(P.SUBSCRIPTION_IDENTIFIER)) == ("o/q0", 0, [42])
        # No Local: its own message on o/mine is not sent back; another client's is.
        c.send(Publish("o/mine", b"own", qos=1, packet_id=2))
        assert c.expect(PubAck).packet_id == 2
        paho_publish(mqtt_port(b), "o/mine", [b"theirs"])
        p = c.expect(Publish)
        assert (p.topic, p.payload, p.properties.get(P.SUBSCRIPTION_IDENTIFIER)) == (
            "o/mine",
            b"theirs",
            [42],
        )
        c.send(PubAck(p.packet_id or 0))
        c.disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0 if ended_by == "disconnect" else 1})
    wait_for(lambda: gone(b, "opts"), what="the connection to end")
    if ended_by == "expiry":
        assert has_queue(b, queue_name("opts"))
        b.advance(1000)
    # The session ended: its queue and (last member gone) the share's queue with it.
    wait_for(lambda: not has_queue(b, queue_name("opts")), 5, "the session queue to go")
    assert not has_queue(b, "mqtt-shared-grp-s.#")
