"""The follower's side of replication: keep a data directory a copy of the leader's.

A follower runs no broker. It connects to the leader's clustering port, takes
the leader's file index, asks for every file it lacks or holds differently,
deletes what the leader does not have, fdatasyncs, and acknowledges the
index's position. Then it applies the leader's actions as they come (appends
at their offsets, allocations ahead, whole-file replaces, deletes) while a second task
fdatasyncs what was applied and acknowledges the position it covered: the
leader's confirms wait for that acknowledgement, and the batches that arrive
during one fdatasync are covered by the next. When it is elected leader, a
broker starts on the directory as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from warren.cluster import codec as c
from warren.cluster.framing import FrameReader
from warren.cluster.leader import LOCAL_ONLY, file_digest, index_files
from warren.store.sync_files import sync_files

log = logging.getLogger("warren.cluster")

#: Seconds a replication TLS handshake may take ([clustering] tls).
HANDSHAKE_TIMEOUT = 10.0

#: Files kept open for appends between batches.
_OPEN_FILES = 128


class Follower:
    def __init__(
        self,
        root: Path,
        node_id: str,
        secret: str,
        stream_reads: str = "",
        on_synced: Callable[[], None] | None = None,
        tls: ssl.SSLContext | None = None,
        stream_protocol_reads: str = "",
    ) -> None:
        self.root = Path(root)
        #: host:port of its stream protocol read service, told to the leader.
        self.stream_protocol_reads = stream_protocol_reads
        #: The client context of [clustering] tls (None: plain TCP).
        self.tls = tls
        self.node_id = node_id
        self.secret = secret
        #: host:port of this node's read-only stream service, told to the leader.
        self.stream_reads = stream_reads
        #: Called whenever more of the leader's actions are on this disk (the
        #: stream read service's consumers read on).
        self.on_synced = on_synced
        #: The leader's position this directory holds on disk (-1: not synced).
        self.position = -1
        self._applied = -1  # applied, maybe not fdatasynced yet
        self.synced = asyncio.Event()
        self._progress = asyncio.Event()  # set (and cleared again) at every ack
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._touched: set[str] = set()
        self._dirs: set[Path] = set()

    async def run(self, host: str, port: int) -> None:
        """Follow the leader at ``host:port`` until the connection ends (raises)."""
        if self.tls is None:
            reader, writer = await asyncio.open_connection(host, port)
        else:
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=self.tls,
                server_hostname=host,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        frames = FrameReader(reader)
        self.synced.clear()
        try:
            hello = c.Hello(
                self.secret,
                self.node_id,
                self.stream_reads,
                stream_protocol_reads=self.stream_protocol_reads,
            )
            writer.write(c.encode(hello))
            await self._full_sync(frames, writer)
            self.synced.set()
            self._tell_synced()
            self._progress.set()
            self._progress.clear()
            self._applied = self.position
            dirty = asyncio.Event()
            syncer = asyncio.ensure_future(self._sync_and_ack(writer, dirty))
            try:
                while True:
                    if syncer.done():
                        syncer.result()  # a failed sync ends the session
                    batch = await frames.batch()
                    for frame in batch:
                        if isinstance(frame, c.Append | c.Allocate | c.Replace | c.Delete | c.Rename):
                            self._apply(frame)
                            self._applied += 1
                        elif isinstance(frame, c.Refused):
                            raise ConnectionError(f"the leader refused: {frame.reason}")
                        elif not isinstance(frame, c.Heartbeat):
                            raise c.ProtocolError(f"unexpected {type(frame).__name__}")
                    dirty.set()
            finally:
                syncer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await syncer
        finally:
            writer.close()
            self.close_files()

    async def _sync_and_ack(self, writer: asyncio.StreamWriter, dirty: asyncio.Event) -> None:
        """fdatasync what was applied and acknowledge it, while the next batches are
        applied: a batch that arrives during a sync goes into the next one."""
        while True:
            await dirty.wait()
            dirty.clear()
            target = self._applied
            await self._sync()  # everything applied up to target (and maybe more)
            self.position = target
            writer.write(c.encode(c.Ack(target)))
            self._progress.set()
            self._progress.clear()
            self._tell_synced()

    def _tell_synced(self) -> None:
        if self.on_synced is not None:
            try:
                self.on_synced()
            except Exception:
                log.exception("the stream read service failed to take new data")

    async def wait_position(self, position: int) -> None:
        """Return once this directory holds the leader's ``position`` on disk."""
        while self.position < position:
            await self._progress.wait()

    # -- full sync --------------------------------------------------------------------
    async def _full_sync(self, frames: FrameReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        index: set[str] = set()
        while True:
            frame = await frames.next()
            if isinstance(frame, c.Refused):
                raise ConnectionError(f"the leader refused: {frame.reason}")
            if isinstance(frame, c.IndexEnd):
                start = frame.position
                break
            if not isinstance(frame, c.IndexEntry):
                raise c.ProtocolError(f"expected IndexEntry, got {type(frame).__name__}")
            index.add(frame.path)
            local = await loop.run_in_executor(None, file_digest, self.root / frame.path)
            if local != (frame.size, frame.sha1) or not (self.root / frame.path).exists():
                writer.write(c.encode(c.Request(frame.path)))
        writer.write(c.encode(c.RequestsEnd()))
        fetched = 0
        while True:
            frame = await frames.next()
            if isinstance(frame, c.SyncDone):
                break
            if not isinstance(frame, c.FileData):
                raise c.ProtocolError(f"expected FileData, got {type(frame).__name__}")
            if frame.offset == 0:
                self._forget(frame.path)
                fetched += 1
            fd = self._open(frame.path, truncate=frame.offset == 0)
            os.pwrite(fd, frame.data, frame.offset)
            self._touched.add(frame.path)
        stale = [
            name
            for name in await loop.run_in_executor(None, index_files, self.root)
            if name not in index
        ]
        for name in stale:
            self._delete(name)
        self._remove_empty_dirs()
        await self._sync()
        self.position = start
        writer.write(c.encode(c.Ack(self.position)))
        log.info(
            "synced with the leader: %d files in its index, %d fetched, %d stale removed",
            len(index),
            fetched,
            len(stale),
        )

    # -- applying actions -------------------------------------------------------------
    def _apply(self, frame: c.Append | c.Allocate | c.Replace | c.Delete | c.Rename) -> None:
        if isinstance(frame, c.Append):
            os.pwrite(self._open(frame.path), frame.data, frame.offset)
            self._touched.add(frame.path)
        elif isinstance(frame, c.Allocate):
            fd = self._open(frame.path)
            try:
                os.posix_fallocate(fd, 0, frame.size)
            except OSError as exc:  # the copy grows as it is written, as on the leader
                log.warning("cannot allocate %s ahead: %s", frame.path, exc)
            self._touched.add(frame.path)
        elif isinstance(frame, c.Rename):
            self._rename(frame.path, frame.to)
        elif isinstance(frame, c.Replace):
            self._forget(frame.path)
            path = self.root / frame.path
            self._mkdirs(path.parent)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(frame.data)
                f.flush()
                os.fdatasync(f.fileno())
            os.replace(tmp, path)
            self._dirs.add(path.parent)
        else:
            self._delete(frame.path)

    def _open(self, rel: str, truncate: bool = False) -> int:
        fd = self._fds.get(rel)
        if fd is not None and not truncate:
            self._fds.move_to_end(rel)
            return fd
        if fd is not None:
            os.close(self._fds.pop(rel))
        path = self.root / rel
        self._mkdirs(path.parent)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        existed = path.exists()
        fd = os.open(path, flags, 0o644)
        if not existed:
            self._dirs.add(path.parent)
        self._fds[rel] = fd
        while len(self._fds) > _OPEN_FILES:
            old_rel, old_fd = self._fds.popitem(last=False)
            if old_rel in self._touched:  # keep it durable before letting it go
                os.fdatasync(old_fd)
                self._touched.discard(old_rel)
            os.close(old_fd)
        return fd

    def _mkdirs(self, directory: Path) -> None:
        if not directory.is_dir():
            missing = directory
            while not missing.parent.exists():
                missing = missing.parent
            directory.mkdir(parents=True, exist_ok=True)
            self._dirs.add(missing.parent)
            self._dirs.add(directory)

    def _forget(self, rel: str) -> None:
        """Close cached descriptors of ``rel`` or of anything under it."""
        for name in [n for n in self._fds if n == rel or n.startswith(rel + "/")]:
            os.close(self._fds.pop(name))
            self._touched.discard(name)

    def _rename(self, rel: str, to: str) -> None:
        """The leader renamed a file (a segment kept as a spare, a spare reused):
        the copy follows, its open descriptor and unsynced writes with it."""
        self._forget(to)
        path, target = self.root / rel, self.root / to
        try:
            os.rename(path, target)
        except FileNotFoundError:  # never copied here: what follows creates it
            log.warning("cannot rename %s: it is not here", rel)
            return
        fd = self._fds.pop(rel, None)
        if fd is not None:
            self._fds[to] = fd
        if rel in self._touched:
            self._touched.discard(rel)
            self._touched.add(to)
        self._dirs.add(path.parent)
        self._dirs.add(target.parent)

    def _delete(self, rel: str) -> None:
        self._forget(rel)
        path = self.root / rel
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                return
        self._dirs.add(path.parent)

    def _remove_empty_dirs(self) -> None:
        for dirpath, _dirnames, _filenames in sorted(
            os.walk(self.root), key=lambda entry: -len(entry[0])
        ):
            path = Path(dirpath)
            if path == self.root or path.relative_to(self.root).parts[0] in LOCAL_ONLY:
                continue
            try:
                path.rmdir()  # only if empty
                self._dirs.add(path.parent)
            except OSError:
                pass

    async def _sync(self) -> None:
        """fdatasync what the applied actions touched, and the directories they changed."""
        fds = [os.dup(self._fds[rel]) for rel in self._touched if rel in self._fds]
        dirs = [d for d in self._dirs if d.is_dir()]
        self._touched.clear()
        self._dirs.clear()
        if fds or dirs:
            await asyncio.get_running_loop().run_in_executor(None, sync_files, fds, [], dirs)

    def close_files(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._touched.clear()
