"""``warren perf mqtt``: MQTT publishers and subscribers in their own processes.

A load generator for any MQTT 3.1.1 / 5 broker (Warren, mosquitto, ...), built
like ``warren perf throughput``: the parent starts one OS process per publisher
and per subscriber (multiprocessing, 'spawn'), waits until all are connected
(subscribers: SUBACK received), sends them the common start time and then only
collects the counts each worker reports once a second over its pipe.

The workers keep the client from being the bottleneck:

* the PUBLISH packets are encoded once (with Warren's sans-IO codec, per packet
  id for QoS 1/2); a batch is one ``bytes.join`` of pre-built pieces, with the
  8-byte send timestamp (``--latency``) as the separator, written with one
  ``sendall``. QoS 1/2 publishers keep at most ``window`` messages in flight
  and count PUBACKs (PUBREC/PUBCOMP for QoS 2) by walking fixed headers.
* subscribers never decode a packet into objects: they walk the fixed headers
  of the received bytes, count PUBLISH packets, take the packet id for the
  PUBACK (QoS 1) or PUBREC (QoS 2) and, with ``--latency``, the timestamp at
  the start of the payload. All acks of one read go out in one ``sendall``.

Packet ids are assigned round-robin in send order over twice the window (at
least 1..1024, at most 1..65535). That is only safe while the broker
acknowledges a connection's messages in order (or nearly: within a window),
which the spec requires for QoS 1 PUBACKs and which brokers do; so an id is
never reused while still in flight.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

from warren.mqtt import properties as P
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.errors import MQTTCodecError
from warren.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from warren.perf.report import SUB_BITS, format_count, format_rate, percentiles_ms, print_json

__all__ = [
    "DEFAULT_INFLIGHT",
    "MQTTError",
    "MQTTParams",
    "connect",
    "parse_uri",
    "run",
    "worker_main",
]

NS = 1_000_000_000
DEFAULT_PORT = 1883
#: Default QoS 1/2 window of a publisher (like ``perf throughput -c 1000``); MQTT 5
#: brokers may announce a lower Receive Maximum in CONNACK, which then wins.
DEFAULT_INFLIGHT = 1024
#: Packet ids are 1..65535; the window stays below so none is reused while in flight.
MAX_INFLIGHT = 65535
#: Whole packets are pre-built per packet id only while they take at most this much.
PREBUILT_BYTES = 32 * 1024 * 1024
BATCH_BYTES = 64 * 1024
MAX_BATCH_MESSAGES = 1024
POLL_NS = 50_000_000
REPORT_NS = NS
IDLE_REPORT_NS = 100_000_000
RECV_SIZE = 256 * 1024
#: In --count mode: give up waiting for missing messages after this long without progress.
STALL_NS = 5 * NS
LINE_LAG_NS = 200_000_000
READY_TIMEOUT = 60.0
FINISH_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
#: MQTT 5 Session Expiry Interval asked for with --persistent.
PERSISTENT_SESSION_EXPIRY = 3600

_TS = struct.Struct(">Q")
_U16 = struct.Struct(">H")


class MQTTError(Exception):
    """The broker refused the connection or subscription, or closed the connection."""


@dataclass(frozen=True)
class MQTTParams:
    """Everything a run needs; also what ``--json`` prints as ``params`` (password masked)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = None
    protocol: int = 4
    qos: int = 0
    publishers: int = 1
    subscribers: int = 1
    size: int = 16
    topic: str = "perf/test"
    time: float = 0.0
    count: int = 0
    rate: int = 0
    inflight: int = DEFAULT_INFLIGHT
    clean_session: bool = True
    latency: bool = False
    keepalive: int = 0
    #: Prefix of the client ids; the parent adds its pid so concurrent runs do not collide.
    client_id: str = "warren-perf"

    def check(self) -> str | None:
        """Why these parameters cannot run, or None."""
        if self.protocol not in (4, 5):
            return "--protocol must be 4 (MQTT 3.1.1) or 5"
        if self.qos not in (0, 1, 2):
            return "--qos must be 0, 1 or 2"
        if self.latency and self.size < 8:
            return "--latency needs --size of at least 8 (the timestamp)"
        if not self.topic or "+" in self.topic or "#" in self.topic:
            return "--topic must be a non-empty topic name without wildcards"
        if self.publishers == 0 and self.subscribers == 0:
            return "nothing to do with --publishers 0 --subscribers 0"
        if self.qos and not 0 < self.inflight <= MAX_INFLIGHT:
            return f"--inflight must be 1..{MAX_INFLIGHT}"
        return None


def parse_uri(uri: str) -> dict[str, Any]:
    """``mqtt://user:pass@host:port`` -> host, port, username, password (missing: None)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("mqtt", "tcp"):
        raise ValueError(f"unsupported URI scheme {parts.scheme!r} (only mqtt://)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"bad port in {uri!r}: {exc}") from None
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "username": unquote(parts.username) if parts.username is not None else None,
        "password": unquote(parts.password) if parts.password is not None else None,
    }


# =====================================================================================
# Connection setup (correct rather than fast: the codec decodes these few packets)
# =====================================================================================


def read_packet(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """Block until one whole packet is in ``buf`` + what the socket gives; returns
    ``(packet, rest)``."""
    while True:
        end = packet_end(buf, 0)
        if end:
            return buf[:end], buf[end:]
        data = sock.recv(65536)
        if not data:
            raise MQTTError("the broker closed the connection")
        buf += data


def packet_end(buf: bytes, pos: int) -> int:
    """End offset of the packet starting at ``pos``, or 0 when it is not all in ``buf``."""
    n = len(buf)
    i = pos + 1
    rl = 0
    shift = 0
    while i < n:
        b = buf[i]
        i += 1
        rl |= (b & 0x7F) << shift
        if b < 0x80:
            return i + rl if i + rl <= n else 0
        shift += 7
        if shift > 21:
            raise MQTTError("malformed remaining length from the broker")
    return 0


def connect_packet(p: MQTTParams, client_id: str, clean: bool) -> bytes:
    props: P.Properties = {}
    if p.protocol == 5 and not clean:
        props[P.SESSION_EXPIRY_INTERVAL] = PERSISTENT_SESSION_EXPIRY
    return encode(
        Connect(
            client_id=client_id,
            protocol_level=p.protocol,
            clean_start=clean,
            keep_alive=p.keepalive,
            username=p.username,
            password=p.password.encode() if p.password is not None else None,
            properties=props,
        ),
        p.protocol,
    )


def check_connack(packet: bytes, protocol: int) -> ConnAck:
    """Decode a CONNACK; raises MQTTError unless it accepts the connection."""
    try:
        decoded = Decoder(protocol).feed(packet)
    except MQTTCodecError as exc:
        raise MQTTError(f"bad CONNACK: {exc}") from None
    if len(decoded) != 1 or not isinstance(decoded[0], ConnAck):
        raise MQTTError(f"expected CONNACK, got {decoded!r}")
    ack = decoded[0]
    if ack.reason_code:
        raise MQTTError(f"connection refused by the broker: reason code 0x{ack.reason_code:02x}")
    return ack


def connect(
    p: MQTTParams, client_id: str, clean: bool | None = None
) -> tuple[socket.socket, ConnAck, bytes]:
    """Open a connection and complete CONNECT/CONNACK; returns the socket (blocking, no
    timeout), the CONNACK and any bytes received after it."""
    sock = socket.create_connection((p.host, p.port), timeout=CONNECT_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(connect_packet(p, client_id, p.clean_session if clean is None else clean))
        packet, rest = read_packet(sock, b"")
        ack = check_connack(packet, p.protocol)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock, ack, rest


def subscribe(sock: socket.socket, p: MQTTParams, buf: bytes) -> bytes:
    """SUBSCRIBE to ``p.topic`` at ``p.qos`` and wait for the SUBACK; returns the bytes after it."""
    sock.settimeout(CONNECT_TIMEOUT)
    sock.sendall(encode(Subscribe(1, [Subscription(p.topic, p.qos)]), p.protocol))
    while True:
        packet, buf = read_packet(sock, buf)
        if packet[0] >> 4 != P.SUBACK:
            continue  # e.g. a retained or session message: not counted
        acks = Decoder(p.protocol).feed(packet)
        ack = acks[0]
        assert isinstance(ack, SubAck)
        if not ack.reason_codes or ack.reason_codes[0] >= 0x80:
            raise MQTTError(f"subscription to {p.topic!r} refused: {ack.reason_codes}")
        sock.settimeout(None)
        return buf


def disconnect(sock: socket.socket, protocol: int) -> None:
    """Send DISCONNECT and close, ignoring a connection the broker already dropped."""
    with contextlib.suppress(OSError):
        sock.sendall(encode(Disconnect(), protocol))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def drop_session(p: MQTTParams, client_id: str) -> None:
    """After a --persistent run: reconnect with a clean session so the broker forgets it."""
    with contextlib.suppress(OSError, MQTTError):
        sock, _, _ = connect(p, client_id, clean=True)
        disconnect(sock, p.protocol)


# =====================================================================================
# Worker processes
# =====================================================================================


@dataclass
class WorkerResult:
    count: int = 0
    acked: int = 0
    rejected: int = 0
    last_ns: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    window: int = 0
    receive_maximum: int | None = None
    hist: dict[int, int] = field(default_factory=dict)


class _Stop(Exception):
    """The parent asked the worker to stop before the start (or went away)."""


def worker_main(role: str, index: int, params: MQTTParams, conn: Connection) -> None:
    """Entry point of a worker process ('pub' or 'sub')."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    try:
        worker: _Worker = (
            _Publisher(index, params, conn) if role == "pub" else _Subscriber(index, params, conn)
        )
        worker.run()
    except _Stop:
        with contextlib.suppress(OSError):
            conn.send(("done", role, index, asdict(WorkerResult())))
    except (MQTTError, OSError, EOFError) as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


class _Worker:
    role = ""

    def __init__(self, index: int, params: MQTTParams, conn: Connection) -> None:
        self.index = index
        self.params = params
        self.conn = conn
        self.client_id = f"{params.client_id}-{self.role}-{index}"
        self.t0 = 0
        self.stop_at = 1 << 62
        self.cpu0 = 0.0

    def run(self) -> None:
        raise NotImplementedError

    def wait_go(self) -> None:
        self.conn.send(("ready", self.role, self.index))
        msg = self.conn.recv()
        if msg[0] != "go":
            raise _Stop
        self.t0 = msg[1]
        if self.params.time:
            self.stop_at = self.t0 + int(self.params.time * NS)
        self.cpu0 = time.process_time()

    def stop_requested(self) -> bool:
        try:
            if self.conn.poll():
                return bool(self.conn.recv()[0] == "stop")
        except (EOFError, OSError):
            return True
        return False

    def finish(self, sock: socket.socket, result: WorkerResult) -> None:
        """Report the final counts at once, then disconnect (and drop a persistent session)."""
        result.cpu_s = time.process_time() - self.cpu0
        result.wall_s = (time.monotonic_ns() - self.t0) / NS
        self.conn.send(("stats", self.role, self.index, result.count, result.acked, None))
        disconnect(sock, self.params.protocol)
        if not self.params.clean_session:
            drop_session(self.params, self.client_id)
        self.conn.send(("done", self.role, self.index, asdict(result)))


class _AckTracker:
    """Publisher side: counts PUBACK (QoS 1) or PUBCOMP (QoS 2) by walking fixed headers,
    answering PUBREC with PUBREL. A rejection (MQTT 5 reason code >= 0x80) ends the flow too."""

    def __init__(self, v5: bool) -> None:
        self.v5 = v5
        self.acked = 0
        self.rejected = 0

    def feed(self, buf: bytes, replies: list[bytes]) -> int:
        """Handle the whole packets in ``buf``; returns the offset of the first incomplete one."""
        pos = 0
        n = len(buf)
        v5 = self.v5
        while n - pos >= 2:
            rl = buf[pos + 1]
            if rl < 0x80:
                vh = pos + 2
                end = vh + rl
                if end > n:
                    break
            else:
                end = packet_end(buf, pos)
                if not end:
                    break
                vh = end - _rl_value(buf, pos)
                rl = end - vh
            kind = buf[pos] >> 4
            if kind == 4 or kind == 7:  # PUBACK / PUBCOMP
                self.acked += 1
                if v5 and rl >= 3 and buf[vh + 2] >= 0x80:
                    self.rejected += 1
            elif kind == 5:  # PUBREC
                if v5 and rl >= 3 and buf[vh + 2] >= 0x80:
                    self.acked += 1
                    self.rejected += 1
                else:
                    replies.append(b"\x62\x02" + buf[vh : vh + 2])
            elif kind == 14:
                raise MQTTError(f"DISCONNECT from the broker{_reason(buf, vh, end)}")
            pos = end
        return pos


def _rl_value(buf: bytes, pos: int) -> int:
    rl = 0
    shift = 0
    i = pos + 1
    while True:
        b = buf[i]
        i += 1
        rl |= (b & 0x7F) << shift
        if b < 0x80:
            return rl
        shift += 7


def _reason(buf: bytes, vh: int, end: int) -> str:
    return f" (reason code 0x{buf[vh]:02x})" if end > vh else ""


def packet_ids(window: int) -> int:
    """How many packet ids a QoS 1/2 publisher cycles through: twice its window (room
    for a broker that acks slightly out of order), at least 1,024, at most 65,535."""
    return min(MAX_INFLIGHT, max(2 * window, 1024))


def publish_pieces(p: MQTTParams, ids: int = MAX_INFLIGHT) -> tuple[list[bytes], bytes]:
    """The PUBLISH packets split around the timestamp: ``heads[i] + ts + tail`` is the
    packet with packet id ``i + 1`` for ``i < ids`` (QoS 0: one head, no id). Without
    --latency the payload is zeros and ``heads[i] + tail`` is the packet."""
    rest = b"\x00" * (p.size - 8) if p.latency else b"\x00" * p.size
    ts_len = 8 if p.latency else 0
    if p.qos == 0:
        whole = encode(Publish(p.topic, b"\x00" * ts_len + rest, 0), p.protocol)
        return [whole[: len(whole) - len(rest) - ts_len]], rest
    heads: list[bytes] = []
    template = encode(Publish(p.topic, b"\x00" * ts_len + rest, p.qos, packet_id=1), p.protocol)
    head = template[: len(template) - len(rest) - ts_len]
    # The packet id is the 2 bytes before the properties (v5) / payload: patch it in.
    id_at = len(head) - (3 if p.protocol == 5 else 2)
    prefix, suffix = head[:id_at], head[id_at + 2 :]
    pack = _U16.pack
    for pid in range(1, ids + 1):
        heads.append(prefix + pack(pid) + suffix)
    return heads, rest


class _Publisher(_Worker):
    role = "pub"

    def run(self) -> None:
        p = self.params
        sock, ack, inbuf = connect(p, self.client_id)
        window = 0
        receive_max: int | None = None
        if p.qos:
            window = p.inflight
            if p.protocol == 5:
                rm = ack.properties.get(P.RECEIVE_MAXIMUM, 65535)
                assert isinstance(rm, int)
                receive_max = rm
                window = min(window, rm)
                max_qos = ack.properties.get(P.MAXIMUM_QOS, 2)
                assert isinstance(max_qos, int)
                if p.qos > max_qos:
                    raise MQTTError(f"the broker's Maximum QoS is {max_qos}")
        heads, tail = publish_pieces(p, packet_ids(window))
        self.wait_go()
        self.sent = 0
        self.tracker = _AckTracker(p.protocol == 5)
        done = threading.Event()
        reporter = threading.Thread(target=self._report_loop, args=(done,), daemon=True)
        reporter.start()
        try:
            result = self._loop(sock, heads, tail, window, inbuf)
        finally:
            done.set()
            reporter.join()
        result.window = window
        result.receive_maximum = receive_max
        self.finish(sock, result)

    def _report_loop(self, done: threading.Event) -> None:
        """Counts go from a thread: sendall may block for long under the broker's
        back-pressure, and the live rates should not stall with it."""
        next_report = self.t0 + REPORT_NS
        while not done.wait(max(0, next_report - time.monotonic_ns()) / NS):
            next_report += REPORT_NS
            self.conn.send(("stats", "pub", self.index, self.sent, self.tracker.acked, None))

    def _loop(
        self, sock: socket.socket, heads: list[bytes], tail: bytes, window: int, inbuf: bytes
    ) -> WorkerResult:
        p = self.params
        latency = p.latency
        msg_len = len(heads[0]) + len(tail) + (8 if latency else 0)
        batch = max(1, min(MAX_BATCH_MESSAGES, BATCH_BYTES // msg_len))
        limit = p.count or (1 << 62)
        rate = p.rate
        quantum = max(1, min(batch, rate // 1000))
        tracker = self.tracker
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poll = poller.poll
        recv = sock.recv
        sendall = sock.sendall
        monotonic_ns = time.monotonic_ns
        ts_pack = _TS.pack
        ids = len(heads)
        # QoS 0: a batch of n is ts.join([head, tail+head, ..., tail]).
        # QoS 1/2: the same with the head of each message's packet id.
        # Per packet id, whole packets (and tail + next head) are pre-built unless that
        # would take too much memory (large payloads): then batches are joined per message.
        prebuilt = ids * msg_len <= PREBUILT_BYTES
        tail_heads = [tail + h for h in heads] if prebuilt else [tail + heads[0]]
        wholes = [h + tail for h in heads] if prebuilt else [heads[0] + tail]
        parts_cache: dict[int, list[bytes]] = {}

        def qos0_parts(n: int) -> list[bytes]:
            lst = parts_cache.get(n)
            if lst is None:
                lst = [heads[0], *([tail_heads[0]] * (n - 1)), tail]
                if len(parts_cache) < 256:
                    parts_cache[n] = lst
            return lst

        def take(lst: list[bytes], start: int, n: int) -> list[bytes]:
            end = start + n
            if end <= ids:
                return lst[start:end]
            return lst[start:] + lst[: end - ids]

        def read_incoming(block_ms: int) -> None:
            nonlocal inbuf
            if not poll(block_ms):
                return
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError("the broker closed the connection")
            inbuf = inbuf + data if inbuf else data
            replies: list[bytes] = []
            used = tracker.feed(inbuf, replies)
            inbuf = inbuf[used:]
            if replies:
                sendall(b"".join(replies))

        if inbuf:
            replies: list[bytes] = []
            inbuf = inbuf[tracker.feed(inbuf, replies) :]
        sent = 0
        t0 = self.t0
        stop_at = self.stop_at
        next_poll = monotonic_ns() + POLL_NS
        whole0 = wholes[0]
        while True:
            now = monotonic_ns()
            if now >= stop_at:
                break
            if now >= next_poll:
                next_poll = now + POLL_NS
                if self.stop_requested():
                    break
                if not window:
                    read_incoming(0)  # a DISCONNECT would show here
            n = limit - sent
            if n <= 0:
                break
            if n > batch:
                n = batch
            if rate:
                due = (now - t0) * rate // NS - sent
                if due < quantum and sent + due < limit:
                    wait_ns = (sent + quantum) * NS // rate + t0 - now
                    time.sleep(min(max(wait_ns, 0), POLL_NS) / NS)
                    continue
                if n > due:
                    n = due
            if window:
                room = window - (sent - tracker.acked)
                if room <= 0:
                    read_incoming(max(1, (next_poll - now) // 1_000_000))
                    continue
                if n > room:
                    n = room
                start = sent % ids
                if not prebuilt:
                    tsb = ts_pack(now) if latency else b""
                    pieces: list[bytes] = []
                    for i in range(start, start + n):
                        pieces += (heads[i % ids], tsb, tail)
                    sendall(b"".join(pieces))
                elif latency:
                    pieces = take(tail_heads, start, n)
                    pieces[0] = heads[start]
                    pieces.append(tail)
                    sendall(ts_pack(now).join(pieces))
                else:
                    sendall(b"".join(take(wholes, start, n)))
            elif latency:
                sendall(ts_pack(now).join(qos0_parts(n)))
            else:
                sendall(whole0 * n)
            sent += n
            self.sent = sent
            if window:
                read_incoming(0)
        last_ns = monotonic_ns()
        if window:
            deadline = monotonic_ns() + int(FINISH_TIMEOUT * NS)
            while tracker.acked < sent and monotonic_ns() < deadline:
                read_incoming(100)
                if self.stop_requested():
                    break
        return WorkerResult(
            count=sent, acked=tracker.acked, rejected=tracker.rejected, last_ns=last_ns
        )


class _Subscriber(_Worker):
    role = "sub"

    def run(self) -> None:
        p = self.params
        sock, _, buf = connect(p, self.client_id)
        buf = subscribe(sock, p, buf)
        self.wait_go()
        result = self._loop(sock, buf)
        self.finish(sock, result)

    def _loop(self, sock: socket.socket, buf: bytes) -> WorkerResult:
        """Count PUBLISH packets until the deadline or the parent's stop, acking QoS 1/2.

        Publishers stamp a whole batch with one timestamp, so latencies are
        recorded per run of equal stamps rather than per message.
        """
        p = self.params
        latency = p.latency
        v5 = p.protocol == 5
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poll = poller.poll
        poll_ms = POLL_NS // 1_000_000
        recv = sock.recv
        sendall = sock.sendall
        monotonic_ns = time.monotonic_ns
        unpack_ts = _TS.unpack_from
        hist: dict[int, int] = {}

        def record(now: int, ts: int, n: int) -> None:
            us = (now - ts) // 1000
            if us < 0:
                us = 0
            b = us.bit_length()
            if b > SUB_BITS:
                b -= SUB_BITS
                us = (b << SUB_BITS) | (us >> b)
            hist[us] = hist.get(us, 0) + n

        count = 0
        reported = 0
        counted = 0
        run_ts = -1
        run_n = 0
        last_ns = self.t0
        stop_at = self.stop_at
        next_report = self.t0 + REPORT_NS
        next_idle_report = 0

        def report() -> None:
            nonlocal reported, hist
            self.conn.send(("stats", "sub", self.index, count, 0, hist))
            reported = count
            hist = {}

        full = False
        while True:
            if not full:
                if count != reported and not poll(0):
                    now = monotonic_ns()
                    if now >= next_idle_report:
                        # Early news when the socket runs dry ends a --count run sooner.
                        next_idle_report = now + IDLE_REPORT_NS
                        report()
                if not poll(poll_ms):
                    now = monotonic_ns()
                    if now >= stop_at or self.stop_requested():
                        break
                    if count != reported and now >= next_report:
                        next_report += REPORT_NS
                        report()
                    continue
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError("the broker closed the connection")
            full = len(data) == RECV_SIZE
            now = monotonic_ns()
            buf = buf + data if buf else data
            n = len(buf)
            pos = 0
            acks: list[bytes] = []
            while n - pos >= 2:
                b0 = buf[pos]
                rl = buf[pos + 1]
                if rl < 0x80:
                    vh = pos + 2
                    end = vh + rl
                    if end > n:
                        break
                else:
                    end = packet_end(buf, pos)
                    if not end:
                        break
                    vh = end - _rl_value(buf, pos)
                kind = b0 >> 4
                if kind == 3:
                    count += 1
                    qos = (b0 >> 1) & 3
                    if qos or latency:
                        at = vh + 2 + ((buf[vh] << 8) | buf[vh + 1])  # after the topic
                        if qos:
                            acks.append(
                                (b"\x40\x02" if qos == 1 else b"\x50\x02") + buf[at : at + 2]
                            )
                            at += 2
                        if latency:
                            if v5:
                                plen = buf[at]
                                if plen < 0x80:
                                    at += 1 + plen
                                else:
                                    plen = _rl_value(buf, at - 1)
                                    at += 1 + (plen > 0x7F) + (plen > 0x3FFF) + (plen > 0x1FFFFF)
                                    at += plen
                            if end - at >= 8:
                                ts = unpack_ts(buf, at)[0]
                                if ts == run_ts:
                                    run_n += 1
                                else:
                                    if run_n:
                                        record(now, run_ts, run_n)
                                    run_ts = ts
                                    run_n = 1
                elif kind == 6:  # PUBREL (QoS 2): complete with PUBCOMP
                    acks.append(b"\x70\x02" + buf[vh : vh + 2])
                elif kind == 14:
                    raise MQTTError(f"DISCONNECT from the broker{_reason(buf, vh, end)}")
                pos = end
            buf = buf[pos:] if pos < n else b""
            if run_n:
                record(now, run_ts, run_n)
                run_n = 0
                run_ts = -1
            if acks:
                sendall(b"".join(acks))
            if count != counted:
                counted = count
                last_ns = now
            if now >= stop_at:
                break
            if now >= next_report:
                next_report += REPORT_NS
                if self.stop_requested():
                    break
                report()
        return WorkerResult(count=count, last_ns=last_ns, hist=hist)


# =====================================================================================
# Parent: orchestration and report
# =====================================================================================


@dataclass
class _Slot:
    role: str
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    count: int = 0
    acked: int = 0
    ready: bool = False
    done: bool = False
    result: dict[str, Any] | None = None


def run(p: MQTTParams, out: TextIO | None = None, as_json: bool = False) -> int:
    """Run the load; prints live lines to ``out`` and the summary. Returns the exit status."""
    summary, status = measure(
        p, out if out is not None else (sys.stderr if as_json else sys.stdout)
    )
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, out if out is not None else sys.stdout)
    return status


def measure(p: MQTTParams, live: TextIO | None = None) -> tuple[dict[str, Any], int]:
    """Run the load (the in-process API); returns the summary and the exit status."""
    problem = p.check()
    if problem:
        return {"errors": [problem], "params": _public(p)}, 2
    if p.client_id == MQTTParams.client_id:
        p = replace(p, client_id=f"warren-perf-{os.getpid()}")
    ctx = multiprocessing.get_context("spawn")
    slots: list[_Slot] = []
    roles = [("sub", i) for i in range(p.subscribers)] + [("pub", i) for i in range(p.publishers)]
    for role, index in roles:
        parent_end, child_end = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=worker_main,
            args=(role, index, p, child_end),
            name=f"warren-perf-mqtt-{role}-{index}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        slots.append(_Slot(role, index, proc, parent_end))
    pubs = [s for s in slots if s.role == "pub"]
    subs = [s for s in slots if s.role == "sub"]
    expected = p.count * p.publishers * p.subscribers
    errors: list[str] = []
    hist: dict[int, int] = {}
    second_hist: dict[int, int] = {}

    def handle(slot: _Slot) -> None:
        try:
            msg = slot.conn.recv()
        except (EOFError, OSError):
            if not slot.done:
                slot.done = True
                errors.append(f"{slot.role} {slot.index}: process exited unexpectedly")
            return
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
        elif kind == "stats":
            slot.count, slot.acked = msg[3], msg[4]
            if msg[5]:
                _merge(second_hist, msg[5])
        elif kind == "done":
            slot.done = True
            slot.result = msg[3]
            slot.count, slot.acked = msg[3]["count"], msg[3]["acked"]
            _merge(second_hist, msg[3]["hist"])
        elif kind == "error":
            slot.done = True
            errors.append(f"{slot.role} {slot.index}: {msg[3]}")

    def pump(timeout: float) -> None:
        by_conn = {id(s.conn): s for s in slots}
        for c in wait([s.conn for s in slots if not s.done], timeout):
            handle(by_conn[id(c)])

    def send_all(msg: tuple[Any, ...]) -> None:
        for s in slots:
            if not s.done:
                with contextlib.suppress(OSError):
                    s.conn.send(msg)

    interrupted = False
    t0 = time.monotonic_ns()
    stop_sent_ns = 0
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while not errors and not all(s.ready or s.done for s in slots):
                if time.monotonic() > deadline:
                    errors.append("workers did not connect in time")
                    break
                pump(0.5)
        except KeyboardInterrupt:
            interrupted = True
            errors.append("interrupted before the start")
        if errors:
            send_all(("stop",))
            stop_sent_ns = time.monotonic_ns()
        else:
            t0 = time.monotonic_ns()
            send_all(("go", t0))
            if live is not None:
                print(
                    f"warren perf mqtt: {p.host}:{p.port} MQTT {'5' if p.protocol == 5 else '3.1.1'}"
                    f", QoS {p.qos}, {p.publishers} publisher(s), {p.subscribers} subscriber(s)"
                    f", {p.size} B payloads, topic {p.topic}",
                    file=live,
                    flush=True,
                )
        second = 1
        next_line = t0 + NS + LINE_LAG_NS
        prev_pub = prev_sub = prev_ack = 0
        last_progress_ns = t0
        last_received = 0
        while not all(s.done for s in slots):
            now = time.monotonic_ns()
            try:
                pump(max(0.0, min(0.2, (next_line - now) / NS)))
            except KeyboardInterrupt:
                if interrupted:
                    break
                interrupted = True
                send_all(("stop",))
                stop_sent_ns = time.monotonic_ns()
                continue
            now = time.monotonic_ns()
            published = sum(s.count for s in pubs)
            received = sum(s.count for s in subs)
            if received != last_received:
                last_received = received
                last_progress_ns = now
            if now >= next_line and not stop_sent_ns:
                lat = percentiles_ms(second_hist, (50, 99))
                _merge(hist, second_hist)
                second_hist.clear()
                acked = sum(s.acked for s in pubs)
                if live is not None:
                    line = (
                        f"{second:>5}s  published {format_rate(published - prev_pub):>10} msg/s"
                        f"  received {format_rate(received - prev_sub):>10} msg/s"
                    )
                    if p.qos:
                        line += f"  acked {format_rate(acked - prev_ack):>10} msg/s"
                    if lat:
                        line += f"  latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms"
                    print(line, file=live, flush=True)
                prev_pub, prev_sub, prev_ack = published, received, acked
                second += 1
                next_line += NS
                while next_line <= now:
                    second += 1
                    next_line += NS
            if stop_sent_ns:
                if now - stop_sent_ns > FINISH_TIMEOUT * NS:
                    errors.append("workers did not finish in time")
                    break
                continue
            if errors:
                send_all(("stop",))
                stop_sent_ns = now
                continue
            if p.count and all(s.done for s in pubs):
                if received >= expected or not subs:
                    send_all(("stop",))
                    stop_sent_ns = now
                elif now - max(last_progress_ns, _last_done(pubs, t0)) > STALL_NS:
                    if p.qos:
                        errors.append(
                            f"subscribers stalled at {received} of {expected} messages; giving up"
                        )
                    send_all(("stop",))
                    stop_sent_ns = now
            elif p.time and now >= t0 + int(p.time * NS) + 2 * NS:
                send_all(("stop",))  # workers stop themselves at the deadline: a safety net
                stop_sent_ns = now
    finally:
        for s in slots:
            s.process.join(1 if s.done else 0.1)
            if s.process.is_alive():
                s.process.terminate()
                s.process.join(2)
            s.conn.close()
    _merge(hist, second_hist)
    summary = _summary(p, slots, hist, t0, expected, errors)
    status = 0
    if errors:
        status = 1
        if live is not None:
            for e in errors:
                print(f"warren perf mqtt: error: {e}", file=sys.stderr)
    elif p.qos and p.count and subs and summary["received"] < expected:
        status = 1
    if interrupted:
        status = 130 if status == 0 else status
    return summary, status


def _last_done(pubs: list[_Slot], t0: int) -> int:
    return max((s.result["last_ns"] for s in pubs if s.result), default=t0)


def _merge(target: dict[int, int], source: dict[int, int]) -> None:
    for k, v in source.items():
        target[k] = target.get(k, 0) + v


def _public(p: MQTTParams) -> dict[str, Any]:
    params = asdict(p)
    if params["password"] is not None:
        params["password"] = "***"
    return params


def _summary(
    p: MQTTParams,
    slots: list[_Slot],
    hist: dict[int, int],
    t0: int,
    expected: int,
    errors: list[str],
) -> dict[str, Any]:
    pubs = [s for s in slots if s.role == "pub"]
    subs = [s for s in slots if s.role == "sub"]
    published = sum(s.count for s in pubs)
    received = sum(s.count for s in subs)
    results = [s.result for s in slots if s.result]

    def last(role_slots: list[_Slot]) -> int:
        return max((s.result["last_ns"] for s in role_slots if s.result), default=t0)

    pub_s = (last(pubs) - t0) / NS
    sub_s = (last(subs) - t0) / NS

    def cpu(role_slots: list[_Slot]) -> list[float]:
        return [
            round(s.result["cpu_s"] / s.result["wall_s"], 3)
            for s in role_slots
            if s.result and s.result["wall_s"] > 0
        ]

    summary: dict[str, Any] = {
        "published": published,
        "received": received,
        "publish_rate": round(published / pub_s, 1) if pub_s > 0 else 0.0,
        "receive_rate": round(received / sub_s, 1) if sub_s > 0 else 0.0,
        "latency_ms": percentiles_ms(hist),
        "duration_s": round(max((r["wall_s"] for r in results), default=0.0), 3),
    }
    if p.qos:
        summary["acked"] = sum(s.acked for s in pubs)
        summary["rejected"] = sum(s.result["rejected"] for s in pubs if s.result)
        windows = [s.result["window"] for s in pubs if s.result]
        summary["inflight"] = min(windows) if windows else None
        rms = [s.result["receive_maximum"] for s in pubs if s.result]
        summary["receive_maximum"] = rms[0] if rms else None
    if p.count:
        summary["expected"] = expected * (1 if subs else 0)
    summary["client_cpu"] = {"publishers": cpu(pubs), "subscribers": cpu(subs)}
    summary["params"] = _public(p)
    if errors:
        summary["errors"] = errors
    return summary


def print_summary(s: dict[str, Any], out: TextIO) -> None:
    def w(line: str) -> None:
        print(line, file=out)

    if "published" not in s:
        for e in s.get("errors", []):
            w(f"warren perf mqtt: {e}")
        return
    w("")
    w(f"Summary ({s['duration_s']:.1f} s)")
    w(
        f"  published  {format_count(s['published']):>14}   {format_rate(s['publish_rate']):>12} msg/s"
    )
    if "acked" in s:
        w(
            f"  acked      {format_count(s['acked']):>14}   rejected {format_count(s['rejected'])}"
            f", in flight at most {s['inflight']}"
            + (
                f" (broker's Receive Maximum {s['receive_maximum']})"
                if s["receive_maximum"] is not None
                else ""
            )
        )
    w(
        f"  received   {format_count(s['received']):>14}   {format_rate(s['receive_rate']):>12} msg/s"
    )
    if "expected" in s:
        w(f"  expected   {format_count(s['expected']):>14}")
    lat = s["latency_ms"]
    if lat:
        w(
            f"  latency    p50 {lat['p50']:.3f} ms  p95 {lat['p95']:.3f} ms  p99 {lat['p99']:.3f} ms"
            f"  max {lat['max']:.3f} ms  ({format_count(lat['samples'])} samples)"
        )
    else:
        w("  latency    n/a (run with --latency)")
    cpu = s["client_cpu"]
    w(
        "  client CPU publishers "
        + (" ".join(f"{c:.0%}" for c in cpu["publishers"]) or "-")
        + ", subscribers "
        + (" ".join(f"{c:.0%}" for c in cpu["subscribers"]) or "-")
    )
    out.flush()
