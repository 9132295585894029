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
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from warren.mqtt.connection import MQTTConnection

if TYPE_CHECKING:
    from harness.broker import Harness
    from warren.mqtt.state import MQTTState


class _MemorySocket:
    """What paho writes goes into the connection; what the connection writes is
    what paho reads (BlockingIOError when there is nothing yet, as on a
    non-blocking socket; b"" once the broker closed)."""

    def __init__(self, client: MemoryMQTT) -> None:
        self.client = client

    def send(self, buffer: bytes | bytearray) -> int:
        self.client.feed(bytes(buffer))
        return len(buffer)

    def recv(self, buffer_size: int) -> bytes:
        client = self.client
        client.take()
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

    memory: MemoryMQTT

    def _create_socket(self) -> Any:
        return _MemorySocket(self.memory)


class MemoryMQTT:
    """One MQTT connection to a harness broker, paho on the client side."""

    def __init__(
        self,
        harness: Harness,
        state: MQTTState,
        peer: tuple[str, int],
        client_id: str,
        protocol: int = paho.MQTTv311,
    ) -> None:
        self.harness = harness
        self.inbox = bytearray()
        self.eof = False
        self._output = asyncio.Event()
        self._close_asked = False
        self.conn = harness.call(
            lambda: MQTTConnection(
                state, peer, ("127.0.0.1", 1883), self._on_output, self._on_close
            )
        )
        self.conn.reading_control = lambda reading: None
        self.conn.request_drain = lambda: None
        self.paho = _Paho(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        self.paho.memory = self

    # -- the transport's part -------------------------------------------------------------
    def _on_output(self) -> None:
        self._output.set()

    def _on_close(self) -> None:
        self._close_asked = True
        self._output.set()

    def feed(self, data: bytes) -> None:
        """paho's bytes into the connection, on the broker's loop."""
        if self.eof:
            raise BrokenPipeError("the broker closed the connection")

        async def feed() -> None:
            conn = self.conn
            conn.now_ms = self.harness.broker.clock.now_ms()  # as the transport does
            conn.octets.recv_oct += len(data)
            conn.feed(data)
            while conn.backlog:  # the transport's later loop turns
                await asyncio.sleep(0)
                conn.feed(b"")
            await asyncio.sleep(0)

        self.harness.run(feed())
        self.take()

    def take(self) -> None:
        out = self.conn.take_output()
        if out:
            self.inbox += b"".join(out)
        if self._close_asked and not self.eof:
            self.eof = True
            self.harness.call(self.conn.connection_lost)

    def lose(self) -> None:
        """The client's socket is gone (paho closed it, or the test dropped it)."""
        if not self.eof:
            self.eof = True
            self.harness.call(self.conn.connection_lost)

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
            self.take()
            if self.inbox or self.eof:
                continue  # paho has bytes to read (or the close) first
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("the broker did not answer in time")
            self._output.clear()
            try:
                self.harness.run(asyncio.wait_for(self._output.wait(), remaining))
            except TimeoutError:
                raise AssertionError("the broker did not answer in time") from None

    def connect(self, **kwargs: Any) -> Any:
        """paho's connect(), then its CONNACK: its reason code (None: closed)."""
        got: list[Any] = []
        self.paho.on_connect = lambda _c, _u, _flags, rc, _props: got.append(rc)
        self.paho.connect("127.0.0.1", 1883, **kwargs)
        self.until(lambda: bool(got) or self.eof)
        return got[0] if got else None
