"""An AMQPConnection driven in memory, with RawAMQP's interface.

The bytes a test sends go straight into AMQPConnection.feed (on the harness's
loop); what it writes (take_output, as the transport would after its
on_output) is decoded with pamqp, as RawAMQP decodes a socket's. The
transport's part is played here: reading paused and resumed (a held reply),
the output taken at the end of each step, the close the connection asks for.

ProtocolAMQP instead runs the listener's own AMQPProtocol (amqp/server.py) over
a MemoryTransport, for what that layer does: the handshake timeout, heartbeat
ticks and close-ok timeout on the broker's clock, output once per loop turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from rawamqp import AMQPFrames, Frame, Timeout, publish_frames

from warren.amqp.connection import AMQPConnection
from warren.amqp.server import AMQPProtocol

if TYPE_CHECKING:
    from harness.broker import Harness


class _InMemory(AMQPFrames):
    """What both in-memory clients share: reading runs the harness's loop until
    the connection has output (signalled on ``_output``) or closed. Each says
    how its output reaches ``buf`` (``_take``)."""

    harness: Harness
    _output: asyncio.Event

    def _take(self) -> None:
        raise NotImplementedError

    def _recv(self, deadline: float) -> bool:
        """Run the broker's loop until the connection has output (or closed);
        False at the close. Raises Timeout at the deadline."""
        before = len(self.buf)
        self._take()
        while len(self.buf) == before and not self.eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout("timed out waiting for data from the server")
            self._output.clear()
            try:
                self.harness.run(asyncio.wait_for(self._output.wait(), remaining))
            except TimeoutError:
                raise Timeout("timed out waiting for data from the server") from None
            self._take()
        return len(self.buf) > before or not self.eof

    def frames_now(self) -> list[tuple[int, Frame]]:
        """The frames the connection has written so far, taken without running
        the loop (what a held reply has not let out is not among them)."""
        self._take()
        out = []
        while (got := self._take_frame()) is not None:
            out.append(got)
        return out


class MemoryAMQP(_InMemory):
    """One AMQP connection to a harness broker, no socket in between."""

    def __init__(self, harness: Harness, peer: tuple[str, int], timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.harness = harness
        self._output = asyncio.Event()
        self._close_asked = False
        self.reading = True
        self.conn = harness.call(
            lambda: AMQPConnection(harness.broker, peer, self._on_output, self._on_close)
        )
        self.conn.reading_control = self._reading_control
        self.conn.resume_input = self._resume_input
        self.conn.local = ("127.0.0.1", 5672)
        # Input the connection was not reading (paused): fed once it reads again.
        self._unread = b""

    # -- what the transport does -------------------------------------------------------
    def _on_output(self) -> None:
        self._output.set()

    def _on_close(self) -> None:
        self._close_asked = True
        self._output.set()

    def _reading_control(self, reading: bool) -> None:
        self.reading = reading

    def _resume_input(self) -> None:
        self.conn.feed(b"")

    def _take(self) -> None:
        """The transport's write: the connection's output into the buffer; a close
        it asked for ends the connection once its output is out."""
        conn = self.conn
        out = conn.take_output()
        if out:
            data = b"".join(out)
            conn.octets.send_oct += len(data)
            self.buf += data
        if self._close_asked and not self.eof:
            self.eof = True
            conn.connection_lost()

    # -- AMQPFrames' transport -------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.eof:
            raise BrokenPipeError("the broker closed the connection")
        pieces = [data[i : i + 1] for i in range(len(data))] if self.bytewise else [data]

        async def feed() -> None:
            conn = self.conn
            conn.now_ms = self.harness.broker.clock.now_ms()  # as the transport does
            for piece in pieces:
                conn.octets.recv_oct += len(piece)
                conn.feed(piece)
                while conn.backlog:  # the transport's later loop turns
                    await asyncio.sleep(0)
                    conn.feed(b"")
            await asyncio.sleep(0)  # what the feed scheduled for this turn

        self.harness.run(feed())
        self._take()

    def close_socket(self) -> None:
        if not self.eof:
            self.eof = True
            self.harness.call(self.conn.connection_lost)


class MemoryTransport(asyncio.Transport):
    """What asyncio's socket transport is to a listener's protocol, in memory:
    written bytes kept for the test, reading paused and resumed, a close or an
    abort that ends in the protocol's connection_lost on a later loop turn."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: asyncio.Protocol,
        peer: tuple[str, int],
        on_write: Callable[[], None],
    ) -> None:
        super().__init__()
        self.loop = loop
        self.protocol = protocol
        self.peer = peer
        self.on_write = on_write
        self.written = bytearray()
        #: Bytes the test sent that the protocol has not been given (reading paused).
        self.incoming = bytearray()
        self.reading = True
        self.closing = False
        self.lost = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 5672)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.on_write()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.lose)

    def abort(self) -> None:
        self.close()

    def lose(self) -> None:
        """The socket is gone: the protocol's connection_lost, once."""
        self.closing = True
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)
            self.on_write()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        self.loop.call_soon(self.deliver)

    def is_reading(self) -> bool:
        return self.reading

    def deliver(self) -> None:
        """Give the protocol what the test sent, as one read, if it is reading."""
        if self.reading and self.incoming and not self.closing:
            data = bytes(self.incoming)
            self.incoming.clear()
            self.protocol.data_received(data)


class ProtocolAMQP(_InMemory):
    """One AMQP connection through the listener's AMQPProtocol (amqp/server.py)
    over a MemoryTransport: what that layer adds to AMQPConnection runs too,
    on the broker's clock (the handshake timeout, heartbeat ticks, the
    close-ok timeout, output flushed once per loop turn, reading yielded).
    ``Harness.amqp_listener.protocols`` lists it, as a listener lists its
    sockets' protocols."""

    def __init__(self, harness: Harness, peer: tuple[str, int], timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.harness = harness
        self._output = asyncio.Event()
        listener = harness.amqp_listener
        self.protocol = proto = harness.call(lambda: AMQPProtocol(listener))
        self.transport = MemoryTransport(harness.loop, proto, peer, self._output.set)
        harness.call(lambda: proto.connection_made(self.transport))
        assert proto.conn is not None, "refused at accept (max_connections)"
        self.conn = proto.conn

    def _take(self) -> None:
        transport = self.transport
        if transport.written:
            self.buf += bytes(transport.written)
            transport.written.clear()
        if transport.lost:
            self.eof = True

    def send(self, data: bytes) -> None:
        if self.eof:
            raise BrokenPipeError("the broker closed the connection")
        pieces = [data[i : i + 1] for i in range(len(data))] if self.bytewise else [data]
        transport = self.transport

        protocol = self.protocol

        async def feed() -> None:
            for piece in pieces:
                transport.incoming += piece
                transport.deliver()
                # Later loop turns, as the socket's reads: until the protocol took
                # it all (it yields reading after a large read or with a backlog).
                # Paused at the connection's request (a resource alarm, a held
                # reply), it reads nothing until that ends: what is left stays
                # unread in ``transport.incoming``, as in a socket's buffer, and
                # is read when reading resumes.
                while transport.incoming and not transport.closing and not protocol.paused:
                    await asyncio.sleep(0)
            await asyncio.sleep(0)  # the flush the read scheduled

        self.harness.run(feed())
        self._take()

    def close_socket(self) -> None:
        if not self.eof:
            self.eof = True
            self.harness.call(self.transport.lose)


def assert_still_serving(h: Harness) -> None:
    """Another client can still connect, declare, publish and get a message
    back: what a test of bad input checks after the bad client is dealt with."""
    with h.amqp() as other:
        other.handshake()
        other.open_channel(1)
        other.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        q = other.expect_method(commands.Queue.DeclareOk, channel=1).queue
        other.send(publish_frames(1, b"still serving", q))
        other.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
        other.expect_method(commands.Basic.GetOk, channel=1)
        assert other.expect_content()[1] == b"still serving"
        other.close()
