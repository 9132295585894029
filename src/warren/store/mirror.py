"""Who hears about every change to the files of a data directory.

Clustering replicates a leader's data directory to its followers byte for
byte (docs/clustering.md). Rather than watch the file system, the code that
writes reports each change as it hands it to the OS: bytes appended at an
offset, space allocated ahead of a file's data, a file's whole new content (a
rewrite or an atomic replace), a file renamed, a file or directory deleted.

The data directory (store/layout.py's DataDir) holds the mirror: the broker
sets it from its replication before it starts, and the StoreFactory
(warren/store_factory.py) hands it to every store and log it makes, in its
constructor. Without clustering there is none (None) and the writers skip the
reports; stores of the transient area get none either, as it is never
replicated. No module-level registry: a store opened on its own (tests,
offline tools) reports to nothing unless it is given a mirror.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class FileMirror(Protocol):
    def wants_data(self) -> bool:
        """Whether anyone would receive an append now (a leader without followers
        does not: a follower that joins copies the files). Writers may skip
        reading back what they wrote while it is False."""
        ...

    def appended(self, path: Path, offset: int, data: bytes) -> None:
        """``data`` was written at ``offset`` of ``path`` (created if new)."""
        ...

    def allocated(self, path: Path, size: int) -> None:
        """``path`` (created if new) has ``size`` bytes allocated ahead of its
        data (posix_fallocate: zeros, the file at least that long)."""
        ...

    def renamed(self, path: Path, to: Path) -> None:
        """``path`` was renamed to ``to`` (in the same directory; ``to`` did not
        exist): a segment file kept as a spare, or a spare reused."""
        ...

    def replaced(self, path: Path, data: bytes) -> None:
        """``path`` now holds exactly ``data``."""
        ...

    def deleted(self, path: Path) -> None:
        """``path``, a file or a directory with everything in it, is gone."""
        ...
