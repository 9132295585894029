"""Every publish on a full disk is answered, in memory and step by step.

A real full disk (a small tmpfs, filled by the test) under a harness broker
(tests/harness/) driven through the listener's own AMQPProtocol: the
write-out of the loop turn (``sync = false``) or the group commit's round
fails with ENOSPC, the disk alarm blocks the publisher, and publishes it
sends while blocked stay unread until the disk is given back. Each publish
gets exactly one answer: a nack for what the failed write dropped, an ack for
what was stored, and the queue holds exactly the acked ones.

(test_disk_full.py's publishers once hung here under load: the cause was the
test's publishers filling the disk again after its recovery, not a lost
confirm; this pins the broker's side of that story.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from diskhelp import MiB, fill, tmpfs
from harness.amqp import ProtocolAMQP
from harness.broker import Harness
from pamqp import commands
from rawamqp import publish_frames

from warren.core.clock import ManualClock

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


@pytest.fixture(params=[False, True], ids=["no-sync", "sync"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A harness broker on a small disk of its own; free_disk_min 0: only a
    failed write raises the disk alarm."""
    with (
        tmpfs(tmp_path / "disk", 8 * MiB) as disk,
        Harness(disk / "data", sync=request.param, free_disk_min=0) as harness,
    ):
        yield harness


def messages(queue: str, first: int, count: int) -> bytes:
    """Persistent messages ``first`` .. to ``queue``, in one write (a run)."""
    return b"".join(
        publish_frames(1, f"{queue}:{i}".encode(), queue, properties=PERSISTENT)
        for i in range(first, first + count)
    )


def answers(c: ProtocolAMQP, answered: dict[int, bool], count: int, seen: list[str]) -> None:
    """Read until ``count`` more publishes are answered, into ``answered``
    (publish number -> acked); other frames' names go to ``seen``. A publish
    answered twice fails."""
    goal = len(answered) + count
    while len(answered) < goal:
        _, frame = c.read_frame()
        if isinstance(frame, commands.Basic.Ack | commands.Basic.Nack):
            tag = frame.delivery_tag
            if frame.multiple:
                tags = [t for t in range(1, tag + 1) if t not in answered]
            else:
                assert tag not in answered, f"publish {tag} answered twice"
                tags = [tag]
            answered.update(dict.fromkeys(tags, isinstance(frame, commands.Basic.Ack)))
        else:
            seen.append(frame.name)


def publisher(broker: Harness, queue: str) -> ProtocolAMQP:
    """A connection with confirms on channel 1, its durable queue declared."""
    c = broker.amqp_protocol()
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    c.send_method(1, commands.Queue.Declare(queue=queue, durable=True))
    c.expect_method(commands.Queue.DeclareOk)
    return c


def in_one_turn(broker: Harness, sends: list[tuple[ProtocolAMQP, bytes]]) -> None:
    """Each connection's bytes as one socket read, all in the same loop turn
    (each connection's flush at its end: the first one writes out every
    store the turn touched), then the loop run until it has nothing to do."""

    def reads() -> None:
        for c, data in sends:
            c.transport.incoming += data
            c.transport.deliver()

    broker.call(reads)
    broker.settle()


@pytest.mark.parametrize("publishers", [1, 2])
@pytest.mark.parametrize("count", [1, 6], ids=["single", "run"])
def test_every_publish_on_a_full_disk_is_answered(
    broker: Harness, count: int, publishers: int
) -> None:
    queues = [f"q{k}" for k in range(publishers)]
    clients = [publisher(broker, q) for q in queues]
    disk = Path(broker.config.data_dir).parent
    filler = disk / "filler"
    fill(filler)

    # The queues' first segments cannot be written: every message is dropped,
    # whichever connection's flush wrote the stores out.
    answered: list[dict[int, bool]] = [{} for _ in clients]
    seen: list[list[str]] = [[] for _ in clients]
    in_one_turn(broker, [(c, messages(q, 1, count)) for c, q in zip(clients, queues, strict=True)])
    for k, c in enumerate(clients):
        answers(c, answered[k], count, seen[k])
        assert answered[k] == dict.fromkeys(range(1, count + 1), False)
        assert seen[k] == ["Connection.Blocked"]
    assert broker.call(lambda: broker.broker.alarms) == {"disk"}

    # Blocked: what the publishers send now is not read, nor answered.
    in_one_turn(
        broker, [(c, messages(q, count + 1, count)) for c, q in zip(clients, queues, strict=True)]
    )
    for c in clients:
        assert c.buf == b"" and c.transport.written == b"", "answered while blocked"
        assert c.transport.incoming, "read while blocked"

    # The disk given back: read, stored, acked.
    filler.unlink()
    assert broker.call(broker.broker.resource_alarms.check_disk) is False
    broker.settle()
    later = range(count + 1, 2 * count + 1)
    for k, (c, q) in enumerate(zip(clients, queues, strict=True)):
        seen[k].clear()
        answers(c, answered[k], count, seen[k])
        assert {t: ok for t, ok in answered[k].items() if t > count} == dict.fromkeys(later, True)
        assert seen[k] == ["Connection.Unblocked"]
        got = []
        while True:
            c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
            _, method = c.read_frame()
            if isinstance(method, commands.Basic.GetEmpty):
                break
            assert isinstance(method, commands.Basic.GetOk)
            got.append(c.expect_content()[1])
        assert got == [f"{q}:{i}".encode() for i in later]
        c.close()


def test_a_send_to_a_blocked_connection_returns_and_is_read_later(broker: Harness) -> None:
    """ProtocolAMQP.send to a connection whose reading the disk alarm paused
    returns at once, what it sent left unread as in a socket's buffer (it used
    to spin on the loop until the harness's 30 s timeout); read once the disk
    is given back."""
    c = publisher(broker, "q")
    disk = Path(broker.config.data_dir).parent
    filler = disk / "filler"
    fill(filler)
    answered: dict[int, bool] = {}
    seen: list[str] = []
    c.send(messages("q", 1, 1))  # dropped by the failed write: the alarm blocks
    answers(c, answered, 1, seen)
    assert answered == {1: False} and seen == ["Connection.Blocked"]

    c.send(messages("q", 2, 1))  # returns: nothing read while paused
    assert c.transport.incoming and c.protocol.paused, "read while blocked"
    assert c.frames_now() == []

    filler.unlink()
    assert broker.call(broker.broker.resource_alarms.check_disk) is False
    seen.clear()
    answers(c, answered, 1, seen)
    assert answered == {1: False, 2: True} and seen == ["Connection.Unblocked"]
    c.close()


@pytest.mark.parametrize("close", ["shutdown", "management"])
def test_a_blocked_client_is_read_again_for_its_close_ok(tmp_path: Path, close: str) -> None:
    """A close the broker starts (its shutdown, or the management API's) while
    the disk alarm has paused a publisher's reads: the client's close-ok is read
    and ends the connection, as RabbitMQ's reader reads again once closing.
    Before, the close-ok sat unread until CLOSE_OK_TIMEOUT_MS aborted the socket
    (3 s of every stop of a broker with a blocked client); the clock here is a
    ManualClock that is never moved, so only reading the close-ok ends it."""
    with (
        tmpfs(tmp_path / "disk", 8 * MiB) as disk,
        Harness(disk / "data", free_disk_min=0, clock=ManualClock()) as broker,
    ):
        c = publisher(broker, "q")
        fill(disk / "filler")
        answered: dict[int, bool] = {}
        seen: list[str] = []
        c.send(messages("q", 1, 1))
        answers(c, answered, 1, seen)
        assert seen == ["Connection.Blocked"] and c.protocol.paused

        if close == "shutdown":
            broker.call(c.protocol.close)
        else:
            broker.call(lambda: c.conn.force_close("closed by the test"))
        code, text, _, _ = c.expect_close()  # answered with close-ok
        assert code == 320, text
        broker.settle()
        assert not c.transport.incoming, "the close-ok was not read"
        assert c.transport.lost, "the connection outlived its close-ok"
