"""Queues as a pika (BlockingConnection) client observes them, over real sockets.

Declaration flags and the counts in declare-ok, server-named queues, the
"last declared queue" shortcuts, purge and delete with their guards, exclusive
and auto-delete lifecycles, and consumer cancellation when a queue goes away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import ChannelClosedByBroker
from pikahelp import Session as BaseSession
from pikahelp import channel_error, publish, uniq, wait_until

pytestmark = pytest.mark.timeout(30)


# -- helpers ------------------------------------------------------------------------------


def queue_state(conn: BlockingConnection, name: str) -> int | tuple[int, int]:
    """(message_count, consumer_count) of a queue, or the error code of a passive declare."""
    ch = conn.channel()
    try:
        ok = ch.queue_declare(name, passive=True).method
    except ChannelClosedByBroker as exc:
        return exc.reply_code
    ch.close()
    return ok.message_count, ok.consumer_count


def exists(conn: BlockingConnection, name: str) -> bool:
    state = queue_state(conn, name)
    assert state != 405, "queue is exclusive to another connection"
    return state != 404


class Session(BaseSession):
    """Cleanup goes on past a queue it cannot delete (an exclusive queue still locked)."""

    tolerate_failed_queue_delete = True


@pytest.fixture
def s(broker: Any) -> Iterator[Session]:
    with closing(Session(broker)) as session:
        yield session


# -- declare --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [{"durable": True}, {"durable": False}, {"auto_delete": True}, {"exclusive": True}],
    ids=["durable", "transient", "auto-delete", "exclusive"],
)
def test_declare_ok_reports_name_and_zero_counts(s: Session, flags: dict[str, bool]) -> None:
    name = uniq()
    ok = s.ch.queue_declare(name, **flags).method
    s.queues.append(name)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    s.ch.confirm_delivery()  # each publish is enqueued before the next line runs
    publish(s.ch, name, b"1", b"2", b"3")
    again = s.ch.queue_declare(name, **flags).method
    assert (again.queue, again.message_count, again.consumer_count) == (name, 3, 0)
    passive = s.ch.queue_declare(name, passive=True).method
    assert (passive.message_count, passive.consumer_count) == (3, 0)


def test_declare_ok_counts_ready_messages_and_consumers(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1", b"2", b"3")
    consumer_ch = s.conn.channel()
    consumer_ch.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    consumer_ch.basic_consume(q, lambda c, m, p, b: got.append(b))
    consumer_ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True, exclusive=False)
    wait_until(s.conn, lambda: len(got) == 3)
    ok = s.ch.queue_declare(q, passive=True).method
    # The auto-ack consumer drained what the prefetch-limited one could not take.
    assert (ok.message_count, ok.consumer_count) == (0, 2)


def test_declare_ok_excludes_unacked_messages(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1", b"2", b"3")
    consumer_ch = s.conn.channel()
    consumer_ch.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    consumer_ch.basic_consume(q, lambda c, m, p, b: got.append(b))
    wait_until(s.conn, lambda: len(got) == 1)
    ok = s.ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)
    assert got == [b"1"]


def test_server_named_queue(s: Session) -> None:
    first = s.ch.queue_declare("", exclusive=True).method
    second = s.ch.queue_declare("", exclusive=True).method
    assert first.queue.startswith("amq.gen-")
    assert second.queue.startswith("amq.gen-")
    assert first.queue != second.queue
    assert (first.message_count, first.consumer_count) == (0, 0)
    publish(s.ch, first.queue, b"x")
    assert s.ch.basic_get(first.queue, auto_ack=True)[2] == b"x"


def test_declare_reserved_amq_prefix_refused(s: Session) -> None:
    name = "amq." + uniq()
    text = channel_error(403, s.ch.queue_declare, name)
    assert text == f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"


def test_passive_declare_of_missing_queue_is_404(s: Session) -> None:
    name = uniq()
    text = channel_error(404, s.ch.queue_declare, name, passive=True)
    assert text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


@pytest.mark.parametrize(
    ("first", "second", "arg"),
    [
        ({"durable": True}, {"durable": False}, "durable"),
        ({"durable": False}, {"durable": True}, "durable"),
        ({"auto_delete": False}, {"auto_delete": True}, "auto_delete"),
        (
            {"arguments": {"x-max-length": 10}},
            {"arguments": {"x-max-length": 20}},
            "x-max-length",
        ),
        ({"arguments": {"x-message-ttl": 1000}}, {}, "x-message-ttl"),
    ],
)
def test_inequivalent_redeclare_is_406(
    s: Session, first: dict[str, Any], second: dict[str, Any], arg: str
) -> None:
    q = s.queue(**first)
    text = channel_error(406, s.ch.queue_declare, q, **second)
    assert text.startswith(f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{q}'")


def test_redeclare_exclusive_mismatch_is_405(s: Session) -> None:
    plain = s.queue()
    text = channel_error(405, s.ch.queue_declare, plain, exclusive=True)
    assert text.startswith("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue")
    ch = s.reopen()
    excl = s.queue(exclusive=True)
    channel_error(405, ch.queue_declare, excl)


def test_redeclare_with_unchecked_argument_is_fine(s: Session) -> None:
    q = s.queue(arguments={"x-custom": "a"})
    ok = s.ch.queue_declare(q, arguments={"x-custom": "b"}).method
    assert ok.queue == q


# -- bind / unbind and the last-declared-queue shortcut ---------------------------------


def test_bind_with_empty_names_uses_last_declared_queue(s: Session) -> None:
    ex = s.exchange("direct")
    other = s.queue()
    q = s.queue()
    s.ch.queue_bind("", ex, "")  # queue '' and key '' -> the last queue, keyed by its name
    s.ch.queue_bind("", ex, "explicit")
    s.ch.basic_publish(ex, q, b"by-name")
    s.ch.basic_publish(ex, "explicit", b"by-key")
    s.ch.basic_publish(ex, "", b"empty-key")
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"by-name"
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"by-key"
    assert s.ch.basic_get(q, auto_ack=True)[0] is None
    assert s.ch.basic_get(other, auto_ack=True)[0] is None
    s.ch.queue_unbind("", ex, "")
    s.ch.basic_publish(ex, q, b"after-unbind")
    s.ch.basic_publish(ex, "explicit", b"still-bound")
    assert s.ch.basic_get("", auto_ack=True)[2] == b"still-bound"
    assert s.ch.basic_get("", auto_ack=True)[0] is None


def test_last_declared_queue_is_per_channel(s: Session) -> None:
    ex = s.exchange("fanout")
    ch2 = s.conn.channel()
    q1 = s.queue()
    q2 = ch2.queue_declare(uniq()).method.queue
    s.queues.append(q2)
    s.ch.queue_bind("", ex)
    s.ch.basic_publish(ex, "", b"x")
    assert s.ch.basic_get(q1, auto_ack=True)[2] == b"x"
    assert s.ch.basic_get(q2, auto_ack=True)[0] is None


def test_passive_declare_sets_last_declared_queue(s: Session) -> None:
    q = s.queue()
    ch2 = s.conn.channel()
    ch2.queue_declare(q, passive=True)
    ch2.basic_publish("", q, b"x")
    assert ch2.basic_get("", auto_ack=True)[2] == b"x"


def test_empty_queue_name_without_previous_declare_is_404(s: Session) -> None:
    ex = s.exchange("direct")
    ch = s.conn.channel()
    text = channel_error(404, ch.queue_bind, "", ex, "k")
    assert text == "NOT_FOUND - no previously declared queue"


def test_purge_and_delete_with_empty_name_use_last_declared(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1", b"2")
    assert s.ch.queue_purge("").method.message_count == 2
    publish(s.ch, q, b"3")
    assert s.ch.queue_delete("").method.message_count == 1
    assert not exists(s.conn, q)


def test_bind_missing_queue_is_404(s: Session) -> None:
    ex = s.exchange("direct")
    name = uniq()
    text = channel_error(404, s.ch.queue_bind, name, ex, "k")
    assert text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_unbind_missing_binding_succeeds(s: Session) -> None:
    ex = s.exchange("direct")
    q = s.queue()
    s.ch.queue_unbind(q, ex, "never-bound")
    assert s.ch.queue_declare(q, passive=True).method.queue == q


def test_bindings_go_with_the_queue(s: Session) -> None:
    ex = s.exchange("fanout")
    q = s.queue()
    s.ch.queue_bind(q, ex)
    s.ch.queue_delete(q)
    s.ch.queue_declare(q)
    s.ch.basic_publish(ex, "", b"x")
    assert s.ch.basic_get(q, auto_ack=True)[0] is None


# -- purge and delete ---------------------------------------------------------------------


def test_purge_returns_ready_count(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1", b"2", b"3", b"4")
    method = s.ch.basic_get(q)[0]  # one unacked: not purged
    assert s.ch.queue_purge(q).method.message_count == 3
    assert s.ch.queue_purge(q).method.message_count == 0
    s.ch.basic_nack(method.delivery_tag, requeue=True)
    assert s.ch.queue_declare(q, passive=True).method.message_count == 1
    _m, _p, body = s.ch.basic_get(q, auto_ack=True)
    assert body == b"1"


def test_purge_missing_queue_is_404(s: Session) -> None:
    channel_error(404, s.ch.queue_purge, uniq())


def test_delete_returns_message_count(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"1", b"2", b"3")
    assert s.ch.queue_delete(q).method.message_count == 3
    assert not exists(s.conn, q)


def test_delete_missing_queue_succeeds(s: Session) -> None:
    assert s.ch.queue_delete(uniq()).method.message_count == 0


def test_delete_if_unused(s: Session) -> None:
    q = s.queue()
    tag = s.ch.basic_consume(q, lambda *a: None)
    ch2 = s.conn.channel()
    text = channel_error(406, ch2.queue_delete, q, if_unused=True)
    assert text == f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use"
    s.ch.basic_cancel(tag)
    s.ch.queue_delete(q, if_unused=True)
    assert not exists(s.conn, q)


def test_delete_if_empty(s: Session) -> None:
    q = s.queue()
    publish(s.ch, q, b"x")
    text = channel_error(406, s.ch.queue_delete, q, if_empty=True)
    assert text == f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty"
    ch = s.reopen()
    assert ch.queue_purge(q).method.message_count == 1
    assert ch.queue_delete(q, if_empty=True).method.message_count == 0
    assert not exists(s.conn, q)


# -- exclusive queues ---------------------------------------------------------------------


def _locked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    text = channel_error(405, fn, *args, **kwargs)
    assert text.startswith("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue")


def test_exclusive_queue_is_locked_to_other_connections(s: Session) -> None:
    q = s.queue(exclusive=True)
    publish(s.ch, q, b"mine")
    ex = s.exchange("fanout")
    other = s.connect()
    _locked(other.channel().queue_declare, q, exclusive=True)
    _locked(other.channel().queue_declare, q)
    _locked(other.channel().queue_declare, q, passive=True)
    _locked(other.channel().basic_consume, q, lambda *a: None)
    _locked(other.channel().basic_get, q)
    _locked(other.channel().queue_purge, q)
    _locked(other.channel().queue_delete, q)
    _locked(other.channel().queue_bind, q, ex)
    # The owner is unaffected.
    assert s.ch.queue_declare(q, passive=True).method.message_count == 1
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"mine"


def test_exclusive_queue_usable_from_any_channel_of_its_connection(s: Session) -> None:
    q = s.queue(exclusive=True)
    s.ch.close()
    ch2 = s.conn.channel()
    ch2.basic_publish("", q, b"x")
    assert ch2.basic_get(q, auto_ack=True)[2] == b"x"


def test_exclusive_queue_disappears_when_its_connection_closes(s: Session) -> None:
    owner = s.connect()
    och = owner.channel()
    q = och.queue_declare(uniq(), exclusive=True, durable=False).method.queue
    och.basic_publish("", q, b"x")
    assert queue_state(s.conn, q) == 405
    owner.close()
    wait_until(s.conn, lambda: queue_state(s.conn, q) == 404)
    # The name is free again.
    ok = s.ch.queue_declare(q, exclusive=True).method
    assert (ok.queue, ok.message_count) == (q, 0)


def test_exclusive_queue_survives_its_channel(s: Session) -> None:
    ch = s.conn.channel()
    q = ch.queue_declare(uniq(), exclusive=True).method.queue
    ch.close()
    assert queue_state(s.conn, q) == (0, 0)


# -- auto-delete queues -------------------------------------------------------------------


def test_auto_delete_queue_goes_with_last_consumer(s: Session) -> None:
    q = s.queue(auto_delete=True)
    t1 = s.ch.basic_consume(q, lambda *a: None)
    t2 = s.ch.basic_consume(q, lambda *a: None)
    s.ch.basic_cancel(t1)
    assert queue_state(s.conn, q) == (0, 1)
    s.ch.basic_cancel(t2)
    wait_until(s.conn, lambda: not exists(s.conn, q))


def test_auto_delete_queue_goes_when_consumer_channel_closes(s: Session) -> None:
    q = s.queue(auto_delete=True)
    ch = s.conn.channel()
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    wait_until(s.conn, lambda: not exists(s.conn, q))


def test_auto_delete_queue_never_consumed_stays(s: Session) -> None:
    q = s.queue(auto_delete=True)
    publish(s.ch, q, b"x")
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"x"
    assert queue_state(s.conn, q) == (0, 0)


# -- consumers cancelled by queue deletion ------------------------------------------------


def test_deleting_queue_cancels_its_consumers(s: Session) -> None:
    assert s.conn.consumer_cancel_notify_supported
    q = s.queue()
    cancelled: list[str] = []
    s.ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    delivered: list[bytes] = []
    tag = s.ch.basic_consume(q, lambda c, m, p, b: delivered.append(b), auto_ack=True)
    publish(s.ch, q, b"before")
    wait_until(s.conn, lambda: delivered == [b"before"])

    other = s.connect()
    assert other.channel().queue_delete(q).method.message_count == 0
    wait_until(s.conn, lambda: cancelled == [tag])
    assert tag not in s.ch.consumer_tags
    assert s.ch.is_open


def test_deleting_queue_from_consumer_channel_cancels_too(s: Session) -> None:
    q = s.queue()
    cancelled: list[str] = []
    s.ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = s.ch.basic_consume(q, lambda *a: None)
    s.ch.queue_delete(q)
    wait_until(s.conn, lambda: cancelled == [tag])
    assert s.ch.is_open


def test_unacked_message_of_deleted_queue_can_still_be_acked(s: Session) -> None:
    q = s.queue()
    cancelled: list[str] = []
    s.ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tags: list[int] = []
    s.ch.basic_consume(q, lambda c, m, p, b: tags.append(m.delivery_tag))
    publish(s.ch, q, b"x")
    wait_until(s.conn, lambda: len(tags) == 1)
    s.connect().channel().queue_delete(q)
    wait_until(s.conn, lambda: len(cancelled) == 1)
    s.ch.basic_ack(tags[0])
    assert s.ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    assert s.ch.is_open


def test_no_cancel_notification_without_the_capability(s: Session) -> None:
    caps = {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": False,
    }
    conn = s.connect(client_properties={"capabilities": caps})
    ch = conn.channel()
    q = ch.queue_declare(uniq()).method.queue
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(q, lambda *a: None)
    s.ch.queue_delete(q)
    ch.exchange_declare("amq.direct", passive=True)  # round trip on the consumer's connection
    conn.process_data_events(time_limit=0.2)
    assert cancelled == []
    assert ch.is_open
