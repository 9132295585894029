"""Power cuts at chosen points: what each file's fsync discipline must keep.

Each test cuts the power right after the broker confirmed something (or at an
armed fsync), kills the broker with it, restarts it on what the cut left, and
checks through a real client (or in the files) that the confirmed thing is
there. Each one failed before the fix it names in its docstring.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from powercut_load import WarrenProcess, drain, message_id, mqtt_client
from powercut_mount import PowerCutMount, power_fixture  # noqa: F401 (the fixtures)

ARGS = ("--segment-size", "65536")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Cuts:
    """One broker at a time on the power-cut mount."""

    def __init__(self, power: PowerCutMount) -> None:
        self.power = power
        self.broker: WarrenProcess | None = None

    def start(self) -> WarrenProcess:
        self.broker = WarrenProcess(self.power.mount(), *ARGS)
        return self.broker

    def cut(self) -> None:
        """The power goes now; the broker dies with it."""
        assert self.broker is not None
        self.power.cut()
        self.broker.kill()
        self.power.unmount()

    def stop(self) -> None:
        """A clean stop and unmount: everything written stays."""
        assert self.broker is not None
        self.broker.stop()
        self.power.unmount()

    def close(self) -> None:
        if self.broker is not None:
            self.broker.kill()
        self.power.unmount()


@pytest.fixture
def cuts(power: PowerCutMount) -> Iterator[Cuts]:
    c = Cuts(power)
    try:
        yield c
    except BaseException:
        if c.broker is not None:
            print(c.broker.log_tail())
        raise
    finally:
        c.close()


def publish(broker: WarrenProcess, exchange: str, routing_key: str, *bodies: bytes, **props: object) -> None:
    conn = broker.amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(delivery_mode=2, **props))
    conn.close()


def declare(broker: WarrenProcess, queue: str, **arguments: object) -> None:
    conn = broker.amqp()
    conn.channel().queue_declare(queue, durable=True, arguments=arguments)
    conn.close()


def test_a_queue_declared_on_a_new_data_dir_keeps_its_confirmed_messages(cuts: Cuts) -> None:
    """The vhost's directory (made at the first start) and its definitions.log were
    never entered durably in their parent directories: the queue, its messages and
    every definition were gone after the cut."""
    broker = cuts.start()
    declare(broker, "first")
    publish(broker, "", "first", b"a", b"b", b"c")
    cuts.cut()
    broker = cuts.start()
    assert [m for m, _, _ in drain(broker, "first")] == ["a", "b", "c"]


def test_declarations_survive_on_a_new_data_dir(cuts: Cuts) -> None:
    """declare-ok follows the definitions.log fdatasync, but the log's own entry in
    the vhost directory was never fsynced: a new vhost's first declarations were
    gone after the cut."""
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("work", durable=True)
    ch.queue_bind("work", "orders", "a.#")
    conn.close()
    cuts.cut()
    broker = cuts.start()
    publish(broker, "orders", "a.b", b"routed")
    assert [m for m, _, _ in drain(broker, "work")] == ["routed"]


@pytest.mark.parametrize(
    "arguments", [{}, {"x-max-priority": 3}], ids=["classic", "priority"]
)
def test_a_new_queue_keeps_its_confirmed_messages(cuts: Cuts, arguments: dict[str, object]) -> None:
    """A queue's directory (and a priority queue's, above its levels') was never
    entered durably in queues/: its messages, fdatasynced and confirmed, vanished
    with it."""
    cuts.start()
    cuts.stop()  # the vhost exists and is durable
    broker = cuts.start()
    declare(broker, "late", **arguments)
    publish(broker, "", "late", b"x", b"y")
    cuts.cut()
    broker = cuts.start()
    assert sorted(m for m, _, _ in drain(broker, "late")) == ["x", "y"]


def test_a_new_stream_keeps_its_confirmed_messages(cuts: Cuts) -> None:
    """The same for a stream's directory."""
    broker = cuts.start()
    declare(broker, "s", **{"x-queue-type": "stream"})
    publish(broker, "", "s", b"s0", b"s1")
    cuts.cut()
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    assert ch.queue_declare("s", passive=True).method.message_count == 2
    ch.basic_qos(prefetch_count=10)
    got: list[str] = []
    ch.basic_consume("s", lambda c, m, p, b: got.append(message_id(b)), arguments={"x-stream-offset": "first"})
    while len(got) < 2:
        conn.process_data_events(time_limit=1)
    assert got == ["s0", "s1"]
    conn.close()


def test_a_delayed_exchange_keeps_its_confirmed_messages(cuts: Cuts, power: PowerCutMount) -> None:
    """A durable x-delayed-message exchange's store: the same for its directory.
    Checked in the files: the message is held for an hour."""
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    ch.exchange_declare("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    conn.close()
    publish(broker, "later", "k", b"held-for-an-hour", headers={"x-delay": 3_600_000})
    cuts.cut()
    held = [p for p in power.backing.glob("vhosts/*/exchanges/*/msgs.*") if b"held-for-an-hour" in p.read_bytes()]
    assert held, sorted(str(p.relative_to(power.backing)) for p in Path(power.backing).rglob("*"))


def ack_all(broker: WarrenProcess, queue: str, n: int) -> list[str]:
    """basic.get and ack ``n`` messages, then a round trip: the broker took the acks."""
    conn = broker.amqp()
    ch = conn.channel()
    got = []
    for _ in range(n):
        method, _props, body = ch.basic_get(queue)
        assert method is not None
        got.append(message_id(body))
        ch.basic_ack(method.delivery_tag)
    assert ch.queue_declare(queue, passive=True).method.message_count == 0
    conn.close()
    return got


def test_acks_lost_to_a_power_cut_come_back_as_redeliveries(cuts: Cuts, power: PowerCutMount) -> None:
    """The ack files are fdatasynced lazily (about a second after a sync round): a
    power cut before that brings acked messages back, redelivered, never loses one.
    The cut comes exactly before the next ack fsync."""
    broker = cuts.start()
    declare(broker, "acked")
    bodies = [b"m%d" % i for i in range(50)]
    names = [b.decode() for b in bodies]
    publish(broker, "", "acked", *bodies)
    assert ack_all(broker, "acked", 50) == names
    # The publishes' own round is followed by a lazy ack sync too: on a busy
    # machine it can come while the acks are being made, and keep the older ones.
    synced_before = power.fsyncs("*acks.*")
    power.arm_fsync("*acks.*")
    after = ["after"]
    try:
        publish(broker, "", "acked", b"after")  # a sync round: the lazy ack sync follows it
    except pika.exceptions.NackError:
        # That lazy ack sync came after the arming: the power went before this
        # publish was synced, and it was rightly refused.
        assert power.frozen.is_set()
        after = []
    assert power.frozen.wait(30), "the ack files were never fsynced"
    cuts.cut()
    broker = cuts.start()
    got = drain(broker, "acked")
    back = [m for m, _, _ in got if m != "after"]
    # The acks the cut took bring their messages back, in order: all of them when
    # no ack was synced before, else those after the last sync (the newest).
    assert back, "no ack was lost to the cut"
    assert back == names[len(names) - len(back) :], back
    if not synced_before:
        assert back == names
    # A refused "after" may be there or not; a confirmed one must be.
    assert set(after) <= {m for m, _, _ in got}
    assert all(redelivered for m, redelivered, _ in got if m != "after")


def test_acks_synced_before_a_power_cut_stay(cuts: Cuts, power: PowerCutMount) -> None:
    """The converse: once the lazy ack sync ran, the acked messages stay gone."""
    broker = cuts.start()
    declare(broker, "acked")
    publish(broker, "", "acked", *[b"m%d" % i for i in range(50)])
    ack_all(broker, "acked", 50)
    power.arm_fsync("*acks.*", after=True)
    publish(broker, "", "acked", b"after")
    assert power.frozen.wait(30), "the ack files were never fsynced"
    cuts.cut()
    broker = cuts.start()
    assert [m for m, _, _ in drain(broker, "acked")] == ["after"]


def test_an_ack_that_outlived_its_message_never_hides_a_later_one(
    cuts: Cuts, power: PowerCutMount
) -> None:
    """An ack can reach the disk before its message: transient messages appended
    after the last sync round, consumed and acked before the lazy ack sync. Recovery
    prunes such acks (they point past the data) and new messages are appended at
    the same offsets; the pruned ack file was rewritten without an fsync, so after a
    second cut the stale acks were back and hid the new, confirmed messages."""
    broker = cuts.start()
    declare(broker, "mixed")
    publish(broker, "", "mixed", b"a0")  # a sync round; the lazy ack sync follows it
    ack_all(broker, "mixed", 1)  # written at once: acks.* is created
    publish(broker, "", "mixed", b"a1")  # a round: fsyncs the directory with acks.* in it
    power.await_fsyncs("*acks.*", 1)  # the lazy ack sync of a0's ack
    power.hold_fsync("*acks.*")
    publish(broker, "", "mixed", b"a2")  # the last round; the next ack sync is held
    conn = broker.amqp()
    ch = conn.channel()
    for i in range(5):  # transient, no confirms: no sync round
        ch.basic_publish("", "mixed", b"t%d" % i, pika.BasicProperties(delivery_mode=1))
    tags = {}
    for _ in range(7):
        method, _props, body = ch.basic_get("mixed")
        tags[message_id(body)] = method.delivery_tag
    for name in ("t0", "t1", "t2", "t3", "t4"):
        ch.basic_ack(tags[name])
    ch.queue_declare("mixed", passive=True)  # the acks were taken (and written out)
    conn.close()
    assert power.held.wait(30), "the ack files were never fsynced"
    power.release()  # the held ack sync takes the transients' acks; then the power goes
    cuts.broker.kill()  # type: ignore[union-attr]
    power.unmount()

    broker = cuts.start()
    assert any("pruned 5 ack entries" in line for line in broker.lines), broker.log_tail()
    publish(broker, "", "mixed", b"p0", b"p1", b"p2", b"p3", b"p4")  # at their offsets
    cuts.cut()

    broker = cuts.start()
    assert sorted(m for m, _, _ in drain(broker, "mixed")) == ["a1", "a2", "p0", "p1", "p2", "p3", "p4"]


def test_a_persistent_mqtt_session_survives_on_a_new_data_dir(cuts: Cuts) -> None:
    """SUBACK follows the sessions.log fsync, but the log's directory (mqtt/<vhost>)
    and the log's entry in it were never fsynced: the subscription was gone after
    the cut, and with it every message queued for the subscriber."""
    broker = cuts.start()
    sub = mqtt_client(broker, "keeper")
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe("kept/#", qos=1)
    assert subscribed.wait(10)
    sub.loop_stop()
    sub.disconnect()
    cuts.cut()
    broker = cuts.start()
    pub = mqtt_client(broker, "sender")
    pub.publish("kept/a", b"queued", qos=1).wait_for_publish(10)
    pub.loop_stop()
    got: list[bytes] = []
    arrived = threading.Event()

    def on_message(client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        got.append(msg.payload)
        arrived.set()

    sub = mqtt_client(broker, "keeper", on_message=on_message)
    assert sub.session_present  # type: ignore[attr-defined]
    assert arrived.wait(10) and got == [b"queued"]
    sub.loop_stop()


def test_a_qos2_packet_id_released_before_a_power_cut_is_free_after_it(cuts: Cuts) -> None:
    """PUBCOMP was sent before the release was synced to sessions.log: after a cut
    the packet id still awaited its PUBREL, so the publisher's next message with
    that id (a new client object starts at 1 again) was taken for a resend of the
    old one and dropped, though its PUBCOMP came."""
    broker = cuts.start()
    received: list[bytes] = []
    arrived = threading.Condition()

    def on_message(client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with arrived:
            received.append(msg.payload)
            arrived.notify_all()

    sub = mqtt_client(broker, "q2-sub", on_message=on_message)
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe("q2/#", qos=2)
    assert subscribed.wait(10)
    sub.loop_stop()
    sub.disconnect()
    pub = mqtt_client(broker, "q2-pub")
    info = pub.publish("q2/x", b"first", qos=2)  # packet id 1
    info.wait_for_publish(10)
    assert info.is_published()  # PUBCOMP received
    pub.loop_stop()
    cuts.cut()
    broker = cuts.start()
    pub = mqtt_client(broker, "q2-pub")  # its session: packet id 1 is free
    info = pub.publish("q2/x", b"second", qos=2)  # packet id 1 again
    info.wait_for_publish(10)
    assert info.is_published()
    pub.loop_stop()
    sub = mqtt_client(broker, "q2-sub", on_message=on_message)
    with arrived:
        assert arrived.wait_for(lambda: b"second" in received, 10), received
    assert received.count(b"first") >= 1
    sub.loop_stop()


def test_a_tracked_stream_position_survives(cuts: Cuts) -> None:
    """A stream's tracked consumer positions (the ``offsets`` file) are replaced by
    a rename when a flush writes them; the next sync fsynced the directory (the
    rename) but not the new file when the flush, not the sync, had written it, so a
    cut left an empty file: the consumer started again from the first message."""
    broker = cuts.start()
    declare(broker, "tracked", **{"x-queue-type": "stream"})
    publish(broker, "", "tracked", *[b"m%d" % i for i in range(10)])
    conn = broker.amqp()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[str] = []

    def on_message(c: object, method: object, props: object, body: bytes) -> None:
        got.append(message_id(body))
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    ch.basic_consume("tracked", on_message, consumer_tag="reader", arguments={"x-stream-offset": None})
    while len(got) < 10:
        conn.process_data_events(time_limit=1)
    ch.basic_cancel("reader")  # the position is written out with the stream's files
    conn.close()
    publish(broker, "", "tracked", b"m10")  # a sync round after it
    cuts.cut()
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    again: list[str] = []
    ch.basic_consume("tracked", lambda c, m, p, b: again.append(message_id(b)), consumer_tag="reader", arguments={"x-stream-offset": None})
    while not again:
        conn.process_data_events(time_limit=1)
    assert again[0] == "m10", again
    conn.close()


def test_a_qos2_delivery_released_before_a_power_cut_is_released_after_it(
    cuts: Cuts, power: PowerCutMount
) -> None:
    """Outgoing QoS 2: on the subscriber's PUBREC the broker acks the queue message
    and records the packet id as released (PUBREL sent, resent after a reconnect
    until PUBCOMP). The ack reached the disk with the lazy ack sync while the
    release record was only written, not synced: after a cut the message was
    gone from the queue and the broker had forgotten the release, so a client
    holding the message until PUBREL (which the cut kept from it) never got it."""
    from mqttraw import RawClient

    from warren.mqtt.packets import MQTT_3_1_1, PubComp, Publish, PubRec, PubRel

    broker = cuts.start()
    with RawClient(broker.mqtt_port, MQTT_3_1_1) as sub:
        sub.connect("holder", clean=False)
        sub.subscribe("out/#", qos=2)
        pub = mqtt_client(broker, "out-pub")
        for warm in (b"warm-0", b"warm-1"):  # the queue's ack file, durably in its directory
            pub.publish("out/x", warm, qos=2).wait_for_publish(10)
            done = sub.expect(Publish)
            sub.send(PubRec(done.packet_id))
            sub.expect(PubRel)
            sub.send(PubComp(done.packet_id))
        power.await_fsyncs("*acks.*", 1)  # their lazy ack sync
        power.arm_fsync("*acks.*", after=True)  # the next one: after the publish's round
        pub.publish("out/x", b"held-until-pubrel", qos=2).wait_for_publish(10)
        delivery = sub.expect(Publish)
        assert delivery.qos == 2 and delivery.payload == b"held-until-pubrel"
        sub.send(PubRec(delivery.packet_id))  # within the second before the ack sync
        assert sub.expect(PubRel).packet_id == delivery.packet_id  # lost with the power
        assert power.frozen.wait(30), "the ack files were never fsynced"
        pub.loop_stop()
    cuts.broker.kill()  # type: ignore[union-attr]
    power.unmount()

    broker = cuts.start()
    with RawClient(broker.mqtt_port, MQTT_3_1_1) as sub:
        assert sub.connect("holder", clean=False).session_present
        again = sub.recv(10)
        assert (isinstance(again, PubRel) and again.packet_id == delivery.packet_id) or (
            isinstance(again, Publish) and again.payload == b"held-until-pubrel"
        ), again


def test_a_deleted_vhost_stays_deleted(cuts: Cuts, power: PowerCutMount) -> None:
    """Deleting a vhost renames its directory out of the way, without an fsync of
    vhosts/: after a cut it was back under its name, and a new vhost of that name
    took over the deleted one's policies (its queues and exchanges had been
    deleted one by one, durably, first)."""
    broker = WarrenProcess(power.mount(), *ARGS, http=True)
    cuts.broker = broker
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert broker.api("PUT", "/api/vhosts/v2")[0] in (201, 204)
    assert broker.api("PUT", "/api/permissions/v2/guest", everything)[0] in (201, 204)
    policy = {"pattern": "^old", "definition": {"max-length": 5}, "apply-to": "queues"}
    assert broker.api("PUT", "/api/policies/v2/limit-old", policy)[0] in (201, 204)
    assert broker.api("DELETE", "/api/vhosts/v2")[0] == 204
    cuts.cut()
    broker = WarrenProcess(power.mount(), *ARGS, http=True)
    cuts.broker = broker
    assert broker.api("PUT", "/api/vhosts/v2")[0] in (201, 204)
    status, policies = broker.api("GET", "/api/policies/v2")
    assert status == 200 and policies == [], policies


def test_a_message_the_http_api_said_was_routed_survives(cuts: Cuts, power: PowerCutMount) -> None:
    """The management API's publish answered {"routed": true} before the message was
    synced (no sync round covered it): a cut right after the answer lost it."""
    broker = WarrenProcess(power.mount(), *ARGS, http=True)
    cuts.broker = broker
    declare(broker, "api")
    body = {"routing_key": "api", "payload": "h1 x", "payload_encoding": "string",
            "properties": {"delivery_mode": 2}}
    assert broker.api("POST", "/api/exchanges/%2F/amq.default/publish", body) == (
        200, {"routed": True})
    cuts.cut()
    broker = cuts.start()
    assert [m for m, _, _ in drain(broker, "api")] == ["h1"]
