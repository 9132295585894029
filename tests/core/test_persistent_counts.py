"""messages_persistent and message_bytes_persistent, exactly, through every way a
message leaves a queue (tests/http/test_mgmt_persistent.py compares a fixed
scenario with RabbitMQ's recorded answers; here the counts are checked against a
model of what each queue holds).

A durable queue counts its persistent (delivery-mode 2) messages, ready and
unacknowledged (basic.get's too), and their body bytes; the segment store keeps
counts of its live transient records for that (store/transient_counts.py).
Every path that ends a message is taken through a broker in memory (issue 29:
tests/harness, pika's calls over MemoryAMQP, raw frames for publish runs, the
API and metrics through ``harness.http()``, a restart a new Harness on the same
data dir): ack, multiple ack, ack of a run, reject and nack
without requeue, a requeue (changes nothing), a channel closed with deliveries
held, purge, basic.get without ack, drop-head over a length limit, expiry with
dead-lettering, the delivery limit, damage found on the read path, and a
restart on the same data (which drops the transient ones). The store's own
paths (a failed write-out, damage, recovery) are checked on the store as well.
Then random sequences of publishes, gets, acks, nacks, rejects and purges
(Hypothesis) against the same model.
"""

from __future__ import annotations

import hashlib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from damage_helpers import layout, overwrite
from harness import Connection, Harness, wait_until
from harness.channel import Properties
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, header_frame, method_frame

from examples import examples
from warren.core.clock import ManualClock

P, T = 2, 1  # delivery modes

#: What is compared, as the management API names it.
KEYS = (
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "messages_persistent",
    "message_bytes",
    "message_bytes_ready",
    "message_bytes_unacknowledged",
    "message_bytes_persistent",
)


def api_queue(broker: Harness, name: str, vhost: str = "/") -> dict[str, int]:
    path = f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(name, safe='')}"
    body = broker.http().get(path)
    return {k: body[k] for k in KEYS}


def metrics_queue(broker: Harness, name: str) -> tuple[float, float]:
    """rabbitmq_queue_messages_persistent and ..._bytes of a queue (per-object)."""
    reply = broker.http().anonymous().request("GET", "/metrics/per-object")
    assert reply.status == 200, reply
    text = reply.body.decode()
    found = {}
    for line in text.splitlines():
        if f'queue="{name}"' in line and line.startswith("rabbitmq_queue_messages_persistent"):
            found[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return (
        found["rabbitmq_queue_messages_persistent"],
        found["rabbitmq_queue_messages_persistent_bytes"],
    )


class Model:
    """What a queue holds: message id -> (delivery mode, body size), ready or unacked."""

    def __init__(self, durable: bool = True) -> None:
        self.durable = durable
        self.mode: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.ready: set[int] = set()
        self.unacked: set[int] = set()
        self._next = 0

    def new(self, mode: int, size: int) -> tuple[int, bytes]:
        i = self._next
        self._next += 1
        body = f"{i}:".encode().ljust(size, b"m" if mode == P else b"t")
        self.mode[i] = mode
        self.size[i] = len(body)
        self.ready.add(i)
        return i, body

    @staticmethod
    def ident(body: bytes) -> int:
        return int(body.split(b":", 1)[0])

    def take(self, body: bytes) -> int:
        """A message went to a client unacknowledged."""
        i = self.ident(body)
        self.ready.remove(i)
        self.unacked.add(i)
        return i

    def settle(self, i: int, requeue: bool = False) -> None:
        self.unacked.remove(i)
        if requeue:
            self.ready.add(i)

    def gone(self, i: int) -> None:
        self.ready.discard(i)
        self.unacked.discard(i)

    def restart(self) -> None:
        """A restart: what was held is back, the transient messages are gone."""
        self.ready |= self.unacked
        self.unacked.clear()
        self.ready = {i for i in self.ready if self.mode[i] == P}

    def expected(self) -> dict[str, int]:
        def size(ids: set[int]) -> int:
            return sum(self.size[i] for i in ids)

        live = self.ready | self.unacked
        persistent = {i for i in live if self.mode[i] == P} if self.durable else set()
        return {
            "messages": len(live),
            "messages_ready": len(self.ready),
            "messages_unacknowledged": len(self.unacked),
            "messages_persistent": len(persistent),
            "message_bytes": size(live),
            "message_bytes_ready": size(self.ready),
            "message_bytes_unacknowledged": size(self.unacked),
            "message_bytes_persistent": size(persistent),
        }


def check(broker: Harness, queue: str, model: Model, *channels: Any) -> None:
    """The API's counts are the model's (after a round trip on each channel)."""
    for ch in channels:
        ch.barrier()
    assert api_queue(broker, queue) == model.expected()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path / "data", segment_size=65536) as b:
        yield b


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def _publish(ch: Any, queue: str, model: Model, mode: int, size: int, **props: Any) -> int:
    i, body = model.new(mode, size)
    ch.basic_publish("", queue, body, Properties(delivery_mode=mode, **props))
    return i


def _mix(ch: Any, queue: str, model: Model, n: int, start: int = 0) -> list[int]:
    """``n`` messages, every third transient, sizes all different."""
    return [
        _publish(ch, queue, model, T if k % 3 == 1 else P, 20 + 7 * (start + k) % 90)
        for k in range(n)
    ]


def test_acks_rejects_requeues_purge_and_gets(broker: Harness) -> None:
    """basic.get and consumer deliveries held, acked one by one and in bulk,
    rejected and nacked without requeue, requeued, a channel closed with
    deliveries held, a purge with deliveries held, basic.get without ack."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    model = Model()
    _mix(ch, "q", model, 12)
    check(broker, "q", model, ch)

    got = []
    for _ in range(4):
        method, _props, body = ch.basic_get("q")
        got.append((method.delivery_tag, model.take(body)))
    check(broker, "q", model, ch)
    ch.basic_ack(got[0][0])  # persistent
    model.settle(got[0][1])
    ch.basic_ack(got[1][0])  # transient
    model.settle(got[1][1])
    check(broker, "q", model, ch)
    ch.basic_nack(got[2][0], requeue=True)
    model.settle(got[2][1], requeue=True)
    check(broker, "q", model, ch)
    ch.basic_reject(got[3][0], requeue=False)
    model.settle(got[3][1])
    check(broker, "q", model, ch)

    # A consumer: deliveries held, acked in bulk, rejected, the channel closed.
    cch = conn.channel()
    cch.basic_qos(prefetch_count=5)
    held: list[tuple[int, int]] = []
    cch.basic_consume("q", lambda _c, m, _p, body: held.append((m.delivery_tag, model.take(body))))
    wait_until(conn, lambda: len(held) == 5)
    check(broker, "q", model, ch, cch)
    cch.basic_ack(held[2][0], multiple=True)
    for _tag, i in held[:3]:
        model.settle(i)
    wait_until(conn, lambda: len(held) == 8)
    check(broker, "q", model, ch, cch)
    cch.basic_nack(held[4][0], multiple=True, requeue=False)
    for _tag, i in held[3:5]:
        model.settle(i)
    more = 8 + min(2, len(model.ready))
    wait_until(conn, lambda: len(held) == more)
    check(broker, "q", model, ch, cch)
    cch.close()
    for _tag, i in held:
        if i in model.unacked:
            model.settle(i, requeue=True)
    check(broker, "q", model, ch)

    # A purge with deliveries held, then their acks; basic.get without ack.
    _mix(ch, "q", model, 9, start=12)
    tags = []
    for _ in range(2):
        method, _props, body = ch.basic_get("q")
        tags.append((method.delivery_tag, model.take(body)))
    assert ch.queue_purge("q").method.message_count == len(model.ready)
    for i in list(model.ready):
        model.gone(i)
    check(broker, "q", model, ch)
    for tag, i in tags:
        ch.basic_ack(tag)
        model.settle(i)
    check(broker, "q", model, ch)
    _mix(ch, "q", model, 6, start=30)
    for _ in range(3):
        _method, _props, body = ch.basic_get("q", auto_ack=True)
        model.gone(model.ident(body))
    check(broker, "q", model, ch)
    assert metrics_queue(broker, "q") == (
        model.expected()["messages_persistent"],
        model.expected()["message_bytes_persistent"],
    )
    conn.close()


def _publish_raw(queue: str, model: Model, modes: list[int]) -> bytes:
    out = b""
    for k, mode in enumerate(modes):
        _i, body = model.new(mode, 30 + 11 * k % 50)
        out += method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
        out += header_frame(1, len(body), commands.Basic.Properties(delivery_mode=mode))
        out += body_frame(1, body)
    return out


def _runs_held(broker: Harness) -> int:
    def count() -> int:
        return sum(
            len(r)
            for conn in broker.broker.connections
            for ch in getattr(conn, "channels", {}).values()
            for r in ch.deliveries.unsettled.runs
        )

    return broker.call(count)


def test_runs_handed_to_a_waiting_consumer(broker: Harness) -> None:
    """Publishes written in one go to a queue whose consumer waits are stored as
    a run (Queue.publish_run, the C encoder when built) and settled in bulk
    (ack_run), in part by a requeue, in part by a reject."""
    c = broker.amqp()
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="r", durable=True))
    c.expect_method(commands.Queue.DeclareOk)
    c.send_method(1, commands.Basic.Qos(prefetch_count=100))
    c.expect_method(commands.Basic.QosOk)
    c.send_method(1, commands.Basic.Consume(queue="r", consumer_tag="ct"))
    c.expect_method(commands.Basic.ConsumeOk)
    model = Model()
    modes = [P, T, P, P, T, T, P, T, P, P, T, P]
    c.send(_publish_raw("r", model, modes))
    for _ in modes:
        deliver = c.expect_method(commands.Basic.Deliver)
        _header, body = c.expect_content()
        model.take(body)
    assert _runs_held(broker) == len(modes)  # one run: every delivery in it

    def round_trip() -> None:
        c.send_method(1, commands.Basic.Qos(prefetch_count=100))
        c.expect_method(commands.Basic.QosOk)

    round_trip()
    assert api_queue(broker, "r") == model.expected()
    c.send_method(1, commands.Basic.Ack(delivery_tag=5, multiple=True))  # ack_run
    for i in range(5):
        model.settle(i)
    round_trip()
    assert api_queue(broker, "r") == model.expected()
    c.send_method(1, commands.Basic.Reject(delivery_tag=6, requeue=False))  # transient
    model.settle(5)
    c.send_method(1, commands.Basic.Nack(delivery_tag=8, multiple=True, requeue=True))
    model.settle(6, requeue=True)
    model.settle(7, requeue=True)
    again = []
    for _ in range(2):
        deliver = c.expect_method(commands.Basic.Deliver)
        _header, body = c.expect_content()
        again.append(deliver.delivery_tag)
        model.take(body)
    round_trip()
    assert api_queue(broker, "r") == model.expected()
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    for i in list(model.unacked):
        model.settle(i)
    round_trip()
    assert api_queue(broker, "r") == model.expected()
    assert model.expected()["messages"] == 0
    c.close()


def test_drop_head_expiry_dead_lettering_and_the_delivery_limit(tmp_path: Path) -> None:
    """Messages taken out of the middle or the head by a queue's own features:
    dropped over x-max-length, expired by x-message-ttl into a durable dead-letter
    queue (which then counts the copies by their own delivery modes), dropped
    past x-delivery-limit. The TTL runs out on the broker's ManualClock, when
    the test moves it."""
    with Harness(tmp_path / "data", segment_size=65536, clock=ManualClock()) as broker:
        _features(broker)


def _features(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("dead", durable=True)
    ch.queue_declare("capped", durable=True, arguments={"x-max-length": 4})
    capped = Model()
    ids = _mix(ch, "capped", capped, 10)
    for i in ids[:6]:
        capped.gone(i)
    check(broker, "capped", capped, ch)

    ch.queue_declare(
        "expiring",
        durable=True,
        arguments={
            "x-message-ttl": 100,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
    )
    expiring, dead = Model(), Model()
    for k in range(6):
        mode = T if k % 2 else P
        _publish(ch, "expiring", expiring, mode, 40 + k)
        dead.new(mode, 40 + k)  # its dead-lettered copy: the same body, the same mode
    check(broker, "expiring", expiring, ch)
    broker.advance(99)  # 1 ms short of the TTL: all still there
    check(broker, "expiring", expiring, ch)
    check(broker, "dead", Model(), ch)
    broker.advance(1)
    for i in range(6):
        expiring.gone(i)
    check(broker, "expiring", expiring, ch)
    check(broker, "dead", dead, ch)

    ch.queue_declare("limited", durable=True, arguments={"x-delivery-limit": 1})
    limited = Model()
    _mix(ch, "limited", limited, 6)
    returned: set[int] = set()
    while limited.ready:  # a message's second return is past the limit: dropped
        method, _props, body = ch.basic_get("limited")
        i = limited.take(body)
        ch.basic_nack(method.delivery_tag, requeue=True)
        limited.settle(i, requeue=i not in returned)
        returned.add(i)
        check(broker, "limited", limited, ch)
    assert len(returned) == 6
    conn.close()


def _queue_dir(data: Path, queue: str) -> Path:
    return (
        data
        / "vhosts"
        / hashlib.sha1(b"/").hexdigest()
        / "queues"
        / (hashlib.sha1(queue.encode()).hexdigest())
    )


def test_damage_found_on_the_read_path(broker: Harness, tmp_path: Path) -> None:
    """A transient record damaged on disk while the broker runs: found when the
    queue reads up to it, stepped over, no longer counted."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("d", durable=True)
    model = Model()
    ids = [_publish(ch, "d", model, m, 50 + k) for k, m in enumerate([P, T, P, T, P, P, T])]
    check(broker, "d", model, ch)
    (segment,) = sorted(_queue_dir(tmp_path / "data", "d").glob("msgs.*"))
    victim = layout(segment)[3][0]  # message 3, transient
    overwrite(segment, victim, b"\x7f\x00\x00\x01")  # its length field
    for _ in range(4):  # 0, 1, 2 and then 4: 3 is stepped over
        _method, _props, body = ch.basic_get("d", auto_ack=True)
        model.gone(model.ident(body))
    model.gone(ids[3])
    check(broker, "d", model, ch)
    assert model.expected()["messages_persistent"] == 1
    conn.close()


def test_counts_across_a_restart(tmp_path: Path) -> None:
    """A durable queue, a priority queue and a quorum queue with held and ready
    messages, the broker stopped and started on the same data: the classic and
    priority queues' transient messages are gone, the quorum queue keeps and
    counts all; the counts then follow new publishes and acks."""
    data = tmp_path / "data"
    broker = Harness(data, segment_size=65536)
    models = {"c": Model(), "p": Model(), "qq": Model()}
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("c", durable=True)
        ch.queue_declare("p", durable=True, arguments={"x-max-priority": 3})
        ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        for name, model in models.items():
            for k in range(40):
                _publish(ch, name, model, T if k % 4 == 1 else P, 30 + k, priority=k % 4)
            for _ in range(3):
                _method, _props, body = ch.basic_get(name)
                model.take(body)
        ch.confirm_delivery()  # a round trip: everything above is in
        for name, model in models.items():
            expected = model.expected()
            if name == "qq":
                expected["messages_persistent"] = expected["messages"]
                expected["message_bytes_persistent"] = expected["message_bytes"]
            assert api_queue(broker, name) == expected
    finally:
        broker.stop()
    broker = Harness(data, segment_size=65536)
    try:
        models["c"].restart()
        models["p"].restart()
        quorum = models.pop("qq")
        quorum.ready |= quorum.unacked
        quorum.unacked.clear()
        counts = api_queue(broker, "qq")
        assert counts["messages"] == counts["messages_persistent"] == 40
        assert counts["message_bytes_persistent"] == sum(quorum.size.values())
        conn = connect(broker)
        ch = conn.channel()
        for name, model in models.items():
            check(broker, name, model, ch)
            _mix(ch, name, model, 8, start=40)
            method, _props, body = ch.basic_get(name)
            model.take(body)
            check(broker, name, model, ch)
            ch.basic_ack(method.delivery_tag)
            model.settle(model.ident(body))
            check(broker, name, model, ch)
        conn.close()
    finally:
        broker.stop()


def test_a_transient_queue_counts_none(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("t", durable=False)
    model = Model(durable=False)
    _mix(ch, "t", model, 9)
    method, _props, body = ch.basic_get("t")
    model.take(body)
    check(broker, "t", model, ch)
    conn.close()


# -- random sequences against the model ----------------------------------------------------


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    data = tmp_path_factory.mktemp("persistent_counts") / "data"
    with Harness(data, segment_size=65536) as b:
        yield b


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from([P, T]), st.integers(0, 9000)),
        st.tuples(st.just("get"), st.booleans(), st.just(0)),
        st.tuples(
            st.sampled_from(["ack", "nack", "reject", "ack-all"]), st.integers(0, 9), st.just(0)
        ),
        st.tuples(st.just("purge"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)

_EXAMPLE = [0]


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, priority=st.booleans())
def test_random_sequences_keep_the_counts_exact(
    shared_broker: Harness, ops: list[tuple[str, Any, int]], priority: bool
) -> None:
    """Random publishes (persistent or transient, bodies of up to 9 KB, in
    segments of 64 KiB), gets with and without ack, acks, nacks with requeue, rejects, acks
    of everything held and purges, on a durable queue (or a priority queue):
    after every step the API's counts are the model's."""
    _EXAMPLE[0] += 1
    name = f"rand{_EXAMPLE[0]}"
    conn = connect(shared_broker)
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True, arguments={"x-max-priority": 4} if priority else {})
        model = Model()
        held: list[tuple[int, int]] = []  # (delivery tag, message id)
        for op, a, b in ops:
            if op == "publish":
                _publish(ch, name, model, a, b, priority=b % 5)
            elif op == "get":
                method, _props, body = ch.basic_get(name, auto_ack=a)
                if method is not None:
                    if a:
                        model.gone(model.ident(body))
                    else:
                        held.append((method.delivery_tag, model.take(body)))
            elif op == "purge":
                assert ch.queue_purge(name).method.message_count == len(model.ready)
                for i in list(model.ready):
                    model.gone(i)
            elif op == "ack-all" and held:
                ch.basic_ack(0, multiple=True)
                for _tag, i in held:
                    model.settle(i)
                held.clear()
            elif held and op != "ack-all":
                tag, i = held.pop(a % len(held))
                if op == "ack":
                    ch.basic_ack(tag)
                elif op == "nack":
                    ch.basic_nack(tag, requeue=True)
                else:
                    ch.basic_reject(tag, requeue=False)
                model.settle(i, requeue=op == "nack")
            check(shared_broker, name, model, ch)
        ch.queue_delete(name)
    finally:
        conn.close()
