"""An AMQPConnection driven in memory, with RawAMQP's interface.

The bytes a test sends go straight into AMQPConnection.feed (on the harness's
loop); what it writes (take_output, as the transport would after its
on_output) is decoded with pamqp, as RawAMQP decodes a socket's. The
transport's part is played here: reading paused and resumed (a held reply),
the output taken at the end of each step, the close the connection asks for.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from rawamqp import AMQPFrames, Timeout

from warren.amqp.connection import AMQPConnection

if TYPE_CHECKING:
    from harness.broker import Harness


class MemoryAMQP(AMQPFrames):
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
