"""The leader's side of replication: every change to the data directory goes to
every follower, and a confirm waits until the in-sync followers have it on disk.

Replicator is the data directory's FileMirror (store/mirror.py), given to
the broker as its replication, which hands it to every store through its
DataDir: each append, allocation, replace and delete becomes one numbered
action. A follower that connects gets a full sync first (the file index with
sizes and SHA-1s, then the files it lacks or has different), while the
actions from the moment the index was taken wait in its queue; then the
actions stream as they happen. The
follower acknowledges a position once every action up to it is written and
fdatasynced.

The group commit asks ``when_replicated(position, callback)`` before it
releases a round's confirms: the callback runs once every follower in the
in-sync replica set (ISR) has acknowledged the position. The ISR is what a
new leader may be elected from, so it changes only through ``isr_changed``
(the cluster node writes it to etcd first, and only then does the leader act
on it):

- joining: a synced follower within ``max_unsynced_actions`` of the leader is
  waited for by every confirm from then on (position J); once it has acked J
  it holds everything ever confirmed, and it is added to the ISR;
- leaving: a follower that disconnects or falls more than
  ``max_unsynced_actions`` behind is removed, and confirms keep waiting for it
  until the smaller ISR is stored. One that has not acknowledged anything for
  ``ack_timeout`` seconds while actions wait (stopped, cut off by a partition,
  a dead disk) is disconnected, which removes it; it full-syncs when it comes
  back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from warren.cluster import codec as c
from warren.cluster.framing import FrameReader

log = logging.getLogger("warren.cluster")

#: Directory entries of the data directory that are never replicated.
LOCAL_ONLY = frozenset({".lock", "transient", ".node_id"})


def relative(root: str, path: Path) -> str | None:
    """``path`` relative to the data directory with ``/``, or None when it is
    outside it or local to this node (the lock, transient stores, temporary files)."""
    where = os.path.abspath(path)
    if not where.startswith(root):
        return None
    rel = where[len(root) :].replace(os.sep, "/")
    first = rel.split("/", 1)[0]
    if not rel or first in LOCAL_ONLY or rel.endswith(".tmp") or "/.deleted-" in "/" + rel:
        return None
    return rel


def index_files(root: Path) -> list[str]:
    """The replicated files under ``root``, as relative paths."""
    prefix = os.path.abspath(root) + os.sep
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.abspath(dirpath) + os.sep == prefix:
            dirnames[:] = [d for d in dirnames if d not in LOCAL_ONLY]
        dirnames[:] = [d for d in dirnames if not d.startswith(".deleted-")]
        for name in filenames:
            rel = relative(prefix, Path(dirpath) / name)
            if rel is not None:
                out.append(rel)
    out.sort()
    return out


def file_digest(path: Path) -> tuple[int, bytes]:
    """(size, SHA-1) of a file as it is now; (0, sha1 of nothing) when it is gone."""
    h = hashlib.sha1()
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(c.CHUNK):
                h.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        pass
    return size, h.digest()


class FollowerLink:
    """One connected follower, as the leader sees it."""

    def __init__(self, replicator: Replicator, writer: asyncio.StreamWriter) -> None:
        self.replicator = replicator
        self.writer = writer
        self.node_id = ""
        #: host:port of its read-only stream service ("" when it has none).
        self.stream_reads = ""
        #: host:port of its stream protocol read service ("" when it has none).
        self.stream_protocol_reads = ""
        self.acked = -1  # the position it has on disk (-1: not synced yet)
        self.syncing = True  # in full sync: actions wait in `pending`
        # Set when confirms started waiting for it on its way into the ISR: the
        # position it must ack before it is added (None: not joining).
        self.joining_at: int | None = None
        self.pending: list[bytes] = []
        self.closed = False
        self.last_ack = 0.0  # loop time of its last progress

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        if self.syncing:
            self.pending.append(frame)
            return
        self.writer.write(frame)
        if self.writer.transport.get_write_buffer_size() > self.replicator.max_buffer:
            log.warning(
                "follower %s: %d bytes unsent; dropping it (it resyncs when it comes back)",
                self.node_id,
                self.writer.transport.get_write_buffer_size(),
            )
            self.close()

    def start_streaming(self) -> None:
        self.syncing = False
        pending, self.pending = self.pending, []
        self.writer.write(b"".join(pending))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()
            self.replicator._lost(self)


IsrChanged = Callable[[frozenset[str]], Awaitable[bool]]


class Replicator:
    """FileMirror of the leader's data directory, the followers it serves, the ISR."""

    def __init__(
        self,
        root: Path,
        secret: str,
        isr_changed: IsrChanged | None = None,
        max_unsynced_actions: int = 8192,
        max_buffer: int = 256 * 1024 * 1024,
        ack_timeout: float = 5.0,
    ) -> None:
        self.root = os.path.abspath(root) + os.sep
        self.secret = secret
        self.position = 0
        self.max_unsynced_actions = max_unsynced_actions
        self.max_buffer = max_buffer
        self.ack_timeout = ack_timeout
        self._watchdog: asyncio.TimerHandle | None = None
        self._stopping = False
        self._isr_changed = isr_changed
        self.links: list[FollowerLink] = []
        #: Node ids whose acks a confirm waits for (stored in etcd by isr_changed).
        self.isr: frozenset[str] = frozenset()
        self._isr_update: asyncio.Task[None] | None = None
        self._waiters: list[tuple[int, Callable[[], None]]] = []

    # -- FileMirror -------------------------------------------------------------------
    def wants_data(self) -> bool:
        return bool(self.links)

    def appended(self, path: Path, offset: int, data: bytes) -> None:
        if not self.links:  # a follower that joins copies the file instead
            return
        rel = relative(self.root, path)
        if rel is None:
            return
        for start in range(0, max(len(data), 1), c.CHUNK):
            self._emit(c.encode(c.Append(rel, offset + start, data[start : start + c.CHUNK])))

    def allocated(self, path: Path, size: int) -> None:
        if not self.links:
            return
        rel = relative(self.root, path)
        if rel is not None:
            self._emit(c.encode(c.Allocate(rel, size)))

    def renamed(self, path: Path, to: Path) -> None:
        if not self.links:
            return
        rel, rel_to = relative(self.root, path), relative(self.root, to)
        if rel is not None and rel_to is not None:
            self._emit(c.encode(c.Rename(rel, rel_to)))

    def replaced(self, path: Path, data: bytes) -> None:
        if not self.links:
            return
        rel = relative(self.root, path)
        if rel is not None:
            self._emit(c.encode(c.Replace(rel, data)))

    def deleted(self, path: Path) -> None:
        if not self.links:
            return
        rel = relative(self.root, path)
        if rel is not None:
            self._emit(c.encode(c.Delete(rel)))

    def _emit(self, frame: bytes) -> None:
        self.position += 1
        for link in self.links:
            link.send(frame)
            if (
                link.node_id in self.isr
                and self.position - link.acked > self.max_unsynced_actions
                and (self._isr_update is None or self._isr_update.done())
            ):
                log.warning(
                    "follower %s fell %d actions behind; leaving the ISR",
                    link.node_id,
                    self.position - link.acked,
                )
                self._want_isr()

    # -- confirms ---------------------------------------------------------------------
    def when_replicated(self, position: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every ISR follower has ``position`` on disk."""
        if self._replicated(position):
            callback()
        else:
            self._waiters.append((position, callback))

    def _replicated(self, position: int) -> bool:
        connected = set()
        for link in self.links:
            if link.closed:
                continue
            connected.add(link.node_id)
            if (link.node_id in self.isr or link.joining_at is not None) and link.acked < position:
                return False
        # An ISR member that is not connected holds everything back until the
        # ISR without it is stored.
        return self.isr <= connected

    def _release(self) -> None:
        if not self._waiters:
            return
        waiting, self._waiters = self._waiters, []
        for position, callback in waiting:
            if self._replicated(position):
                try:
                    callback()
                except Exception:
                    log.exception("replication callback failed")
            else:
                self._waiters.append((position, callback))

    # -- the ISR ----------------------------------------------------------------------
    def _lag(self, link: FollowerLink) -> int:
        return self.position - link.acked

    def _wanted_isr(self) -> frozenset[str]:
        return frozenset(
            link.node_id
            for link in self.links
            if not link.closed
            and link.acked >= 0
            and self._lag(link) <= self.max_unsynced_actions
            and (
                link.node_id in self.isr
                or (link.joining_at is not None and link.acked >= link.joining_at)
            )
        )

    def _want_isr(self) -> None:
        if self._stopping:
            return
        if self._isr_update is None or self._isr_update.done():
            self._isr_update = asyncio.ensure_future(self._update_isr())

    async def _update_isr(self) -> None:
        while (wanted := self._wanted_isr()) != self.isr:
            stored = True
            if self._isr_changed is not None:
                try:
                    stored = await self._isr_changed(wanted)
                except Exception:
                    log.exception("storing the ISR failed; retrying in 1 s")
                    stored = False
                if not stored:
                    await asyncio.sleep(1)
                    continue
            log.info("in-sync replicas: %s", ", ".join(sorted(wanted)) or "none")
            for link in self.links:
                if link.node_id in wanted:
                    link.joining_at = None
                elif link.node_id in self.isr:
                    link.joining_at = None  # left: joins again from scratch
            self.isr = wanted
            self._release()

    def _lost(self, link: FollowerLink) -> None:
        if link in self.links:
            self.links.remove(link)
        log.info("follower %s disconnected", link.node_id or "(unnamed)")
        if link.node_id in self.isr:
            self._want_isr()
        self._release()

    def _check_acks(self) -> None:
        """Disconnect followers that keep confirms waiting without acknowledging."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for link in list(self.links):
            waited_for = link.node_id in self.isr or link.joining_at is not None
            if waited_for and link.acked < self.position and now - link.last_ack > self.ack_timeout:
                log.warning(
                    "follower %s acknowledged nothing for %.1f s (%d actions behind); "
                    "disconnecting it, out of the ISR",
                    link.node_id,
                    now - link.last_ack,
                    self.position - link.acked,
                )
                link.close()
            elif link.acked >= self.position:
                link.last_ack = now  # nothing pending: not late
        self._watchdog = loop.call_later(min(1.0, self.ack_timeout / 2), self._check_acks)

    async def stop_and_flush(self, timeout: float = 2.0) -> None:
        """stop(), then wait (at most ``timeout`` seconds) until every follower
        connection has sent what it holds: a clean stop's last writes (the acks,
        what was delivered) reach the followers before the leader goes."""
        writers = [link.writer for link in self.links if not link.closed]
        self.stop()
        if writers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True),
                    timeout,
                )

    def stop(self) -> None:
        """Stop serving the followers (the leader is stepping down). The ISR stays
        as stored: the followers that disconnect now may be elected."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._isr_update is not None:
            self._isr_update.cancel()
        for link in list(self.links):
            link.close()

    def _ack(self, link: FollowerLink, position: int) -> None:
        if position > link.acked:
            link.last_ack = asyncio.get_running_loop().time()
        link.acked = max(link.acked, position)
        if (
            link.node_id not in self.isr
            and link.joining_at is None
            and self._lag(link) <= self.max_unsynced_actions
        ):
            # From now on confirms wait for it; once it has what they waited for
            # before (up to here), it holds everything ever confirmed.
            link.joining_at = self.position
        if (link.node_id in self.isr) != (link.node_id in self._wanted_isr()):
            self._want_isr()
        self._release()

    def followers(self) -> list[dict[str, Any]]:
        """Each connected follower: id, address, position on disk, lag, ISR state."""
        out = []
        for link in self.links:
            peer = link.writer.get_extra_info("peername")
            out.append(
                {
                    "node": link.node_id,
                    "address": f"{peer[0]}:{peer[1]}" if peer else None,
                    "state": "syncing" if link.syncing else "streaming",
                    "acked_position": link.acked,
                    "lag_actions": max(self.position - link.acked, 0) if link.acked >= 0 else None,
                    "in_sync": link.node_id in self.isr,
                    "stream_reads": link.stream_reads or None,
                    "stream_protocol_reads": link.stream_protocol_reads or None,
                }
            )
        return out

    def stream_replicas(self) -> list[str]:
        """host:port of the in-sync followers' stream read services, for readers
        to spread over (AMQP's connection.start announces them)."""
        return [
            link.stream_reads
            for link in self.links
            if link.stream_reads and not link.closed and link.node_id in self.isr
        ]

    def stream_protocol_replicas(self) -> list[str]:
        """host:port of the in-sync followers' stream protocol read services: the
        streams' replicas in the stream protocol's Metadata."""
        return [
            link.stream_protocol_reads
            for link in self.links
            if link.stream_protocol_reads and not link.closed and link.node_id in self.isr
        ]

    # -- serving a follower -----------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One follower's connection, from its Hello to its end."""
        link = FollowerLink(self, writer)
        frames = FrameReader(reader)
        peer = writer.get_extra_info("peername")
        try:
            hello = await frames.next()
            if not isinstance(hello, c.Hello):
                raise c.ProtocolError("expected Hello")
            if not hmac.compare_digest(hello.secret.encode(), self.secret.encode()):
                log.warning("replication peer %s: wrong secret; refused", peer)
                writer.write(c.encode(c.Refused("wrong clustering secret")))
                await writer.drain()
                return
            link.node_id = hello.node_id
            link.stream_reads = hello.stream_reads
            link.stream_protocol_reads = hello.stream_protocol_reads
            if any(other.node_id == link.node_id for other in self.links):
                for other in [o for o in self.links if o.node_id == link.node_id]:
                    other.close()  # a reconnect: the old link is dead
            self.links.append(link)
            link.last_ack = asyncio.get_running_loop().time()
            if self._watchdog is None:
                self._check_acks()
            start = await self._full_sync(link, frames)
            link.start_streaming()
            log.info("follower %s (%s) synced from position %d", link.node_id, peer, start)
            while True:
                frame = await frames.next()
                if isinstance(frame, c.Ack):
                    self._ack(link, frame.position)
                elif not isinstance(frame, c.Heartbeat):
                    raise c.ProtocolError(f"unexpected {type(frame).__name__}")
        except (c.ProtocolError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.info("follower %s (%s): %s", link.node_id or "?", peer, exc)
        finally:
            link.close()

    async def _full_sync(self, link: FollowerLink, frames: FrameReader) -> int:
        """Index, requests, files; returns the position the index was taken at."""
        loop = asyncio.get_running_loop()
        # Taken on the loop, between two actions: from here on the actions queue up
        # for this follower, and they apply on top of whatever the files hold when
        # they are read below (appends carry offsets, replaces whole contents).
        start = self.position
        names = await loop.run_in_executor(None, index_files, Path(self.root))
        for name in names:
            size, digest = await loop.run_in_executor(None, file_digest, Path(self.root, name))
            link.writer.write(c.encode(c.IndexEntry(name, size, digest)))
            await link.writer.drain()
        link.writer.write(c.encode(c.IndexEnd(start)))
        await link.writer.drain()
        wanted: list[str] = []
        while True:
            frame = await frames.next()
            if isinstance(frame, c.RequestsEnd):
                break
            if not isinstance(frame, c.Request):
                raise c.ProtocolError(f"expected Request, got {type(frame).__name__}")
            wanted.append(frame.path)
        for name in wanted:
            if relative(self.root, Path(self.root, name)) is None:
                raise c.ProtocolError(f"request for {name!r}")
            await self._send_file(link, name)
        link.writer.write(c.encode(c.SyncDone()))
        await link.writer.drain()
        return start

    async def _send_file(self, link: FollowerLink, name: str) -> None:
        loop = asyncio.get_running_loop()
        path = Path(self.root, name)
        offset = 0
        try:
            f = await loop.run_in_executor(None, open, path, "rb")
        except FileNotFoundError:  # deleted since the index: a Delete action follows
            link.writer.write(c.encode(c.FileData(name, 0, b"")))
            return
        try:
            while True:
                chunk = await loop.run_in_executor(None, f.read, c.CHUNK)
                if not chunk and offset:
                    break
                link.writer.write(c.encode(c.FileData(name, offset, chunk)))
                await link.writer.drain()
                offset += len(chunk)
                if not chunk:
                    break
        finally:
            f.close()
