"""A small raw AMQP 0-9-1 client for protocol-error tests (not a test module).

It lets a test say exactly which bytes go on the wire, including broken ones,
and decodes what comes back with pamqp, an independent codec, so the tests do
not only check Warren against itself. RawAMQP carries the bytes over a socket
(reading relies on socket timeouts only); tests/harness/amqp.py's MemoryAMQP
feeds them to a broker's AMQPConnection in memory.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Any, TypeVar

from pamqp import base, body, commands, frame, header, heartbeat
from pamqp.exceptions import UnmarshalingException

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

CLIENT_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
}

Frame = Any  # one of pamqp's frame objects
M = TypeVar("M", bound=base.Frame)
A = TypeVar("A", bound="AMQPFrames")


class Timeout(AssertionError):
    """Nothing (or not the awaited thing) arrived in time."""


class Closed(AssertionError):
    """The server closed the socket while a frame was awaited."""


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    """One frame with arbitrary type, channel, payload and end octet."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_frame(channel: int, method: base.Frame) -> bytes:
    return frame.marshal(method, channel)


def method_payload(method: base.Frame) -> bytes:
    """The payload of a method frame (class id, method id, arguments)."""
    return method_frame(0, method)[7:-1]


def header_frame(
    channel: int, body_size: int, properties: commands.Basic.Properties | None = None
) -> bytes:
    props = properties or commands.Basic.Properties()
    return frame.marshal(header.ContentHeader(0, body_size, props), channel)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame.marshal(body.ContentBody(data), channel)


def publish_frames(
    channel: int,
    data: bytes,
    routing_key: str,
    exchange: str = "",
    properties: commands.Basic.Properties | None = None,
    announced_size: int | None = None,
) -> bytes:
    """basic.publish + header + one body frame (announced_size lets the header lie)."""
    size = len(data) if announced_size is None else announced_size
    out = method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
    out += header_frame(channel, size, properties)
    if data:
        out += body_frame(channel, data)
    return out


def _close_fields(
    close: commands.Connection.Close | commands.Channel.Close,
) -> tuple[int, str, int, int]:
    return (
        int(close.reply_code or 0),
        close.reply_text,
        int(close.class_id or 0),
        int(close.method_id or 0),
    )


class AMQPFrames:
    """One raw connection's frames, whatever carries the bytes: what is received
    is decoded with pamqp. A transport provides send(), _recv() and
    close_socket() (RawAMQP: a socket; tests/harness/amqp.py: a broker in memory)."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.buf = b""
        self.eof = False
        self.heartbeats = 0  # heartbeat frames received (skipped by expect_method)
        self.bytewise = False  # send every byte in its own write
        self.tune: commands.Connection.Tune | None = None
        self.start: commands.Connection.Start | None = None

    # -- the transport ---------------------------------------------------------------
    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def close_socket(self) -> None:
        raise NotImplementedError

    def _recv(self, deadline: float) -> bool:
        """Read more bytes into the buffer; False on EOF. Raises Timeout at the deadline."""
        raise NotImplementedError

    # -- sending ---------------------------------------------------------------------
    def send_method(self, channel: int, method: base.Frame) -> None:
        self.send(method_frame(channel, method))

    def send_heartbeat(self) -> None:
        self.send(HEARTBEAT_FRAME)

    # -- receiving -------------------------------------------------------------------

    def _take_frame(self) -> tuple[int, Frame] | None:
        """A complete frame from the buffer, or None if more bytes are needed."""
        buf = self.buf
        if buf[:4] == b"AMQP":
            if len(buf) < 8:
                return None
            self.buf = buf[8:]
            return 0, header.ProtocolHeader(buf[5], buf[6], buf[7])
        if len(buf) < 7:
            return None
        (size,) = struct.unpack_from(">I", buf, 3)
        if len(buf) < 8 + size:
            return None
        try:
            consumed, channel, value = frame.unmarshal(buf[: 8 + size])
        except UnmarshalingException as exc:
            raise AssertionError(
                f"server sent an undecodable frame {buf[: 8 + size]!r}: {exc}"
            ) from None
        self.buf = buf[consumed:]
        if isinstance(value, heartbeat.Heartbeat):
            self.heartbeats += 1
        return channel, value

    def read_frame(self, timeout: float | None = None) -> tuple[int, Frame]:
        """The next (channel, frame); raises Timeout, or Closed at EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            got = self._take_frame()
            if got is not None:
                return got
            if self.eof or not self._recv(deadline):
                raise Closed(f"server closed the socket (unparsed bytes: {self.buf!r})")

    def expect_method(
        self, cls: type[M], timeout: float | None = None, channel: int | None = None
    ) -> M:
        """The next method frame (heartbeats skipped) must be a ``cls``; returns it."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            ch, value = self.read_frame(max(deadline - time.monotonic(), 0.001))
            if isinstance(value, heartbeat.Heartbeat):
                continue
            if not isinstance(value, cls):
                raise AssertionError(f"expected {cls.__name__}, got {value!r} on channel {ch}")
            if channel is not None and ch != channel:
                raise AssertionError(
                    f"expected {cls.__name__} on channel {channel}, got channel {ch}"
                )
            return value

    def expect_content(self, timeout: float | None = None) -> tuple[header.ContentHeader, bytes]:
        """A content header and its body frames."""
        _, hdr = self.read_frame(timeout)
        assert isinstance(hdr, header.ContentHeader), hdr
        data = b""
        while len(data) < hdr.body_size:
            _, part = self.read_frame(timeout)
            assert isinstance(part, body.ContentBody), part
            data += part.value
        return hdr, data

    def expect_close(self, timeout: float | None = None) -> tuple[int, str, int, int]:
        """connection.close from the server, answered with close-ok."""
        close = self.expect_method(commands.Connection.Close, timeout, channel=0)
        with contextlib.suppress(OSError):
            self.send_method(0, commands.Connection.CloseOk())
        return _close_fields(close)

    def expect_channel_close(
        self, channel: int, timeout: float | None = None
    ) -> tuple[int, str, int, int]:
        """channel.close from the server on ``channel`` (not answered: the test decides)."""
        close = self.expect_method(commands.Channel.Close, timeout, channel=channel)
        return _close_fields(close)

    def wait_eof(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the socket; frames before EOF are discarded."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            try:
                self._recv(deadline)
            except Timeout:
                return False
            while self._take_frame() is not None:
                pass
        return True

    def raw_until_eof(self, timeout: float = 5.0) -> bytes:
        """Every byte up to EOF, undecoded (AssertionError if the socket stays open)."""
        deadline = time.monotonic() + timeout
        while self._recv(deadline):
            pass
        data, self.buf = self.buf, b""
        return data

    def frames_until_eof(self, timeout: float = 5.0) -> list[tuple[int, Frame]]:
        """Every frame up to EOF (AssertionError if the socket stays open)."""
        out: list[tuple[int, Frame]] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                out.append(self.read_frame(max(deadline - time.monotonic(), 0.001)))
            except Closed:
                return out

    # -- handshake and channels ------------------------------------------------------
    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
        capabilities: dict[str, Any] | None = None,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int | None = None,
        open_connection: bool = True,
    ) -> None:
        """Header, start-ok, tune-ok with the given limits (server's when None), open."""
        self.start_ok(user, password, mechanism, capabilities)
        tune = self.tune = self.expect_method(commands.Connection.Tune)
        self.tune_ok(
            tune.channel_max if channel_max is None else channel_max,
            tune.frame_max if frame_max is None else frame_max,
            tune.heartbeat if heartbeat is None else heartbeat,
        )
        if open_connection:
            self.open(vhost)
            self.expect_method(commands.Connection.OpenOk)

    def start_ok(
        self,
        user: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        """Send the protocol header, read connection.start, answer with start-ok."""
        self.send(PROTOCOL_HEADER)
        self.start = self.expect_method(commands.Connection.Start)
        caps: Any = CLIENT_CAPABILITIES if capabilities is None else capabilities
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "warren-rawamqp", "capabilities": caps},
                mechanism=mechanism,
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
        )

    def tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None:
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat
            ),
        )

    def open(self, vhost: str = "/") -> None:
        self.send_method(0, commands.Connection.Open(virtual_host=vhost))

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(channel, commands.Channel.Open())
        self.expect_method(commands.Channel.OpenOk, channel=channel)

    # -- requests --------------------------------------------------------------------
    def basic_get(
        self, queue: str, channel: int = 1, no_ack: bool = True
    ) -> tuple[commands.Basic.GetOk | None, commands.Basic.Properties | None, bytes | None]:
        """basic.get, as pika's basic_get answers: (get-ok, properties, body), or
        three Nones for get-empty."""
        self.send_method(channel, commands.Basic.Get(queue=queue, no_ack=no_ack))
        while True:
            _, method = self.read_frame()
            if isinstance(method, heartbeat.Heartbeat):
                continue
            if isinstance(method, commands.Basic.GetEmpty):
                return None, None, None
            assert isinstance(method, commands.Basic.GetOk), method
            hdr, data = self.expect_content()
            return method, hdr.properties, data

    def ready_count(self, queue: str, channel: int = 1) -> int:
        """The queue's ready messages, as a passive queue.declare reports them."""
        self.send_method(channel, commands.Queue.Declare(queue=queue, passive=True))
        ok = self.expect_method(commands.Queue.DeclareOk, channel=channel)
        return int(ok.message_count or 0)

    def close(self) -> None:
        """A clean client-initiated connection.close."""
        self.send_method(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        self.expect_method(commands.Connection.CloseOk, channel=0)

    def __enter__(self: A) -> A:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_socket()


class RawAMQP(AMQPFrames):
    """One raw connection over a real socket."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes) -> None:
        if self.bytewise:
            for i in range(len(data)):
                self.sock.sendall(data[i : i + 1])
        else:
            self.sock.sendall(data)

    def close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _recv(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout("timed out waiting for data from the server")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise Timeout("timed out waiting for data from the server") from None
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True
