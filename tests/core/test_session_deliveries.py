"""core/deliveries.py: a client session's delivery streams, on a real broker's
queues (tests/harness: no listener, the loop run by the test).

Every protocol consumes and settles through these (AMQP's channel, MQTT's
delivery, the HTTP API's get); their own tests show the rules through real
clients (test_pika_basic.py, test_nack_ranges.py, test_dead_lettering.py,
tests/protocol/mqtt). Here each rule is shown once on the stream itself, with
the one part a protocol adds: a consumer that records what it is handed and
takes what its credit allows."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness

from warren.core.consumer import Consumer
from warren.core.deliveries import Deliveries
from warren.core.errors import NotImplemented_, PreconditionFailed
from warren.core.message import Message
from warren.core.queue import Queue
from warren.core.session import ClientSession
from warren.core.stats import MessageStats
from warren.core.vhost import VHost

PERSISTENT = b"\x10\x00\x02"


class _Owner:
    """The connection a session belongs to (named in its log lines)."""

    name = "test connection"
    user = None

    def info(self) -> dict[str, Any]:
        return {}


class Recorder(Consumer):
    """A protocol's consumer at its simplest: what it is handed, by tag."""

    __slots__ = ("got",)

    def __init__(self, deliveries: Deliveries, queue: Queue, prefetch: int = 0) -> None:
        super().__init__(deliveries, f"ctag-{queue.name}", queue, False, prefetch_count=prefetch)
        #: (delivery tag, body, redelivered), in delivery order.
        self.got: list[tuple[int, bytes, bool]] = []

    def can_take(self) -> bool:
        return self.has_credit()

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        tag = self.deliveries.next_tag()
        self.deliveries.track(tag, self.queue, seq, msg, self)
        self.got.append((tag, msg.body, redelivered))

    def cancelled(self) -> None:
        self.deliveries.cancelled(self.tag, self)


def _vhost(h: Harness) -> VHost:
    return h.broker.vhosts["/"]


def _publish(h: Harness, queue: str, *bodies: bytes) -> None:
    vhost = _vhost(h)

    def publish() -> None:
        for body in bodies:
            vhost.publish(vhost.default_exchange, Message("", queue, PERSISTENT, body, 1000))

    h.call(publish)


def _stream(h: Harness) -> tuple[ClientSession, Deliveries, MessageStats]:
    session = ClientSession(h.broker, _Owner())
    stats = MessageStats()
    return session, session.deliveries(stats, retire=_vhost(h).base_stats), stats


def _bodies(h: Harness, queue: Queue) -> list[bytes]:
    """What the queue holds ready, in order (pulled without an ack, then put back)."""
    session, deliveries, _ = _stream(h)
    out: list[bytes] = []
    while (item := deliveries.pull(queue, False)) is not None:
        out.append(item[1].body)
    deliveries.close()
    return out


def test_a_consumer_takes_what_its_prefetch_allows_and_a_range_ack_refills_it(
    harness: Harness,
) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", *(b"m%d" % i for i in range(10)))
    _session, deliveries, stats = _stream(h)
    c = Recorder(deliveries, q, prefetch=4)
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    assert [body for _, body, _ in c.got] == [b"m0", b"m1", b"m2", b"m3"]
    assert (q.unacked, q.message_count, len(deliveries.unsettled)) == (4, 6, 4)

    assert h.call(lambda: deliveries.ack_range(1, 3))  # tags 1, 2, 3
    h.pump()
    assert [body for _, body, _ in c.got[4:]] == [b"m4", b"m5", b"m6"]
    assert (q.unacked, stats.ack, q.stats.ack, c.unacked_count) == (4, 3, 3, 4)
    # A range one tag of which is not unsettled is not settled as a range.
    assert not h.call(lambda: deliveries.ack_range(3, 2))
    assert len(deliveries.unsettled) == 4


def test_multiple_acks_up_to_a_tag_and_an_unknown_tag_is_refused(harness: Harness) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c")
    _session, deliveries, stats = _stream(h)
    c = Recorder(deliveries, q)
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    h.call(lambda: deliveries.ack(2, True))
    assert (q.unacked, stats.ack, sorted(deliveries.unsettled.singles)) == (1, 2, [3])
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 2"):
        deliveries.ack(2, False)


def test_requeued_deliveries_go_back_to_their_place_and_come_back_redelivered(
    harness: Harness,
) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c")
    _session, deliveries, _ = _stream(h)
    c = Recorder(deliveries, q, prefetch=2)
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    h.call(lambda: deliveries.cancel(c.tag))
    h.call(lambda: deliveries.reject(2, True, requeue=True))
    assert (q.unacked, q.message_count) == (0, 3)
    other = Recorder(deliveries, q)
    h.call(lambda: deliveries.consume("other", other))
    h.pump()
    assert [(body, again) for _, body, again in other.got] == [
        (b"a", True),
        (b"b", True),
        (b"c", False),
    ]


def test_dropped_deliveries_are_dead_lettered_in_tag_order(harness: Harness) -> None:
    h = harness
    vhost = _vhost(h)
    h.call(lambda: vhost.declare_exchange("dlx", "fanout"))
    dead = h.call(lambda: vhost.declare_queue("dead"))
    h.call(lambda: vhost.bind(vhost.exchanges["dlx"], dead, ""))
    q = h.call(lambda: vhost.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx"}))
    _publish(h, "work", b"a", b"b", b"c", b"d")
    _session, deliveries, _ = _stream(h)
    c = Recorder(deliveries, q)
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    assert h.call(lambda: deliveries.reject_range(3, 2, requeue=False))  # c, d
    h.call(lambda: deliveries.reject(1, False, requeue=False))  # a
    assert (q.unacked, q.message_count) == (1, 0)
    assert h.call(lambda: _bodies(h, dead)) == [b"c", b"d", b"a"]


def test_a_queue_that_refuses_rejects_refuses_before_anything_is_settled(
    harness: Harness,
) -> None:
    h = harness
    vhost = _vhost(h)
    s = h.call(lambda: vhost.declare_queue("log", arguments={"x-queue-type": "stream"}))
    _publish(h, "log", b"a", b"b")
    _session, deliveries, _ = _stream(h)
    c = Recorder(deliveries, s, prefetch=10)
    c.arguments = {"x-stream-offset": "first"}
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    assert len(c.got) == 2
    with pytest.raises(NotImplemented_, match="not supported by stream queues"):
        deliveries.reject(2, True, requeue=True)
    assert not deliveries.reject_range(1, 2, requeue=False)
    assert len(deliveries.unsettled) == 2  # nothing settled
    h.call(lambda: deliveries.ack(0, True))
    assert len(deliveries.unsettled) == 0


def test_the_streams_own_prefetch_holds_every_consumer_and_a_settle_refills_them_all(
    harness: Harness,
) -> None:
    h = harness
    vhost = _vhost(h)
    one = h.call(lambda: vhost.declare_queue("one"))
    two = h.call(lambda: vhost.declare_queue("two"))
    _session, deliveries, _ = _stream(h)
    deliveries.prefetch_count = 2  # AMQP's basic.qos global=true
    a, b = Recorder(deliveries, one), Recorder(deliveries, two)
    h.call(lambda: deliveries.consume("a", a))
    h.call(lambda: deliveries.consume("b", b))
    _publish(h, "one", b"1a", b"1b")
    h.pump()
    _publish(h, "two", b"2a")
    h.pump()
    assert (len(a.got), len(b.got)) == (2, 0)
    h.call(lambda: deliveries.ack(a.got[0][0], False))  # room on queue one's side
    h.pump()
    assert [body for _, body, _ in b.got] == [b"2a"]  # queue two was asked too


def test_closing_a_stream_cancels_its_consumers_and_puts_back_what_is_unsettled(
    harness: Harness,
) -> None:
    h = harness
    vhost = _vhost(h)
    q = h.call(lambda: vhost.declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c", b"d")
    session, deliveries, stats = _stream(h)
    c = Recorder(deliveries, q)
    h.call(lambda: deliveries.consume(c.tag, c))
    h.pump()
    h.call(lambda: deliveries.ack(2, False))
    held = deliveries.take(4, False)[0]  # held by a transaction, not settled yet
    acks_before = vhost.base_stats.ack
    h.call(lambda: deliveries.close([entry for _, entry in held]))
    assert (q.consumer_count, q.unacked, deliveries.closed) == (0, 0, True)
    assert h.call(lambda: _bodies(h, q)) == [b"a", b"c", b"d"]  # queue order
    assert vhost.base_stats.ack == acks_before + stats.ack == acks_before + 1
    h.call(deliveries.close)  # once
    assert vhost.base_stats.ack == acks_before + 1


def test_a_sessions_close_closes_its_open_streams_then_its_exclusive_queues(
    harness: Harness,
) -> None:
    h = harness
    vhost = _vhost(h)
    owner = _Owner()
    shared = h.call(lambda: vhost.declare_queue("shared"))
    mine = h.call(lambda: vhost.declare_queue("mine", durable=False, exclusive=True, owner=owner))
    _publish(h, "shared", b"s1", b"s2")
    session = ClientSession(h.broker, owner)
    deliveries = session.deliveries(MessageStats())
    c = Recorder(deliveries, shared)
    h.call(lambda: deliveries.consume(c.tag, c))
    mc = Recorder(deliveries, mine)
    h.call(lambda: deliveries.consume(mc.tag, mc))
    h.pump()
    assert shared.unacked == 2
    h.call(lambda: session.closed(owner, vhost))
    assert deliveries.closed
    assert (shared.unacked, shared.message_count, shared.consumer_count) == (0, 2, 0)
    assert "mine" not in vhost.queues and mine.deleted
