"""An MQTTConnection driven in memory, with a real paho Client as the other end.

paho-mqtt is the independent codec: the test uses paho's own API (connect,
subscribe, publish, its callbacks), and paho's packets go to the broker's
MQTTConnection through an in-memory socket (paho's ``_create_socket`` is the
one seam it offers for that), as its decoder reads what the connection writes.
The harness plays the transport's part: output taken after each step, the
close the connection asks for, the keep-alive ticks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import paho.mqtt.client as paho
from mqttraw import Closed, MQTTPackets
from paho.mqtt.enums import CallbackAPIVersion

from harness.mqtt_decode import PacketReader
from warren.mqtt.connection import MQTTConnection
from warren.mqtt.packets import (
    MQTT_5,
    Packet,
)
from warren.mqtt.server import MQTTListener, MQTTProtocol

if TYPE_CHECKING:
    from harness.broker import Harness

T = TypeVar("T")


class _MemorySocket:
    """What paho writes goes into the connection; what the connection writes is
    what paho reads (BlockingIOError when there is nothing yet, as on a
    non-blocking socket; b"" once the broker closed)."""

    def __init__(self, client: MemoryTransport) -> None:
        self.client = client

    def send(self, buffer: bytes | bytearray) -> int:
        self.client.feed(bytes(buffer))
        return len(buffer)

    def recv(self, buffer_size: int) -> bytes:
        client = self.client
        if not client.inbox:
            if client.eof:
                return b""
            raise BlockingIOError
        data = bytes(client.inbox[:buffer_size])
        del client.inbox[:buffer_size]
        return data

    def close(self) -> None:
        self.client.lose()

    def fileno(self) -> int:
        return -1

    def setblocking(self, flag: bool) -> None:
        pass


class _Paho(paho.Client):
    """paho's Client over the in-memory socket."""

    memory: MemoryTransport

    def _create_socket(self) -> Any:
        return _MemorySocket(self.memory)


class _Transport(asyncio.Transport):
    """The broker side of the in-memory socket: what the protocol writes lands in
    the client's inbox; reading paused keeps the client's bytes back, as a
    socket's buffer would, until it resumes."""

    def __init__(self, client: MemoryTransport, peer: tuple[str, int]) -> None:
        super().__init__()
        self.client = client
        self.peer = peer
        self.closing = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 1883)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.client.inbox += data
        self.client.output.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.client.output.set()
            asyncio.get_running_loop().call_soon(self.client.closed_by_broker)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            asyncio.get_running_loop().call_soon(self.client.deliver)

    def is_reading(self) -> bool:
        return self.reading


class MemoryTransport:
    """One in-memory socket to the broker: Warren's MQTTProtocol (the transport
    glue with the CONNECT timeout, keep-alive and unfinished-packet timers) on
    one side, the test's client on the other."""

    def __init__(self, harness: Harness, listener: MQTTListener, peer: tuple[str, int]) -> None:
        self.harness = harness
        self.inbox = bytearray()
        self.eof = False
        self.pending = bytearray()
        self.output = asyncio.Event()

        def make() -> tuple[MQTTProtocol, _Transport]:
            proto = MQTTProtocol(listener)
            transport = _Transport(self, peer)
            proto.connection_made(transport)
            return proto, transport

        self.protocol, self.transport = harness.call(make)
        conn = self.protocol.conn
        assert conn is not None
        self.conn: MQTTConnection = conn

    def feed(self, data: bytes) -> None:
        """The client's bytes to the broker (held while it does not read)."""
        if self.eof:
            raise BrokenPipeError("the broker closed the connection")
        self.pending += data

        async def feed() -> None:
            self.deliver()
            for _ in range(3):  # the turns the protocol's own callbacks take
                await asyncio.sleep(0)

        self.harness.run(feed())

    def deliver(self) -> None:
        transport = self.transport
        while self.pending and transport.reading and not transport.closing:
            data = bytes(self.pending)
            self.pending.clear()
            self.protocol.data_received(data)

    def closed_by_broker(self) -> None:
        if not self.eof:
            self.eof = True
            self.protocol.connection_lost(None)

    def lose(self) -> None:
        """The client's socket is gone (closed by the client, without DISCONNECT)."""
        if not self.eof:
            self.eof = True
            self.transport.closing = True
            self.harness.call(lambda: self.protocol.connection_lost(None))

    def wait_output(self, deadline: float) -> bool:
        """Run the broker's loop until it writes or closes; False at the deadline."""
        if self.inbox or self.eof:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.output.clear()
        try:
            self.harness.run(asyncio.wait_for(self.output.wait(), remaining))
        except TimeoutError:
            return False
        if self.transport.closing and not self.eof:
            self.harness.pump()
        return True


class MemoryMQTT(MemoryTransport):
    """One MQTT connection to a harness broker, paho on the client side."""

    def __init__(
        self,
        harness: Harness,
        listener: MQTTListener,
        peer: tuple[str, int],
        client_id: str,
        protocol: int = paho.MQTTv311,
        **options: Any,
    ) -> None:
        """``options``: more of paho's Client arguments (clean_session...)."""
        super().__init__(harness, listener, peer)
        self.paho = _Paho(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **options
        )
        self.paho.memory = self

    # -- driving paho and the broker together ------------------------------------------------
    def until(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        """Let paho write and read, and the broker's loop run, until ``done()``
        (AssertionError at the deadline: a safety net, not a wait for time)."""
        deadline = time.monotonic() + timeout
        client = self.paho
        while True:
            client.loop_write()
            client.loop_read(100)
            if done():
                return
            if self.eof and not client.is_connected():
                raise AssertionError("the broker closed the connection")
            if time.monotonic() > deadline:
                raise AssertionError("the broker did not answer in time")
            if self.inbox or (self.eof and client.is_connected()):
                continue  # paho has bytes to read (or the close) first
            if not self.wait_output(deadline):
                raise AssertionError("the broker did not answer in time")

    def connect(self, **kwargs: Any) -> Any:
        """paho's connect(), then its CONNACK: its reason code (None: closed)."""
        got: list[Any] = []
        self.paho.on_connect = lambda _c, _u, _flags, rc, _props: got.append(rc)
        self.paho.connect("127.0.0.1", 1883, **kwargs)
        self.until(lambda: bool(got) or self.eof)
        return got[0] if got else None


class RawMQTT(MemoryTransport, MQTTPackets):
    """tests/mqttraw.py's RawClient in memory: the test writes every byte
    (packets encoded by Warren's encoder, or raw bytes) and acknowledges what it
    chooses; the broker's bytes are read by harness.mqtt_decode, a decoder
    written apart from Warren's codec."""

    def __init__(
        self,
        harness: Harness,
        listener: MQTTListener,
        peer: tuple[str, int],
        level: int = MQTT_5,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(harness, listener, peer)
        self.level = level
        self.timeout = timeout
        self.reader = PacketReader(level)
        self.backlog: list[Packet] = []

    def send_raw(self, data: bytes) -> None:
        self.feed(data)

    def close(self) -> None:
        self.lose()

    # -- receiving -------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> Packet:
        """The next packet; Closed at EOF, TimeoutError if none comes in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.backlog:
            if self.inbox:
                self.backlog.extend(self.reader.feed(bytes(self.inbox)))
                self.inbox.clear()
                continue
            if self.eof:
                raise Closed()
            if not self.wait_output(deadline):
                raise TimeoutError("no packet from the broker")
        return self.backlog.pop(0)

    def nothing_more(self) -> None:
        """Nothing has arrived once the broker's loop has done all it can now
        (Harness.settle: its callbacks and file syncs, no window of wall time;
        what the broker's clock would bring later is the test's to advance)."""
        self.harness.settle()
        if self.backlog or self.inbox:
            raise AssertionError(f"unexpected {self.recv()!r}")
