"""``warren perf mqtt-idle``: hold many idle MQTT connections, see what the broker pays.

Holder processes open ``--connections`` non-blocking sockets, at most
``--concurrency`` handshakes at a time each (connect, CONNECT, CONNACK) on one
epoll, then hold them: keep-alive 0 by default, so the broker expects no
PINGREQ (with ``--keepalive`` the holders send one every half interval).
There is one holder process per open-file limit's worth of connections: one
when the limit allows them all.

Limits that matter at 100,000 connections on one machine:

* one source address has about 28,000 ephemeral ports towards one broker
  port (``/proc/sys/net/ipv4/ip_local_port_range``), so beyond
  ``PORTS_PER_SOURCE`` connections to a loopback broker the sockets are bound
  to 127.0.0.1, 127.0.0.2, ... (all of 127/8 is loopback on Linux) with
  ``IP_BIND_ADDRESS_NO_PORT``, so the port is only chosen at connect time;
* every connection is a file descriptor here and another in the broker: the
  soft RLIMIT_NOFILE is raised to what is needed, and with CAP_SYS_RESOURCE
  (root, usually) the hard limit too, up to ``/proc/sys/fs/nr_open``. Where
  even root lacks that capability (some containers), the connections are
  split over holder processes; the broker, one process, stays bound by the
  hard limit it was started with.

With ``--ready`` a line ``READY <connected> <failed>`` goes to stdout once all
handshakes are over, so a script can measure the broker's RSS and then stop
the holder with SIGINT or SIGTERM (or let ``--hold`` run out).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import ipaddress
import math
import multiprocessing
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any, TextIO

from warren.perf.limits import raise_nofile
from warren.perf.mqtt_client import (
    MQTTError,
    MQTTTarget,
    check_connack,
    connect_packet,
    packet_end,
)
from warren.perf.report import format_count, pid_note, print_result, print_rss_change, read_rss

__all__ = ["IdleParams", "run", "source_addresses"]

#: Connections per source address before the next one is used (one address has ~28k ports).
PORTS_PER_SOURCE = 25_000
#: Give up on handshakes that made no progress for this long.
STALL_S = 15.0
#: Linux socket option (not in Python's socket module): bind the address, pick the port at connect.
IP_BIND_ADDRESS_NO_PORT = 24


@dataclass(frozen=True)
class IdleParams(MQTTTarget):
    connections: int = 1000
    keepalive: int = 0
    #: Seconds to hold them; 0: until SIGINT/SIGTERM.
    hold: float = 0.0
    concurrency: int = 500
    #: Source addresses to spread over (0: as many as needed, for a loopback broker).
    sources: int = 0
    pid: int | None = None
    settle: float = 1.0
    ready: bool = False
    client_id: str = "warren-idle"


def source_addresses(host: str, connections: int, sources: int = 0) -> list[str | None]:
    """Source addresses to bind, round-robin; ``[None]`` means let the kernel choose."""
    if sources <= 0:
        if connections <= PORTS_PER_SOURCE:
            return [None]
        try:
            loopback = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            loopback = False
        if not loopback:
            return [None]
        sources = math.ceil(connections / PORTS_PER_SOURCE)
    if sources == 1:
        return [None]
    return [f"127.0.0.{i}" for i in range(1, min(sources, 254) + 1)]


class _Holder:
    def __init__(self, p: IdleParams, offset: int = 0, count: int | None = None) -> None:
        self.p = p
        self.offset = offset
        self.count = p.connections if count is None else count
        self.socks: list[socket.socket] = []
        self.failures: collections.Counter[str] = collections.Counter()

    def open_all(self, sources: list[str | None]) -> None:
        """Open every connection, ``concurrency`` handshakes at a time."""
        p = self.p
        addr = (socket.gethostbyname(p.host), p.port)
        ep = select.epoll()
        pending: dict[int, list[Any]] = {}  # fd -> [sock, connected?, bytes so far]
        nxt = 0
        n_sources = len(sources)
        last_progress = time.monotonic()
        try:
            while nxt < self.count or pending:
                while nxt < self.count and len(pending) < p.concurrency:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.setblocking(False)
                    try:
                        src = sources[(self.offset + nxt) % n_sources]
                        if src is not None:
                            s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                            s.bind((src, 0))
                        err = s.connect_ex(addr)
                    except OSError as exc:
                        err = exc.errno or -1
                    nxt += 1
                    if err not in (0, errno.EINPROGRESS):
                        self.failures[f"connect: {errno.errorcode.get(err, err)}"] += 1
                        s.close()
                        continue
                    fd = s.fileno()
                    pending[fd] = [s, False, b"", self.offset + nxt - 1]
                    ep.register(fd, select.EPOLLOUT)
                events = ep.poll(1.0)
                now = time.monotonic()
                if events:
                    last_progress = now
                elif now - last_progress > STALL_S:
                    for entry in pending.values():
                        self.failures["handshake timed out"] += 1
                        entry[0].close()
                    pending.clear()
                    break
                for fd, _ev in events:
                    entry = pending[fd]
                    s = entry[0]
                    if not entry[1]:
                        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if err:
                            self._fail(ep, pending, fd, f"connect: {errno.errorcode.get(err, err)}")
                            continue
                        entry[1] = True
                        try:
                            s.send(
                                connect_packet(p, f"{p.client_id}-{entry[3]}", True, p.keepalive)
                            )
                        except OSError as exc:
                            self._fail(ep, pending, fd, f"send: {exc}")
                            continue
                        ep.modify(fd, select.EPOLLIN)
                        continue
                    try:
                        data = s.recv(256)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        self._fail(ep, pending, fd, f"recv: {exc}")
                        continue
                    if not data:
                        self._fail(ep, pending, fd, "closed by the broker before CONNACK")
                        continue
                    entry[2] += data
                    end = packet_end(entry[2], 0)
                    if not end:
                        continue
                    try:
                        check_connack(entry[2][:end], p.protocol)
                    except MQTTError as exc:
                        self._fail(ep, pending, fd, str(exc))
                        continue
                    ep.unregister(fd)
                    del pending[fd]
                    self.socks.append(s)
        finally:
            for entry in pending.values():
                entry[0].close()
            ep.close()

    def _fail(self, ep: select.epoll, pending: dict[int, list[Any]], fd: int, why: str) -> None:
        self.failures[why] += 1
        ep.unregister(fd)
        pending.pop(fd)[0].close()

    def ping_all(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.send(b"\xc0\x00")

    def alive(self) -> int:
        """How many connections the broker has not closed (no hang-up or pending EOF)."""
        ep = select.epoll()
        try:
            for s in self.socks:
                ep.register(s.fileno(), select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR)
            dead = 0
            while True:
                events = ep.poll(0, 65536)
                if not events:
                    break
                dead += len(events)
                for fd, _ev in events:
                    ep.unregister(fd)
            return len(self.socks) - dead
        finally:
            ep.close()

    def close_all(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.send(b"\xe0\x00")  # DISCONNECT: a normal end, no will
            s.close()
        self.socks.clear()


def _hold(seconds: float) -> bool:
    """Wait ``seconds`` (0: forever) or until SIGINT/SIGTERM; True when a signal ended it."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        if not seconds:
            signal.sigwait(sigs)
            return True
        return signal.sigtimedwait(sigs, seconds) is not None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _child_main(
    p: IdleParams, offset: int, count: int, sources: list[str | None], conn: Connection
) -> None:
    """A holder process: open its share, report, hold (pinging if asked) until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates the stop
    raise_nofile(count + 64)
    holder = _Holder(p, offset, count)
    try:
        holder.open_all(sources)
    except OSError as exc:
        holder.failures[f"{type(exc).__name__}: {exc}"] += count - len(holder.socks)
    conn.send(("ready", len(holder.socks), dict(holder.failures)))
    ping = p.keepalive / 2 if p.keepalive else None
    try:
        while not conn.poll(ping):
            holder.ping_all()
        conn.recv()
    except (EOFError, OSError):
        pass
    alive = holder.alive()
    holder.close_all()
    with contextlib.suppress(OSError):
        conn.send(("done", alive))


def run(p: IdleParams, as_json: bool = False, out: TextIO | None = None) -> int:
    """Open and hold the connections in holder processes of at most the open-file limit
    each (one process when it allows them all); prints the report. Returns the exit status."""
    out = out if out is not None else sys.stdout
    text = None if as_json else out
    capacity = raise_nofile(p.connections + 64) - 64
    if capacity < 1:
        print("warren perf mqtt-idle: no file descriptors to spare", file=sys.stderr)
        return 2
    shares = [min(capacity, p.connections - i) for i in range(0, p.connections, capacity)]
    sources = source_addresses(p.host, p.connections, p.sources)
    note = pid_note(p.pid)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    ctx = multiprocessing.get_context("spawn")
    children: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    failures: collections.Counter[str] = collections.Counter()
    connected = failed = alive = 0
    rss_before = read_rss(p.pid) if p.pid is not None else None
    rss = None
    status = 0
    open_s = 0.0
    start = time.perf_counter()
    try:
        try:
            offset = 0
            for share in shares:
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_child_main,
                    args=(p, offset, share, sources, child_end),
                    name=f"warren-perf-mqtt-idle-{offset}",
                    daemon=True,
                )
                proc.start()
                child_end.close()
                children.append((proc, parent_end))
                offset += share
            for _proc, conn in children:
                try:
                    _kind, n, why = conn.recv()
                except EOFError:
                    n, why = 0, {"holder process died": 1}
                connected += n
                failures.update(why)
            open_s = time.perf_counter() - start
            failed = sum(failures.values())
            if text:
                print(
                    f"connected {format_count(connected)} of {format_count(p.connections)} in "
                    f"{open_s:.2f} s ({connected / open_s if open_s else 0:,.0f}/s), "
                    f"{len(shares)} holder process(es), {len(sources)} source address(es)"
                    + (f"; {format_count(failed)} failed" if failed else ""),
                    file=text,
                    flush=True,
                )
                for why_text, n in failures.most_common(5):
                    print(f"  {format_count(n)} failed: {why_text}", file=text)
            if failed:
                status = 1
            if p.settle > 0 and p.pid is not None:
                time.sleep(p.settle)  # let the broker's memory settle before reading it
            rss = read_rss(p.pid) if p.pid is not None else None
            if text and p.pid is not None and not note:
                print_rss_change(text, p.pid, rss_before, rss, connected, "connection")
            if p.ready:
                print(f"READY {connected} {failed}", file=out, flush=True)
            if text:
                print(
                    f"holding them {f'for {p.hold:g} s' if p.hold else 'until interrupted'}",
                    file=text,
                    flush=True,
                )
            _hold(p.hold)
        except KeyboardInterrupt:
            if not open_s:
                status = 130
        for _proc, conn in children:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for _proc, conn in children:
            with contextlib.suppress(EOFError, OSError):
                alive += conn.recv()[1]
    finally:
        held_s = time.perf_counter() - start - open_s
        for child, conn in children:
            child.join(30)
            if child.is_alive():
                child.terminate()
                child.join(5)
            conn.close()
        signal.signal(signal.SIGTERM, previous)
    result: dict[str, Any] = {
        "connections": connected,
        "failed": failed,
        "failures": dict(failures),
        "alive_at_end": alive,
        "open_s": round(open_s, 3),
        "held_s": round(held_s, 3),
        "processes": len(shares),
        "sources": [s or "auto" for s in sources],
        "pid": p.pid,
        "rss_kib_before": rss_before,
        "rss_kib": rss,
        "params": {
            "host": p.host,
            "port": p.port,
            "protocol": p.protocol,
            "connections": p.connections,
            "keepalive": p.keepalive,
        },
    }
    last = f"{format_count(alive)} still connected at the end; closed them"
    print_result(result, as_json, out, last, note)
    return status
