"""How often a stream's tracked offsets reach its ``offsets`` file, in memory.

Every ack of a tracking consumer moves its stored offset. The file was
rewritten (a temporary file and a rename) at every loop turn with acks: 2,907
renames, 5 s of a 16.8 s profiled test. Now a change is written
TRACKING_WRITE_MS later on the broker's clock (a ManualClock here), so at most
that often, and at once when the consumer goes (or the stream closes). What the file holds at any moment is what a
restart after kill -9 finds: the test copies the data directory then and
starts a broker on the copy, whose consumer gets again exactly the messages
acked since the last write (docs/streams.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import Connection, Harness
from harness.channel import uniq

from warren.core.clock import ManualClock
from warren.store.stream_tracking import TRACKING_FILE, TRACKING_WRITE_MS

pytestmark = pytest.mark.timeout(60)

TRACKED = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}


class OneByOne:
    """A tracking consumer with prefetch 1 that acks each message as a separate
    step when told to (each ack its own loop turn at the broker)."""

    def __init__(self, conn: Connection, queue: str, tag: str) -> None:
        self.conn = conn
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=1)
        self.got: list[int] = []
        self.tags: list[int] = []
        self.acked = 0
        self.ch.basic_consume(queue, self._on_message, consumer_tag=tag, arguments=TRACKED)

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.got.append(props.headers["x-stream-offset"])
        self.tags.append(method.delivery_tag)

    def next_offset(self) -> int:
        """The offset of the next delivery (read already, or now)."""
        while len(self.got) <= self.acked:
            self.conn.read_one()
        return self.got[self.acked]

    def ack_next(self) -> None:
        """Ack the delivery next_offset gave."""
        self.ch.basic_ack(self.tags[self.acked])
        self.acked += 1
        self.ch.barrier()  # the broker has processed the ack (and flushed its turn)


def stored(data: Path) -> bytes | None:
    """The stream's offsets file as it is on disk now (None: not written yet)."""
    found = list(data.rglob(TRACKING_FILE))
    assert len(found) <= 1, found
    return found[0].read_bytes() if found else None


def entry(tag: str, offset: int) -> bytes:
    raw = tag.encode()
    return bytes([len(raw)]) + raw + offset.to_bytes(8, "big", signed=True)


def test_offsets_are_written_at_most_once_per_interval(tmp_path: Path) -> None:
    data = tmp_path / "data"
    killed = tmp_path / "killed"
    with Harness(data, clock=ManualClock()) as b:
        conn = b.amqp_connection()
        ch = conn.channel()
        ch.confirm_delivery()
        s = uniq("stream")
        ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream"})
        for i in range(30):
            ch.basic_publish("", s, str(i).encode())
        c = OneByOne(conn, s, "t")
        # Ten acks, each in its own loop turn, while the clock stands still:
        # the file is not rewritten per ack (it was, ten times).
        for i in range(10):
            assert c.next_offset() == i
            c.ack_next()
            assert stored(data) is None
        b.advance(TRACKING_WRITE_MS)
        assert stored(data) == entry("t", 10)
        for i in range(10, 15):
            assert c.next_offset() == i
            c.ack_next()
        b.advance(TRACKING_WRITE_MS - 1)
        assert stored(data) == entry("t", 10)
        b.advance(1)
        assert stored(data) == entry("t", 15)
        # Three more acks, not yet written: a kill -9 now keeps the file as it is.
        for i in range(15, 18):
            assert c.next_offset() == i
            c.ack_next()
        shutil.copytree(data, killed)
        assert stored(killed) == entry("t", 15)
        # A consumer that goes has its position written at once.
        c.ch.basic_cancel("t")
        assert stored(data) == entry("t", 18)
        conn.close()
    with Harness(data, clock=ManualClock()) as b:
        conn = b.amqp_connection()
        assert OneByOne(conn, s, "t").next_offset() == 18
        conn.close()
    # After the kill: the acks of the last interval come again, nothing is skipped.
    with Harness(killed, clock=ManualClock()) as b:
        conn = b.amqp_connection()
        assert OneByOne(conn, s, "t").next_offset() == 15
        conn.close()
