"""basic.nack and basic.reject, single and multiple, requeue true and false,
through a client: what a client sees when a span of deliveries goes back at once
(issue 27: settled by range) is what the one-by-one path gave it. Requeued
messages come back in their original order, redelivered, ahead of what was
behind them; quorum queues count the returns in x-delivery-count; dead-letter
copies leave in tag order with their x-death; a tag that names nothing closes
the channel with 406; the prefetch slots a nack frees are filled again.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); a consumer's
callback runs when a read meets its delivery, as pika's I/O loop calls it.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import Channel, Connection, Harness, channel_error, harness_fixture, wait_until
from harness.channel import uniq

KINDS = ["classic", "priority", "quorum"]

# Small segments: a backlog of a few hundred messages spans more than one.
broker = harness_fixture(segment_size=64 * 1024)


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def _arguments(kind: str, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(extra)
    if kind == "priority":
        args["x-max-priority"] = 5
    elif kind == "quorum":
        args["x-queue-type"] = "quorum"
    return args


def _declare(ch: Channel, kind: str, **extra: Any) -> str:
    q = uniq(kind)
    ch.queue_declare(q, durable=kind == "quorum", arguments=_arguments(kind, **extra))
    return q


def _fill(ch: Channel, q: str, bodies: list[bytes]) -> None:
    """A backlog: published (confirmed) before anyone consumes."""
    for body in bodies:
        ch.basic_publish("", q, body)


class _Consumer:
    """A consumer that keeps (method, properties, body) of each delivery."""

    def __init__(self, conn: Connection, q: str, prefetch: int) -> None:
        self.conn = conn
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[Any, Any, bytes]] = []
        self.tag = self.ch.basic_consume(q, lambda _c, m, p, b: self.got.append((m, p, b)))

    def wait(self, n: int) -> list[tuple[Any, Any, bytes]]:
        """Until ``n`` deliveries more than now have come; those."""
        start = len(self.got)
        wait_until(self.conn, lambda: len(self.got) >= start + n)
        return self.got[start:]


def _bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i:04d}".encode() for i in range(n)]


def _count(p: Any) -> Any:
    return (p.headers or {}).get("x-delivery-count")


@pytest.mark.parametrize("kind", KINDS)
def test_nack_multiple_requeue_of_a_backlog_comes_back_in_order(broker: Harness, kind: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = _declare(ch, kind)
    bodies = _bodies(300)
    _fill(ch, q, bodies)
    c = _Consumer(conn, q, 100)
    first = c.wait(100)
    assert [b for _, _, b in first] == bodies[:100]
    assert not any(m.redelivered for m, _, _ in first)
    # 1 .. 40 back at once, then 41 .. 100 (tag 0: everything unacked).
    c.ch.basic_nack(first[39][0].delivery_tag, multiple=True, requeue=True)
    again = c.wait(40)
    assert [b for _, _, b in again] == bodies[:40]
    assert all(m.redelivered for m, _, _ in again)
    if kind == "quorum":
        assert [_count(p) for _, p, _ in again] == [1] * 40
    c.ch.basic_nack(0, multiple=True, requeue=True)
    back = c.wait(100)
    # Every unacked one (the 40 redelivered, 41 .. 100) returned to its old
    # place: the order of the queue, each redelivered.
    assert [b for _, _, b in back] == bodies[:100]
    assert all(m.redelivered for m, _, _ in back)
    if kind == "quorum":
        assert [_count(p) for _, p, _ in back] == [2] * 40 + [1] * 60
    c.ch.basic_ack(0, multiple=True)
    rest = c.wait(100)
    assert [b for _, _, b in rest] == bodies[100:200]
    assert not any(m.redelivered for m, _, _ in rest)
    if kind == "quorum":
        assert [_count(p) for _, p, _ in rest] == [None] * 100
    conn.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["consumed", "got"])
def test_single_nacks_and_rejects_in_a_row_keep_the_order(
    broker: Harness, kind: str, how: str
) -> None:
    """Singles out of a consumer's run, or basic.get's, out of order, requeue
    true: back in queue order, ahead of the rest (read back with basic.get,
    the consumer cancelled so that nothing is redelivered in between)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = _declare(ch, kind)
    bodies = _bodies(50)
    _fill(ch, q, bodies)
    if how == "consumed":
        c = _Consumer(conn, q, 20)
        tags = [m.delivery_tag for m, _, _ in c.wait(20)]
        c.ch.basic_cancel(c.tag)
        user = c.ch
    else:
        user = conn.channel()
        tags = []
        for body in bodies[:20]:
            method, _props, got = user.basic_get(q)
            assert got == body
            tags.append(method.delivery_tag)
    for i in (7, 3, 12, 4, 5, 6, 19):
        if i % 2:
            user.basic_reject(tags[i], requeue=True)
        else:
            user.basic_nack(tags[i], requeue=True)
    back = [user.basic_get(q) for _ in range(8)]
    assert [b for _, _, b in back] == [bodies[i] for i in (3, 4, 5, 6, 7, 12, 19, 20)]
    assert [m.redelivered for m, _, _ in back] == [True] * 7 + [False]
    if kind == "quorum":
        assert [_count(p) for _, p, _ in back] == [1] * 7 + [None]
    conn.close()


@pytest.mark.parametrize("kind", KINDS)
def test_nack_requeue_false_dead_letters_in_order_with_x_death(broker: Harness, kind: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    dlq = uniq("dlq")
    ch.queue_declare(dlq)
    q = _declare(ch, kind, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    bodies = _bodies(200)
    _fill(ch, q, bodies)
    c = _Consumer(conn, q, 200)
    got = c.wait(200)
    tags = [m.delivery_tag for m, _, _ in got]
    c.ch.basic_nack(tags[9], requeue=True)  # once around: redelivered, counted
    (again,) = c.wait(1)
    assert again[2] == bodies[9] and again[0].redelivered
    c.ch.basic_reject(tags[150], requeue=False)
    c.ch.basic_nack(tags[99], multiple=True, requeue=False)  # 0 .. 99 but 9
    c.ch.basic_nack(again[0].delivery_tag, requeue=False)  # 9, now
    c.ch.basic_nack(0, multiple=True, requeue=False)  # 100 .. 199 but 150
    dead: list[tuple[Any, bytes]] = []
    d = conn.channel()
    d.basic_consume(dlq, lambda _c, m, p, b: dead.append((p, b)), auto_ack=True)
    wait_until(conn, lambda: len(dead) == 200)
    expected = [bodies[150]] + [b for i, b in enumerate(bodies[:100]) if i != 9]
    expected += [bodies[9]] + [b for i, b in enumerate(bodies[100:], 100) if i != 150]
    assert [b for _, b in dead] == expected
    for props, _body in dead:
        (death,) = props.headers["x-death"]
        assert death["reason"] == "rejected" and death["queue"] == q and death["count"] == 1
        assert death["exchange"] == "" and death["routing-keys"] == [q]
        assert "x-delivery-count" not in props.headers
        assert props.headers["x-first-death-reason"] == "rejected"
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    conn.close()


def test_a_multiple_nack_across_two_queues_dead_letters_in_tag_order(
    broker: Harness,
) -> None:
    """Deliveries of two queues interleaved on one channel: one nack multiple
    sends the copies to their shared dead-letter queue in delivery-tag order."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    dlq = uniq("dlq")
    ch.queue_declare(dlq)
    dl = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    qa, qb = _declare(ch, "classic", **dl), _declare(ch, "quorum", **dl)
    got: list[tuple[Any, bytes]] = []
    c = conn.channel()
    c.basic_qos(prefetch_count=100)
    for q in (qa, qb):
        c.basic_consume(q, lambda _c, m, p, b: got.append((m, b)))
    for i in range(40):
        ch.basic_publish("", qa if i % 3 else qb, f"x{i}".encode())
        wait_until(conn, lambda i=i: len(got) == i + 1)
    c.basic_nack(got[-1][0].delivery_tag, multiple=True, requeue=False)
    dead: list[bytes] = []
    c.basic_consume(dlq, lambda _c, m, p, b: dead.append(b), auto_ack=True)
    wait_until(conn, lambda: len(dead) == 40)
    by_tag = [b for _, b in sorted(got, key=lambda item: item[0].delivery_tag)]
    assert dead == by_tag == [f"x{i}".encode() for i in range(40)]
    conn.close()


def test_a_quorum_nack_over_the_delivery_limit_splits_the_span(broker: Harness) -> None:
    """One nack multiple, requeue true, over deliveries some of which are at the
    delivery limit: those are dead-lettered (delivery_limit), the rest go back
    in order, their x-delivery-count one higher."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    dlq = uniq("dlq")
    ch.queue_declare(dlq)
    q = _declare(
        ch,
        "quorum",
        **{"x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
    )
    bodies = _bodies(30)
    _fill(ch, q, bodies)
    c = _Consumer(conn, q, 30)
    got = c.wait(30)
    for i in (2, 5, 6, 20):
        c.ch.basic_nack(got[i][0].delivery_tag, requeue=True)
    once = c.wait(4)
    assert [b for _, _, b in once] == [bodies[i] for i in (2, 5, 6, 20)]
    c.ch.basic_nack(0, multiple=True, requeue=True)
    back = c.wait(26)
    assert [b for _, _, b in back] == [b for i, b in enumerate(bodies) if i not in (2, 5, 6, 20)]
    assert [_count(p) for _, p, _ in back] == [1] * 26
    dead: list[tuple[Any, bytes]] = []
    d = conn.channel()
    d.basic_consume(dlq, lambda _c, m, p, b: dead.append((p, b)), auto_ack=True)
    wait_until(conn, lambda: len(dead) == 4)
    assert [b for _, b in dead] == [bodies[i] for i in (2, 5, 6, 20)]
    assert all(p.headers["x-death"][0]["reason"] == "delivery_limit" for p, _ in dead)
    conn.close()


@pytest.mark.parametrize(
    "settle",
    [
        lambda ch, tag: ch.basic_nack(tag + 1000, requeue=True),
        lambda ch, tag: ch.basic_nack(tag + 1000, requeue=False),
        lambda ch, tag: ch.basic_reject(tag + 1000, requeue=True),
        lambda ch, tag: ch.basic_nack(tag - 5, multiple=True, requeue=True),  # acked already
        lambda ch, tag: (
            ch.basic_nack(tag + 1, requeue=True) or ch.basic_reject(tag + 1, requeue=False)
        ),
    ],
    ids=["nack", "nack-drop", "reject", "multiple-below", "twice"],
)
def test_a_tag_that_names_nothing_closes_the_channel_with_406(broker: Harness, settle: Any) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = _declare(ch, "classic")
    bodies = _bodies(20)
    _fill(ch, q, bodies)
    c = _Consumer(conn, q, 10)
    got = c.wait(10)
    c.ch.basic_ack(got[5][0].delivery_tag, multiple=True)
    c.wait(6)  # the freed slots filled: tags 7 .. 16 unacked
    text = channel_error(406, lambda: (settle(c.ch, got[5][0].delivery_tag), c.ch.barrier()))
    assert "unknown delivery tag" in text
    # The channel's unacked deliveries went back in place, redelivered; the
    # acked ones are gone; nothing of the failed nack was applied twice.
    d = _Consumer(conn, q, 100)
    rest = d.wait(14)
    assert [b for _, _, b in rest] == bodies[6:]
    assert [m.redelivered for m, _, _ in rest] == [True] * 10 + [False] * 4
    conn.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("requeue", [True, False])
def test_a_nack_gives_its_prefetch_slots_back(broker: Harness, kind: str, requeue: bool) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = _declare(ch, kind)
    bodies = _bodies(40)
    _fill(ch, q, bodies)
    c = _Consumer(conn, q, 10)
    first = c.wait(10)
    assert [b for _, _, b in first] == bodies[:10]
    c.ch.basic_nack(first[6][0].delivery_tag, multiple=True, requeue=requeue)
    refill = c.wait(7)
    expected = bodies[:7] if requeue else bodies[10:17]
    assert [b for _, _, b in refill] == expected
    assert all(m.redelivered for m, _, _ in refill) == requeue
    conn.pump()  # all the broker has written by now
    assert len(c.got) == 17  # the prefetch holds: 3 + 7 unacked
    c.ch.basic_reject(refill[0][0].delivery_tag, requeue=requeue)
    (one,) = c.wait(1)
    assert one[2] == (bodies[0] if requeue else bodies[17])
    c.ch.close()  # the 10 unacked go back
    left = 40 if requeue else 40 - 8
    assert ch.queue_declare(q, passive=True).method.message_count == left

    def unacked() -> tuple[int, int]:
        queue = broker.broker.vhosts["/"].queues[q]
        return queue.unacked, queue.unacked_bytes

    assert broker.call(unacked) == (0, 0)
    conn.close()
