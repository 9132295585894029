"""Power cuts while segment files are retired as spares and reused
(docs/storage.md, "Writing": spares): 0 confirmed messages lost, acknowledged
ones back only as redeliveries, nothing of a spare's earlier life served, and
every spare accounted for after the restart (a spare file, or a segment)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from powercut_load import GONE, Ledger, WarrenProcess, drain, message_id
from powercut_mount import PowerCutMount, power_fixture  # noqa: F401 (the fixtures)

ARGS = ("--segment-size", "65536")
PADDING = b" " + b"." * 8000  # 8 messages a 64 KiB segment
QUEUE = "reuse"


class Broker:
    """One broker at a time on the power-cut mount, and what its queue was sent."""

    def __init__(self, power: PowerCutMount) -> None:
        self.power = power
        self.broker: WarrenProcess | None = None
        self.ledger = Ledger(QUEUE)
        self.n = 0

    def start(self) -> WarrenProcess:
        self.broker = WarrenProcess(self.power.mount(), *ARGS)
        return self.broker

    def publish(self, count: int) -> None:
        """Publish ``count`` messages, each confirmed before the next (a sync round each)."""
        assert self.broker is not None
        conn = self.broker.amqp()
        try:
            ch = conn.channel()
            ch.queue_declare(QUEUE, durable=True)
            ch.confirm_delivery()
            for _ in range(count):
                mid = f"m{self.n}"
                self.n += 1
                with self.ledger.lock:
                    self.ledger.published.add(mid)
                ch.basic_publish(
                    "", QUEUE, mid.encode() + PADDING, pika.BasicProperties(delivery_mode=2)
                )
                with self.ledger.lock:
                    self.ledger.confirmed.add(mid)
            conn.close()
        except GONE:
            pass

    def consume(self, count: int) -> None:
        """basic.get and ack ``count`` messages, then a round trip (the acks were taken)."""
        assert self.broker is not None
        conn = self.broker.amqp()
        ch = conn.channel()
        for _ in range(count):
            method, _props, body = ch.basic_get(QUEUE)
            assert method is not None
            with self.ledger.lock:
                self.ledger.acked.add(message_id(body))
            ch.basic_ack(method.delivery_tag)
        ch.queue_declare(QUEUE, passive=True)
        conn.close()

    def cut_and_restart(self) -> WarrenProcess:
        assert self.broker is not None
        self.broker.kill()
        self.power.unmount()
        return self.start()

    def verify(self) -> None:
        """Everything confirmed and not acked is there; the rest as the ledger allows."""
        assert self.broker is not None
        got = drain(self.broker, QUEUE)
        self.ledger.check([(m, r) for m, r, _ in got])
        with self.ledger.lock:
            self.ledger.acked.update(m for m, _, _ in got)

    def files(self) -> list[str]:
        return sorted(
            p.name
            for p in Path(self.power.backing).rglob("*")
            if p.name.startswith(("msgs.", "spare."))
        )

    def close(self) -> None:
        if self.broker is not None:
            self.broker.kill()
        self.power.unmount()


@pytest.fixture
def broker(power: PowerCutMount) -> Iterator[Broker]:
    b = Broker(power)
    try:
        yield b
    except BaseException:
        if b.broker is not None:
            print(b.broker.log_tail())
        raise
    finally:
        b.close()


def retire_two(b: Broker) -> None:
    """32 messages (4 segments), 16 of them consumed: two segments retired as spares."""
    b.start()
    b.publish(32)
    b.consume(16)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_cut_at_the_spares_sync_loses_nothing(
    broker: Broker, power: PowerCutMount, after: bool
) -> None:
    """Before the spare's fdatasync: the spare header and the rename may be lost
    (the segment comes back with its acks, or without them: redelivered); after
    it, before the directory's fsync: msgs.<id> with the spare header, a spare
    again."""
    retire_two(broker)
    power.arm_fsync("*spare.*", after=after)
    threading.Thread(target=broker.publish, args=(4,), daemon=True).start()
    assert power.frozen.wait(30), "the spares were never fsynced"
    broker.cut_and_restart()
    broker.verify()
    # The restarted broker reuses what it found: more segments, all served.
    broker.publish(24)
    broker.verify()
    assert broker.broker is not None
    broker.broker.stop()
    power.unmount()
    assert len([f for f in broker.files() if f.startswith("spare.")]) <= 2


def test_the_spares_are_reused_on_this_mount(broker: Broker, power: PowerCutMount) -> None:
    """What the cuts below interrupt: two spares, made ready by two sync rounds,
    become the next two segments (the same files)."""
    retire_two(broker)
    broker.publish(2)
    backing = Path(power.backing)
    spares = {p.stat().st_ino for p in backing.rglob("spare.*")}
    assert len(spares) == 2
    broker.publish(16)
    assert spares <= {p.stat().st_ino for p in backing.rglob("msgs.*")}
    assert not list(backing.rglob("spare.*"))


@pytest.mark.parametrize("ops", [3, 8, 15, 30, 60, 120])
def test_a_cut_during_a_reuse_loses_nothing(broker: Broker, power: PowerCutMount, ops: int) -> None:
    """The spares are ready (two sync rounds after the retire); the next segments
    are started in them while the power goes at a chosen count of operations:
    among the renames, the new headers, the records and their syncs."""
    retire_two(broker)
    broker.publish(2)  # the spares' sync round, then the round that makes them ready
    assert power.fsyncs("*spare.*") == 2
    before = broker.files()
    power.arm_ops(ops)
    threading.Thread(target=broker.publish, args=(400,), daemon=True).start()
    assert power.frozen.wait(60), "the load never reached the cut"
    broker.cut_and_restart()
    broker.verify()
    broker.publish(24)
    broker.verify()
    assert broker.broker is not None
    broker.broker.stop()
    power.unmount()
    assert before and len([f for f in broker.files() if f.startswith("spare.")]) <= 2


def consume_until(b: Broker, stop: threading.Event) -> None:
    """Take and ack messages one at a time until ``stop`` or the broker dies."""
    assert b.broker is not None
    try:
        conn = b.broker.amqp()
        ch = conn.channel()
        while not stop.is_set():
            method, _props, body = ch.basic_get(QUEUE)
            if method is None:
                conn.process_data_events(time_limit=0.02)
                continue
            with b.ledger.lock:
                b.ledger.acked.add(message_id(body))
            ch.basic_ack(method.delivery_tag)
        conn.close()
    except GONE:
        pass


def test_reuse_under_random_cuts_with_a_consumer(broker: Broker, power: PowerCutMount) -> None:
    """A consumer acks while a publisher fills segments: retires and reuses all the
    time; four cuts at random points, each restart checked."""
    rng = random.Random(11)
    broker.start()
    for _round in range(4):
        stop = threading.Event()
        broker.publish(1)  # the queue exists
        consumer = threading.Thread(target=consume_until, args=(broker, stop), daemon=True)
        consumer.start()
        power.arm_ops(rng.randint(200, 1500))
        threading.Thread(target=broker.publish, args=(100_000,), daemon=True).start()
        assert power.frozen.wait(120), "the load never reached the cut"
        stop.set()
        broker.cut_and_restart()
        consumer.join(30)
        broker.verify()
    assert broker.broker is not None
    broker.broker.stop()
    power.unmount()
