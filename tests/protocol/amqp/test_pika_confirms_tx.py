"""Publisher confirms and transactions as a pika (BlockingConnection) client sees them.

Confirms: acks for routed and unroutable messages, many in flight at once
(acks may be coalesced with multiple=true), return-before-ack for mandatory
messages. Transactions: publishes and acks take effect only on commit, are
discarded on rollback; confirm and tx modes exclude each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import UnroutableError
from pika.spec import Basic, BasicProperties
from pikahelp import barrier, channel_error, connect, settle, uniq, wait_until

pytestmark = pytest.mark.timeout(30)


# -- helpers ------------------------------------------------------------------------------


class Session:
    """A connection with a channel, plus an observer connection to look from outside."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.conn = connect(broker)
        self.ch = self.conn.channel()
        self.observer = connect(broker)
        self.queues: list[str] = []

    def queue(self) -> str:
        name = self.ch.queue_declare(uniq()).method.queue
        self.queues.append(name)
        return name

    def ready(self, queue: str) -> int:
        """Ready messages in ``queue`` as another connection sees them."""
        ch = self.observer.channel()
        try:
            return int(ch.queue_declare(queue, passive=True).method.message_count)
        finally:
            ch.close()

    def close(self) -> None:
        conn = self.observer
        try:
            ch = conn.channel()
            for q in self.queues:
                ch.queue_delete(q)
        finally:
            conn.close()
            if self.conn.is_open:
                self.conn.close()


@pytest.fixture
def s(broker: Any) -> Iterator[Session]:
    with closing(Session(broker)) as session:
        yield session


class ConfirmRecorder:
    """Publisher confirms on the raw pika channel under a BlockingChannel.

    BlockingChannel waits for each confirm before publishing the next message;
    the underlying channel lets many publishes be in flight and shows every
    ack/nack frame as the broker sent it, multiple flag included.
    """

    def __init__(self, conn: BlockingConnection, ch: BlockingChannel) -> None:
        self.conn = conn
        self.impl = ch._impl
        self.events: list[tuple[str, Any]] = []
        self.frames: list[Basic.Ack | Basic.Nack] = []
        selected: list[bool] = []
        self.impl.add_on_return_callback(self._on_return)
        self.impl.confirm_delivery(self._on_confirm, lambda _frame: selected.append(True))
        wait_until(conn, lambda: bool(selected))
        self.published = 0

    def _on_return(
        self, _ch: Any, method: Basic.Return, props: BasicProperties, body: bytes
    ) -> None:
        self.events.append(("return", (method.reply_code, method.routing_key, body)))

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        self.frames.append(method)
        kind = "ack" if isinstance(method, Basic.Ack) else "nack"
        self.events.append((kind, method.delivery_tag))

    def publish(self, exchange: str, routing_key: str, body: bytes, mandatory: bool = False) -> int:
        self.impl.basic_publish(exchange, routing_key, body, mandatory=mandatory)
        self.published += 1
        return self.published

    def acked(self) -> set[int]:
        """Every publish sequence number covered by an ack so far."""
        done: set[int] = set()
        for m in self.frames:
            if isinstance(m, Basic.Ack):
                if m.multiple:
                    done.update(range(1, m.delivery_tag + 1))
                else:
                    done.add(m.delivery_tag)
        return done

    def wait_all(self, timeout: float = 10.0) -> None:
        expected = set(range(1, self.published + 1))
        wait_until(self.conn, lambda: self.acked() >= expected, timeout)


# -- publisher confirms -------------------------------------------------------------------


def test_confirm_ack_for_routed_message(s: Session) -> None:
    q = s.queue()
    rec = ConfirmRecorder(s.conn, s.ch)
    rec.publish("", q, b"routed")
    rec.wait_all()
    assert rec.events == [("ack", 1)]
    assert s.ready(q) == 1


def test_confirm_ack_for_unroutable_message(s: Session) -> None:
    rec = ConfirmRecorder(s.conn, s.ch)
    rec.publish("amq.direct", "nobody", b"dropped")
    rec.publish("", uniq("missing"), b"dropped too")
    rec.wait_all()
    assert [kind for kind, _ in rec.events] == ["ack"] * len(rec.events)
    assert rec.acked() == {1, 2}


def test_blocking_channel_confirms(s: Session) -> None:
    q = s.queue()
    s.ch.confirm_delivery()
    s.ch.basic_publish("", q, b"1")  # returns only once acked; raises on nack
    s.ch.basic_publish("amq.direct", "nobody", b"2")  # unroutable, still acked
    assert s.ready(q) == 1


def test_many_confirms_in_flight(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    rec = ConfirmRecorder(s.conn, s.ch)
    n = 2000
    for i in range(n):
        target = (q1, q2, uniq("missing"))[i % 3]
        rec.publish("", target, str(i).encode())
    rec.wait_all()
    settle(s.conn, 0.1)
    assert rec.acked() == set(range(1, n + 1))
    assert not any(isinstance(m, Basic.Nack) for m in rec.frames)
    # Acks may arrive out of order (RabbitMQ confirms unroutable messages at once),
    # but every ack frame must confirm something not confirmed before.
    covered: set[int] = set()
    for m in rec.frames:
        tags = set(range(1, m.delivery_tag + 1)) if m.multiple else {m.delivery_tag}
        assert tags - covered, f"ack {m} confirms nothing new"
        covered |= tags
    assert s.ready(q1) + s.ready(q2) == n - n // 3


def test_confirm_sequence_is_per_channel(s: Session) -> None:
    q = s.queue()
    rec1 = ConfirmRecorder(s.conn, s.ch)
    rec2 = ConfirmRecorder(s.conn, s.conn.channel())
    rec1.publish("", q, b"a")
    rec1.publish("", q, b"b")
    rec2.publish("", q, b"c")
    rec1.wait_all()
    rec2.wait_all()
    assert rec1.acked() == {1, 2}
    assert rec2.events == [("ack", 1)]


def test_mandatory_unroutable_gets_return_then_ack(s: Session) -> None:
    q = s.queue()
    rec = ConfirmRecorder(s.conn, s.ch)
    rec.publish("amq.direct", "nobody", b"lost", mandatory=True)
    rec.publish("", q, b"kept", mandatory=True)
    rec.wait_all()
    settle(s.conn, 0.1)
    assert rec.events[0] == ("return", (312, "nobody", b"lost"))
    assert rec.acked() == {1, 2}
    assert [e for e in rec.events if e[0] == "return"] == [rec.events[0]]


def test_blocking_channel_mandatory_confirm_raises_unroutable(s: Session) -> None:
    q = s.queue()
    s.ch.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        s.ch.basic_publish("amq.direct", "nobody", b"lost", mandatory=True)
    (returned,) = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert returned.body == b"lost"
    s.ch.basic_publish("", q, b"next", mandatory=True)  # the channel carries on
    assert s.ready(q) == 1


def test_confirm_publish_to_missing_exchange_closes_channel(s: Session) -> None:
    s.ch.confirm_delivery()
    name = uniq("missing")
    text = channel_error(404, s.ch.basic_publish, name, "k", b"x")
    assert text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_confirm_select_after_tx_select_is_406(s: Session) -> None:
    s.ch.tx_select()
    text = channel_error(406, s.ch.confirm_delivery)
    assert text == "PRECONDITION_FAILED - cannot switch from tx to confirm mode"


def test_tx_select_after_confirm_select_is_406(s: Session) -> None:
    s.ch.confirm_delivery()
    text = channel_error(406, s.ch.tx_select)
    assert text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"


# -- transactions: publishes ------------------------------------------------------------


def test_tx_publishes_are_invisible_until_commit(s: Session) -> None:
    q = s.queue()
    s.ch.tx_select()
    for body in (b"1", b"2", b"3"):
        s.ch.basic_publish("", q, body)
    barrier(s.ch)
    assert s.ready(q) == 0
    assert s.ch.basic_get(q)[0] is None  # not even to the publishing channel
    s.ch.tx_commit()
    assert s.ready(q) == 3
    assert [s.ch.basic_get(q, auto_ack=True)[2] for _ in range(3)] == [b"1", b"2", b"3"]


def test_tx_rollback_discards_publishes(s: Session) -> None:
    q = s.queue()
    s.ch.tx_select()
    s.ch.basic_publish("", q, b"discarded-1")
    s.ch.basic_publish("", q, b"discarded-2")
    s.ch.tx_rollback()
    assert s.ready(q) == 0
    s.ch.tx_commit()  # nothing left to commit
    assert s.ready(q) == 0
    s.ch.basic_publish("", q, b"kept")
    s.ch.tx_commit()
    assert s.ready(q) == 1
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"kept"


def test_channel_stays_transactional_after_commit(s: Session) -> None:
    q = s.queue()
    s.ch.tx_select()
    s.ch.basic_publish("", q, b"1")
    s.ch.tx_commit()
    s.ch.basic_publish("", q, b"2")
    barrier(s.ch)
    assert s.ready(q) == 1
    s.ch.tx_commit()
    assert s.ready(q) == 2


def test_uncommitted_publishes_are_lost_when_channel_closes(s: Session) -> None:
    q = s.queue()
    ch = s.conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"never")
    ch.close()
    assert s.ready(q) == 0


def test_tx_mandatory_return_comes_with_commit(s: Session) -> None:
    returned: list[bytes] = []
    s.ch.add_on_return_callback(lambda ch, m, p, b: returned.append(b))
    s.ch.tx_select()
    s.ch.basic_publish("amq.direct", "nobody", b"lost", mandatory=True)
    barrier(s.ch)
    settle(s.conn, 0.1)
    assert returned == []
    s.ch.tx_commit()
    wait_until(s.conn, lambda: returned == [b"lost"])


def test_tx_commit_without_select_is_406(s: Session) -> None:
    text = channel_error(406, s.ch.tx_commit)
    assert text == "PRECONDITION_FAILED - channel is not transactional"


def test_a_commit_with_a_message_a_queue_refused_is_partial(s: Session) -> None:
    # RabbitMQ 3.10, asked with the same client script: the channel is closed
    # with 406 "partial tx completion" and what the queue did take stays.
    name = uniq()
    s.ch.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    s.queues.append(name)
    s.ch.tx_select()
    s.ch.basic_publish("", name, b"1")
    s.ch.basic_publish("", name, b"2")
    text = channel_error(406, s.ch.tx_commit)
    assert text == "PRECONDITION_FAILED - partial tx completion"
    assert s.ready(name) == 1


def test_tx_rollback_without_select_is_406(s: Session) -> None:
    text = channel_error(406, s.ch.tx_rollback)
    assert text == "PRECONDITION_FAILED - channel is not transactional"


# -- transactions: acks -------------------------------------------------------------------


def _two_messages_one_got(s: Session) -> tuple[str, int]:
    q = s.queue()
    s.ch.basic_publish("", q, b"1")
    s.ch.basic_publish("", q, b"2")
    s.ch.tx_select()
    s.ch.tx_commit()
    method = s.ch.basic_get(q)[0]
    assert method is not None
    return q, method.delivery_tag


def test_tx_ack_takes_effect_on_commit(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_ack(tag)
    s.ch.tx_commit()
    s.ch.close()
    assert s.ready(q) == 1  # only message 2 is left


def test_rolled_back_ack_leaves_message_unacked(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_ack(tag)
    s.ch.tx_rollback()
    assert s.ready(q) == 1  # message 1 is still out, unacked
    s.ch.basic_recover(requeue=True)
    assert s.ready(q) == 2
    method, _p, body = s.ch.basic_get(q)
    assert (body, method.redelivered) == (b"1", True)


def test_rolled_back_ack_requeued_on_close(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_ack(tag)
    s.ch.tx_rollback()
    s.ch.close()
    assert s.ready(q) == 2


def test_rolled_back_ack_can_be_acked_again(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_ack(tag)
    s.ch.tx_rollback()
    s.ch.basic_ack(tag)
    s.ch.tx_commit()
    s.ch.close()
    assert s.ready(q) == 1


def test_uncommitted_ack_requeued_on_close(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_ack(tag)
    s.ch.close()
    assert s.ready(q) == 2


def test_tx_reject_with_requeue_applies_on_commit(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_reject(tag, requeue=True)
    barrier(s.ch)
    assert s.ready(q) == 1
    s.ch.tx_commit()
    assert s.ready(q) == 2
    method, _p, body = s.ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"1", True)


def test_tx_nack_without_requeue_drops_on_commit(s: Session) -> None:
    q, tag = _two_messages_one_got(s)
    s.ch.basic_nack(tag, requeue=False)
    s.ch.tx_commit()
    s.ch.close()
    assert s.ready(q) == 1


def test_tx_ack_of_unknown_tag_is_406(s: Session) -> None:
    s.ch.tx_select()
    s.ch.basic_ack(99)
    text = channel_error(406, s.ch.tx_commit)
    assert text == "PRECONDITION_FAILED - unknown delivery tag 99"


def test_tx_publish_and_ack_commit_together(s: Session) -> None:
    src, dst = s.queue(), s.queue()
    s.ch.basic_publish("", src, b"work")
    s.ch.tx_select()
    s.ch.tx_commit()
    method, _p, body = s.ch.basic_get(src)
    s.ch.basic_publish("", dst, body + b"-done")
    s.ch.basic_ack(method.delivery_tag)
    barrier(s.ch)
    assert (s.ready(src), s.ready(dst)) == (0, 0)
    s.ch.tx_commit()
    s.ch.close()
    assert (s.ready(src), s.ready(dst)) == (0, 1)


def test_tx_ack_frees_prefetch_only_on_commit(s: Session) -> None:
    q = s.queue()
    s.ch.basic_publish("", q, b"1")
    s.ch.tx_select()
    s.ch.tx_commit()
    s.ch.basic_qos(prefetch_count=1)
    tags: list[int] = []
    s.ch.basic_consume(q, lambda ch, m, p, b: tags.append(m.delivery_tag))
    wait_until(s.conn, lambda: len(tags) == 1)
    s.ch.basic_ack(tags[0])
    s.observer.channel().basic_publish("", q, b"2")  # a new message to deliver...
    barrier(s.ch)
    settle(s.conn)
    assert tags == [1]  # ...but the uncommitted ack has not freed the prefetch slot
    s.ch.tx_commit()
    wait_until(s.conn, lambda: tags == [1, 2])


def test_rolled_back_ack_keeps_prefetch_slot(s: Session) -> None:
    q = s.queue()
    for body in (b"1", b"2"):
        s.ch.basic_publish("", q, body)
    s.ch.tx_select()
    s.ch.tx_commit()
    s.ch.basic_qos(prefetch_count=1)
    tags: list[int] = []
    s.ch.basic_consume(q, lambda ch, m, p, b: tags.append(m.delivery_tag))
    wait_until(s.conn, lambda: len(tags) == 1)
    s.ch.basic_ack(tags[0])
    s.ch.tx_rollback()
    s.ch.tx_commit()
    settle(s.conn)
    assert tags == [1]
    s.ch.basic_ack(tags[0])
    s.ch.tx_commit()
    wait_until(s.conn, lambda: tags == [1, 2])
