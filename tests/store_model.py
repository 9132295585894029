"""A model-based test of MessageStores on disk, shared by test_segment_store.py and
test_priority_store.py: random append/append_shifted/peek/shift/ack/requeue/
remove_ready/purge/scan_ready/reopen against a plain in-memory model (counts,
transient counts included).

The model keeps, per message, its priority level and whether it is ready (and
redelivered), unacked or gone. The next message is the ready one with the highest
level and, within it, the oldest (lowest id): a requeued message sorts back into
its original place. Sequence numbers of disk stores do not change across a
restart, so the model checks them against what append/shift returned. Those
of messages that did not survive a restart may be handed out again (an emptied
directory starts its segment ids afresh), so the model forgets them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from examples import examples
from warren.core.message import Message
from warren.core.properties import BasicProperties
from warren.core.store import MessageStore

STATE_MACHINE_SETTINGS = settings(
    max_examples=examples(100),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class StoreModel(RuleBasedStateMachine):
    """Subclasses say how to open the store on ``self.dir`` (with the delivered
    marks a clean close recorded, or None as after a crash) and which level a
    priority property maps to."""

    def open_store(self, marks: dict[Path, int] | None = None) -> Any:
        raise NotImplementedError

    def level(self, priority: int | None) -> int:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.store: MessageStore = self.open_store()
        self.sent: dict[int, Message] = {}
        self.levels: dict[int, int] = {}
        self.seqs: dict[int, int] = {}  # id -> the store's seq
        self.ready: dict[int, bool] = {}  # id -> redelivered
        self.unacked: set[int] = set()
        self.gone: set[int] = set()  # acked, removed or purged since the last restart

    def teardown(self) -> None:
        self.store.close(sync=False)  # type: ignore[call-arg]
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ----------------------------------------------------------------------
    def order(self) -> list[int]:
        return sorted(self.ready, key=lambda i: (-self.levels[i], i))

    def new_message(self, persistent: bool, size: int, priority: int | None) -> int:
        i = len(self.sent)
        props = BasicProperties(delivery_mode=2 if persistent else 1, priority=priority)
        self.sent[i] = Message("x", "k", props.encode(), f"{i}:".encode().ljust(size, b"."), i)
        self.levels[i] = self.level(priority)
        return i

    def check_unique(self, i: int) -> None:
        known = {self.seqs[j] for j in (*self.ready, *self.unacked, *self.gone)}
        assert self.seqs[i] not in known

    def check_item(self, item: tuple[int, Message, bool] | None) -> int | None:
        """Compare shift()/peek() with the model's next message; returns its id."""
        order = self.order()
        if not order:
            assert item is None
            return None
        assert item is not None
        seq, msg, redelivered = item
        i = order[0]
        assert msg.timestamp == i, (msg.timestamp, i)
        assert msg.body == self.sent[i].body and msg.properties == self.sent[i].properties
        assert seq == self.seqs[i]
        assert redelivered == self.ready[i]
        return i

    # -- rules --------------------------------------------------------------------------
    @rule(
        persistent=st.booleans(),
        size=st.integers(0, 300),
        priority=st.none() | st.integers(0, 255),
    )
    def append(self, persistent: bool, size: int, priority: int | None) -> None:
        i = self.new_message(persistent, size, priority)
        self.seqs[i] = self.store.append(self.sent[i])
        self.check_unique(i)
        self.ready[i] = False

    @precondition(lambda self: not self.ready)
    @rule(
        persistent=st.booleans(),
        size=st.integers(0, 300),
        priority=st.none() | st.integers(0, 255),
    )
    def append_shifted(self, persistent: bool, size: int, priority: int | None) -> None:
        i = self.new_message(persistent, size, priority)
        self.seqs[i] = self.store.append_shifted(self.sent[i])
        self.check_unique(i)
        self.unacked.add(i)

    @rule()
    def peek(self) -> None:
        self.check_item(self.store.peek())

    @rule()
    def shift(self) -> None:
        i = self.check_item(self.store.shift())
        if i is not None:
            del self.ready[i]
            self.unacked.add(i)

    @precondition(lambda self: self.unacked)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.unacked)))
        self.store.ack(self.seqs[i])
        self.unacked.remove(i)
        self.gone.add(i)

    @precondition(lambda self: self.unacked)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.unacked)))
        self.store.requeue(self.seqs[i], self.sent[i])
        self.unacked.remove(i)
        self.ready[i] = True

    @precondition(lambda self: self.ready)
    @rule(data=st.data())
    def remove_ready(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.ready)))
        msg = self.store.remove_ready(self.seqs[i])
        assert msg is not None
        assert msg.body == self.sent[i].body and msg.timestamp == i
        del self.ready[i]
        self.gone.add(i)
        assert self.store.remove_ready(self.seqs[i]) is None

    @precondition(lambda self: self.unacked or self.gone)
    @rule(data=st.data())
    def remove_not_ready(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.unacked | self.gone)))
        count, size = self.store.ready_count, self.store.ready_bytes
        assert self.store.remove_ready(self.seqs[i]) is None
        assert (self.store.ready_count, self.store.ready_bytes) == (count, size)

    @rule()
    def purge(self) -> None:
        assert self.store.purge() == len(self.ready)
        self.gone.update(self.ready)
        self.ready.clear()

    @rule()
    def scan(self) -> None:
        expected = [(self.seqs[i], i, self.sent[i].properties) for i in self.order()]
        assert list(self.store.scan_ready()) == expected

    @rule(sync=st.booleans(), clean=st.booleans())
    def reopen(self, sync: bool, clean: bool) -> None:
        marks = self.store.delivered_marks() if clean else None
        self.store.close(sync=sync)  # type: ignore[call-arg]
        self.store = self.open_store(marks)
        # Unacked messages come back, flagged redelivered as every message delivered
        # before (requeued, or flagged by an earlier reopen) is; after a crash
        # (no marks) every survivor is. Transient ones are dropped.
        delivered = self.unacked | {i for i, redelivered in self.ready.items() if redelivered}
        survivors = set(self.ready) | self.unacked
        self.unacked.clear()
        self.ready.clear()
        self.gone.clear()
        for i in survivors:
            if self.sent[i].persistent:
                self.ready[i] = marks is None or i in delivered
        self.scan()

    @invariant()
    def same_counts(self) -> None:
        assert self.store.ready_count == len(self.ready)
        assert self.store.ready_bytes == sum(len(self.sent[i].body) for i in self.ready)

    @invariant()
    def same_transient_counts(self) -> None:
        """The transient messages held, ready or unacked, and their bytes: what
        a durable queue's persistent counts leave out."""
        live = [i for i in (*self.ready, *self.unacked) if not self.sent[i].persistent]
        assert self.store.transient() == (len(live), sum(len(self.sent[i].body) for i in live))
