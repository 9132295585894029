"""An AMQP 1.0 message the 0-9-1 form cannot carry keeps its bare message
(Message.native, amqp1/mapping.py's keep_native): to, subject, typed ids and
application properties, several data sections, a footer come back to a 1.0
consumer byte for byte through classic, quorum and stream queues, across a
restart and dead-lettering, while a 0-9-1 consumer sees what it saw before.
In memory, with Qpid Proton's engine as the client (harness/amqp1.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pika
import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from procs import start_warren

from warren.amqp1.mapping import from_core, keep_native, to_core
from warren.amqp1.message import Properties, decode_message, encode_sections

proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection  # noqa: E402

broker = harness_fixture(manual_clock=True)

QUEUE_TYPES = ["classic", "priority", "quorum", "stream"]


def client(harness: Harness) -> ProtonClient:
    return ProtonClient(harness).open()


def declare(harness: Harness, name: str, kind: str = "classic", **arguments: Any) -> None:
    """A durable queue of ``kind``: classic, priority (a classic queue with
    x-max-priority: the priority store), quorum or stream."""
    if kind == "priority":
        kind, arguments = "classic", {"x-max-priority": 5, **arguments}
    harness.call(
        lambda: harness.broker.vhosts["/"].declare_queue(
            name, durable=True, arguments={"x-queue-type": kind, **arguments}
        )
    )


def section(code: int, value: Any) -> bytes:
    """One described section, encoded by proton (the oracle)."""
    data = proton.Data()
    data.put_described()
    data.enter()
    data.put_ulong(code)
    data.put_object(value)
    data.exit()
    return data.encode()


def rich(durable: bool = False) -> proton.Message:
    """Everything the 0-9-1 form loses: to, subject, a ulong message-id, a binary
    correlation-id, creation-time in ms, typed application properties, an
    amqp-value body."""
    return proton.Message(
        durable=durable,
        body={"k": [1, 2], "f": 1.5},
        address="/queues/anywhere",
        subject="the subject",
        id=proton.ulong(42),
        correlation_id=b"\x01\x02",
        creation_time=1700000000.123,
        properties={
            "i": 7,
            "u": proton.uint(3),
            "b": True,
            "t": proton.timestamp(1700000000123),
            "bin": b"xy",
            "s": "str",
        },
    )


def payloads(durable: bool = False) -> list[bytes]:
    """Messages (no annotations) whose bare message needs its native form."""
    value = rich(durable).encode()
    sequence = proton.Message(body=[1, "a", None], subject="seq", durable=durable)
    sequence.inferred = True
    data_sections = section(0x75, b"one") + section(0x75, b"two")
    footer = section(0x78, {proton.symbol("x-opt-sig"): b"\x00\x01"})
    return [
        value,
        sequence.encode() + footer,
        (section(0x70, [True]) if durable else b"")
        + section(0x73, [None, None, "to-here"])
        + data_sections
        + footer,
    ]


def send_raw(c: ProtonClient, sender: Any, payload: bytes, tag: str) -> Any:
    delivery = sender.delivery(tag)
    sender.send(payload)
    sender.advance()
    c.pump()
    return delivery


def bare_of(payload: bytes) -> bytes:
    """The bare message and footer of a payload: what follows the header,
    delivery and message annotations (descriptors 0x70 to 0x72), found with
    proton's decoder."""
    data = proton.Data()
    at = 0
    while at < len(payload):
        data.clear()
        used = data.decode(payload[at:])
        data.rewind()
        data.next()
        data.enter()
        data.next()
        code = data.get_ulong()
        if code >= 0x73:
            return payload[at:]
        at += used
    return b""


def receive_all(c: ProtonClient, address: str, n: int, **options: Any) -> list[bytes]:
    receiver = c.receiver(address, credit=n, name=f"r-{uuid.uuid4()}", **options)
    got: list[bytes] = []
    for _ in range(20):
        while (delivery := receiver.current) is not None and not delivery.partial:
            got.append(receiver.recv(delivery.pending))
            receiver.advance()
            delivery.update(proton.Delivery.ACCEPTED)
            delivery.settle()
        if len(got) >= n:
            break
        c.pump()
    c.pump()
    return got


def from_first(receiver: Any) -> None:
    receiver.source.filter.put_dict(
        {proton.symbol("rabbitmq:stream-offset-spec"): proton.symbol("first")}
    )


@pytest.mark.parametrize("kind", QUEUE_TYPES)
def test_a_1_0_message_comes_back_to_a_1_0_consumer_as_sent(broker: Harness, kind: str) -> None:
    declare(broker, "q", kind)
    c = client(broker)
    sender = c.sender("/queues/q")
    sent = payloads()
    deliveries = [send_raw(c, sender, p, f"t{i}") for i, p in enumerate(sent)]
    assert [d.remote_state for d in deliveries] == [proton.Delivery.ACCEPTED] * len(sent)
    options = {"configure": from_first} if kind == "stream" else {}
    got = receive_all(c, "/queues/q", len(sent), **options)
    assert [bare_of(p) for p in got] == [bare_of(p) for p in sent]
    message = proton.Message()
    message.decode(got[0])
    want = rich()
    assert (message.address, message.subject, message.id) == ("/queues/anywhere", "the subject", 42)
    assert bytes(message.correlation_id) == b"\x01\x02"
    assert message.creation_time == pytest.approx(1700000000.123)
    got_props = {
        k: bytes(v) if isinstance(v, memoryview) else v for k, v in message.properties.items()
    }
    assert got_props == want.properties
    assert {k: type(v) for k, v in got_props.items()} == {
        k: type(v) for k, v in want.properties.items()
    }
    assert message.body == want.body
    # The head is the broker's: where it was published, a durable header from the queue.
    assert message.annotations[proton.symbol("x-routing-key")] == "q"
    c.close()


def test_a_0_9_1_consumer_sees_the_mapped_message_unchanged(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    sent = payloads()
    for i, p in enumerate(sent):
        send_raw(c, sender, p, f"t{i}")
    conn = broker.amqp_connection()
    channel = conn.channel()
    for payload in sent:
        _, props, body = channel.basic_get("q", auto_ack=True)
        want_props, want_body = to_core(decode_message(payload))
        assert body == want_body
        assert props is not None
        want = commands.Basic.Properties()
        want.unmarshal(int.from_bytes(want_props[:2], "big"), want_props[2:])
        assert props == want  # the 0-9-1 properties as before: no native in sight
    _, props, body = channel.basic_get("q", auto_ack=True)
    assert body is None
    conn.close()
    c.close()


def test_a_message_the_mapping_keeps_stores_no_native_form(broker: Harness) -> None:
    declare(broker, "plain")
    declare(broker, "rich")
    c = client(broker)
    plain = proton.Message(
        body=b"plain",
        id="id-1",
        correlation_id="c-1",
        content_type="text/plain",
        durable=True,
        creation_time=1700000000.0,
        properties={"s": "x", "n": 5, "yes": True},
    )
    plain.inferred = True
    c.send(c.sender("/queues/plain", name="plain"), plain)
    c.send(c.sender("/queues/rich", name="rich"), rich())

    def native(name: str) -> bytes | None:
        head = broker.broker.vhosts["/"].queues[name].store.peek()
        assert head is not None
        return head[1].native

    assert broker.call(lambda: native("plain")) is None
    assert broker.call(lambda: native("rich")) == bare_of(rich().encode())
    (got,) = receive_all(c, "/queues/plain", 1)
    message = proton.Message()
    message.decode(got)
    assert (message.body, message.id, message.properties) == (b"plain", "id-1", plain.properties)
    c.close()


@pytest.mark.parametrize("kind", QUEUE_TYPES)
def test_the_native_form_survives_a_restart(tmp_path: Path, kind: str) -> None:
    data = tmp_path / "data"
    sent = payloads(durable=True)
    with Harness(data) as first:
        declare(first, "q", kind)
        c = client(first)
        sender = c.sender("/queues/q")
        for i, p in enumerate(sent):
            send_raw(c, sender, p, f"t{i}")
        c.close()
    with Harness(data) as second:
        c = client(second)
        options = {"configure": from_first} if kind == "stream" else {}
        got = receive_all(c, "/queues/q", len(sent), **options)
        assert [bare_of(p) for p in got] == [bare_of(p) for p in sent]
        c.close()


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_dead_lettered_message_keeps_its_native_form(broker: Harness, kind: str) -> None:
    declare(broker, "dlq")
    declare(
        broker, "work", kind, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    )
    c = client(broker)
    sender = c.sender("/queues/work")
    send_raw(c, sender, sent := rich().encode(), "t0")
    receiver = c.receiver("/queues/work", credit=1, name="work")
    delivery = receiver.current
    assert delivery is not None
    receiver.recv(delivery.pending)
    receiver.advance()
    c.settle(delivery, proton.Delivery.REJECTED)
    (dead,) = receive_all(c, "/queues/dlq", 1)
    assert bare_of(dead) == bare_of(sent)
    message = proton.Message()
    message.decode(dead)
    (death,) = message.annotations["x-opt-deaths"]
    assert (death["queue"], death["reason"]) == ("work", "rejected")
    assert message.subject == "the subject"
    c.close()


def test_keep_native_only_when_the_mapping_loses_something() -> None:
    def kept(message: proton.Message) -> bool:
        decoded = decode_message(message.encode())
        return keep_native(decoded, *to_core(decoded)) is not None

    def data(**fields: Any) -> proton.Message:
        message = proton.Message(body=b"x", **fields)
        message.inferred = True
        return message

    assert not kept(data())
    assert not kept(data(id="a", correlation_id=uuid.uuid4(), durable=True, priority=3))
    assert not kept(data(properties={"s": "t", "l": 5, "u": proton.uint(5), "f": 0.5}))
    assert not kept(data(creation_time=1700000000.0, reply_to="/queues/r"))
    assert not kept(proton.Message(body=[1, 2], inferred=True))  # amqp-sequence: kept already
    assert kept(data(address="/queues/q"))
    assert kept(data(subject="s"))
    assert kept(data(id=proton.ulong(1)))
    assert kept(data(correlation_id=b"bin"))
    assert kept(data(creation_time=1700000000.5))
    assert kept(data(properties={"b": b"bytes"}))
    assert kept(data(properties={"t": proton.timestamp(1001)}))
    assert kept(data(group_sequence=4))


def test_get_messages_of_the_management_api_shows_the_0_9_1_view_and_keeps_native(
    broker: Harness,
) -> None:
    declare(broker, "q")
    c = client(broker)
    send_raw(c, c.sender("/queues/q"), sent := rich().encode(), "t0")
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    reply = broker.http().post("/api/queues/%2F/q/get", get)
    assert reply.status == 200, reply
    (shown,) = reply.json()
    assert shown["properties"]["message_id"] == "42"  # the 0-9-1 view, as before
    assert shown["properties"]["type"] == "amqp-1.0"
    (got,) = receive_all(c, "/queues/q", 1)  # requeued: the native form still there
    assert bare_of(got) == bare_of(sent)
    c.close()


def test_a_quorum_redelivery_counts_in_the_header_and_keeps_native(broker: Harness) -> None:
    declare(broker, "q", "quorum")
    c = client(broker)
    send_raw(c, c.sender("/queues/q"), sent := rich().encode(), "t0")
    receiver = c.receiver("/queues/q", credit=1, name="q")
    delivery = receiver.current
    assert delivery is not None
    receiver.recv(delivery.pending)
    receiver.advance()
    delivery.local.failed = True
    c.settle(delivery, proton.Delivery.MODIFIED)  # delivery-failed: counted
    (again,) = receive_all(c, "/queues/q", 1)
    assert bare_of(again) == bare_of(sent)
    message = proton.Message()
    message.decode(again)
    assert (message.delivery_count, message.first_acquirer) == (1, False)
    assert message.annotations is None or "x-delivery-count" not in message.annotations
    c.close()


def test_cc_copies_keep_native(broker: Harness) -> None:
    declare(broker, "a")
    declare(broker, "b")
    c = client(broker)
    payload = proton.Message(
        body={"v": 1}, subject="cc", annotations={proton.symbol("x-cc"): ["b"]}
    ).encode()
    send_raw(c, c.sender("/queues/a"), payload, "t0")  # the default exchange, CC b
    (in_a,) = receive_all(c, "/queues/a", 1)
    (in_b,) = receive_all(c, "/queues/b", 1)
    assert bare_of(in_a) == bare_of(in_b) == bare_of(payload)
    c.close()


@given(
    body=st.binary(max_size=600),
    durable=st.none() | st.booleans(),
    priority=st.none() | st.integers(0, 255),
    ttl=st.none() | st.integers(0, 2**32 - 1),
)
def test_the_shortcut_for_one_data_section_is_what_mapping_back_says(
    body: bytes, durable: bool | None, priority: int | None, ttl: int | None
) -> None:
    """keep_native does not map back a bare message of one data section with
    no properties or annotations: mapping back gives it every time."""
    header = section(0x70, [durable, priority, None if ttl is None else proton.uint(ttl)])
    decoded = decode_message(header + section(0x75, body))
    properties, core_body = to_core(decoded)
    assert keep_native(decoded, properties, core_body) is None
    back = from_core(properties, core_body)
    assert (back.properties, back.application_properties, back.footer) == (None, None, None)
    assert back.body == decoded.body


@pytest.mark.timeout(90)
def test_a_real_restart_gives_back_the_native_form(tmp_path: Path) -> None:
    """A `warren` process stopped and started again on the same data dir: the
    records with a native section are read back from disk (classic and quorum)."""

    def connect(port: int) -> Any:
        return BlockingConnection(
            f"amqp://127.0.0.1:{port}",
            user="guest",
            password="guest",
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
            timeout=20,
        )

    data = tmp_path / "data"
    sent = rich(durable=True)
    proc, port = start_warren(data)
    try:
        amqp091 = pika.BlockingConnection(
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/")
        )
        channel = amqp091.channel()
        for kind in ("classic", "quorum"):
            channel.queue_declare(kind, durable=True, arguments={"x-queue-type": kind})
        amqp091.close()
        conn = connect(port)
        for kind in ("classic", "quorum"):
            conn.create_sender(f"/queues/{kind}").send(sent)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
    proc, port = start_warren(data)
    try:
        conn = connect(port)
        for kind in ("classic", "quorum"):
            receiver = conn.create_receiver(f"/queues/{kind}")
            got = receiver.receive(timeout=20)
            receiver.accept()
            assert (got.subject, got.address, got.id) == (sent.subject, sent.address, 42)
            assert bytes(got.correlation_id) == b"\x01\x02"
            assert got.creation_time == pytest.approx(sent.creation_time)
            assert got.body == sent.body
            assert got.properties["t"] == sent.properties["t"]
            assert type(got.properties["u"]) is proton.uint
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


_texts = st.text(max_size=20) | st.text(min_size=40, max_size=50) | st.just("x" * 300)
_ids = (
    st.none()
    | _texts
    | st.uuids().map(lambda u: f"urn:uuid:{u}")
    | st.uuids()
    | st.integers(0, 2**64 - 1).map(proton.ulong)
    | st.binary(max_size=8)
)
_values = (
    _texts
    | st.text(max_size=5).map(lambda t: t + "\x00")
    | st.just("y" * 5000)
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.integers(0, 2**32 - 1).map(proton.uint)
    | st.binary(max_size=4)
    | st.floats(allow_nan=False)
    | st.integers(0, 2**40).map(proton.timestamp)
)


@given(
    message_id=_ids,
    correlation_id=_ids,
    user_id=st.none() | st.binary(max_size=6) | st.just(b"guest"),
    reply_to=st.none()
    | _texts
    | _texts.map(lambda t: "/queues/" + t)
    | st.just("/queues/a%2Fb")
    | st.just("/queues/%zz"),
    content_type=st.none() | st.sampled_from(["text/plain", "application/json", "x" * 300]),
    creation_time=st.none() | st.integers(0, 2**45).map(lambda ms: ms / 1000),
    group_id=st.none() | _texts,
    properties=st.none() | st.dictionaries(_texts | st.just("x-key"), _values, max_size=4),
)
def test_the_shortcut_for_simple_properties_is_what_mapping_back_says(
    message_id: Any,
    correlation_id: Any,
    user_id: bytes | None,
    reply_to: str | None,
    content_type: str | None,
    creation_time: float | None,
    group_id: str | None,
    properties: dict[str, Any] | None,
) -> None:
    """keep_native's shortcut (no native when every property is of a simple
    kind) never says lossless where mapping back finds a difference."""
    message = proton.Message(body=b"body")
    fields = {
        "id": message_id,
        "correlation_id": correlation_id,
        "user_id": user_id,
        "reply_to": reply_to,
        "content_type": content_type,
        "creation_time": creation_time,
        "group_id": group_id,
        "properties": properties,
    }
    for name, value in fields.items():
        if value is not None:
            setattr(message, name, value)
    message.inferred = True
    decoded = decode_message(message.encode())
    properties_raw, core_body = to_core(decoded)
    kept = keep_native(decoded, properties_raw, core_body)
    back = from_core(properties_raw, core_body)
    props = decoded.properties if decoded.properties != Properties() else None
    ap = decoded.application_properties
    ap = ap if ap is not None and ap.content else None
    definitive = (
        encode_sections([s for s in (props, ap) if s is not None])
        == encode_sections(
            [s for s in (back.properties, back.application_properties) if s is not None]
        )
        and back.body == decoded.body
    )
    assert (kept is None) == definitive


_simple_texts = st.text(max_size=12)


@given(
    message_id=st.none() | _simple_texts | st.uuids(),
    correlation_id=st.none() | _simple_texts,
    user_id=st.none() | st.just(b"guest"),
    reply_to=st.none() | _simple_texts.map(lambda t: "/queues/" + t),
    content_type=st.none() | st.just("text/plain"),
    creation_time=st.none() | st.integers(0, 2**33).map(float),
    group_id=st.none() | _simple_texts,
    properties=st.none()
    | st.dictionaries(
        _simple_texts, _simple_texts | st.booleans() | st.integers(-(2**63), 2**63 - 1), max_size=4
    ),
)
def test_the_shortcut_agrees_on_simple_properties_too(**fields: Any) -> None:
    """The same with values mostly of the kinds the shortcut takes."""
    test_the_shortcut_for_simple_properties_is_what_mapping_back_says.hypothesis.inner_test(
        **fields
    )
