"""core/deliveries.py: a client session's delivery streams, on a real broker's
queues (tests/harness: no listener, the loop run by the test).

Every protocol consumes and settles through these (AMQP's channel, MQTT's
delivery, the HTTP API's get); their own tests show the rules through real
clients (test_pika_basic.py, test_nack_ranges.py, test_dead_lettering.py,
tests/protocol/mqtt). Here each rule is shown once by calling the stream
itself: its consumers are an in-memory AMQP connection's (basic.consume on a
channel, whose delivery stream the test settles through), its pulls need no
consumer at all."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, MemoryAMQP
from pamqp import commands

from warren.core.deliveries import Deliveries
from warren.core.errors import NotImplemented_, PreconditionFailed
from warren.core.message import Message
from warren.core.queue import Queue
from warren.core.session import ClientSession
from warren.core.stats import MessageStats
from warren.core.vhost import VHost

PERSISTENT = b"\x10\x00\x02"


class _Owner:
    """The connection a pull-only session belongs to (named in its log lines)."""

    name = "test connection"
    user = None

    def info(self) -> dict[str, Any]:
        return {}


def _vhost(h: Harness) -> VHost:
    return h.broker.vhosts["/"]


def _publish(h: Harness, queue: str, *bodies: bytes) -> None:
    vhost = _vhost(h)

    def publish() -> None:
        for body in bodies:
            vhost.router.publish(
                vhost.default_exchange, Message("", queue, PERSISTENT, body, 1000)
            )

    h.call(publish)


def _bodies(h: Harness, queue: Queue) -> list[bytes]:
    """What the queue holds ready, in order: pulled unacked, then put back by
    the pulling stream's close."""
    deliveries = ClientSession(h.broker, _Owner()).deliveries(MessageStats())

    def pull_all() -> list[bytes]:
        out: list[bytes] = []
        while (item := deliveries.pull(queue, False)) is not None:
            out.append(item[1].body)
        deliveries.close()
        return out

    return h.call(pull_all)


class _Channel:
    """Channel 1 of an in-memory AMQP connection: its consumers deliver into
    its delivery stream (``deliveries``), which the test settles through."""

    def __init__(self, h: Harness, prefetch: int = 0) -> None:
        self.h = h
        self.amqp: MemoryAMQP = h.amqp()
        self.amqp.handshake()
        self.amqp.open_channel(1)
        if prefetch:
            self.amqp.send_method(1, commands.Basic.Qos(prefetch_count=prefetch))
            self.amqp.expect_method(commands.Basic.QosOk)
        self.channel = self.amqp.conn.channels[1]
        self.deliveries: Deliveries = self.channel.deliveries

    def consume(self, queue: str, tag: str, **arguments: Any) -> None:
        self.amqp.send_method(
            1, commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments)
        )
        self.amqp.expect_method(commands.Basic.ConsumeOk)

    def received(self, n: int) -> list[tuple[int, bytes, bool]]:
        """The next ``n`` deliveries: (tag, body, redelivered)."""
        out = []
        for _ in range(n):
            deliver = self.amqp.expect_method(commands.Basic.Deliver)
            _, body = self.amqp.expect_content()
            out.append((deliver.delivery_tag, body, deliver.redelivered))
        return out

    def nothing_more(self) -> bool:
        self.h.pump()
        self.amqp._take()
        return not self.amqp.buf


def test_a_consumer_takes_what_its_prefetch_allows_and_a_range_ack_refills_it(
    harness: Harness,
) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", *(b"m%d" % i for i in range(10)))
    c = _Channel(h, prefetch=4)
    c.consume("work", "c")
    assert c.received(4) == [(i + 1, b"m%d" % i, False) for i in range(4)]
    assert c.nothing_more()
    deliveries = c.deliveries
    assert (q.unacked, q.message_count, len(deliveries.unsettled)) == (4, 6, 4)

    assert h.call(lambda: deliveries.ack_range(1, 3))
    assert [body for _, body, _ in c.received(3)] == [b"m4", b"m5", b"m6"]
    assert (q.unacked, deliveries.stats.ack, q.stats.ack) == (4, 3, 3)
    # A range one tag of which is not unsettled is not settled as a range.
    assert not h.call(lambda: deliveries.ack_range(3, 2))
    assert len(deliveries.unsettled) == 4


def test_multiple_acks_up_to_a_tag_and_an_unknown_tag_is_refused(harness: Harness) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c")
    c = _Channel(h)
    c.consume("work", "c")
    c.received(3)
    deliveries = c.deliveries
    h.call(lambda: deliveries.ack(2, True))
    assert (q.unacked, deliveries.stats.ack, len(deliveries.unsettled)) == (1, 2, 1)
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 2"):
        deliveries.ack(2, False)


def test_requeued_deliveries_go_back_to_their_place_and_come_back_redelivered(
    harness: Harness,
) -> None:
    h = harness
    q = h.call(lambda: _vhost(h).declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c")
    c = _Channel(h, prefetch=2)
    c.consume("work", "c")
    c.received(2)
    deliveries = c.deliveries
    h.call(lambda: deliveries.cancel("c"))
    h.call(lambda: deliveries.reject(2, True, requeue=True))
    assert (q.unacked, q.message_count, q.consumer_count) == (0, 3, 0)
    c.consume("work", "again")
    assert [(body, again) for _, body, again in c.received(2)] == [(b"a", True), (b"b", True)]


def test_dropped_deliveries_are_dead_lettered_in_tag_order(harness: Harness) -> None:
    h = harness
    vhost = _vhost(h)
    h.call(lambda: vhost.declare_exchange("dlx", "fanout"))
    dead = h.call(lambda: vhost.declare_queue("dead"))
    h.call(lambda: vhost.bind(vhost.exchanges["dlx"], dead, ""))
    q = h.call(lambda: vhost.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx"}))
    _publish(h, "work", b"a", b"b", b"c", b"d")
    c = _Channel(h)
    c.consume("work", "c")
    c.received(4)
    deliveries = c.deliveries
    assert h.call(lambda: deliveries.reject_range(3, 2, requeue=False))  # c, d
    h.call(lambda: deliveries.reject(1, False, requeue=False))  # a
    assert (q.unacked, q.message_count) == (1, 0)
    assert _bodies(h, dead) == [b"c", b"d", b"a"]


def test_a_queue_that_refuses_rejects_refuses_before_anything_is_settled(
    harness: Harness,
) -> None:
    h = harness
    h.call(lambda: _vhost(h).declare_queue("log", arguments={"x-queue-type": "stream"}))
    _publish(h, "log", b"a", b"b")
    c = _Channel(h, prefetch=10)
    c.consume("log", "c", **{"x-stream-offset": "first"})
    c.received(2)
    deliveries = c.deliveries
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
    h.call(lambda: vhost.declare_queue("one"))
    h.call(lambda: vhost.declare_queue("two"))
    c = _Channel(h)
    c.deliveries.prefetch_count = 2  # what basic.qos global=true sets
    c.consume("one", "a")
    c.consume("two", "b")
    _publish(h, "one", b"1a", b"1b")
    assert [body for _, body, _ in c.received(2)] == [b"1a", b"1b"]
    _publish(h, "two", b"2a")
    assert c.nothing_more()
    h.call(lambda: c.deliveries.ack(1, False))  # room opened on queue one's side
    assert [body for _, body, _ in c.received(1)] == [b"2a"]  # queue two was asked too


def test_closing_a_stream_cancels_its_consumers_and_puts_back_what_is_unsettled(
    harness: Harness,
) -> None:
    h = harness
    vhost = _vhost(h)
    q = h.call(lambda: vhost.declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c", b"d")
    c = _Channel(h)
    c.consume("work", "c")
    c.received(4)
    deliveries = c.deliveries
    h.call(lambda: deliveries.ack(2, False))
    # Taken out by a transaction and not settled yet (as the channel holds it).
    taken, runs = deliveries.take(4, False)
    held = [entry for _, entry in taken] + [e for run in runs for _, e in run.entries()]
    assert len(held) == 1
    acks_before = vhost.base_stats.ack
    h.call(lambda: deliveries.close(held))
    assert (q.consumer_count, q.unacked, deliveries.closed) == (0, 0, True)
    assert _bodies(h, q) == [b"a", b"c", b"d"]  # queue order
    assert vhost.base_stats.ack == acks_before + 1
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
    got = h.call(lambda: [deliveries.pull(shared, False), deliveries.pull(shared, False)])
    assert [item[1].body for item in got if item is not None] == [b"s1", b"s2"]
    assert (shared.unacked, shared.message_count) == (2, 0)
    h.call(lambda: session.closed(owner, vhost))
    assert deliveries.closed
    assert (shared.unacked, shared.message_count) == (0, 2)
    assert "mine" not in vhost.queues and mine.deleted
    assert _bodies(h, shared) == [b"s1", b"s2"]


def test_a_channel_closed_by_the_server_retires_its_counters_once(harness: Harness) -> None:
    """A channel the server closed stays listed until the client's close-ok; its
    counters went to the vhost's when its delivery stream closed, so the
    listing (and the metrics, which sum it) show none of them any more."""
    h = harness
    vhost = _vhost(h)
    h.call(lambda: vhost.declare_queue("work"))
    _publish(h, "work", b"a", b"b", b"c")
    c = _Channel(h)
    c.consume("work", "c")
    c.received(3)
    acks_before = vhost.base_stats.ack
    c.amqp.send_method(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    c.amqp.send_method(1, commands.Basic.Ack(delivery_tag=99))  # unknown: 406
    c.amqp.expect_channel_close(1)
    assert c.channel.closing and c.amqp.conn.channels.get(1) is c.channel
    assert vhost.base_stats.ack == acks_before + 2
    (listed,) = c.amqp.conn.channels_info()
    assert listed["message_stats"].get("ack", 0) == 0
