"""The worker processes of ``warren perf mqtt``: MQTT publishers and subscribers.

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

import socket
import struct
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from warren.mqtt import properties as P
from warren.mqtt.codec import encode
from warren.mqtt.packets import Publish
from warren.perf.mqtt_client import (
    MAX_INFLIGHT,
    MQTTError,
    connect,
    disconnect,
    drop_session,
    packet_span,
    reason,
    rl_value,
    subscribe,
)
from warren.perf.workers import (
    Publisher,
    Receiver,
    Worker,
    WorkerResult,
    record_latency,
    worker_entry,
)

if TYPE_CHECKING:
    from warren.perf.mqtt import MQTTParams

__all__ = ["packet_ids", "publish_pieces", "worker_main"]

#: Whole packets are pre-built per packet id only while they take at most this much.
PREBUILT_BYTES = 32 * 1024 * 1024

_TS = struct.Struct(">Q")
_U16 = struct.Struct(">H")


@dataclass
class MQTTResult(WorkerResult):
    """What a worker sends with "done"; ``acked`` counts PUBACK/PUBCOMP."""

    rejected: int = 0
    window: int = 0
    receive_maximum: int | None = None


def worker_main(role: str, index: int, params: MQTTParams, conn: Connection) -> None:
    """Entry point of a worker process ('pub' or 'sub')."""

    def make() -> Worker:
        if role == "pub":
            return _Publisher(index, params, conn)
        return _Subscriber(index, params, conn)

    worker_entry(role, index, conn, make, (MQTTError, OSError, EOFError), MQTTResult())


class _MQTTWorker(Worker):
    def __init__(self, index: int, params: MQTTParams, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.client_id = f"{params.client_id}-{self.role}-{index}"

    def finish(self, sock: socket.socket, result: MQTTResult) -> None:
        """Report the final counts at once, then disconnect (and drop a persistent session)."""
        self.stamp(result)
        disconnect(sock, self.params.protocol)
        if not self.params.clean_session:
            drop_session(self.params, self.client_id)
        self.send_done(result)


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
            else:  # a remaining length of more than one byte
                vh, end = packet_span(buf, pos)
                if not end:
                    break
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
                raise MQTTError(f"DISCONNECT from the broker{reason(buf, vh, end)}")
            pos = end
        return pos


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


class _Publisher(_MQTTWorker, Publisher):
    role = "pub"

    def __init__(self, index: int, params: MQTTParams, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.tracker = _AckTracker(params.protocol == 5)

    def acked(self) -> int:
        return self.tracker.acked

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
        with self.reporting():
            result = self._loop(sock, heads, tail, window, inbuf)
        result.window = window
        result.receive_maximum = receive_max
        self.finish(sock, result)

    def _loop(
        self, sock: socket.socket, heads: list[bytes], tail: bytes, window: int, inbuf: bytes
    ) -> MQTTResult:
        p = self.params
        latency = p.latency
        msg_len = len(heads[0]) + len(tail) + (8 if latency else 0)
        tracker = self.tracker
        sendall = sock.sendall
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

        whole0 = wholes[0]

        def send(n: int, now: int, sent: int) -> None:
            if window:
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

        def feed(buf: bytes) -> int:
            replies: list[bytes] = []
            used = tracker.feed(buf, replies)
            if replies:  # PUBREL for PUBREC
                sendall(b"".join(replies))
            return used

        read_incoming = self.reader(sock, inbuf, feed)
        sent, last_ns = self.publish(msg_len, p.count, window, send, read_incoming)
        return MQTTResult(
            count=sent, acked=tracker.acked, rejected=tracker.rejected, last_ns=last_ns
        )


class _Subscriber(_MQTTWorker, Receiver):
    role = "sub"

    def run(self) -> None:
        p = self.params
        sock, _, buf = connect(p, self.client_id)
        buf = subscribe(sock, p, buf)
        self.wait_go()
        result = self._loop(sock, buf)
        self.finish(sock, result)

    def _loop(self, sock: socket.socket, buf: bytes) -> MQTTResult:
        """Count PUBLISH packets until the deadline or the parent's stop, acking QoS 1/2.

        Publishers stamp a whole batch with one timestamp, so latencies are
        recorded per run of equal stamps rather than per message.
        """
        p = self.params
        latency = p.latency
        v5 = p.protocol == 5
        sendall = sock.sendall
        unpack_ts = _TS.unpack_from
        hist: dict[int, int] = {}
        record = partial(record_latency, hist)

        count = 0
        run_ts = -1
        run_n = 0
        # What arrived with CONNACK and SUBACK (a persistent session's queued messages,
        # perhaps a whole window of them) comes first: no more may come until it is acked.
        first, buf = buf, b""
        for data, now in self.reads(sock, hist, first):
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
                    vh, end = packet_span(buf, pos)
                    if not end:
                        break
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
                                    plen = rl_value(buf, at - 1)
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
                    raise MQTTError(f"DISCONNECT from the broker{reason(buf, vh, end)}")
                pos = end
            buf = buf[pos:] if pos < n else b""
            if run_n:
                record(now, run_ts, run_n)
                run_n = 0
                run_ts = -1
            if acks:
                sendall(b"".join(acks))
            self.count = count
        return MQTTResult(count=count, last_ns=self.last_ns, hist=hist)
