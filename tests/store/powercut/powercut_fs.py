"""A FUSE file system that can lose power: every write not yet fsynced is dropped.

It passes every operation through to a backing directory and keeps, beside it,
what a power cut would leave:

- per file (by the backing inode): its durable size and the original bytes of
  every durable range overwritten or truncated away since its last
  fsync/fdatasync. A file's fsync makes its content durable, nothing else.
- per directory: its durable entries (name -> inode), taken when the directory
  itself is fsynced. A create, mkdir, rename, link, unlink or rmdir is durable
  only once its directory has been fsynced afterwards.

That is the strict reading of POSIX (and of Linux's fsync(2): "Calling fsync()
does not necessarily ensure that the entry in the directory containing the file
has also reached disk. For that an explicit fsync() on a file descriptor for
the directory is also needed"), the least a program may count on. ext4 in its
default data=ordered mode keeps more (a file's fsync commits the journal, with
every earlier create and rename in it); a program correct under this model is
correct there too. Optionally (``torn``) a power cut keeps a random part of
each file's unsynced appended tail, and a random set of the 4 KiB pages its
unsynced writes changed in place (each page either as written or as it was),
as writeback that happened before the cut would, so recovery also meets torn
records. fallocate (mode 0) allocates ahead: the size it adds is durable only
once the file is fsynced, like any growth.

To keep an inode that a durable entry still names after it was unlinked or
replaced, every regular file is hard-linked into ``store`` (``store/<ino>``)
while anything durable or live names it, and a removed directory that a durable
entry names is moved to ``store/dir-<ino>`` instead of being removed.

``cut`` (or an armed trigger) "switches the power off": from then on every
operation fails with EIO. ``unmount`` then rebuilds the backing directory as the
power cut left it: the durable tree, each file at its durable content.

Run as ``python powercut_fs.py BACKING MOUNTPOINT STORE [--seed N] [--torn]``; it reads
commands from stdin and answers on stdout (tests/store/powercut/powercut_mount.py drives it):

    arm ops N            freeze before the N-th next mutating operation
    arm fsync GLOB [K]   freeze before the (K+1)-th next fsync of a file whose
                         path matches GLOB (fnmatch, on the path from the mount root, e.g. ``*acks.*``)
    arm synced GLOB [K]  the same, but let that fsync through and freeze just after it
    arm hold GLOB        hold the next fsync of a matching file (say ``held``) until
    release              lets it through; the power goes just after it
    cut                  freeze now
    count GLOB           how many fsyncs of matching files were done
    await GLOB N         say ``reached`` once N fsyncs of matching files were done
    unmount              unmount; after a cut, rebuild the durable state

It says ``mounted`` once mounted, ``frozen OPS`` when it freezes, ``done`` at the end.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import mfusepy as fuse

log = logging.getLogger("powercut")

#: The unit in which (torn) writeback reaches the disk.
PAGE = 4096

_STAT_KEYS = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_ino", "st_blocks")


@dataclass
class FileState:
    """What a power cut leaves of one file's content."""

    durable_size: int
    #: (offset, original bytes) of durable ranges changed since the last fsync, in
    #: the order they were saved: restoring them backwards gives the durable bytes.
    undo: list[tuple[int, bytes]] = field(default_factory=list)


def _backing_flags(flags: int) -> int:
    """The backing file's open flags: readable (writes save what they overwrite),
    positioned writes (the kernel gives each write its offset, O_APPEND too), and
    O_TRUNC done as a tracked truncate."""
    flags &= ~(os.O_APPEND | os.O_TRUNC)
    if flags & os.O_ACCMODE != os.O_RDONLY:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags


class Frozen(OSError):
    def __init__(self) -> None:
        super().__init__(errno.EIO, "the power is off")


class PowerCutFS(fuse.Operations):  # type: ignore[misc]
    use_ns = True
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(self, backing: str, store: str, seed: int = 0, torn: bool = False) -> None:
        self.root = os.path.realpath(backing)
        self.store = os.path.realpath(store)
        self.random = random.Random(seed)
        self.torn = torn
        self._mutex = threading.RLock()
        self.files: dict[int, FileState] = {}
        self.dirs: dict[int, dict[str, int]] = {}  # durable entries per directory inode
        self.refs: Counter[int] = Counter()  # durable entries naming each inode
        self.open_files: dict[int, tuple[int, str]] = {}  # fh (backing fd) -> (ino, path)
        self._dir_paths: dict[int, str] = {}  # fh of an open directory -> its path then
        self.frozen = False
        self.ops = 0
        self.fsyncs: Counter[str] = Counter()  # path -> fsyncs done
        self._arm_ops: int | None = None
        self._arm_fsync: tuple[str, int, bool] | None = None  # (glob, skip, after it)
        self.on_freeze: Any = None
        self.on_hold: Any = None
        self._hold: str | None = None
        self._released = threading.Event()
        self._awaited: list[tuple[str, int, Any]] = []  # (glob, count, callback)
        self.root_ino = os.lstat(self.root).st_ino
        os.makedirs(self.store, exist_ok=True)
        self._adopt(self.root)

    # -- the model ------------------------------------------------------------------------
    def _adopt(self, directory: str) -> None:
        """Everything on the backing directory at mount time is durable."""
        ino = os.lstat(directory).st_ino
        entries = self.dirs[ino] = {}
        with os.scandir(directory) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                entries[entry.name] = st.st_ino
                self.refs[st.st_ino] += 1
                if entry.is_dir(follow_symlinks=False):
                    self._adopt(entry.path)
                elif entry.is_file(follow_symlinks=False) and st.st_ino not in self.files:
                    self.files[st.st_ino] = FileState(st.st_size)
                    self._link_into_store(entry.path, st.st_ino)

    def _link_into_store(self, path: str, ino: int) -> None:
        target = os.path.join(self.store, str(ino))
        if os.path.lexists(target):
            os.unlink(target)  # an inode number the backing file system reused
        os.link(path, target)

    def _forget_if_unreachable(self, ino: int) -> None:
        """Drop a file or directory inode nothing live or durable names any more."""
        if self.refs[ino] > 0:
            return
        if ino in self.files:
            stored = os.path.join(self.store, str(ino))
            try:
                if os.lstat(stored).st_nlink > 1:
                    return  # still linked in the live tree
                os.unlink(stored)
            except FileNotFoundError:
                pass
            del self.files[ino]
        elif ino in self.dirs:
            grave = os.path.join(self.store, f"dir-{ino}")
            if os.path.isdir(grave):
                os.rmdir(grave)
                del self.dirs[ino]
        self.refs.pop(ino, None)

    def _save_original(self, state: FileState, fd: int, start: int, end: int) -> None:
        end = min(end, state.durable_size)
        if start < end:
            state.undo.append((start, os.pread(fd, end - start, start)))

    def _mutating(self) -> None:
        """Count a mutating operation; freeze when an armed count runs out."""
        if self.frozen:
            raise Frozen()
        self.ops += 1
        if self._arm_ops is not None:
            self._arm_ops -= 1
            if self._arm_ops <= 0:
                self.freeze()
                raise Frozen()

    def freeze(self) -> None:
        with self._mutex:
            if self.frozen:
                return
            self.frozen = True
            self._arm_ops = self._arm_fsync = None
            if self.on_freeze is not None:
                self.on_freeze(self.ops)

    def arm_ops(self, n: int) -> None:
        with self._mutex:
            self._arm_ops = max(1, n)

    def arm_fsync(self, pattern: str, skip: int, after: bool = False) -> None:
        with self._mutex:
            self._arm_fsync = (pattern, skip, after)

    def arm_hold(self, pattern: str) -> None:
        with self._mutex:
            self._hold = pattern
            self._released.clear()

    def release_hold(self) -> None:
        self._released.set()

    def count_fsyncs(self, pattern: str) -> int:
        with self._mutex:
            return sum(n for path, n in self.fsyncs.items() if fnmatch.fnmatch(path, pattern))

    def await_fsyncs(self, pattern: str, n: int, callback: Any) -> None:
        """Call ``callback`` once ``n`` fsyncs of files matching ``pattern`` were done."""
        with self._mutex:
            self._awaited.append((pattern, n, callback))
            self._check_awaited()

    def _check_awaited(self) -> None:
        for item in list(self._awaited):
            pattern, n, callback = item
            if self.count_fsyncs(pattern) >= n:
                self._awaited.remove(item)
                callback()

    def _check_fsync_trigger(self, path: str) -> bool:
        """Before a file's fsync: freeze now (raises), or say to freeze once it is done."""
        if self._arm_fsync is None:
            return False
        pattern, skip, after = self._arm_fsync
        if not fnmatch.fnmatch(path, pattern):
            return False
        if skip > 0:
            self._arm_fsync = (pattern, skip - 1, after)
            return False
        if not after:
            self.freeze()
            raise Frozen()
        return True

    # -- after the power cut --------------------------------------------------------------
    def rebuild(self) -> None:
        """Replace the backing directory by what the power cut left (after unmount)."""
        new_root = self.root + ".cut"
        shutil.rmtree(new_root, ignore_errors=True)
        os.mkdir(new_root)
        linked: set[int] = set()
        self._build(self.root_ino, new_root, linked)
        for ino in linked:
            self._restore(ino, os.path.join(self.store, str(ino)))
        old_root = self.root + ".live"
        os.rename(self.root, old_root)
        os.rename(new_root, self.root)
        shutil.rmtree(old_root)
        shutil.rmtree(self.store)

    def _build(self, dir_ino: int, path: str, linked: set[int]) -> None:
        for name, ino in sorted(self.dirs.get(dir_ino, {}).items()):
            target = os.path.join(path, name)
            if ino in self.dirs:
                os.mkdir(target)
                self._build(ino, target, linked)
            elif ino in self.files:
                os.link(os.path.join(self.store, str(ino)), target)
                linked.add(ino)
            else:
                log.warning("durable entry %s names inode %d, which is not tracked", target, ino)

    def _restore(self, ino: int, path: str) -> None:
        state = self.files[ino]
        size = os.lstat(path).st_size
        keep = state.durable_size
        if self.torn and size > keep:
            # Writeback may have reached part of the unsynced tail before the cut.
            keep = self.random.randint(keep, size)
        os.truncate(path, keep)
        if state.undo:
            # Pages written in place since the last fsync: each as it was, or (torn)
            # as written, as writeback before the cut may have left it.
            pages = {p for o, d in state.undo for p in range(o // PAGE, (o + len(d) - 1) // PAGE + 1)}
            lost = {p for p in pages if not self.torn or self.random.random() < 0.5}
            fd = os.open(path, os.O_WRONLY)
            try:
                for offset, data in reversed(state.undo):
                    for page in range(offset // PAGE, (offset + len(data) - 1) // PAGE + 1):
                        if page in lost:
                            start = max(offset, page * PAGE)
                            end = min(offset + len(data), (page + 1) * PAGE)
                            os.pwrite(fd, data[start - offset : end - offset], start)
            finally:
                os.close(fd)

    # -- helpers --------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        return self.root + path

    def _stat_dict(self, st: os.stat_result) -> dict[str, Any]:
        attrs = {key: getattr(st, key) for key in _STAT_KEYS}
        if stat.S_ISREG(st.st_mode) and st.st_ino in self.files:
            attrs["st_nlink"] = max(1, st.st_nlink - 1)  # not counting the store's link
        attrs["st_atime"] = st.st_atime_ns
        attrs["st_mtime"] = st.st_mtime_ns
        attrs["st_ctime"] = st.st_ctime_ns
        return attrs

    # -- reading --------------------------------------------------------------------------
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            if self.frozen:
                raise Frozen()
            if path is None:
                if fh is None:
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
                return self._stat_dict(os.fstat(fh))
            return self._stat_dict(os.lstat(self._full(path)))

    def readdir(self, path: str | None, fh: int) -> list[str]:
        with self._mutex:
            if self.frozen:
                raise Frozen()
            return [".", "..", *os.listdir(fh)]

    def opendir(self, path: str) -> int:
        with self._mutex:
            if self.frozen:
                raise Frozen()
            fd = os.open(self._full(path), os.O_RDONLY | os.O_DIRECTORY)
            self._dir_paths[fd] = path.lstrip("/") or "."
            return fd

    def releasedir(self, path: str | None, fh: int) -> int:
        with self._mutex:
            self._dir_paths.pop(fh, None)
            os.close(fh)
        return 0

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self.root)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
        return {key: getattr(st, key) for key in keys} | {"f_namemax": st.f_namemax}

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            if self.frozen:
                raise Frozen()
        return os.pread(fh, size, offset)

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    # -- files ----------------------------------------------------------------------------
    def create(self, path: str, mode: int, flags: int) -> int:
        with self._mutex:
            self._mutating()
            full = self._full(path)
            existed = os.path.lexists(full)
            fd = os.open(full, _backing_flags(flags) | os.O_CREAT, mode)
            ino = os.fstat(fd).st_ino
            if not existed:
                self.files[ino] = FileState(0)
                self._link_into_store(full, ino)
            elif flags & os.O_TRUNC:
                self._truncate(ino, fd, 0)
            self.open_files[fd] = (ino, path.lstrip("/"))
            return fd

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            if self.frozen:
                raise Frozen()
            fd = os.open(self._full(path), _backing_flags(flags) & ~os.O_CREAT)
            ino = os.fstat(fd).st_ino
            if flags & os.O_TRUNC:
                self._mutating()
                self._truncate(ino, fd, 0)
            self.open_files[fd] = (ino, path.lstrip("/"))
            return fd

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            self._mutating()
            ino = self.open_files[fh][0]
            state = self.files.get(ino)
            if state is not None:
                self._save_original(state, fh, offset, offset + len(data))
            return os.pwrite(fh, data, offset)

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        with self._mutex:
            if mode:
                raise fuse.FuseOSError(errno.EOPNOTSUPP)
            self._mutating()
            os.posix_fallocate(fh, offset, size)
            return 0

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self._mutating()
            if fh is None:
                fd = os.open(self._full(path or "/"), os.O_RDWR)
                try:
                    self._truncate(os.fstat(fd).st_ino, fd, length)
                finally:
                    os.close(fd)
            else:
                self._truncate(self.open_files[fh][0], fh, length)
            return 0

    def _truncate(self, ino: int, fd: int, length: int) -> None:
        state = self.files.get(ino)
        if state is not None:
            self._save_original(state, fd, length, os.fstat(fd).st_size)
        os.ftruncate(fd, length)

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self._mutex:
            if self.frozen:
                raise Frozen()
            ino, opened_as = self.open_files[fh]
            held = self._hold is not None and fnmatch.fnmatch(opened_as, self._hold)
            if held:
                self._hold = None
                if self.on_hold is not None:
                    self.on_hold(opened_as)
        if held:  # outside the lock: every other operation goes on meanwhile
            self._released.wait()
        with self._mutex:
            if self.frozen:
                raise Frozen()
            freeze_after = held or self._check_fsync_trigger(opened_as)
            self._mutating()
            state = self.files.get(ino)
            if state is not None:
                state.durable_size = os.fstat(fh).st_size
                state.undo.clear()
            self.fsyncs[opened_as] += 1
            self._check_awaited()
            if freeze_after:
                self.freeze()  # this fsync made it, nothing after it does
            return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        with self._mutex:
            self.open_files.pop(fh, None)
            os.close(fh)
            return 0

    def chmod(self, path: str, mode: int) -> int:
        with self._mutex:
            self._mutating()
            os.chmod(self._full(path), mode)
            return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._mutex:
            self._mutating()
            os.chown(self._full(path), uid, gid)
            return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            self._mutating()
            os.utime(self._full(path), ns=times)
            return 0

    # -- directories ----------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            self._mutating()
            full = self._full(path)
            os.mkdir(full, mode)
            self.dirs[os.lstat(full).st_ino] = {}
            return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            self._mutating()
            full = self._full(path)
            ino = os.lstat(full).st_ino
            if os.listdir(full):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))
            self._remove_dir(full, ino)
            return 0

    def _remove_dir(self, full: str, ino: int) -> None:
        if self.refs[ino] > 0:  # a durable entry still names it: keep the inode
            os.rename(full, os.path.join(self.store, f"dir-{ino}"))
        else:
            os.rmdir(full)
            self.dirs.pop(ino, None)

    def unlink(self, path: str) -> int:
        with self._mutex:
            self._mutating()
            full = self._full(path)
            ino = os.lstat(full).st_ino
            os.unlink(full)
            self._forget_if_unreachable(ino)
            return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self._mutating()
            src, dst = self._full(old), self._full(new)
            victim: int | None = None
            try:
                st = os.lstat(dst)
            except FileNotFoundError:
                pass
            else:
                victim = st.st_ino
                if os.path.isdir(dst) and not os.path.islink(dst):
                    if os.listdir(dst):
                        raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))
                    if os.lstat(src).st_ino != victim:
                        self._remove_dir(dst, victim)
                        victim = None
            os.rename(src, dst)
            if victim is not None and victim != os.lstat(dst).st_ino:
                self._forget_if_unreachable(victim)
            return 0

    def link(self, target: str, source: str) -> int:
        with self._mutex:
            self._mutating()
            os.link(self._full(source), self._full(target))
            return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self._mutex:
            self._mutating()
            ino = os.fstat(fh).st_ino
            entries = {}
            with os.scandir(fh) as it:
                for entry in it:
                    entries[entry.name] = entry.inode()
            old = self.dirs.get(ino, {})
            self.dirs[ino] = entries
            for child in entries.values():
                self.refs[child] += 1
            for child in old.values():
                self.refs[child] -= 1
            kept = set(entries.values())
            for child in old.values():
                if child not in kept:
                    self._forget_if_unreachable(child)
            self.fsyncs[self._dir_paths.get(fh, "?")] += 1
            return 0


def _unmount(mountpoint: str) -> bool:
    """Unmount; False when something still holds the mount (the caller detaches it)."""
    for command in (["fusermount3", "-u", mountpoint], ["umount", mountpoint]):
        try:
            if subprocess.run(command, capture_output=True).returncode == 0:
                return True
        except FileNotFoundError:
            continue
    return False


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Session:
    """The mount's life: control commands on stdin, and the end (once)."""

    def __init__(self, fs: PowerCutFS, mountpoint: str) -> None:
        self.fs = fs
        self.mountpoint = mountpoint
        self._ended = threading.Lock()

    def control(self) -> None:
        fs = self.fs
        for raw in sys.stdin:
            words = raw.split()
            if not words:
                continue
            if words[:2] == ["arm", "ops"]:
                fs.arm_ops(int(words[2]))
                _say("armed")
            elif words[:2] in (["arm", "fsync"], ["arm", "synced"]):
                fs.arm_fsync(words[2], int(words[3]) if len(words) > 3 else 0, words[1] == "synced")
                _say("armed")
            elif words[:2] == ["arm", "hold"]:
                fs.arm_hold(words[2])
                _say("armed")
            elif words[0] == "release":
                fs.release_hold()
            elif words[0] == "cut":
                fs.freeze()
            elif words[0] == "await":
                fs.await_fsyncs(words[1], int(words[2]), lambda: _say("reached"))
            elif words[0] == "count":
                _say(f"count {fs.count_fsyncs(words[1])}")
            elif words[0] == "unmount":
                break
        if not _unmount(self.mountpoint):
            # Still held open (a test that failed half way): detach it, refuse every
            # operation still coming, and end the process, which ends the connection.
            subprocess.run(["umount", "-l", self.mountpoint], capture_output=True)
        self.end()

    def end(self) -> None:
        """Rebuild what a power cut left (if it came), say done, exit."""
        if not self._ended.acquire(blocking=False):
            self._ended.acquire()  # the other thread is at it, and ends the process
        fs = self.fs
        fs._released.set()  # a held fsync must not keep its caller in the kernel
        try:
            with fs._mutex:
                cut = fs.frozen
                fs.frozen = True  # nothing more gets through
                if cut:
                    fs.rebuild()
                else:
                    shutil.rmtree(fs.store, ignore_errors=True)
                _say("done")
        except BaseException:
            log.exception("the power-cut file system could not finish")
        finally:
            sys.stderr.flush()
            os._exit(0)


class _FUSE(fuse.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, with ftruncate's handle passed on (mfusepy drops it, and with
    nullpath_ok an open file's truncate comes without a path)."""

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        name = None if path is None else path.decode(self.encoding, self.errors)
        return int(self.operations.truncate(name, length, fh))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("store")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torn", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fs = PowerCutFS(args.backing, args.store, args.seed, args.torn)
    fs.on_freeze = lambda ops: _say(f"frozen {ops}")
    fs.on_hold = lambda path: _say(f"held {path}")
    session = Session(fs, args.mountpoint)

    def init(path: str) -> None:
        threading.Thread(target=session.control, daemon=True).start()
        _say("mounted")

    fs.init = init
    _FUSE(fs, args.mountpoint, foreground=True, hard_remove=True, default_permissions=True)
    session.end()  # unmounted from outside, or by the control thread


if __name__ == "__main__":
    main()
