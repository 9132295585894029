"""The slow half of a store's sync: fdatasync what the stores collected.

A store's sync has two halves (store/sync.py's Syncable): under its lock it
writes out its buffers and collects what must reach the disk (descriptors,
files, directories); outside the lock these functions make it durable. In C
when built (warren._syncworker: one call that never takes the GIL back in
between, src/warren/_syncworker.c), else in Python, sync_files_python, which is
also the C version's reference. Segment logs, ack files, a priority store's
levels and a cluster follower's copy all sync through here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import warren

__all__ = ["sync_collected", "sync_files", "sync_files_python"]

_native = warren.native_module("_syncworker")
#: The C version of sync_files below (None: not built).
_native_sync: Callable[[list[int], list[bytes], list[bytes]], None] | None = (
    None if _native is None else _native.sync_files
)


def sync_files(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
    """fdatasync the descriptors (closing them) and the files, then fsync the
    directories: the slow half of a sync, run outside the lock. In C when
    built: one call that never takes the GIL back in between (a sync thread
    waiting for the GIL behind a busy event loop delays the round)."""
    if _native_sync is not None:
        _native_sync(fds, [os.fsencode(p) for p in paths], [os.fsencode(d) for d in dirs])
    else:
        sync_files_python(fds, paths, dirs)


def sync_collected(collect: Callable[[list[int], list[Path], list[Path]], None]) -> None:
    """A store's whole sync: ``collect`` (its collect_sync, under its lock) names
    what to fdatasync, sync_files does it; what was collected is synced (and
    its descriptors closed) even when ``collect`` raises part way."""
    fds: list[int] = []
    paths: list[Path] = []
    dirs: list[Path] = []
    try:
        collect(fds, paths, dirs)
    finally:
        sync_files(fds, paths, dirs)


_sync_file_range = getattr(os, "sync_file_range", None)  # Linux only
_SYNC_FILE_RANGE_WRITE = getattr(os, "SYNC_FILE_RANGE_WRITE", 2)


def sync_files_python(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
    """sync_files without the C extension (and its reference)."""
    try:
        if len(fds) > 1 and _sync_file_range is not None:
            # Every file's writeback started before any is waited on: one
            # journal commit per round, not one per file (see _syncworker.c).
            for fd in fds:
                with contextlib.suppress(OSError):
                    _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
        for fd in fds:
            os.fdatasync(fd)
        for path in paths:
            _fdatasync_path(path)
        for directory in dirs:
            try:
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # deleted meanwhile
                continue
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):  # one bad descriptor must not leak the rest
                os.close(fd)


def _fdatasync_path(path: Path) -> None:
    """fdatasync through a fresh descriptor: it flushes the inode, whoever wrote it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # deleted since (no longer needed): nothing to keep
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """Make a create, rename or removal in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
