"""Byte-stream protocols (AMQP's, MQTT's) over WebSocket on the HTTP listener.

A :class:`warren.node.WebSocketEndpoint` names a path, subprotocols and a
factory of ``asyncio.Protocol``. :func:`select_endpoint` picks the endpoint
for an upgrade request, :func:`serve` accepts it and drives a fresh protocol
through a :class:`WebSocketTransport`: binary messages received are
``data_received`` calls, ``write`` sends binary messages. The protocol cannot
tell it from a TCP socket, so it runs unchanged, and this module never
imports a protocol package.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

from aiohttp import WSCloseCode, WSMsgType, web

from warren.node import WebSocketEndpoint

__all__ = [
    "WebSocketTransport",
    "WebSocketConnections",
    "offered_subprotocols",
    "select_endpoint",
    "serve",
    "websocket_middleware",
]

log = logging.getLogger("warren.http.websocket")

#: Pause the protocol's writing above this many queued bytes (asyncio's default too).
HIGH_WATER = 64 * 1024
#: Largest message sent: writes are joined up to it and a larger write is cut, so a
#: client's message limit (1 MiB in Python's websockets) never meets a burst.
MAX_SEND = 256 * 1024
#: How long a closing handshake may take before the socket is cut.
CLOSE_TIMEOUT = 3.0
#: Largest message accepted from a client (aiohttp closes with 1009 above it).
#: Clients send protocol frames, which the protocols themselves bound well below this.
MAX_MESSAGE = 16 * 1024 * 1024
#: The extra-info names passed through to the HTTP connection's transport.
_EXTRA = frozenset({"peername", "sockname", "ssl_object", "socket"})


def offered_subprotocols(request: web.BaseRequest) -> list[str]:
    """The subprotocols of the client's ``Sec-WebSocket-Protocol`` headers, in its order."""
    return [
        name.strip()
        for header in request.headers.getall("Sec-WebSocket-Protocol", ())
        for name in header.split(",")
        if name.strip()
    ]


def select_endpoint(
    endpoints: Sequence[WebSocketEndpoint], path: str, offered: Sequence[str]
) -> tuple[WebSocketEndpoint, str | None] | None:
    """The endpoint an upgrade to ``path`` offering ``offered`` goes to, and the
    subprotocol to answer with (None: none). The endpoint whose path it is wins;
    on any other path, the first endpoint that lists one of the offered subprotocols.
    The answer is the client's first offered subprotocol the endpoint lists, so a
    client that offers several gets its own preference."""
    for endpoint in endpoints:
        if endpoint.path == path:
            return endpoint, _first_known(endpoint, offered)
    for endpoint in endpoints:
        chosen = _first_known(endpoint, offered)
        if chosen is not None:
            return endpoint, chosen
    return None


def _first_known(endpoint: WebSocketEndpoint, offered: Iterable[str]) -> str | None:
    return next((name for name in offered if name in endpoint.subprotocols), None)


def _is_upgrade(request: web.Request) -> bool:
    return (
        request.method == "GET"
        and request.headers.get("Upgrade", "").strip().lower() == "websocket"
    )


class WebSocketConnections:
    """The open WebSocket transports of one listener, so that stopping it closes them
    (aiohttp would otherwise wait its shutdown timeout for their handlers)."""

    def __init__(self) -> None:
        self.transports: set[WebSocketTransport] = set()

    async def close_all(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close each with 1001 Going Away after what is queued; cut those still
        open after ``timeout``."""
        transports = list(self.transports)
        for transport in transports:
            transport.close(WSCloseCode.GOING_AWAY)
        if transports:
            await asyncio.wait([t.done for t in transports], timeout=timeout)
        for transport in transports:
            if not transport.done.done():
                transport.abort()


def websocket_middleware(
    endpoints: Sequence[WebSocketEndpoint], connections: WebSocketConnections
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that takes the upgrade requests an endpoint claims before
    the management routes see them: no management authentication (the protocol
    authenticates its clients), and any other request goes on untouched."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if _is_upgrade(request):
            selected = select_endpoint(endpoints, request.path, offered_subprotocols(request))
            if selected is not None:
                return await serve(request, *selected, connections=connections)
        return await handler(request)

    return middleware


async def serve(
    request: web.Request,
    endpoint: WebSocketEndpoint,
    subprotocol: str | None,
    connections: WebSocketConnections | None = None,
) -> web.WebSocketResponse:
    """Accept the upgrade answering ``subprotocol`` and run a new protocol of
    ``endpoint`` over it until either side closes."""
    ws = web.WebSocketResponse(
        protocols=(subprotocol,) if subprotocol else (),
        timeout=CLOSE_TIMEOUT,
        max_msg_size=MAX_MESSAGE,
        # The payloads are protocol frames, often already compressed message bodies:
        # deflating them would cost the loop more than it saves.
        compress=False,
        # A text message is refused (1003) whatever it holds: never decode it.
        decode_text=False,
    )
    # Made before the upgrade is answered: if it cannot be (its listener is not
    # started), the client gets a 500, not a 101 and a dropped connection.
    protocol = endpoint.new_protocol()
    await ws.prepare(request)
    transport = WebSocketTransport(ws, request, protocol)
    if connections is not None:
        connections.transports.add(transport)
        transport.done.add_done_callback(lambda _: connections.transports.discard(transport))
    await transport.run()
    return ws


class WebSocketTransport(asyncio.Transport):
    """An ``asyncio.Transport`` over an aiohttp WebSocket, for a byte-stream protocol.

    Each ``write`` queues bytes; one writer task sends what is queued, joined
    into one binary message (up to MAX_SEND bytes), so a protocol's burst of
    writes in one loop turn costs one message. Queued bytes above the high-water
    mark pause the protocol's writing, as a socket's full buffer does. While
    reading is paused no message is taken from the socket: aiohttp's queue fills
    and stops reading the TCP socket, so the client is pushed back as over TCP
    (and, as over TCP, a client that vanishes meanwhile is noticed when reading
    resumes, a write fails or the protocol's own heartbeat gives up).
    """

    def __init__(
        self, ws: web.WebSocketResponse, request: web.BaseRequest, protocol: asyncio.Protocol
    ) -> None:
        super().__init__()
        self._ws = ws
        self._request = request
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._buffer: list[bytes] = []
        self._size = 0
        self._high = HIGH_WATER
        self._low = HIGH_WATER // 4
        self._writing_paused = False
        self._reading = True
        self._closing = False
        self._close_code: int = WSCloseCode.OK
        self._write_waiter: asyncio.Future[None] | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        #: Nothing more is sent (abort, a text message, the end): writes are dropped.
        self._aborted = False
        self._lost = False
        #: Resolved once the protocol has had its connection_lost.
        self.done: asyncio.Future[None] = self._loop.create_future()

    # -- driving the protocol ------------------------------------------------------------
    async def run(self) -> None:
        """connection_made, then the messages as data_received until the websocket
        ends, then connection_lost (once, whatever ended it)."""
        exc: BaseException | None = None
        try:
            self._writer = self._loop.create_task(self._write_loop())
            self._protocol.connection_made(self)
            exc = await self._read_loop()
        except asyncio.CancelledError:
            exc = ConnectionAbortedError("the HTTP listener stopped")
            raise
        except Exception as error:
            # The protocol failed (data_received raised): cut, as asyncio's transports do.
            log.exception("%s: websocket connection failed", self._peer())
            exc = error
            self.abort()
        finally:
            await self._finish_writer()
            self._connection_lost(exc)

    async def _read_loop(self) -> BaseException | None:
        """Until the websocket ends; returns the error that ended it, None when closed."""
        ws = self._ws
        while True:
            if not self._reading and not self._closing:
                self._read_waiter = self._loop.create_future()
                try:
                    await self._read_waiter
                finally:
                    self._read_waiter = None
                continue
            msg = await ws.receive()
            kind = msg.type
            if kind is WSMsgType.BINARY:
                if not self._closing:  # nothing is delivered after close(), as asyncio's
                    # The protocol of the moment: one may hand the transport to
                    # another (warren/header_handoff.py: AMQP 1.0 after its header).
                    self._protocol.data_received(msg.data)
            elif kind is WSMsgType.TEXT:
                log.info("%s: text message on a binary protocol's websocket, closing", self._peer())
                self._stop_writing()
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary messages only")
                return ConnectionError("text message on a binary protocol's websocket")
            elif kind is WSMsgType.ERROR:
                error = ws.exception() or msg.data
                return error if isinstance(error, BaseException) else ConnectionError(str(error))
            else:  # CLOSE, CLOSING, CLOSED: the client's close, ours, or the socket's end
                return ws.exception()

    async def _write_loop(self) -> None:
        """Send what is queued, in order, one message per batch; when closing and
        nothing is left, close the websocket."""
        ws = self._ws
        try:
            while not ws.closed:
                if not self._buffer:
                    if self._closing:
                        await ws.close(code=self._close_code)
                        return
                    self._write_waiter = self._loop.create_future()
                    try:
                        await self._write_waiter
                    finally:
                        self._write_waiter = None
                    continue
                chunks, self._buffer = self._buffer, []
                batch: list[bytes] = []
                batch_size = 0
                for chunk in chunks:
                    if batch and batch_size + len(chunk) > MAX_SEND:
                        await self._send(batch[0] if len(batch) == 1 else b"".join(batch))
                        batch, batch_size = [], 0
                    if len(chunk) > MAX_SEND:
                        view = memoryview(chunk)
                        for start in range(0, len(chunk), MAX_SEND):
                            await self._send(view[start : start + MAX_SEND])
                    else:
                        batch.append(chunk)
                        batch_size += len(chunk)
                if batch:
                    await self._send(batch[0] if len(batch) == 1 else b"".join(batch))
        except Exception as exc:
            # The socket went while sending (reset, drain timeout): cut it, so that
            # the reader sees its end too.
            if not ws.closed:
                log.info("%s: websocket send failed: %s", self._peer(), exc)
            self._cut()

    async def _send(self, data: bytes | memoryview) -> None:
        """One binary message; its bytes leave the write buffer once the socket took them."""
        # aiohttp takes any bytes-like object (its annotation says bytes): a slice of a
        # large write goes out uncopied.
        await self._ws.send_bytes(cast(bytes, data))
        self._size -= len(data)
        if self._writing_paused and self._size <= self._low:
            self._writing_paused = False
            self._call_protocol(self._protocol.resume_writing)

    async def _finish_writer(self) -> None:
        """Let the flush and closing handshake of a close() end (bounded); a writer
        the peer's end left waiting has nothing more to do."""
        writer = self._writer
        if writer is None or writer.done():
            return
        if self._closing:
            await asyncio.wait([writer], timeout=CLOSE_TIMEOUT)
        writer.cancel()
        await asyncio.wait([writer])  # its end, without taking our own cancellation

    def _connection_lost(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = self._aborted = True
        self._buffer.clear()
        self._size = 0
        try:
            self._protocol.connection_lost(exc if isinstance(exc, Exception) else None)
        finally:
            if not self.done.done():
                self.done.set_result(None)

    def _call_protocol(self, callback: Callable[[], None]) -> None:
        """pause_writing/resume_writing, whose failure must not stop the writer (asyncio
        logs it and goes on too)."""
        try:
            callback()
        except Exception:
            log.exception("%s: protocol %s failed", self._peer(), callback.__name__)

    def _peer(self) -> str:
        peer = self.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]} (websocket)" if isinstance(peer, tuple) else "websocket"

    # -- asyncio.WriteTransport ----------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._aborted or not data:
            return
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._buffer.append(chunk)
        self._size += len(chunk)
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if not self._writing_paused and self._size > self._high:
            self._writing_paused = True
            self._call_protocol(self._protocol.pause_writing)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet handed to the socket (the message being sent included)."""
        return self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        if not self._writing_paused and self._size > self._high:
            self._writing_paused = True
            self._call_protocol(self._protocol.pause_writing)

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a websocket carries no half-close; close() instead")

    def close(self, code: int = WSCloseCode.OK) -> None:
        """Send what is queued, then close the websocket with ``code`` (1000)."""
        if self._closing:
            return
        self._closing = True
        self._close_code = code
        self._wake_reader()  # so that the closing handshake finds the reader waiting
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self) -> None:
        """Drop what is queued and cut the connection; connection_lost follows."""
        self._stop_writing()
        self._wake_reader()
        self._cut()

    def is_closing(self) -> bool:
        return self._closing

    def _stop_writing(self) -> None:
        self._closing = True
        self._aborted = True
        self._buffer.clear()
        self._size = 0
        writer = self._writer
        if writer is not None and writer is not asyncio.current_task():
            writer.cancel()

    def _cut(self) -> None:
        """Close the TCP connection under the websocket: the reader sees its end."""
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    # -- asyncio.ReadTransport -----------------------------------------------------------
    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._wake_reader()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- asyncio.BaseTransport -----------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in _EXTRA:
            transport = self._request.transport
            if transport is not None:
                return transport.get_extra_info(name, default)
        return super().get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if not isinstance(protocol, asyncio.Protocol):
            raise TypeError("a websocket transport drives an asyncio.Protocol")
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol
