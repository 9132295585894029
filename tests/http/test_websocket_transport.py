"""WebSocketTransport on its own: a real aiohttp server running a small scripted
protocol (an echo with commands) and aiohttp's client, both on the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import WSMsgType, web

from warren.http.websocket import (
    MAX_SEND,
    WebSocketConnections,
    WebSocketTransport,
    select_endpoint,
    websocket_middleware,
)
from warren.node import WebSocketEndpoint

pytestmark = pytest.mark.timeout(30)

TIMEOUT = 5.0
FLOOD = 4 * 1024 * 1024


class Scripted(asyncio.Protocol):
    """Echoes what it receives, except a few commands that exercise the transport."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: WebSocketTransport | None = None
        self.received: list[bytes] = []
        self.lost: list[Exception | None] = []
        self.lost_event = asyncio.Event()
        self.writing_paused = asyncio.Event()
        self.writing_resumed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, WebSocketTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        self.received.append(data)
        if data == b"burst":  # three writes in one turn
            transport.write(b"a")
            transport.writelines([b"b", bytearray(b"c")])
        elif data == b"big":  # one write larger than a message may be
            transport.write(bytes(range(256)) * (3 * MAX_SEND // 256 + 7))
        elif data == b"flood":
            for _ in range(FLOOD // 65536):
                transport.write(b"f" * 65536)
        elif data == b"close":
            transport.write(b"bye")
            transport.close()
        elif data == b"abort":
            transport.write(b"never sent")
            transport.abort()
        elif data == b"raise":
            raise RuntimeError("protocol bug")
        elif data == b"pause":
            transport.pause_reading()
            transport.write(b"paused")
        elif data == b"resume-first":  # from another connection
            first = self.server.protocols[0]
            assert first.transport is not None
            transport.write(b"first had %d" % len(first.received))
            first.transport.resume_reading()
        else:
            transport.write(data)

    def pause_writing(self) -> None:
        self.writing_paused.set()

    def resume_writing(self) -> None:
        self.writing_resumed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)
        self.lost_event.set()


class Server:
    """An aiohttp app serving Scripted at /echo (subprotocol ``echo``) on a free port."""

    def __init__(self) -> None:
        self.protocols: list[Scripted] = []
        self.connections = WebSocketConnections()
        self.runner: web.AppRunner | None = None
        self.port = 0

    def new_protocol(self) -> Scripted:
        protocol = Scripted(self)
        self.protocols.append(protocol)
        return protocol

    async def start(self) -> None:
        endpoint = WebSocketEndpoint("/echo", ("echo",), self.new_protocol)
        app = web.Application(middlewares=[websocket_middleware([endpoint], self.connections)])
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        await self.connections.close_all()
        assert self.runner is not None
        await self.runner.cleanup()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def open_ws(
    server: Server, session: aiohttp.ClientSession
) -> aiohttp.ClientWebSocketResponse:
    return await session.ws_connect(f"http://127.0.0.1:{server.port}/echo", protocols=("echo",))


async def receive_bytes(ws: aiohttp.ClientWebSocketResponse) -> bytes:
    msg = await ws.receive(timeout=TIMEOUT)
    assert msg.type is WSMsgType.BINARY, msg
    return bytes(msg.data)


async def lost(protocol: Scripted) -> list[Exception | None]:
    await asyncio.wait_for(protocol.lost_event.wait(), TIMEOUT)
    return protocol.lost


@pytest.mark.asyncio
async def test_echo_and_extra_info(server: Server, session: aiohttp.ClientSession) -> None:
    ws = await open_ws(server, session)
    assert ws.protocol == "echo"
    await ws.send_bytes(b"hello")
    assert await receive_bytes(ws) == b"hello"
    transport = server.protocols[0].transport
    assert transport is not None
    assert transport.get_extra_info("peername") == ws.get_extra_info("sockname")
    assert transport.get_extra_info("sockname") == ("127.0.0.1", server.port)
    assert transport.get_extra_info("socket") is not None
    assert transport.get_extra_info("ssl_object") is None
    assert transport.get_extra_info("nothing", 7) == 7
    assert transport.get_protocol() is server.protocols[0]
    assert transport.is_reading() and not transport.is_closing()
    await ws.close()
    assert await lost(server.protocols[0]) == [None]


@pytest.mark.asyncio
async def test_writes_of_one_turn_are_one_message(
    server: Server, session: aiohttp.ClientSession
) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"burst")
    assert await receive_bytes(ws) == b"abc"
    await ws.send_bytes(b"big")
    expected = bytes(range(256)) * (3 * MAX_SEND // 256 + 7)
    got = b""
    while len(got) < len(expected):
        part = await receive_bytes(ws)
        assert len(part) <= MAX_SEND
        got += part
    assert got == expected
    await ws.close()


@pytest.mark.asyncio
async def test_close_sends_what_is_queued_then_1000(
    server: Server, session: aiohttp.ClientSession
) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"close")
    assert await receive_bytes(ws) == b"bye"
    msg = await ws.receive(timeout=TIMEOUT)
    assert (msg.type, msg.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.OK)
    assert await lost(server.protocols[0]) == [None]
    assert server.protocols[0].transport is not None
    assert server.protocols[0].transport.is_closing()


@pytest.mark.asyncio
async def test_abort_cuts_the_connection(server: Server, session: aiohttp.ClientSession) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"abort")
    msg = await ws.receive(timeout=TIMEOUT)
    assert msg.type in (WSMsgType.CLOSED, WSMsgType.ERROR), msg
    assert len(await lost(server.protocols[0])) == 1


@pytest.mark.asyncio
async def test_a_failing_protocol_is_cut(server: Server, session: aiohttp.ClientSession) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"raise")
    msg = await ws.receive(timeout=TIMEOUT)
    assert msg.type in (WSMsgType.CLOSED, WSMsgType.ERROR), msg
    reasons = await lost(server.protocols[0])
    assert len(reasons) == 1 and isinstance(reasons[0], RuntimeError)


@pytest.mark.asyncio
async def test_a_text_message_closes_with_1003(
    server: Server, session: aiohttp.ClientSession
) -> None:
    ws = await open_ws(server, session)
    other = await open_ws(server, session)
    await ws.send_frame(b"\xff not UTF-8", WSMsgType.TEXT)  # refused as text, not as bad UTF-8
    msg = await ws.receive(timeout=TIMEOUT)
    assert (msg.type, msg.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.UNSUPPORTED_DATA)
    reasons = await lost(server.protocols[0])
    assert len(reasons) == 1 and isinstance(reasons[0], ConnectionError)
    assert server.protocols[0].received == []
    await other.send_bytes(b"still here")
    assert await receive_bytes(other) == b"still here"
    await other.close()


@pytest.mark.asyncio
async def test_writing_pauses_above_the_high_water_mark(
    server: Server, session: aiohttp.ClientSession
) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"flood")
    protocol = server.protocols[0]
    # 4 MiB written in one turn: far above 64 KiB, paused at once.
    await asyncio.wait_for(protocol.writing_paused.wait(), TIMEOUT)
    transport = protocol.transport
    assert transport is not None
    assert transport.get_write_buffer_limits() == (16 * 1024, 64 * 1024)
    got = 0
    while got < FLOOD:
        got += len(await receive_bytes(ws))
    assert got == FLOOD
    await asyncio.wait_for(protocol.writing_resumed.wait(), TIMEOUT)
    assert transport.get_write_buffer_size() == 0
    await ws.close()


@pytest.mark.asyncio
async def test_write_buffer_limits(server: Server, session: aiohttp.ClientSession) -> None:
    ws = await open_ws(server, session)
    await ws.send_bytes(b"x")
    assert await receive_bytes(ws) == b"x"
    protocol = server.protocols[0]
    transport = protocol.transport
    assert transport is not None
    transport.set_write_buffer_limits(high=100)
    assert transport.get_write_buffer_limits() == (25, 100)
    with pytest.raises(ValueError):
        transport.set_write_buffer_limits(high=10, low=20)
    transport.write(b"y" * 101)
    assert protocol.writing_paused.is_set()  # at once, in write()
    assert await receive_bytes(ws) == b"y" * 101
    await asyncio.wait_for(protocol.writing_resumed.wait(), TIMEOUT)
    await ws.close()


@pytest.mark.asyncio
async def test_no_message_is_taken_while_reading_is_paused(
    server: Server, session: aiohttp.ClientSession
) -> None:
    first = await open_ws(server, session)
    await first.send_bytes(b"pause")
    assert await receive_bytes(first) == b"paused"
    transport = server.protocols[0].transport
    assert transport is not None and not transport.is_reading()
    for n in (b"1", b"2", b"3"):
        await first.send_bytes(n)
    # Another connection looks at the first one's count, then resumes its reading.
    control = await open_ws(server, session)
    await control.send_bytes(b"resume-first")
    assert await receive_bytes(control) == b"first had 1"
    echoed = b""
    while len(echoed) < 3:  # echoes written in one turn may come as one message
        echoed += await receive_bytes(first)
    assert echoed == b"123"
    assert transport.is_reading()
    await first.close()
    await control.close()


@pytest.mark.asyncio
async def test_closing_every_connection(server: Server, session: aiohttp.ClientSession) -> None:
    sockets = [await open_ws(server, session) for _ in range(3)]
    for ws in sockets:
        await ws.send_bytes(b"hi")
        assert await receive_bytes(ws) == b"hi"
    await server.connections.close_all()
    for ws in sockets:
        msg = await ws.receive(timeout=TIMEOUT)
        assert (msg.type, msg.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.GOING_AWAY)
    assert [p.lost for p in server.protocols] == [[None]] * 3
    assert not server.connections.transports


@pytest.mark.asyncio
async def test_other_requests_are_routed_as_usual(
    server: Server, session: aiohttp.ClientSession
) -> None:
    base = f"http://127.0.0.1:{server.port}"
    async with session.get(base + "/echo") as resp:  # no upgrade: not the endpoint
        assert resp.status == 404
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await session.ws_connect(base + "/other", protocols=("chat",))
    assert refused.value.status == 404
    ws = await session.ws_connect(base + "/other", protocols=("chat", "echo"))
    assert ws.protocol == "echo"
    await ws.close()


def test_select_endpoint_with_two_protocols() -> None:
    """A second endpoint (MQTT's, say) just works: path first, then endpoint order."""
    amqp = WebSocketEndpoint("/ws/amqp", ("amqp", "amqpws"), asyncio.Protocol)
    mqtt = WebSocketEndpoint("/mqtt", ("mqtt", "mqttv3.1"), asyncio.Protocol)
    endpoints = [amqp, mqtt]
    assert select_endpoint(endpoints, "/mqtt", ["mqtt"]) == (mqtt, "mqtt")
    assert select_endpoint(endpoints, "/mqtt", []) == (mqtt, None)
    assert select_endpoint(endpoints, "/mqtt", ["amqp"]) == (mqtt, None)  # the path decides
    assert select_endpoint(endpoints, "/", ["mqttv3.1"]) == (mqtt, "mqttv3.1")
    assert select_endpoint(endpoints, "/", ["x", "mqtt", "amqpws"]) == (amqp, "amqpws")
    assert select_endpoint(endpoints, "/ws/amqp", ["amqpws", "amqp"]) == (amqp, "amqpws")
    assert select_endpoint(endpoints, "/", ["x"]) is None
    assert select_endpoint(endpoints, "/", []) is None
