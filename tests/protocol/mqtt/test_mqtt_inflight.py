"""What an MQTT session has in flight, in memory (tests/harness): QoS 1
deliveries are the delivery stream's unsettled ones under their packet id,
QoS 0 deliveries to the same acknowledging consumer take the stream's own
numbers and are settled at once, and a PUBACK with only its packet id is read
without the codec while any other still goes through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness
from memclients import Factory, RawClient, harnesses

from warren.mqtt.packets import MQTT_5, Disconnect, PubAck, Publish


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Factory]:
    yield from harnesses(tmp_path)


@pytest.fixture
def mq(broker_factory: Factory) -> Harness:
    return broker_factory()


def _queue_acks(mq: Harness, name: str) -> int:
    queue = mq.broker.vhosts["/"].queues[name]
    return int(mq.call(lambda: queue.stats.ack))


def test_qos0_and_qos1_deliveries_of_one_consumer(mq: Harness) -> None:
    """One session, a QoS 0 and a QoS 1 subscription: its queue's consumer
    acknowledges, the QoS 0 messages are settled as they go out, only the QoS 1
    ones are in flight, each until its PUBACK (a second PUBACK for the same id
    settles nothing more), and their packet ids are free again after it."""
    with RawClient(mq, level=4) as s, RawClient(mq, level=4) as p:
        s.connect("mix")
        s.subscribe("mix/zero", qos=0, pid=1)
        s.subscribe("mix/one", qos=1, pid=2)
        p.connect("mixpub")
        for i in range(3):
            p.send(Publish("mix/zero", b"z%d" % i, qos=1, packet_id=10 + i))
            p.send(Publish("mix/one", b"o%d" % i, qos=1, packet_id=20 + i))
        got = s.publishes(6)
        ones = [g for g in got if g.qos == 1]
        zeros = [g for g in got if g.qos == 0]
        assert [g.payload for g in ones] == [b"o0", b"o1", b"o2"]
        assert [g.payload for g in zeros] == [b"z0", b"z1", b"z2"]
        assert all(g.packet_id is None for g in zeros)
        pids = [g.packet_id or 0 for g in ones]
        assert len(set(pids)) == 3 and all(0 < pid <= 0xFFFF for pid in pids)
        mq.settle()
        delivery = s.conn.delivery
        assert mq.call(delivery.in_flight) == 3
        assert _queue_acks(mq, "mqtt-subscription-mixqos1") == 3  # the QoS 0 ones
        s.send(PubAck(pids[0]), PubAck(pids[0]), PubAck(pids[1]))
        mq.settle()
        assert mq.call(delivery.in_flight) == 1
        assert _queue_acks(mq, "mqtt-subscription-mixqos1") == 5
        s.send(PubAck(pids[2]))
        mq.settle()
        assert mq.call(delivery.in_flight) == 0
        assert _queue_acks(mq, "mqtt-subscription-mixqos1") == 6
        # Another round: the ids are free, nothing was left behind.
        p.send(Publish("mix/one", b"again", qos=1, packet_id=30))
        again = s.expect(Publish)
        assert again.payload == b"again" and not again.dup
        s.send(PubAck(again.packet_id or 0))
        mq.settle()
        assert mq.call(delivery.in_flight) == 0
        assert _queue_acks(mq, "mqtt-subscription-mixqos1") == 7


def test_puback_with_reason_code_or_bad_flags_goes_through_the_codec(mq: Harness) -> None:
    """A 5.0 PUBACK with a reason code settles its message as a plain one does;
    a PUBACK with reserved flags set is malformed (0x81), not read as a PUBACK."""
    with RawClient(mq, level=MQTT_5) as s, RawClient(mq, level=MQTT_5) as p:
        s.connect("rc")
        s.subscribe("rc/t", qos=1)
        p.connect("rcpub")
        p.send(Publish("rc/t", b"a", qos=1, packet_id=1))
        p.send(Publish("rc/t", b"b", qos=1, packet_id=2))
        a, b = s.publishes(2)
        s.send(PubAck(a.packet_id or 0, 0x10))  # No matching subscribers
        mq.settle()
        assert mq.call(s.conn.delivery.in_flight) == 1
        pid = b.packet_id or 0
        s.send_raw(bytes((0x41, 2, pid >> 8, pid & 0xFF)))
        closed = s.wait_closed()
        assert closed and isinstance(closed[-1], Disconnect)
        assert closed[-1].reason_code == 0x81
