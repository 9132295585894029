"""Who hears about every change to the files of a data directory.

Clustering replicates a leader's data directory to its followers byte for
byte (docs/clustering.md). Rather than watch the file system, the code that
writes reports each change as it hands it to the OS: bytes appended at an
offset, space allocated ahead of a file's data, a file's whole new content (a
rewrite or an atomic replace), a file renamed, a file or directory deleted. A
store looks up its directory's mirror once, when it is made; without
clustering there is none and the writers skip the reports.
"""

from __future__ import annotations

import os
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


_mirrors: dict[str, FileMirror] = {}


def attach(root: Path, mirror: FileMirror) -> None:
    """Report every change under ``root`` (stores made before this call are not covered)."""
    _mirrors[os.path.abspath(root) + os.sep] = mirror


def detach(root: Path) -> None:
    _mirrors.pop(os.path.abspath(root) + os.sep, None)


def mirror_for(path: Path) -> FileMirror | None:
    """The mirror of the data directory that holds ``path``, if any."""
    if not _mirrors:
        return None
    where = os.path.abspath(path) + os.sep
    for root, mirror in _mirrors.items():
        if where.startswith(root):
            return mirror
    return None
