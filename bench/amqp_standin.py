"""A stand-in AMQP broker that limits nothing: the `warren perf` client's own ceiling.

bench/compare.py measures the perf client against it before the real brokers,
so the report can say how far the client alone goes. It completes the
handshake, then discards what a publisher sends or writes pre-built
deliveries to a consumer as fast as the socket takes them.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import PROTOCOL_HEADER, method_frame  # noqa: E402
from warren.perf.message import message_template  # noqa: E402

__all__ = ["StandIn"]


class StandIn:
    """Speaks just enough AMQP for `warren perf throughput`: handshake, declarations,
    consume. After that it discards everything a publisher sends (without parsing it;
    it only looks for connection.close) or, for a consumer, writes pre-built
    basic.deliver frames as fast as the socket takes them. Measures the client alone."""

    def __init__(self, body_size: int = 16) -> None:
        self.body_size = body_size
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, EOFError), conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = _FrameReader(conn)
            if reader.read_exact(8) != PROTOCOL_HEADER:
                return
            conn.sendall(
                method_frame(0, spec.ConnectionStart(server_properties={"product": "stand-in"}))
            )
            while True:
                ch, method = reader.method()
                reply: spec.Method | None = None
                if isinstance(method, spec.ConnectionStartOk):
                    reply = spec.ConnectionTune(channel_max=2047, frame_max=131072, heartbeat=0)
                    ch = 0
                elif isinstance(method, spec.ConnectionTuneOk):
                    continue
                elif isinstance(method, spec.ConnectionOpen):
                    reply = spec.ConnectionOpenOk()
                elif isinstance(method, spec.ChannelOpen):
                    reply = spec.ChannelOpenOk()
                    conn.sendall(method_frame(ch, reply))
                    # A publisher's channel: from here on only discard.
                    self._discard(conn, reader.take_rest())
                    return
                if reply is not None:
                    conn.sendall(method_frame(ch, reply))

    def _discard(self, conn: socket.socket, pending: bytes) -> None:
        """Throw bytes away; answer what a perf client may still ask (declares, consume, close).

        Every request a perf client makes after the handshake is a synchronous one
        (it waits for the reply before sending anything else), so it is always at the
        very end of what has arrived: only the last bytes of each read are searched.
        """
        data = pending
        tail = b""
        while True:
            if data:
                if len(data) >= _TAIL:
                    window, seen = data[-_TAIL:], 0
                else:  # contiguous with the previous read's tail
                    window, seen = tail + data, len(tail)
                if self._answer(conn, window, seen):
                    return
                tail = window[-_TAIL:]
            data = conn.recv(1 << 20)
            if not data:
                return

    def _answer(self, conn: socket.socket, window: bytes, seen: int) -> bool:
        """Reply to requests found in ``window``; True once the connection is closed.

        The first ``seen`` bytes were searched before (the previous read's tail,
        kept for markers split across reads): matches that lie wholly inside
        them were answered already.
        """
        for index, reply in _REPLIES.items():
            marker = struct.pack(">I", index)
            at = window.find(marker, max(0, seen - 3))
            while at >= 7:
                ftype, ch, _size = struct.unpack_from(">BHI", window, at - 7)
                if ftype == 1 and ch <= 1:
                    if index == spec.ConnectionClose.INDEX:
                        conn.sendall(method_frame(0, spec.ConnectionCloseOk()))
                        return True
                    if index == spec.BasicConsume.INDEX:
                        conn.sendall(method_frame(ch, spec.BasicConsumeOk(consumer_tag="ctag")))
                        self._flood(conn, ch)
                        return True
                    assert reply is not None
                    conn.sendall(method_frame(ch, reply))
                at = window.find(marker, at + 1)
        return False

    def _flood(self, conn: socket.socket, ch: int) -> None:
        """Deliveries as fast as the consumer reads them, stamped per batch, until it closes."""
        closed = threading.Event()

        def watch() -> None:
            with contextlib.suppress(OSError):
                while True:
                    data = conn.recv(1 << 16)
                    if not data or struct.pack(">I", spec.ConnectionClose.INDEX) in data:
                        break
            closed.set()

        threading.Thread(target=watch, daemon=True).start()
        deliver = method_frame(
            ch,
            spec.BasicDeliver(
                consumer_tag="ctag", delivery_tag=1, exchange="", routing_key="perf-test"
            ),
        )
        head, tail = message_template(ch, "", "perf-test", self.body_size, False, 131072)
        # message_template builds a basic.publish; swap its method frame for the deliver.
        publish_len = len(method_frame(ch, spec.BasicPublish(routing_key="perf-test")))
        head = deliver + head[publish_len:]
        batch = 1024
        parts = [head, *([tail + head] * (batch - 1)), tail]
        with contextlib.suppress(OSError):
            while not closed.is_set():
                conn.sendall(struct.pack(">Q", time.monotonic_ns()).join(parts))
        with contextlib.suppress(OSError):
            conn.sendall(method_frame(0, spec.ConnectionCloseOk()))


#: How many trailing bytes of each read the stand-in searches for requests.
_TAIL = 512

_REPLIES: dict[int, spec.Method | None] = {
    spec.ConnectionClose.INDEX: None,
    spec.BasicConsume.INDEX: None,
    spec.QueueDeclare.INDEX: spec.QueueDeclareOk(queue="perf-test"),
    spec.QueueDelete.INDEX: spec.QueueDeleteOk(),
    spec.QueueBind.INDEX: spec.QueueBindOk(),
    spec.ExchangeDeclare.INDEX: spec.ExchangeDeclareOk(),
    spec.ExchangeDelete.INDEX: spec.ExchangeDeleteOk(),
    spec.BasicQos.INDEX: spec.BasicQosOk(),
}


class _FrameReader:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.conn.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def method(self) -> tuple[int, spec.Method]:
        while True:
            ftype, ch, size = struct.unpack(">BHI", self.read_exact(7))
            payload = self.read_exact(size + 1)[:-1]
            if ftype == 1:
                return ch, spec.decode_method(payload)

    def take_rest(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest
