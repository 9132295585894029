"""store/segment_log.py's sync_files: the C version (one call without the GIL)
behaves as the Python one: descriptors synced and always closed, files gone
meanwhile skipped, the first real failure raised as the same OSError."""

from __future__ import annotations

import errno
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warren.store.segment_log import sync_files_python

SyncFiles = Callable[[list[int], list[Path], Path | None], None]


def _implementations() -> list[Any]:
    impls = [pytest.param(sync_files_python, id="python")]
    try:
        fast = importlib.import_module("warren._fastpath")
    except ImportError:
        return impls

    def in_c(fds: list[int], paths: list[Path], directory: Path | None) -> None:
        fast.sync_files(
            fds,
            [os.fsencode(p) for p in paths],
            None if directory is None else os.fsencode(directory),
        )

    impls.append(pytest.param(in_c, id="c"))
    return impls


IMPLEMENTATIONS = _implementations()


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def _written(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"x" * 100)
    return fd


@pytest.mark.parametrize("sync", IMPLEMENTATIONS)
def test_syncs_and_closes_skipping_what_is_gone(sync: SyncFiles, tmp_path: Path) -> None:
    fds = [_written(tmp_path / "a"), _written(tmp_path / "b")]
    other = tmp_path / "c"
    os.close(_written(other))
    sync(fds, [other, tmp_path / "gone"], tmp_path)
    assert all(_closed(fd) for fd in fds)
    sync([], [], tmp_path / "no-such-dir")  # a directory deleted meanwhile: nothing to do
    assert (tmp_path / "a").read_bytes() == b"x" * 100


@pytest.mark.parametrize("sync", IMPLEMENTATIONS)
def test_a_bad_descriptor_raises_and_the_others_still_close(
    sync: SyncFiles, tmp_path: Path
) -> None:
    good = _written(tmp_path / "a")
    bad = os.open(tmp_path, os.O_RDONLY)
    os.close(bad)  # a closed number: EBADF
    with pytest.raises(OSError) as info:
        sync([bad, good], [], None)
    assert info.value.errno == errno.EBADF
    assert _closed(good)


@pytest.mark.parametrize("sync", IMPLEMENTATIONS)
def test_a_path_that_cannot_be_opened_names_itself(sync: SyncFiles, tmp_path: Path) -> None:
    os.close(_written(tmp_path / "file"))
    inside_a_file = tmp_path / "file" / "child"
    with pytest.raises(NotADirectoryError) as info:
        sync([], [inside_a_file], None)
    assert info.value.filename in (str(inside_a_file), os.fsencode(inside_a_file))
