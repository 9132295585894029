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

For the listeners whose clients end the same way (MQTT's, AMQP 1.0's, the
stream protocol's) there is also `socket_addresses`, `end_connection` and
`OpenClients` (the clients a listener closes at shutdown), `ConnectionTimer` (a
client's one check on the broker's clock) and `HandshakeTimer` (that check as
AMQP 1.0's and the stream protocol's run it: a deadline for the handshake, then
the connection's own ``tick``).

It lives outside the protocol packages so that neither imports the other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from warren.core.clock import Clock, TimerHandle
from warren.core.stats import OctetStats

__all__ = [
    "YIELD_AFTER_BYTES",
    "BatchedProtocol",
    "ConnectionTimer",
    "HandshakeTimer",
    "OpenClients",
    "SansIOConnection",
    "end_connection",
    "socket_addresses",
]

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


class TickingConnection(Protocol):
    """What `HandshakeTimer` needs of a sans-IO connection."""

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def tick(self, now_ms: int) -> int:
        """Its periodic checks (heartbeats, idle timeout) at ``now_ms``: ms until
        the next, 0 for none."""
        ...


class HandshakeTimer(ConnectionTimer):
    """A client's check on the broker's clock as the AMQP 1.0 and stream protocols
    run it: until its connection is open (``state >= open_state``), the deadline
    of its handshake, which aborts it; from then on the connection's own
    ``tick``, rearmed for as long as it asks."""

    __slots__ = ("_abort", "_conn", "_log", "_open_state", "_what")

    def __init__(self, clock: Clock, open_state: int, what: str, logger: logging.Logger) -> None:
        """``what`` names the protocol in the timeout's warning (``stream``)."""
        super().__init__(clock)
        self._open_state = open_state
        self._what = what
        self._log = logger
        self._conn: TickingConnection | None = None
        self._abort: Callable[[], None] = _nothing

    def start(self, conn: TickingConnection, timeout_ms: int, abort: Callable[[], None]) -> None:
        """``conn`` was just made: it has ``timeout_ms`` to open, else ``abort``."""
        self._conn = conn
        self._abort = abort
        self.set(self._clock.now_ms() + timeout_ms, self.check)

    @property
    def opened(self) -> bool:
        """Whether the connection is past its handshake."""
        return self._conn is not None and self._conn.state >= self._open_state

    def handshake_done(self) -> None:
        """The connection just opened: its checks replace the deadline."""
        self.cancel()
        self.check()

    def check(self) -> None:
        self.fired()
        conn = self._conn
        if conn is None or conn.closed:
            return
        now = self._clock.now_ms()
        if conn.state < self._open_state:
            if now >= self.due:
                self._log.warning("%s: %s handshake timeout, closing", conn.name, self._what)
                self._abort()
            return
        due = conn.tick(now)
        if due:
            self.set(now + due, self.check)


def _nothing() -> None:
    pass


Address = tuple[str, int]


def socket_addresses(transport: asyncio.BaseTransport) -> tuple[Address | None, Address | None]:
    """The peer's and this side's (host, port) of a socket transport; None where
    the transport has none to give (a Unix socket's, an in-memory one's)."""
    peer = transport.get_extra_info("peername")
    local = transport.get_extra_info("sockname")
    return (
        (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None,
        (str(local[0]), int(local[1])) if isinstance(local, tuple) else None,
    )


class EndingConnection(Protocol):
    """What `end_connection` needs of a sans-IO connection."""

    @property
    def name(self) -> str: ...

    def connection_lost(self) -> None: ...


def end_connection(conn: EndingConnection | None, logger: logging.Logger, what: str) -> None:
    """A protocol's connection_lost: the sans-IO connection lets go of the core
    (sessions, consumers, a will). A failure there is logged as ``what``, never
    raised into the event loop, so that the protocol's own cleanup still runs."""
    if conn is None:
        return
    try:
        conn.connection_lost()
    except Exception:
        logger.exception("%s: %s", conn.name, what)


class Closing(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closing)


class OpenClients(Generic[C]):
    """A listener's client protocols, added at connection_made and discarded at
    connection_lost. At shutdown `close_all` tells each to close (its
    ``close()`` says the protocol's goodbye) and waits until their connections
    are lost, or ``timeout`` s."""

    def __init__(self) -> None:
        self._open: set[C] = set()
        #: Those close_all waits for: set at their connection_lost.
        self._closing: dict[C, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._open))

    def __contains__(self, client: object) -> bool:
        return client in self._open

    def add(self, client: C) -> None:
        self._open.add(client)

    def discard(self, client: C) -> None:
        self._open.discard(client)
        waiter = self._closing.pop(client, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def close_all(self, timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        clients = list(self._open)
        for client in clients:
            self._closing[client] = loop.create_future()
            client.close()
        waiting = [self._closing[c] for c in clients if c in self._closing]
        try:
            if waiting:
                await asyncio.wait(waiting, timeout=timeout)
        finally:
            for client in clients:
                self._closing.pop(client, None)
