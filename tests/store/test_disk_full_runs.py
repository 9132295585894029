"""A publish run that a full disk cuts in two, for real and every time.

A stream stores a run of publishes in pieces, one per segment
(StreamStore.append_run). Here the first piece goes past what the write
segment's file has allocated while the disk (a small tmpfs, filled by the
test) has two pages free: its write-out, made when the second piece starts
a new segment, fails with ENOSPC and drops it, while the second piece fits
the new segment's file and is stored. The publisher must get a nack for
every message of the first piece and an ack for every message of the
second (before the fix the whole run was acked: messages confirmed and not
in the stream; then the whole run was nacked). With several queues, a later
queue's write may cost an earlier one its part after it returned: a run's
and a single message's confirm must then be a nack.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread
from diskhelp import MiB, fill, tmpfs
from pamqp import commands
from rawamqp import RawAMQP, publish_frames
from test_disk_full import queue_numbers, stream_numbers

from warren.store.segment_alloc import FIRST_ALLOCATION
from warren.store.segment_format import MARK_SIZE, V2_HEADER_SIZE

#: The stream's segment size: past the first allocation of a segment file, so
#: that the first segment's data outgrows what its file has.
SEGMENT = FIRST_ALLOCATION + 16 * 1024
BODY = 1000
PAGE = 4096


class Publisher:
    """Raw publishes with confirms on one channel of a new connection: bodies
    ``s:<i>:...`` (publish number i), each with a deduplication key of the
    same length."""

    def __init__(self, port: int, exchange: str = "", routing_key: str = "s") -> None:
        self.amqp = amqp = RawAMQP(port)
        amqp.handshake()
        amqp.open_channel(1)
        amqp.send_method(1, commands.Confirm.Select())
        amqp.expect_method(commands.Confirm.SelectOk)
        self.exchange = exchange
        self.routing_key = routing_key
        self.published = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()

    def declare(self, queue: str, durable: bool = True, **arguments: object) -> None:
        self.amqp.send_method(
            1, commands.Queue.Declare(queue=queue, durable=durable, arguments=arguments)
        )
        self.amqp.expect_method(commands.Queue.DeclareOk)

    def frames(self, i: int, key: int | None = None) -> bytes:
        head = f"s:{i}:".encode()
        props = commands.Basic.Properties(
            delivery_mode=2, headers={"x-deduplication-header": f"k{i if key is None else key:06d}"}
        )
        data = head + b"." * (BODY - len(head))
        return publish_frames(1, data, self.routing_key, self.exchange, properties=props)

    def publish(self, keys: list[int | None]) -> range:
        """One message per entry (None: its own key, else that publish's key), all
        in one write, so that the broker reads them as one run; their numbers."""
        first = self.published + 1
        data = b"".join(self.frames(first + k, key) for k, key in enumerate(keys))
        self.published += len(keys)
        self.amqp.send(data)
        return range(first, self.published + 1)

    def settle(self) -> None:
        """Read confirms until every publish so far has one."""
        pending = set(range(1, self.published + 1)) - self.acked - self.nacked
        while pending:
            _ch, method = self.amqp.read_frame(30)
            if isinstance(method, commands.Connection.Blocked | commands.Connection.Unblocked):
                continue  # the failed write raised the disk alarm
            assert isinstance(method, commands.Basic.Ack | commands.Basic.Nack), method
            tag = method.delivery_tag
            done = {t for t in pending if t <= tag} if method.multiple else {tag}
            pending -= done
            (self.acked if isinstance(method, commands.Basic.Ack) else self.nacked).update(done)


def leave_free(disk: Path, pages: int) -> Path:
    """Fill ``disk`` but for ``pages`` pages; the filler file."""
    filler = disk / "filler"
    fill(filler)
    os.truncate(filler, filler.stat().st_size - pages * PAGE)
    return filler


def check_against_confirms(stored: list[int], pub: Publisher, dup: int | None = None) -> None:
    """Every acked publish is stored (but a duplicate), in publish order, and
    nothing that was neither acked nor nacked."""
    assert stored == sorted(set(stored)), "out of order or twice"
    missing = sorted(pub.acked - set(stored) - {dup})
    assert not missing, ("confirmed but not stored", missing)
    assert set(stored) <= pub.acked | pub.nacked


def fan_out(b: BrokerThread, bound: tuple[str, ...]) -> tuple[Publisher, Any]:
    """A publisher to fanout exchange ``fan``, a stream ``s`` (small segments), a
    durable queue ``q`` and a transient one ``t`` declared, the ``bound`` ones
    bound to it; also the stream's store."""
    pub = Publisher(b.port, exchange="fan", routing_key="")
    amqp = pub.amqp
    amqp.send_method(1, commands.Exchange.Declare(exchange="fan", exchange_type="fanout"))
    amqp.expect_method(commands.Exchange.DeclareOk)
    pub.declare("s", **{"x-queue-type": "stream", "x-stream-max-segment-size-bytes": SEGMENT})
    pub.declare("q")
    pub.declare("t", durable=False)
    for queue in bound:
        amqp.send_method(1, commands.Queue.Bind(queue=queue, exchange="fan"))
        amqp.expect_method(commands.Queue.BindOk)
    return pub, b.call(lambda: b.broker.vhosts["/"].queues["s"].stream)


def fill_stream_to_its_allocation(b: BrokerThread, pub: Publisher, stream: Any) -> int:
    """Publish (confirmed) as many messages as the first allocation of the
    stream's file holds with a little room left; how many."""
    pub.publish([None])
    pub.settle()
    record = b.call(lambda: stream.ready_bytes)
    below: int = (FIRST_ALLOCATION - 2 * 1024 - V2_HEADER_SIZE) // record
    pub.publish([None] * (below - 1))
    pub.settle()
    return below


def budget_of_a_page(b: BrokerThread) -> bool:
    """Make the free-disk budget one page (run on the broker's loop); whether the
    disk alarm went off."""
    b.broker.config.free_disk_min = PAGE
    return b.broker.resource_alarms.check_disk()


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "deduplicated"])
def test_a_run_cut_by_a_full_disk_is_nacked_exactly_where_it_was_lost(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread], dedup: bool
) -> None:
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        pub = Publisher(b.port)
        args: dict[str, object] = {
            "x-queue-type": "stream",
            "x-stream-max-segment-size-bytes": SEGMENT,
        }
        if dedup:
            args["x-message-deduplication"] = True
        pub.declare("s", **args)
        stream = b.call(lambda: b.broker.vhosts["/"].queues["s"].stream)

        # The first segment, filled to a little below its file's first allocation.
        pub.publish([None])
        pub.settle()
        record = b.call(lambda: stream.ready_bytes)
        below = (FIRST_ALLOCATION - 2 * 1024 - V2_HEADER_SIZE) // record
        pub.publish([None] * (below - 1))
        pub.settle()
        assert pub.acked == set(range(1, below + 1))
        pos = V2_HEADER_SIZE + b.call(lambda: stream.ready_bytes)
        assert pos == V2_HEADER_SIZE + below * record

        # The disk full but for two pages: less than the first segment's data
        # must grow by, enough for the new segment's piece.
        filler = leave_free(disk, 2)
        first_piece = (SEGMENT - pos - MARK_SIZE) // record
        assert (pos + first_piece * record + MARK_SIZE) - FIRST_ALLOCATION > 3 * PAGE
        second_piece = 2
        assert V2_HEADER_SIZE + second_piece * record + MARK_SIZE <= PAGE
        # Deduplicated: a duplicate of publish 1 in the first piece splits the
        # run in two stretches (the second one's new segment drops the first).
        keys: list[int | None] = [None] * (first_piece + second_piece)
        dup = None
        if dedup:
            keys.insert(first_piece // 2, 1)
            dup = pub.published + 1 + first_piece // 2
        run = pub.publish(keys)
        pub.settle()
        stored = stream_numbers(b.port, "s")
        pub.amqp.close_socket()
        # The same after a restart, with room again.
        b.stop()
        filler.unlink()
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        try:
            assert stream_numbers(b.port, "s") == stored
        finally:
            b.stop()

    check_against_confirms(stored, pub, dup)
    # Exactly the first piece was lost, and only its publishes were nacked.
    kept = [i for i in run if i != dup]
    assert stored == list(range(1, below + 1)) + kept[-second_piece:]
    assert pub.nacked == set(kept[:-second_piece])
    assert pub.acked == set(stored) | ({dup} if dup else set())


def test_a_run_to_several_queues_is_nacked_when_a_later_queue_cost_an_earlier_its_part(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # A run routed to a stream, then to two classic queues. The stream stores
    # its part first, buffered, past what its file has allocated; the last
    # queue (not durable: what it loses costs no confirm) spends the free-disk
    # budget, so every store written in the turn is written out
    # (store/disk_budget.py): the stream's write-out fails, while the durable
    # queue's part fits what its file has. The stream's part is lost after it
    # returned: the run must be nacked, never acked.
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        pub, stream = fan_out(b, bound=("s", "q", "t"))
        below = fill_stream_to_its_allocation(b, pub, stream)
        assert pub.acked == set(range(1, below + 1))
        b.call(lambda: b.broker.vhosts["/"].queues["t"].purge())

        # Two pages free, a budget of one: the stream's part must grow its file
        # by more than two pages, the purged queue's part needs more than one
        # page of budget, and the durable queue's fits its file.
        filler = leave_free(disk, 2)
        assert b.call(lambda: budget_of_a_page(b)) is False
        run = pub.publish([None] * 12)
        pub.settle()
        streamed = stream_numbers(b.port, "s")
        queued = queue_numbers(b.port, "q")
        pub.amqp.close_socket()
        b.stop()
        filler.unlink()

    check_against_confirms(streamed, pub)
    check_against_confirms(queued, pub)
    assert streamed == list(range(1, below + 1))  # the run's part was lost
    assert pub.nacked == set(run)


def test_one_message_to_several_queues_is_nacked_when_a_later_queue_cost_an_earlier_its_part(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # The single-message path (Router.enqueue) of the case above: one publish,
    # through pika with confirms, routed to a stream, then a durable queue,
    # then a transient one. The stream buffers its record past what its file
    # has allocated, the durable queue's fits its file, and the last queue
    # spends the free-disk budget: every store written in the turn is written
    # out, the stream's write-out fails and drops the record after the stream
    # returned. The publisher must get a nack, never an ack.
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        pub, stream = fan_out(b, bound=("s", "t"))
        below = fill_stream_to_its_allocation(b, pub, stream)
        # The durable queue: one message, so that its file has room to spare.
        pub.amqp.send_method(1, commands.Queue.Bind(queue="q", exchange="fan"))
        pub.amqp.expect_method(commands.Queue.BindOk)
        pub.publish([None])
        pub.settle()
        assert pub.acked == set(range(1, below + 2))
        b.call(lambda: b.broker.vhosts["/"].queues["t"].purge())

        # Two pages free, a budget of one: the message's record must grow the
        # stream's file by more than two pages, fits the durable queue's file,
        # and needs more than a page of budget in the purged queue.
        filler = leave_free(disk, 2)
        assert b.call(lambda: budget_of_a_page(b)) is False
        big = 4 * PAGE
        pos = V2_HEADER_SIZE + b.call(lambda: stream.ready_bytes)
        assert pos + big - FIRST_ALLOCATION > 2 * PAGE
        assert pos + big + MARK_SIZE <= SEGMENT  # in the same segment
        number = pub.published + 1
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
        ch = conn.channel()
        ch.confirm_delivery()
        body = f"s:{number}:".encode().ljust(big, b".")
        try:
            ch.basic_publish("fan", "", body, pika.BasicProperties(delivery_mode=2))
            acked = True
        except pika.exceptions.NackError:
            acked = False
        conn.close()
        streamed = stream_numbers(b.port, "s")
        pub.amqp.close_socket()
        b.stop()
        filler.unlink()
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        try:
            assert stream_numbers(b.port, "s") == streamed
            queued = queue_numbers(b.port, "q")
        finally:
            b.stop()

    assert streamed == list(range(1, below + 2))  # the message's record was lost
    if acked:
        assert number in streamed and number in queued, "confirmed but not stored"
    assert not acked
