"""The basic class as a pika (BlockingConnection) client observes it, over real sockets.

Prefetch (per consumer and global), consumers (no-ack, exclusive, tags,
cancel, priorities), mandatory returns, basic.get, ack/nack/reject with
requeue to the original position, recover, requeue on channel and connection
close, large multi-frame bodies and exact property round trips.
"""

from __future__ import annotations

import datetime
import decimal
import os
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import UnroutableError
from pika.spec import Basic, BasicProperties
from pikahelp import (
    Session,
    barrier,
    channel_error,
    connect,
    connection_error,
    publish,
    settle,
    uniq,
    wait_until,
)

pytestmark = pytest.mark.timeout(30)


# -- helpers ------------------------------------------------------------------------------


class Delivery:
    __slots__ = ("method", "props", "body")

    def __init__(self, method: Basic.Deliver, props: BasicProperties, body: bytes) -> None:
        self.method = method
        self.props = props
        self.body = body

    @property
    def tag(self) -> int:
        return int(self.method.delivery_tag)

    @property
    def redelivered(self) -> bool:
        return bool(self.method.redelivered)


class Collector(list[Delivery]):
    """A consumer callback that records deliveries."""

    def __call__(
        self, ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        self.append(Delivery(method, props, body))

    @property
    def bodies(self) -> list[bytes]:
        return [d.body for d in self]


@pytest.fixture
def s(broker: Any) -> Iterator[Session]:
    with closing(Session(broker)) as session:
        yield session


def numbered(n: int, start: int = 1) -> list[bytes]:
    return [str(i).encode() for i in range(start, start + n)]


def ready(ch: BlockingChannel, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


# -- basic.qos ----------------------------------------------------------------------------


def test_prefetch_count_is_per_consumer(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    publish(s.ch, q1, *numbered(5))
    publish(s.ch, q2, *numbered(5))
    ch = s.conn.channel()
    ch.basic_qos(prefetch_count=2)
    got1, got2 = Collector(), Collector()
    ch.basic_consume(q1, got1)
    ch.basic_consume(q2, got2)
    wait_until(s.conn, lambda: len(got1) + len(got2) == 4)
    settle(s.conn)
    assert (got1.bodies, got2.bodies) == ([b"1", b"2"], [b"1", b"2"])
    assert (ready(s.ch, q1), ready(s.ch, q2)) == (3, 3)
    ch.basic_ack(got1[0].tag)
    wait_until(s.conn, lambda: len(got1) == 3)
    settle(s.conn)
    assert got1.bodies == [b"1", b"2", b"3"]
    assert len(got2) == 2


def test_prefetch_count_applies_to_consumers_created_afterwards(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    publish(s.ch, q1, *numbered(4))
    publish(s.ch, q2, *numbered(4))
    ch = s.conn.channel()
    unlimited, limited = Collector(), Collector()
    ch.basic_consume(q1, unlimited)
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q2, limited)
    wait_until(s.conn, lambda: len(unlimited) == 4 and len(limited) == 1)
    settle(s.conn)
    assert len(limited) == 1


def test_global_prefetch_is_shared_by_the_channel_consumers(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    publish(s.ch, q1, *numbered(5))
    publish(s.ch, q2, *numbered(5))
    ch = s.conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got1, got2 = Collector(), Collector()
    ch.basic_consume(q1, got1)
    ch.basic_consume(q2, got2)
    wait_until(s.conn, lambda: len(got1) + len(got2) == 3)
    settle(s.conn)
    assert len(got1) + len(got2) == 3
    assert ready(s.ch, q1) + ready(s.ch, q2) == 7
    ch.basic_ack(0, multiple=True)
    wait_until(s.conn, lambda: len(got1) + len(got2) == 6)
    settle(s.conn)
    assert len(got1) + len(got2) == 6


def test_global_and_per_consumer_prefetch_combine(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    publish(s.ch, q1, *numbered(5))
    publish(s.ch, q2, *numbered(5))
    ch = s.conn.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got1, got2 = Collector(), Collector()
    ch.basic_consume(q1, got1)
    ch.basic_consume(q2, got2)
    wait_until(s.conn, lambda: len(got1) + len(got2) == 3)
    settle(s.conn)
    assert sorted([len(got1), len(got2)]) == [1, 2]


def test_global_prefetch_ignores_basic_get(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    s.ch.basic_qos(prefetch_count=1, global_qos=True)
    method = s.ch.basic_get(q)[0]
    assert method is not None
    got = Collector()
    s.ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 1)
    settle(s.conn)
    assert got.bodies == [b"2"]


def test_basic_get_is_not_limited_by_prefetch(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    s.ch.basic_qos(prefetch_count=1)
    bodies = [s.ch.basic_get(q)[2] for _ in range(3)]
    assert bodies == numbered(3)


def test_raising_prefetch_resumes_delivery(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(4))
    ch = s.conn.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got = Collector()
    ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 1)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    wait_until(s.conn, lambda: len(got) == 3)
    settle(s.conn)
    assert got.bodies == numbered(3)


@pytest.mark.parametrize("global_qos", [False, True])
def test_prefetch_size_is_not_implemented(s: Session, global_qos: bool) -> None:
    text = connection_error(540, s.ch.basic_qos, prefetch_size=1024, global_qos=global_qos)
    assert text == "NOT_IMPLEMENTED - prefetch_size!=0 (1024)"


# -- basic.consume / basic.cancel ---------------------------------------------------------


def test_consume_no_ack(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    ch = s.conn.channel()
    ch.basic_qos(prefetch_count=1)  # irrelevant without acks
    got = Collector()
    ch.basic_consume(q, got, auto_ack=True)
    wait_until(s.conn, lambda: len(got) == 3)
    assert got.bodies == numbered(3)
    assert [d.tag for d in got] == [1, 2, 3]
    assert not any(d.redelivered for d in got)
    ch.close()
    assert ready(s.ch, q) == 0  # nothing was waiting for an ack


def test_delivery_fields(s: Session) -> None:
    q = s.queue()
    s.ch.queue_bind(q, "amq.topic", "a.*")
    s.ch.basic_publish("amq.topic", "a.b", b"x")
    got = Collector()
    tag = s.ch.basic_consume(q, got, consumer_tag="my-tag")
    assert tag == "my-tag"
    wait_until(s.conn, lambda: len(got) == 1)
    m = got[0].method
    assert (m.consumer_tag, m.delivery_tag, m.redelivered) == ("my-tag", 1, False)
    assert (m.exchange, m.routing_key) == ("amq.topic", "a.b")


def test_server_generated_consumer_tag(s: Session) -> None:
    q = s.queue()
    replies: list[Any] = []
    s.ch._impl._rpc(Basic.Consume(queue=q, consumer_tag=""), replies.append, [Basic.ConsumeOk])
    wait_until(s.conn, lambda: bool(replies))
    tag = replies[0].method.consumer_tag
    assert tag.startswith("amq.ctag-")
    assert len(tag) > len("amq.ctag-") + 8
    assert s.ch.queue_declare(q, passive=True).method.consumer_count == 1
    cancelled: list[Any] = []
    s.ch._impl._rpc(Basic.Cancel(consumer_tag=tag), cancelled.append, [Basic.CancelOk])
    wait_until(s.conn, lambda: bool(cancelled))
    assert cancelled[0].method.consumer_tag == tag
    assert s.ch.queue_declare(q, passive=True).method.consumer_count == 0


def test_duplicate_consumer_tag_closes_the_connection(s: Session) -> None:
    q = s.queue()
    s.ch.basic_consume(q, Collector(), consumer_tag="dup")
    # pika refuses a duplicate tag itself, so send the second consume directly.
    s.ch._impl._send_method(Basic.Consume(queue=q, consumer_tag="dup"))
    text = connection_error(530, wait_until, s.conn, lambda: False)
    assert text == "NOT_ALLOWED - attempt to reuse consumer tag 'dup'"


def test_same_tag_on_two_channels_is_fine(s: Session) -> None:
    q = s.queue()
    ch2 = s.conn.channel()
    s.ch.basic_consume(q, Collector(), consumer_tag="shared")
    ch2.basic_consume(q, Collector(), consumer_tag="shared")
    assert s.ch.queue_declare(q, passive=True).method.consumer_count == 2


def test_exclusive_consumer(s: Session) -> None:
    q = s.queue()
    tag = s.ch.basic_consume(q, Collector(), exclusive=True)
    other = s.connect().channel()
    text = channel_error(403, other.basic_consume, q, Collector())
    assert text == f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"
    s.ch.basic_cancel(tag)
    s.connect().channel().basic_consume(q, Collector())


def test_exclusive_consume_refused_when_queue_has_consumers(s: Session) -> None:
    q = s.queue()
    s.ch.basic_consume(q, Collector())
    ch2 = s.conn.channel()
    text = channel_error(403, ch2.basic_consume, q, Collector(), exclusive=True)
    assert text == f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"


def test_consume_from_missing_queue_is_404(s: Session) -> None:
    name = uniq()
    text = channel_error(404, s.ch.basic_consume, name, Collector())
    assert text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_cancel_stops_delivery_and_keeps_unacked(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1")
    got = Collector()
    tag = s.ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 1)
    s.ch.basic_cancel(tag)
    assert tag not in s.ch.consumer_tags
    publish(s.ch, q, b"2")
    settle(s.conn)
    assert got.bodies == [b"1"]
    ok = s.ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (1, 0)
    # The delivery made before the cancel can still be acknowledged.
    s.ch.basic_ack(got[0].tag)
    barrier(s.ch)
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"2"


def test_cancel_unknown_consumer_tag_is_ok(s: Session) -> None:
    replies: list[Any] = []
    s.ch._impl._rpc(Basic.Cancel(consumer_tag="never"), replies.append, [Basic.CancelOk])
    wait_until(s.conn, lambda: bool(replies))
    assert replies[0].method.consumer_tag == "never"
    assert s.ch.is_open


def test_round_robin_between_equal_consumers(s: Session) -> None:
    q = s.queue()
    ch1, ch2 = s.conn.channel(), s.conn.channel()
    a, b = Collector(), Collector()
    ch1.basic_consume(q, a, auto_ack=True)
    ch2.basic_consume(q, b, auto_ack=True)
    publish(s.ch, q, *numbered(10))
    wait_until(s.conn, lambda: len(a) + len(b) == 10)
    assert (len(a), len(b)) == (5, 5)
    assert sorted(a.bodies + b.bodies, key=int) == numbered(10)


# -- consumer priorities ------------------------------------------------------------------


def test_higher_priority_consumer_gets_messages_while_it_has_capacity(s: Session) -> None:
    q = s.queue()
    low_ch, high_ch = s.conn.channel(), s.conn.channel()
    low_ch.basic_qos(prefetch_count=100)
    high_ch.basic_qos(prefetch_count=2)
    low, high = Collector(), Collector()
    low_ch.basic_consume(q, low)
    high_ch.basic_consume(q, high, arguments={"x-priority": 10})
    publish(s.ch, q, *numbered(6))
    wait_until(s.conn, lambda: len(low) + len(high) == 6)
    assert high.bodies == [b"1", b"2"]
    assert low.bodies == [b"3", b"4", b"5", b"6"]
    high_ch.basic_ack(0, multiple=True)
    low_ch.basic_ack(0, multiple=True)
    publish(s.ch, q, b"7", b"8")
    wait_until(s.conn, lambda: len(high) == 4)
    settle(s.conn)
    assert high.bodies[2:] == [b"7", b"8"]
    assert len(low) == 4


def test_unlimited_high_priority_consumer_gets_everything(s: Session) -> None:
    q = s.queue()
    low, high, lowest = Collector(), Collector(), Collector()
    s.ch.basic_consume(q, low, auto_ack=True)
    s.ch.basic_consume(q, lowest, auto_ack=True, arguments={"x-priority": -5})
    s.ch.basic_consume(q, high, auto_ack=True, arguments={"x-priority": 5})
    publish(s.ch, q, *numbered(20))
    wait_until(s.conn, lambda: len(high) == 20)
    settle(s.conn)
    assert (len(low), len(lowest)) == (0, 0)
    assert high.bodies == numbered(20)


def test_invalid_consumer_priority_is_406(s: Session) -> None:
    q = s.queue()
    text = channel_error(406, s.ch.basic_consume, q, Collector(), arguments={"x-priority": "hi"})
    assert text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}'")


# -- mandatory and basic.return ---------------------------------------------------------


def test_mandatory_unroutable_is_returned(s: Session) -> None:
    returned: list[tuple[Basic.Return, BasicProperties, bytes]] = []
    s.ch.add_on_return_callback(lambda ch, m, p, b: returned.append((m, p, b)))
    props = BasicProperties(content_type="text/plain", headers={"h": 1}, message_id="m1")
    s.ch.basic_publish("amq.direct", "nobody-home", b"lost", props, mandatory=True)
    wait_until(s.conn, lambda: bool(returned))
    method, rprops, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", "nobody-home")
    assert body == b"lost"
    assert (rprops.content_type, rprops.headers, rprops.message_id) == (
        "text/plain",
        {"h": 1},
        "m1",
    )


def test_non_mandatory_unroutable_is_dropped_silently(s: Session) -> None:
    returned: list[Any] = []
    s.ch.add_on_return_callback(lambda *a: returned.append(a))
    s.ch.basic_publish("amq.direct", "nobody-home", b"lost")
    barrier(s.ch)
    settle(s.conn)
    assert returned == []


def test_mandatory_routed_is_not_returned(s: Session) -> None:
    q = s.queue()
    returned: list[Any] = []
    s.ch.add_on_return_callback(lambda *a: returned.append(a))
    s.ch.basic_publish("", q, b"kept", mandatory=True)
    barrier(s.ch)
    settle(s.conn)
    assert returned == []
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"kept"


def test_mandatory_with_confirms_raises_unroutable(s: Session) -> None:
    s.ch.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        s.ch.basic_publish("amq.fanout", "", b"x", mandatory=True)
    (msg,) = info.value.messages
    assert (msg.method.reply_code, msg.body) == (312, b"x")


# -- basic.get ----------------------------------------------------------------------------


def test_basic_get_reports_remaining_count(s: Session) -> None:
    q = s.queue()
    s.ch.queue_bind(q, "amq.direct", "rk")
    for body in numbered(3):
        s.ch.basic_publish("amq.direct", "rk", body)
    seen = []
    for _ in range(3):
        method, _props, body = s.ch.basic_get(q, auto_ack=True)
        assert (method.exchange, method.routing_key, method.redelivered) == (
            "amq.direct",
            "rk",
            False,
        )
        seen.append((body, method.message_count))
    assert seen == [(b"1", 2), (b"2", 1), (b"3", 0)]
    assert s.ch.basic_get(q, auto_ack=True) == (None, None, None)


def test_basic_get_from_missing_queue_is_404(s: Session) -> None:
    channel_error(404, s.ch.basic_get, uniq())


def test_basic_get_delivery_tags_increase_per_channel(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    tags = [s.ch.basic_get(q)[0].delivery_tag for _ in range(2)]
    ch2 = s.conn.channel()
    assert tags == [1, 2]
    assert ch2.basic_get(q)[0].delivery_tag == 1


# -- ack / nack / reject ----------------------------------------------------------------


def test_requeued_messages_return_to_their_original_position(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(5))
    tags = {}
    for _ in range(5):
        method, _p, body = s.ch.basic_get(q)
        assert not method.redelivered
        tags[body] = method.delivery_tag
    s.ch.basic_nack(tags[b"2"], requeue=True)
    s.ch.basic_nack(tags[b"4"], requeue=True)
    publish(s.ch, q, b"6")
    out = []
    for _ in range(3):
        method, _p, body = s.ch.basic_get(q, auto_ack=True)
        out.append((body, method.redelivered))
    assert out == [(b"2", True), (b"4", True), (b"6", False)]
    assert s.ch.basic_get(q)[0] is None
    s.ch.basic_ack(0, multiple=True)


def test_requeue_to_a_consumer_keeps_order(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(5))
    got = Collector()
    s.ch.basic_qos(prefetch_count=5)
    s.ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 5)
    s.ch.basic_ack(got[0].tag)
    s.ch.basic_nack(got[3].tag, multiple=True, requeue=True)  # 2, 3 and 4 in one go
    wait_until(s.conn, lambda: len(got) == 8)
    assert [(d.body, d.redelivered) for d in got[5:]] == [
        (b"2", True),
        (b"3", True),
        (b"4", True),
    ]
    assert [d.tag for d in got[5:]] == [6, 7, 8]


def test_nack_multiple_requeues_in_order(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(5))
    tags = [s.ch.basic_get(q)[0].delivery_tag for _ in range(5)]
    s.ch.basic_nack(tags[2], multiple=True, requeue=True)  # 1, 2, 3
    s.ch.basic_reject(tags[4], requeue=False)  # 5 dropped
    s.ch.basic_ack(tags[3])  # 4 done
    out = [s.ch.basic_get(q, auto_ack=True) for _ in range(3)]
    assert [(body, m.redelivered) for m, _p, body in out] == [
        (b"1", True),
        (b"2", True),
        (b"3", True),
    ]
    assert s.ch.basic_get(q)[0] is None


def test_nack_without_requeue_drops(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    tags = [s.ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    s.ch.basic_nack(tags[1], multiple=True, requeue=False)
    s.ch.close()
    ch = s.conn.channel()
    assert ready(ch, q) == 1
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"3", True)


def test_ack_multiple_and_ack_all(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(6))
    tags = [s.ch.basic_get(q)[0].delivery_tag for _ in range(6)]
    s.ch.basic_ack(tags[2], multiple=True)  # 1..3
    # Already acked by the multiple ack.
    channel_error(406, lambda: (s.ch.basic_ack(tags[1]), barrier(s.ch)))
    ch = s.conn.channel()
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]  # 4..6, redelivered
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert ready(s.conn.channel(), q) == 0


def test_ack_of_unknown_tag_is_406(s: Session) -> None:
    text = channel_error(406, lambda: (s.ch.basic_ack(42), barrier(s.ch)))
    assert text == "PRECONDITION_FAILED - unknown delivery tag 42"


@pytest.mark.parametrize("how", ["ack", "nack", "reject"])
def test_settling_twice_is_406(s: Session, how: str) -> None:
    q = s.queue()
    publish(s.ch, q, b"x")
    tag = s.ch.basic_get(q)[0].delivery_tag
    settle_fn: Callable[[int], None] = {
        "ack": s.ch.basic_ack,
        "nack": lambda t: s.ch.basic_nack(t, requeue=False),
        "reject": lambda t: s.ch.basic_reject(t, requeue=False),
    }[how]
    settle_fn(tag)
    text = channel_error(406, lambda: (settle_fn(tag), barrier(s.ch)))
    assert text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"


def test_ack_of_no_ack_delivery_is_406(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"x")
    tag = s.ch.basic_get(q, auto_ack=True)[0].delivery_tag
    s.ch.basic_ack(tag)
    channel_error(406, barrier, s.ch)


def test_unacked_survive_until_the_channel_closes(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(2))
    s.ch.basic_get(q)
    assert ready(s.ch, q) == 1


# -- basic.recover ------------------------------------------------------------------------


def test_recover_redelivers_unacked_to_the_consumer(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    got = Collector()
    s.ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 3)
    s.ch.basic_ack(got[0].tag)
    s.ch.basic_recover(requeue=True)
    wait_until(s.conn, lambda: len(got) == 5)
    assert [(d.body, d.redelivered) for d in got[3:]] == [(b"2", True), (b"3", True)]
    assert [d.tag for d in got] == [1, 2, 3, 4, 5]
    s.ch.basic_ack(5, multiple=True)
    barrier(s.ch)
    ok = s.ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (0, 1)


def test_recover_requeues_basic_get_messages(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(2))
    s.ch.basic_get(q)
    s.ch.basic_get(q)
    s.ch.basic_recover(requeue=True)
    assert ready(s.ch, q) == 2
    method, _p, body = s.ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"1", True)


def test_recover_without_requeue_is_not_implemented(s: Session) -> None:
    text = connection_error(540, s.ch.basic_recover, requeue=False)
    assert text == "NOT_IMPLEMENTED - requeue=false"


# -- requeue when the holder goes away ----------------------------------------------------


def _hold_three(s: Session, q: str) -> tuple[BlockingConnection, BlockingChannel, Collector]:
    holder = s.connect()
    ch = holder.channel()
    got = Collector()
    ch.basic_qos(prefetch_count=3)
    ch.basic_consume(q, got)
    wait_until(holder, lambda: len(got) == 3)
    return holder, ch, got


@pytest.mark.parametrize("close", ["channel", "connection"])
def test_unacked_are_requeued_to_another_consumer_in_order(s: Session, close: str) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    holder, hch, held = _hold_three(s, q)
    assert held.bodies == numbered(3)
    waiting = Collector()
    s.ch.basic_consume(q, waiting)
    settle([s.conn, holder], 0.1)
    assert waiting == []
    (hch if close == "channel" else holder).close()
    wait_until(s.conn, lambda: len(waiting) == 3)
    assert [(d.body, d.redelivered) for d in waiting] == [(b, True) for b in numbered(3)]


@pytest.mark.parametrize("close", ["channel", "connection"])
def test_requeued_on_close_go_ahead_of_later_messages(s: Session, close: str) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(5))
    holder, hch, held = _hold_three(s, q)
    assert held.bodies == numbered(3)
    publish(s.ch, q, b"6")
    (hch if close == "channel" else holder).close()
    wait_until(s.conn, lambda: ready(s.ch, q) == 6)
    got = Collector()
    s.ch.basic_consume(q, got)
    wait_until(s.conn, lambda: len(got) == 6)
    assert [(d.body, d.redelivered) for d in got] == [
        (b"1", True),
        (b"2", True),
        (b"3", True),
        (b"4", False),
        (b"5", False),
        (b"6", False),
    ]


def test_acked_messages_are_not_requeued_on_close(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, *numbered(3))
    holder, hch, held = _hold_three(s, q)
    hch.basic_ack(held[1].tag)
    holder.close()
    wait_until(s.conn, lambda: ready(s.ch, q) == 2)
    bodies = [s.ch.basic_get(q, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"1", b"3"]


# -- large messages -----------------------------------------------------------------------


def _body(size: int) -> bytes:
    return os.urandom(size)


@pytest.mark.parametrize(
    "size",
    [0, 1, 131072 - 9, 131072 - 8, 131072 - 7, 131072 * 3, 1 << 20, 5 << 20],
    ids=["empty", "one", "frame-1", "frame", "frame+1", "3-frames", "1MiB", "5MiB"],
)
def test_large_bodies_split_across_frames(s: Session, size: int) -> None:
    conn = s.connect(frame_max=131072)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = _body(size)
    ch.basic_publish("", q, body)
    method, _props, got = ch.basic_get(q, auto_ack=True)
    assert method is not None
    assert len(got) == size
    assert got == body


def test_large_bodies_with_small_frame_max(s: Session) -> None:
    conn = s.connect(frame_max=4096)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    bodies = [_body(n) for n in (4088, 4089, 100_000, 1 << 20)]
    for body in bodies:
        ch.basic_publish("", q, body, BasicProperties(headers={"n": len(body)}))
    got = Collector()
    ch.basic_consume(q, got, auto_ack=True)
    wait_until(conn, lambda: len(got) == len(bodies))
    assert got.bodies == bodies
    assert [d.props.headers for d in got] == [{"n": len(b)} for b in bodies]


def test_large_message_to_a_consumer_and_back_via_return(s: Session) -> None:
    body = _body(5 << 20)
    returned: list[bytes] = []
    s.ch.add_on_return_callback(lambda ch, m, p, b: returned.append(b))
    s.ch.basic_publish("amq.direct", "nowhere", body, mandatory=True)
    q = s.queue()
    s.ch.basic_publish("", q, body)
    got = Collector()
    s.ch.basic_consume(q, got, auto_ack=True)
    wait_until(s.conn, lambda: len(got) == 1 and len(returned) == 1, timeout=15)
    assert got[0].body == body
    assert returned[0] == body


def test_message_over_max_size_is_refused(broker_factory: Callable[..., Any]) -> None:
    b = broker_factory(max_message_size=1000)
    conn = connect(b)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x" * 1000)
        assert ch.basic_get(q, auto_ack=True)[2] == b"x" * 1000
        ch.basic_publish("", q, b"x" * 1001)
        text = channel_error(406, barrier, ch)
        assert (
            text
            == "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
        )
        assert conn.is_open
    finally:
        conn.close()


# -- properties -----------------------------------------------------------------------------

HEADERS: dict[str, Any] = {
    "str": "text",
    "unicode": "ünïcødé ✓",
    "empty": "",
    "int": 42,
    "negative": -7,
    "long": 2**40,
    "big-negative": -(2**60),
    "true": True,
    "false": False,
    "void": None,
    "bytes": b"\x00\x01\xfe\xff",
    "decimal": decimal.Decimal("3.14"),
    "negative-decimal": decimal.Decimal("-0.005"),
    "timestamp": datetime.datetime(2021, 6, 7, 8, 9, 10, tzinfo=datetime.UTC),
    "array": [1, "two", True, None, [3, [4]], {"five": 5}],
    "empty-array": [],
    "table": {"nested": {"deep": {"deeper": ["x", {"y": decimal.Decimal("1.5")}]}}},
    "empty-table": {},
}


def _all_properties() -> BasicProperties:
    return BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=HEADERS,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="reply-queue",
        expiration="600000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="event.created",
        user_id="guest",
        app_id="the-app",
        cluster_id="the-cluster",
    )


_FIELDS = [
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
]


def _assert_same_properties(got: BasicProperties, sent: BasicProperties) -> None:
    for field in _FIELDS:
        assert getattr(got, field) == getattr(sent, field), field
    assert got.headers is not None
    for key, value in HEADERS.items():
        assert _kind(got.headers[key]) == _kind(value), key


def _kind(value: Any) -> type:
    """The field type a value stands for (pika decodes 64-bit ints as an int subclass)."""
    for kind in (bool, int, str, bytes, decimal.Decimal, datetime.datetime, list, dict):
        if isinstance(value, kind):
            return kind
    return type(value)


def test_every_property_round_trips_via_basic_get(s: Session) -> None:
    q = s.queue()
    sent = _all_properties()
    s.ch.basic_publish("", q, b"body", sent)
    _m, props, body = s.ch.basic_get(q, auto_ack=True)
    assert body == b"body"
    _assert_same_properties(props, sent)


def test_every_property_round_trips_via_consumer_and_return(s: Session) -> None:
    q = s.queue()
    sent = _all_properties()
    returned: list[BasicProperties] = []
    s.ch.add_on_return_callback(lambda ch, m, p, b: returned.append(p))
    s.ch.basic_publish("", uniq("missing"), b"body", sent, mandatory=True)
    s.ch.basic_publish("", q, b"body", sent)
    got = Collector()
    s.ch.basic_consume(q, got, auto_ack=True)
    wait_until(s.conn, lambda: len(got) == 1 and len(returned) == 1)
    _assert_same_properties(got[0].props, sent)
    _assert_same_properties(returned[0], sent)


def test_no_properties_stay_absent(s: Session) -> None:
    q = s.queue()
    s.ch.basic_publish("", q, b"bare")
    _m, props, _b = s.ch.basic_get(q, auto_ack=True)
    for field in _FIELDS:
        assert getattr(props, field) is None, field


def test_user_id_must_match_the_authenticated_user(s: Session) -> None:
    q = s.queue()
    s.ch.basic_publish("", q, b"x", BasicProperties(user_id="mallory"))
    text = channel_error(406, barrier, s.ch)
    assert text == (
        "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'"
    )
    ch = s.conn.channel()
    assert ch.basic_get(q)[0] is None
