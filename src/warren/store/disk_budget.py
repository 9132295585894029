"""What the writers of a data directory tell the free-disk alarm, and confirms.

**The budget.** The broker measures the free space of its data directory
(once a second, and whenever the budget runs out) and hands the writers the
difference to ``free_disk_min`` as ``DiskBudget.left``. Every writer subtracts
what it appends, before writing it: a segment log per record or per run of
records, an ack file per batch, a definitions or MQTT log per line. That is one
integer subtraction and a comparison; when ``left`` drops below zero the writer
calls ``spent()`` at once, in the same loop turn, and the broker writes out what
is buffered, measures again and, below ``free_disk_min``, raises the disk alarm
before any publisher is read again. So no publisher gets far past the limit
(docs/storage.md, "Free-disk alarm", says how far).

**Failed writes.** When a write fails anyway (another process filled the disk,
a quota, an I/O error), the writer undoes it so its file ends at a record
boundary, forgets what it could not write (the records' owner takes them out of
its counters) and calls ``write_failed()``: the broker raises the disk alarm.

**Write generations.** A publisher confirm must be a nack exactly for the
messages that were lost. ``gen`` counts every successful write-out of any
segment log (and every sync round): records appended while ``gen`` had one
value reach the disk together or are lost together, per log. A log remembers
the generations it lost (``SegmentLog.lost_between``), and a confirm waits in
batches of one generation and one set of stores (amqp/confirms.py), so after the
sync round it can ask whether its messages were among them (store/sync.py).

**Spares.** Fully acknowledged segment files kept for reuse
(store/segment_spares.py) stay on the disk, so the free space the broker
measures already counts them; ``spare_bytes`` is what the data directory's
stores hold as spares, at most ``spare_limit``, and a store keeps one only
while ``left`` has room for it (near the limit they are deleted instead, and
a store deletes those it holds at its next sync).

One budget per data directory: the DataDir (store/layout.py) holds it, and
the StoreFactory (warren/store_factory.py) passes it to every writer it makes,
in its constructor. A writer made without one (a store opened alone, tests,
offline tools) uses ``UNMETERED``, which never runs out.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SPARE_LIMIT", "UNLIMITED", "UNMETERED", "DiskBudget"]

#: A budget that cannot run out in practice (and stays a short int when compiled).
UNLIMITED = 1 << 60
#: What a data directory's stores may hold as spare segment files, together.
SPARE_LIMIT = 256 * 1024 * 1024


class DiskBudget:
    """Bytes the writers may still append before the broker looks at the disk again."""

    def __init__(
        self,
        on_spent: Callable[[], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        #: Bytes left; writers subtract what they append and call spent() below zero.
        self.left = UNLIMITED
        #: Write generation (see the module's docstring).
        self.gen = 1
        #: Bytes of spare segment files the stores hold, and how many they may.
        self.spare_bytes = 0
        self.spare_limit = SPARE_LIMIT
        self._on_spent = on_spent
        self._on_failed = on_failed

    def spent(self) -> None:
        """A writer took ``left`` below zero: let the broker measure again now."""
        if self._on_spent is None:
            self.left = UNLIMITED
        else:
            self._on_spent()

    def write_failed(self, exc: BaseException) -> None:
        """A write failed and was undone (its data is lost): raise the alarm."""
        if self._on_failed is not None:
            self._on_failed(exc)


#: What writers outside any broker's data directory use.
UNMETERED = DiskBudget()
