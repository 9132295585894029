"""Power cuts at chosen points: what each file's fsync discipline must keep.

Each test cuts the power right after the broker confirmed something (or at an
armed fsync), kills the broker with it, restarts it on what the cut left, and
checks through a real client (or in the files) that the confirmed thing is
there. Each one failed before the fix it names in its docstring.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from powercut_load import WarrenProcess, drain, message_id
from powercut_mount import PowerCutMount

ARGS = ("--segment-size", "65536")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Cuts:
    """One broker at a time on the power-cut mount."""

    def __init__(self, power: PowerCutMount) -> None:
        self.power = power
        self.broker: WarrenProcess | None = None

    def start(self) -> WarrenProcess:
        self.broker = WarrenProcess(self.power.mount(), *ARGS)
        return self.broker

    def cut(self) -> None:
        """The power goes now; the broker dies with it."""
        assert self.broker is not None
        self.power.cut()
        self.broker.kill()
        self.power.unmount()

    def stop(self) -> None:
        """A clean stop and unmount: everything written stays."""
        assert self.broker is not None
        self.broker.stop()
        self.power.unmount()

    def close(self) -> None:
        if self.broker is not None:
            self.broker.kill()
        self.power.unmount()


@pytest.fixture
def cuts(power: PowerCutMount) -> Iterator[Cuts]:
    c = Cuts(power)
    try:
        yield c
    except BaseException:
        if c.broker is not None:
            print(c.broker.log_tail())
        raise
    finally:
        c.close()


def publish(broker: WarrenProcess, exchange: str, routing_key: str, *bodies: bytes, **props: object) -> None:
    conn = broker.amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(delivery_mode=2, **props))
    conn.close()


def declare(broker: WarrenProcess, queue: str, **arguments: object) -> None:
    conn = broker.amqp()
    conn.channel().queue_declare(queue, durable=True, arguments=arguments)
    conn.close()


def test_a_queue_declared_on_a_new_data_dir_keeps_its_confirmed_messages(cuts: Cuts) -> None:
    """The vhost's directory (made at the first start) and its definitions.log were
    never entered durably in their parent directories: the queue, its messages and
    every definition were gone after the cut."""
    broker = cuts.start()
    declare(broker, "first")
    publish(broker, "", "first", b"a", b"b", b"c")
    cuts.cut()
    broker = cuts.start()
    assert [m for m, _, _ in drain(broker, "first")] == ["a", "b", "c"]


def test_declarations_survive_on_a_new_data_dir(cuts: Cuts) -> None:
    """declare-ok follows the definitions.log fdatasync, but the log's own entry in
    the vhost directory was never fsynced: a new vhost's first declarations were
    gone after the cut."""
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("work", durable=True)
    ch.queue_bind("work", "orders", "a.#")
    conn.close()
    cuts.cut()
    broker = cuts.start()
    publish(broker, "orders", "a.b", b"routed")
    assert [m for m, _, _ in drain(broker, "work")] == ["routed"]


@pytest.mark.parametrize(
    "arguments", [{}, {"x-max-priority": 3}], ids=["classic", "priority"]
)
def test_a_new_queue_keeps_its_confirmed_messages(cuts: Cuts, arguments: dict[str, object]) -> None:
    """A queue's directory (and a priority queue's, above its levels') was never
    entered durably in queues/: its messages, fdatasynced and confirmed, vanished
    with it."""
    cuts.start()
    cuts.stop()  # the vhost exists and is durable
    broker = cuts.start()
    declare(broker, "late", **arguments)
    publish(broker, "", "late", b"x", b"y")
    cuts.cut()
    broker = cuts.start()
    assert sorted(m for m, _, _ in drain(broker, "late")) == ["x", "y"]


def test_a_new_stream_keeps_its_confirmed_messages(cuts: Cuts) -> None:
    """The same for a stream's directory."""
    broker = cuts.start()
    declare(broker, "s", **{"x-queue-type": "stream"})
    publish(broker, "", "s", b"s0", b"s1")
    cuts.cut()
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    assert ch.queue_declare("s", passive=True).method.message_count == 2
    ch.basic_qos(prefetch_count=10)
    got: list[str] = []
    ch.basic_consume("s", lambda c, m, p, b: got.append(message_id(b)), arguments={"x-stream-offset": "first"})
    while len(got) < 2:
        conn.process_data_events(time_limit=1)
    assert got == ["s0", "s1"]
    conn.close()


def test_a_delayed_exchange_keeps_its_confirmed_messages(cuts: Cuts, power: PowerCutMount) -> None:
    """A durable x-delayed-message exchange's store: the same for its directory.
    Checked in the files: the message is held for an hour."""
    broker = cuts.start()
    conn = broker.amqp()
    ch = conn.channel()
    ch.exchange_declare("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    conn.close()
    publish(broker, "later", "k", b"held-for-an-hour", headers={"x-delay": 3_600_000})
    cuts.cut()
    held = [p for p in power.backing.glob("vhosts/*/exchanges/*/msgs.*") if b"held-for-an-hour" in p.read_bytes()]
    assert held, sorted(str(p.relative_to(power.backing)) for p in Path(power.backing).rglob("*"))
