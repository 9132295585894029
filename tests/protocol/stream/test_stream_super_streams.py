"""Super streams in memory (core/super_stream.py, control.py): CreateSuperStream,
DeleteSuperStream, Route and Partitions with rstream's frames as the client,
their response codes and permissions as RabbitMQ's rabbit_stream_reader gives
them; a super stream declared over AMQP 0-9-1 seen by Route and Partitions,
and a restart that keeps one."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from harness import harness_fixture
from harness.broker import Harness
from harness.held_syncs import HeldSyncs
from harness.stream import MemoryStream, split_frames
from rstream import encoding, schema

from warren.core import super_stream
from warren.core.errors import NotFound
from warren.core.exchange import DirectExchange
from warren.core.stream_queue import StreamQueue
from warren.core.super_stream import PARTITION_ORDER, SUPER_STREAM
from warren.stream_protocol.constants import ResponseCode

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK


def opened(broker: Harness, user: str = "guest", password: str = "guest") -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open(user, password).response_code == OK
    return client


def create(
    client: MemoryStream,
    name: str,
    partitions: list[str],
    keys: list[str],
    arguments: dict[str, str] | None = None,
) -> int:
    props = [schema.Property(k, v) for k, v in (arguments or {}).items()]
    frame = schema.CreateSuperStream(client.next_id(), name, partitions, keys, props)
    return int(client.request(frame).response_code)


def create_n(client: MemoryStream, name: str, n: int) -> int:
    return create(client, name, [f"{name}-{i}" for i in range(n)], [str(i) for i in range(n)])


def partitions(client: MemoryStream, name: str) -> tuple[int, list[str]]:
    answer = client.request(schema.SuperStreamPartitions(client.next_id(), name))
    return answer.response_code, answer.streams


def route(client: MemoryStream, name: str, key: str) -> tuple[int, list[str]]:
    answer = client.request(schema.SuperStreamRoute(client.next_id(), key, name))
    return answer.response_code, answer.streams


def delete(client: MemoryStream, name: str) -> int:
    return int(client.request(schema.DeleteSuperStream(client.next_id(), name)).response_code)


def vhost(broker: Harness) -> Any:
    return broker.broker.vhosts["/"]


def test_create_makes_the_exchange_streams_and_bindings(broker: Harness) -> None:
    client = opened(broker)
    assert create_n(client, "orders", 3) == OK
    v = vhost(broker)
    ex = v.exchanges["orders"]
    assert isinstance(ex, DirectExchange)
    assert (ex.durable, ex.auto_delete, ex.internal) == (True, False, False)
    assert ex.arguments == {SUPER_STREAM: True}
    for i in range(3):
        q = v.queues[f"orders-{i}"]
        assert isinstance(q, StreamQueue)
        assert q.arguments["x-queue-leader-locator"] == "balanced"
    bindings = sorted(
        (b.destination.name, b.routing_key, b.arguments) for b in ex.bindings.values()
    )
    assert bindings == [(f"orders-{i}", str(i), {PARTITION_ORDER: i}) for i in range(3)]
    assert partitions(client, "orders") == (OK, ["orders-0", "orders-1", "orders-2"])
    assert route(client, "orders", "2") == (OK, ["orders-2"])
    assert route(client, "orders", "nope") == (OK, [])
    meta = client.request(schema.Metadata(client.next_id(), ["orders-0", "orders-1"]))
    assert [m.response_code for m in meta.metadata] == [OK, OK]


def test_arguments_and_binding_keys_name_the_partitions(broker: Harness) -> None:
    client = opened(broker)
    keys = ["amer", "emea", "apac"]
    args = {"max-length-bytes": "1000000", "max-age": "10s", "queue-leader-locator": "client-local"}
    assert create(client, "regions", [f"regions-{k}" for k in keys], keys, args) == OK
    q = vhost(broker).queues["regions-emea"]
    assert q.arguments["x-max-length-bytes"] == 1_000_000
    assert q.arguments["x-max-age"] == "10s"
    assert q.arguments["x-queue-leader-locator"] == "client-local"
    assert partitions(client, "regions")[1] == ["regions-amer", "regions-emea", "regions-apac"]
    assert route(client, "regions", "apac") == (OK, ["regions-apac"])


def test_refusals_and_nothing_made_by_them(broker: Harness) -> None:
    client = opened(broker)
    assert create_n(client, "taken", 2) == OK
    assert create_n(client, "taken", 2) == ResponseCode.STREAM_ALREADY_EXISTS
    assert client.request(schema.Create(client.next_id(), "other-1", [])).response_code == OK
    assert create_n(client, "other", 2) == ResponseCode.STREAM_ALREADY_EXISTS
    v = vhost(broker)
    assert "other" not in v.exchanges and "other-0" not in v.queues
    failed = ResponseCode.PRECONDITION_FAILED
    assert create_n(client, "amq.super", 1) == failed
    assert create_n(client, "", 1) == failed
    assert create(client, "uneven", ["uneven-0", "uneven-1"], ["0"]) == failed
    assert create(client, "twice", ["twice-0", "twice-0"], ["0", "1"]) == failed
    assert create(client, "badpart", ["amq.p"], ["0"]) == failed
    assert create(client, "badarg", ["badarg-0"], ["0"], {"max-length-bytes": "lots"}) == failed
    assert create(client, "badloc", ["badloc-0"], ["0"], {"queue-leader-locator": "x"}) == failed
    assert create_n(client, "huge", 1001) == failed
    for name in ("uneven", "twice", "badpart", "badarg", "badloc", "huge"):
        assert name not in v.exchanges
    assert not [q for q in v.queues if q.startswith(("uneven", "twice", "badarg", "badloc"))]
    missing = ResponseCode.STREAM_DOES_NOT_EXIST
    assert delete(client, "nothing") == missing
    assert partitions(client, "nothing") == (missing, [])
    assert route(client, "nothing", "0") == (missing, [])
    assert delete(client, "amq.direct") == missing


def test_the_vhost_queue_limit_counts_every_partition(broker: Harness) -> None:
    broker.call(lambda: vhost(broker).set_limits({"max-queues": 3}))
    client = opened(broker)
    assert create_n(client, "big", 4) == ResponseCode.PRECONDITION_FAILED
    assert "big" not in vhost(broker).exchanges
    assert create_n(client, "small", 3) == OK


def test_delete_removes_the_exchange_and_partitions_and_tells_their_users(
    broker: Harness,
) -> None:
    client = opened(broker)
    assert create_n(client, "gone", 2) == OK
    v = vhost(broker)
    broker.call(lambda: v.declare_queue("classic", durable=True))
    broker.call(lambda: v.bind(v.exchanges["gone"], v.queues["classic"], "x"))
    user = opened(broker)
    pub = schema.DeclarePublisher(user.next_id(), 1, "", "gone-1")
    assert user.request(pub).response_code == OK
    assert delete(client, "gone") == OK
    assert "gone" not in v.exchanges
    assert "gone-0" not in v.queues and "gone-1" not in v.queues
    assert "classic" in v.queues  # not a partition: not deleted
    told = [encoding.decode_frame(f) for f in user.raw(b"")]
    assert [(m.metadata_info.stream, m.metadata_info.code) for m in told] == [
        ("gone-1", ResponseCode.STREAM_NOT_AVAILABLE)
    ]
    assert delete(client, "gone") == ResponseCode.STREAM_DOES_NOT_EXIST


def test_permissions(broker: Harness) -> None:
    def users() -> None:
        store = broker.broker.users
        store.add_user("nobody", "pw")
        store.set_permissions("nobody", "/", "^$", "^$", "^$")
        # May make the exchange but not the streams.
        store.add_user("half", "pw")
        store.set_permissions("half", "/", "^half$", "^half$", "^half$")
        # May read and write but configure nothing.
        store.add_user("rw", "pw")
        store.set_permissions("rw", "/", "^$", ".*", ".*")
        # May write the exchange but not its streams.
        store.add_user("xw", "pw")
        store.set_permissions("xw", "/", "^$", "^perm$", "^perm$")

    broker.call(users)
    admin = opened(broker)
    refused = ResponseCode.ACCESS_REFUSED
    assert create_n(opened(broker, "nobody", "pw"), "n", 1) == refused
    assert create_n(opened(broker, "half", "pw"), "half", 1) == refused
    assert "half" not in vhost(broker).exchanges
    assert create_n(admin, "perm", 2) == OK
    rw, xw, nobody = (opened(broker, u, "pw") for u in ("rw", "xw", "nobody"))
    assert delete(rw, "perm") == refused
    assert partitions(rw, "perm") == (OK, ["perm-0", "perm-1"])
    assert route(rw, "perm", "1") == (OK, ["perm-1"])
    assert partitions(xw, "perm") == (refused, [])
    assert route(xw, "perm", "1") == (refused, [])
    assert route(xw, "perm", "none") == (OK, [])  # no route: no stream to refuse
    assert partitions(nobody, "perm") == (refused, [])
    assert route(nobody, "perm", "1") == (refused, [])
    # Checked before the super stream is looked for, as RabbitMQ.
    assert partitions(nobody, "missing") == (refused, [])
    assert "perm" in vhost(broker).exchanges


def test_a_super_stream_declared_over_amqp_091(broker: Harness) -> None:
    """As RabbitMQ's Java client (and rabbitmq-streams) declares one: Route and
    Partitions see it, and a 0-9-1 publish is routed by its routing key."""
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.exchange_declare("amqp-ss", "direct", durable=True, arguments={SUPER_STREAM: True})
    # Bound out of order, one with its order as text, one bound without any:
    # partitions are listed by order, those without one last.
    for i in (2, 0, 1):
        ch.queue_declare(f"amqp-ss-{i}", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare("amqp-ss-extra", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare("classic", durable=True)
    ch.queue_bind("amqp-ss-extra", "amqp-ss", "k")
    ch.queue_bind("amqp-ss-2", "amqp-ss", "k", arguments={PARTITION_ORDER: 2})
    ch.queue_bind("amqp-ss-0", "amqp-ss", "a", arguments={PARTITION_ORDER: "0"})
    ch.queue_bind("amqp-ss-1", "amqp-ss", "k", arguments={PARTITION_ORDER: 1})
    ch.queue_bind("classic", "amqp-ss", "k")
    client = opened(broker)
    streams = ["amqp-ss-0", "amqp-ss-1", "amqp-ss-2", "amqp-ss-extra"]
    assert partitions(client, "amqp-ss") == (OK, streams)
    assert route(client, "amqp-ss", "k") == (OK, ["amqp-ss-1", "amqp-ss-2", "amqp-ss-extra"])
    ch.basic_publish("amqp-ss", "a", b"to-0")
    broker.settle()
    v = vhost(broker)
    assert [v.queues[s].stream.next_offset for s in streams] == [1, 0, 0, 0]
    assert delete(client, "amqp-ss") == OK
    assert not [q for q in v.queues if q.startswith("amqp-ss")]
    assert "classic" in v.queues


def test_a_restart_keeps_the_super_stream(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Harness(data) as first:
        client = opened(first)
        assert create(client, "kept", ["kept-b", "kept-a"], ["b", "a"]) == OK
    with Harness(data) as second:
        client = opened(second)
        assert partitions(client, "kept") == (OK, ["kept-b", "kept-a"])
        assert route(client, "kept", "a") == (OK, ["kept-a"])
        assert vhost(second).exchanges["kept"].arguments == {SUPER_STREAM: True}
        assert delete(client, "kept") == OK
    with Harness(data) as third:
        client = opened(third)
        assert partitions(client, "kept")[0] == ResponseCode.STREAM_DOES_NOT_EXIST
        assert not [q for q in vhost(third).queues if q.startswith("kept")]


def test_create_is_answered_once_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        client = opened(harness)
        frame = schema.CreateSuperStream(client.next_id(), "held", ["held-0"], ["0"], [])
        conn = client.conn
        syncs.hold()
        try:
            harness.call(lambda: conn.feed(encoding.encode_frame(frame)))
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()
            assert client.take() == b""
        finally:
            syncs.release()
        harness.settle()
        answers = [encoding.decode_frame(f) for f in split_frames(client.take())]
        assert [a.response_code for a in answers] == [OK]


def test_the_management_api_makes_and_deletes_one(broker: Harness) -> None:
    """RabbitMQ's PUT /api/stream/super-streams/{vhost}/{name} (its
    rabbitmq_stream_management checks), and Warren's DELETE."""
    api = broker.http()
    path = "/api/stream/super-streams/%2F/"
    assert api.put(path + "carrots", {"partitions": 3}).status == 204
    client = opened(broker)
    assert partitions(client, "carrots") == (OK, ["carrots-0", "carrots-1", "carrots-2"])
    assert api.put(path + "cucumber", {"binding-keys": "fresh, old,,"}).status == 204
    assert partitions(client, "cucumber")[1] == ["cucumber-fresh", "cucumber-old"]
    assert route(client, "cucumber", "old") == (OK, ["cucumber-old"])
    args = {"max-length-bytes": 1000000, "max-age": "1h", "queue-leader-locator": "client-local"}
    assert api.put(path + "aubergine", {"partitions": "2", "arguments": args}).status == 204
    assert vhost(broker).queues["aubergine-1"].arguments["x-max-length-bytes"] == 1000000
    bad = [
        {"partitions": 3, "binding-keys": "a"},
        {},
        {"partitions": "this is not a partition"},
        {"partitions": 0},
        {"partitions": -5},
        {"partitions": 1001},
        {"binding-keys": " , "},
        {"binding-keys": ",".join(f"k{i}" for i in range(1001))},
        {"partitions": 3, "arguments": {"queue-leader-locator": "remote"}},
        {"partitions": 3, "arguments": ["no"]},
    ]
    for body in bad:
        reply = api.put(path + "watermelon", body)
        assert reply.status == 400, (body, reply)
    assert "watermelon" not in vhost(broker).exchanges
    taken = api.put(path + "carrots", {"partitions": 1})
    assert taken.status == 400 and "already" in taken.json()["reason"]
    assert api.put("/api/stream/super-streams/nope/x", {"partitions": 1}).status == 404

    def user() -> None:
        users = broker.broker.users
        users.add_user("no-configure", "pw", tags=["management"])
        users.set_permissions("no-configure", "/", "^$", ".*", ".*")

    broker.call(user)
    limited = api.as_user("no-configure", "pw")
    assert limited.put(path + "denied", {"partitions": 3}).status == 401
    assert limited.delete(path + "carrots").status == 401
    assert api.delete(path + "carrots").status == 204
    assert "carrots" not in vhost(broker).exchanges
    assert not [q for q in vhost(broker).queues if q.startswith("carrots")]
    assert api.delete(path + "carrots").status == 404


def test_partition_index(broker: Harness) -> None:
    """rabbit_stream_manager:partition_index: the binding's order, else the
    name's number, else -1 (what a partition's single active consumer goes by)."""
    client = opened(broker)
    assert create(client, "idx", ["idx-b", "idx-a"], ["b", "a"]) == OK
    v = vhost(broker)

    def unordered() -> None:
        for name in ("idx-7", "idx-x"):
            v.declare_queue(name, durable=True, arguments={"x-queue-type": "stream"})
            v.bind(v.exchanges["idx"], v.queues[name], name)

    broker.call(unordered)
    index = partial(super_stream.partition_index, v, "idx")
    assert [index(s) for s in ("idx-b", "idx-a", "idx-7", "idx-x")] == [0, 1, 7, -1]
    with pytest.raises(NotFound):
        index("elsewhere")
    with pytest.raises(NotFound):
        super_stream.partition_index(v, "missing", "idx-a")


def test_a_failure_half_way_takes_back_what_was_made(broker: Harness) -> None:
    """The second partition's directory cannot be made (a full or failing
    disk): the first partition and the exchange go again, INTERNAL_ERROR."""
    v = vhost(broker)
    real = v.stores._stream_store_factory

    def failing(vh: Any, name: str, arguments: dict[str, Any]) -> Any:
        if name == "roll-1":
            raise OSError(28, "No space left on device")
        return real(vh, name, arguments)

    v.stores._stream_store_factory = failing
    client = opened(broker)
    assert create_n(client, "roll", 3) == ResponseCode.INTERNAL_ERROR
    assert "roll" not in v.exchanges
    assert not [q for q in v.queues if q.startswith("roll")]
    v.stores._stream_store_factory = real
    assert create_n(client, "roll", 3) == OK
