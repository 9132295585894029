"""store/sync_files.py's sync_files: the C version (warren._syncworker, one
call without the GIL) behaves as the Python one: descriptors synced and always
closed, files gone meanwhile skipped, the first real failure raised as the same
OSError. And the C SyncWorker thread that store/sync.py's rounds run on: the
same work, finished jobs reported through its pipe, in order."""

from __future__ import annotations

import errno
import importlib
import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warren.store.sync_files import sync_files_python

SyncFiles = Callable[[list[int], list[Path], list[Path]], None]


def _implementations() -> list[Any]:
    impls = [pytest.param(sync_files_python, id="python")]
    try:
        fast = importlib.import_module("warren._syncworker")
    except ImportError:
        return impls

    def in_c(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        fast.sync_files(fds, [os.fsencode(p) for p in paths], [os.fsencode(d) for d in dirs])

    # Made before any test closes a descriptor on purpose: its pipe must not
    # take the number a test expects to be closed.
    worker = fast.SyncWorker()

    def on_worker(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        worker.submit(7, fds, [os.fsencode(p) for p in paths], [os.fsencode(d) for d in dirs])
        done = _collect(worker, 1)
        assert [job for job, _ in done] == [7]
        if done[0][1] is not None:
            raise done[0][1]

    impls.append(pytest.param(in_c, id="c"))
    impls.append(pytest.param(on_worker, id="worker"))
    return impls


def _collect(worker: Any, count: int) -> list[tuple[int, OSError | None]]:
    """Wait on the worker's pipe (as the event loop does) until ``count`` jobs are done."""
    done: list[tuple[int, OSError | None]] = []
    while len(done) < count:
        readable, _, _ = select.select([worker.fileno()], [], [], 10)
        assert readable, "the sync worker reported nothing for 10 s"
        done.extend(worker.collect())
    return done


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
    sync(fds, [other, tmp_path / "gone"], [tmp_path])
    assert all(_closed(fd) for fd in fds)
    sync([], [], [tmp_path / "no-such-dir"])  # a directory deleted meanwhile: nothing to do
    assert (tmp_path / "a").read_bytes() == b"x" * 100


@pytest.mark.parametrize("sync", IMPLEMENTATIONS)
def test_a_bad_descriptor_raises_and_the_others_still_close(
    sync: SyncFiles, tmp_path: Path
) -> None:
    good = _written(tmp_path / "a")
    bad = os.open(tmp_path, os.O_RDONLY)
    os.close(bad)  # a closed number: EBADF
    with pytest.raises(OSError) as info:
        sync([bad, good], [], [])
    assert info.value.errno == errno.EBADF
    assert _closed(good)


@pytest.mark.parametrize("sync", IMPLEMENTATIONS)
def test_a_path_that_cannot_be_opened_names_itself(sync: SyncFiles, tmp_path: Path) -> None:
    os.close(_written(tmp_path / "file"))
    inside_a_file = tmp_path / "file" / "child"
    with pytest.raises(NotADirectoryError) as info:
        sync([], [inside_a_file], [])
    assert info.value.filename in (str(inside_a_file), os.fsencode(inside_a_file))


def test_the_worker_reports_many_jobs_in_order_and_closes_cleanly(tmp_path: Path) -> None:
    fast = pytest.importorskip("warren._syncworker")
    worker = fast.SyncWorker()
    bad = os.open(tmp_path, os.O_RDONLY)
    os.close(bad)
    fds = [_written(tmp_path / f"f{i}") for i in range(50)]
    for i, fd in enumerate(fds):
        worker.submit(i, [bad if i == 20 else fd], [], [os.fsencode(tmp_path)])
    done = _collect(worker, 50)
    assert [job for job, _ in done] == list(range(50))
    errors = {job: error for job, error in done if error is not None}
    assert list(errors) == [20] and errors[20].errno == errno.EBADF
    assert all(_closed(fd) for i, fd in enumerate(fds) if i != 20)
    os.close(fds[20])  # job 20 was given the bad number instead
    pipe = worker.fileno()
    worker.close()
    assert worker.fileno() == -1 and _closed(pipe)  # the pipe goes with close(), not at GC
    with pytest.raises(RuntimeError):
        worker.submit(99, [], [], [])
    worker.close()  # twice is harmless


def test_a_refused_argument_still_closes_the_descriptors(tmp_path: Path) -> None:
    fast = pytest.importorskip("warren._syncworker")
    worker = fast.SyncWorker()
    fd = _written(tmp_path / "a")
    with pytest.raises(TypeError):
        worker.submit(1, [fd], ["not bytes"], [])
    assert _closed(fd)
    worker.close()
