"""The asyncio half every protocol shares: batched writes, fair reads, flow control.

A protocol package (amqp/, mqtt/) keeps its state machine sans-IO and connects
it to a transport with a subclass of `BatchedProtocol`, which
- writes whatever the connection gathered during a loop turn in one
  ``transport.write`` (`request_flush` schedules it once per turn);
- stops reading a socket for the rest of the loop turn after a large read (or
  while the connection has unprocessed input, `drain_backlog`): uvloop
  otherwise reads a busy publisher's socket up to 32 times per turn, and the
  delivery passes and acks waiting behind it starve;
- pauses reading on the connection's request (the free-disk alarm),
  independently of that yielding;
- passes the transport's write flow control on to the connection.

It lives outside the protocol packages so that neither imports the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from warren.core.clock import Clock, TimerHandle
from warren.core.stats import OctetStats

__all__ = ["BatchedProtocol", "SansIOConnection", "YIELD_AFTER_BYTES"]

#: Reads at least this large end the connection's reading for the current loop turn.
YIELD_AFTER_BYTES = 16 * 1024


class SansIOConnection(Protocol):
    """What `BatchedProtocol` needs of a protocol's sans-IO connection."""

    octets: OctetStats

    def take_output(self) -> list[bytes]: ...

    def set_writable(self, writable: bool) -> None: ...


class BatchedProtocol(asyncio.Protocol):
    """One client's transport, for a sans-IO connection set by the subclass."""

    conn: SansIOConnection | None

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._flush_scheduled = False
        self._yielding = False
        self._blocked = False
        self._closing_reads = False

    # -- reading ------------------------------------------------------------------------
    def count_read(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None:
            octets = conn.octets
            octets.recv_oct += len(data)
            octets.recv_cnt += 1

    def yield_reading(self) -> None:
        """Read no more from this socket until the callbacks already scheduled ran."""
        if self._yielding:
            return
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self._yielding = True
            transport.pause_reading()
            self.loop.call_soon(self._end_yield)

    def drain_backlog(self) -> bool:
        """Process input kept from earlier reads; True while some is left."""
        return False

    def _end_yield(self) -> None:
        if self.drain_backlog():
            self.loop.call_soon(self._end_yield)
            return
        self._yielding = False
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self._blocked:
            transport.resume_reading()

    @property
    def paused(self) -> bool:
        """Reading is off at the connection's request (an alarm, a held reply)
        rather than for the rest of a loop turn (``yield_reading``)."""
        return self._blocked

    def set_reading(self, reading: bool) -> None:
        """The connection's own pause (free-disk alarm), independent of yielding."""
        if self._closing_reads:
            return
        self._blocked = not reading
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not reading:
            transport.pause_reading()
        elif not self._yielding:
            transport.resume_reading()

    def read_until_closed(self) -> None:
        """A close this side started waits for the peer's answer, so reading goes
        on whatever paused it (a resource alarm), as RabbitMQ's reader reads again
        once closing: a blocked client's close-ok was otherwise never read and the
        connection waited out its close timeout."""
        self._closing_reads = True
        self._blocked = False
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self._yielding:
            transport.resume_reading()

    # -- writing ------------------------------------------------------------------------
    def request_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        transport, conn = self.transport, self.conn
        if transport is None or conn is None or transport.is_closing():
            return
        out = conn.take_output()
        if out:
            data = b"".join(out) if len(out) > 1 else out[0]
            octets = conn.octets
            octets.send_oct += len(data)
            octets.send_cnt += 1
            transport.write(data)

    def request_close(self) -> None:
        self.loop.call_soon(self.close_now)

    def close_now(self) -> None:
        """Write what is pending, then close the transport."""
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(True)


class ConnectionTimer:
    """A connection's one pending check on the broker's clock (a handshake's
    deadline, then keep alive or idle timeout): set again, it replaces the
    one before. The MQTT and AMQP 1.0 protocols hold one each."""

    __slots__ = ("_clock", "_handle", "due")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._handle: TimerHandle | None = None
        #: When the pending check runs (ms of the clock); meaningless when none is.
        self.due = 0

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def set(self, due_ms: int, callback: Callable[[], None]) -> None:
        """``callback`` at ``due_ms`` instead of what was pending; it is to call
        :meth:`fired` first."""
        if self._handle is not None:
            self._handle.cancel()
        self.due = due_ms
        self._handle = self._clock.call_at(due_ms, callback)

    def fired(self) -> None:
        """The pending check is running: nothing is pending any more."""
        self._handle = None

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
