"""AMQP 0-9-1 over WebSocket on the HTTP listener, end to end.

The client is aiohttp's WebSocket client speaking AMQP frames encoded and
decoded by pamqp (an independent codec), against an embedded broker on
ephemeral ports; the TCP side uses tests/rawamqp.py.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import aiohttp
import pytest
import pytest_asyncio
from conftest import BrokerThread
from httphelp import Api
from pamqp import base, body, commands, frame, header, heartbeat
from rawamqp import PROTOCOL_HEADER, RawAMQP, publish_frames

from warren.http.websocket import WebSocketTransport

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]

M = TypeVar("M", bound=base.Frame)
TIMEOUT = 5.0


class Closed(AssertionError):
    """The websocket ended while a frame was awaited."""

    def __init__(self, msg: aiohttp.WSMessage, close_code: int | None) -> None:
        super().__init__(f"websocket ended: {msg.type.name} {msg.data!r} (code {close_code})")
        self.close_code = close_code


class WsAMQP:
    """One AMQP connection over a websocket; frames in and out through pamqp."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.buf = b""

    async def send(self, *frames: bytes) -> None:
        """All of ``frames`` in one binary message."""
        await self.ws.send_bytes(b"".join(frames))

    async def send_method(self, channel: int, method: base.Frame) -> None:
        await self.send(frame.marshal(method, channel))

    def _take(self) -> tuple[int, Any] | None:
        if len(self.buf) < 7:
            return None
        (size,) = struct.unpack_from(">I", self.buf, 3)
        if len(self.buf) < 8 + size:
            return None
        consumed, channel, value = frame.unmarshal(self.buf[: 8 + size])
        self.buf = self.buf[consumed:]
        return channel, value

    async def read_frame(self) -> tuple[int, Any]:
        while True:
            got = self._take()
            if got is not None:
                return got
            msg = await self.ws.receive(timeout=TIMEOUT)
            if msg.type is not aiohttp.WSMsgType.BINARY:
                raise Closed(msg, close_code(msg, self.ws))
            self.buf += msg.data

    async def expect(self, cls: type[M], channel: int | None = None) -> M:
        while True:
            ch, value = await self.read_frame()
            if isinstance(value, heartbeat.Heartbeat):
                continue
            assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
            assert channel is None or ch == channel
            return value

    async def handshake(self) -> None:
        await self.send(PROTOCOL_HEADER)
        await self.expect(commands.Connection.Start)
        await self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "ws-test"}, response="\0guest\0guest"
            ),
        )
        tune = await self.expect(commands.Connection.Tune)
        await self.send_method(
            0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat=0)
        )
        await self.send_method(0, commands.Connection.Open(virtual_host="/"))
        await self.expect(commands.Connection.OpenOk)

    async def open_channel(self, channel: int = 1) -> None:
        await self.send_method(channel, commands.Channel.Open())
        await self.expect(commands.Channel.OpenOk, channel)

    async def declare(self, queue: str, channel: int = 1) -> None:
        await self.send_method(channel, commands.Queue.Declare(queue=queue))
        ok = await self.expect(commands.Queue.DeclareOk, channel)
        assert ok.queue == queue

    async def close(self) -> None:
        """connection.close, close-ok, then the server's websocket close (1000)."""
        await self.send_method(0, commands.Connection.Close(200, "bye", 0, 0))
        await self.expect(commands.Connection.CloseOk)
        msg = await self.ws.receive(timeout=TIMEOUT)
        assert close_code(msg, self.ws) == aiohttp.WSCloseCode.OK, msg


def close_code(msg: aiohttp.WSMessage, ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """The code the server closed with: its close frame's (aiohttp's client reports 1006
    when its answer to the frame finds the socket already closed by the server)."""
    return int(msg.data) if msg.type is aiohttp.WSMsgType.CLOSE else ws.close_code


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def ws_url(broker: BrokerThread, path: str = "/ws/amqp") -> str:
    return f"http://127.0.0.1:{broker.http_port}{path}"


async def connect(
    session: aiohttp.ClientSession,
    broker: BrokerThread,
    path: str = "/ws/amqp",
    protocols: tuple[str, ...] = ("amqp",),
    **kw: Any,
) -> WsAMQP:
    ws = await session.ws_connect(ws_url(broker, path), protocols=protocols, **kw)
    return WsAMQP(ws)


def ws_protocols(broker: BrokerThread) -> list[Any]:
    """The broker's AMQP protocols whose transport is a websocket (read on its loop)."""
    return broker.call(
        lambda: [
            p for p in broker.amqp_listener.protocols if isinstance(p.transport, WebSocketTransport)
        ]
    )


async def all_lost(broker: BrokerThread, protocols: list[Any]) -> None:
    """Until each of ``protocols`` has had its connection_lost (its ``closed`` future)."""

    async def wait() -> None:
        await asyncio.wait_for(asyncio.gather(*(p.closed for p in protocols)), TIMEOUT)

    await asyncio.to_thread(broker.run, wait())


async def test_publish_confirm_consume_over_websocket(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    client = await connect(session, broker)
    assert client.ws.protocol == "amqp"
    await client.handshake()
    await client.open_channel()
    await client.declare("ws-q")
    await client.send_method(1, commands.Confirm.Select())
    await client.expect(commands.Confirm.SelectOk, 1)
    await client.send(publish_frames(1, b"hello over ws", "ws-q"))
    ack = await client.expect(commands.Basic.Ack, 1)
    assert ack.delivery_tag == 1

    await client.send_method(1, commands.Basic.Consume(queue="ws-q", consumer_tag="c1"))
    await client.expect(commands.Basic.ConsumeOk, 1)
    deliver = await client.expect(commands.Basic.Deliver, 1)
    assert (deliver.consumer_tag, deliver.routing_key) == ("c1", "ws-q")
    content = await client.expect(header.ContentHeader, 1)
    assert content.body_size == len(b"hello over ws")
    assert (await client.expect(body.ContentBody, 1)).value == b"hello over ws"
    await client.send_method(1, commands.Basic.Ack(deliver.delivery_tag))

    # Listed as an AMQP connection; its local port is the HTTP listener's.
    conns = await asyncio.to_thread(Api(broker.http_port).get, "/api/connections")
    assert len(conns) == 1
    c = conns[0]
    assert (c["protocol"], c["user"], c["vhost"]) == ("AMQP 0-9-1", "guest", "/")
    assert c["port"] == broker.http_port
    assert c["name"].endswith(f" -> 127.0.0.1:{broker.http_port}")
    assert c["client_properties"]["product"] == "ws-test"

    protocols = ws_protocols(broker)
    assert len(protocols) == 1
    await client.send_method(1, commands.Channel.Close(200, "done", 0, 0))
    await client.expect(commands.Channel.CloseOk, 1)
    await client.close()
    await all_lost(broker, protocols)
    assert broker.call(lambda: broker.broker.get_vhost("/").queues["ws-q"].message_count) == 0
    assert ws_protocols(broker) == []


async def test_fragmented_and_batched_input(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    """A protocol header and frames cut across several messages, and several frames
    in one message, are one byte stream to the broker."""
    client = await connect(session, broker)
    for i in range(len(PROTOCOL_HEADER)):
        await client.send(PROTOCOL_HEADER[i : i + 1])
    await client.expect(commands.Connection.Start)
    start_ok = frame.marshal(
        commands.Connection.StartOk(client_properties={}, response="\0guest\0guest"), 0
    )
    for i in range(0, len(start_ok), 3):
        await client.send(start_ok[i : i + 3])
    await client.expect(commands.Connection.Tune)
    # tune-ok, connection.open, channel.open and two declares in one message
    await client.send(
        frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0),
        frame.marshal(commands.Connection.Open(virtual_host="/"), 0),
        frame.marshal(commands.Channel.Open(), 1),
        frame.marshal(commands.Queue.Declare(queue="a"), 1),
        frame.marshal(commands.Queue.Declare(queue="b"), 1),
    )
    await client.expect(commands.Connection.OpenOk)
    await client.expect(commands.Channel.OpenOk, 1)
    assert (await client.expect(commands.Queue.DeclareOk, 1)).queue == "a"
    assert (await client.expect(commands.Queue.DeclareOk, 1)).queue == "b"
    # a publish whose frames are split mid-frame and across frame boundaries
    data = publish_frames(1, b"x" * 1000, "a") + publish_frames(1, b"y" * 10, "b")
    for cut in (5, 17, 40, 300, 1030):
        await client.send(data[:cut])
        data = data[cut:]
    await client.send(data)
    await client.send_method(1, commands.Basic.Get(queue="b", no_ack=True))
    await client.expect(commands.Basic.GetOk, 1)
    await client.expect(header.ContentHeader, 1)
    assert (await client.expect(body.ContentBody, 1)).value == b"y" * 10
    await client.send_method(1, commands.Basic.Get(queue="a", no_ack=True))
    await client.expect(commands.Basic.GetOk, 1)
    await client.expect(header.ContentHeader, 1)
    assert (await client.expect(body.ContentBody, 1)).value == b"x" * 1000
    await client.close()


async def test_a_text_message_closes_that_websocket_only(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    other = await connect(session, broker)
    await other.handshake()
    rude = await connect(session, broker)
    await rude.handshake()
    protocols = ws_protocols(broker)
    assert len(protocols) == 2
    await rude.ws.send_str("AMQP")
    with pytest.raises(Closed) as closed:
        await rude.read_frame()
    assert closed.value.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
    # the other websocket and TCP connections go on
    await other.open_channel()
    await other.declare("still-here")
    tcp = RawAMQP(broker.port)
    try:
        await asyncio.to_thread(tcp.handshake)
    finally:
        tcp.close_socket()
    await other.close()
    await all_lost(broker, protocols)


async def test_subprotocol_negotiation_and_routing(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    # amqp at any path: routed by subprotocol
    client = await connect(session, broker, "/some/where", protocols=("amqp",))
    assert client.ws.protocol == "amqp"
    await client.handshake()
    await client.close()
    # the client's first offered subprotocol the endpoint knows
    client = await connect(session, broker, protocols=("v12.stomp", "amqpws", "amqp"))
    assert client.ws.protocol == "amqpws"
    await client.handshake()
    await client.close()
    # none offered: accepted on the endpoint's own path, without a subprotocol
    client = await connect(session, broker, protocols=())
    assert client.ws.protocol is None
    await client.handshake()
    await client.close()
    # no endpoint at that path, no known subprotocol: the usual routing answers
    for path, protocols, status in (
        ("/nowhere", ("v12.stomp",), 404),
        ("/nowhere", (), 404),
        ("/api/overview", (), 401),  # management auth still applies
    ):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url(broker, path), protocols=protocols)
        assert refused.value.status == status, path
    # plain HTTP is untouched: /ws/amqp is no page, the API still wants credentials
    async with session.get(ws_url(broker)) as resp:
        assert resp.status == 404
    async with session.get(ws_url(broker, "/api/overview")) as resp:
        assert resp.status == 401
    overview = await asyncio.to_thread(Api(broker.http_port).get, "/api/overview")
    assert overview["node"].startswith("warren@")


async def test_a_consumer_that_does_not_read_is_pushed_back(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    """A websocket consumer that stops reading makes the broker stop delivering to it
    (its transport paused the connection's writing), not buffer every message, and
    the broker keeps serving others; once it reads, every message arrives."""
    started = time.monotonic()
    body_size = 32 * 1024
    # A small receive buffer on the client's socket, so it pushes back early.
    connector = aiohttp.TCPConnector(socket_factory=_small_receive_buffer)
    async with aiohttp.ClientSession(connector=connector) as slow_session:
        slow = await connect(slow_session, broker)
        await slow.handshake()
        await slow.open_channel()
        await slow.declare("firehose")
        await slow.send_method(1, commands.Basic.Consume(queue="firehose", no_ack=True))
        await slow.expect(commands.Basic.ConsumeOk, 1)

        tcp = RawAMQP(broker.port)
        try:
            await asyncio.to_thread(tcp.handshake)
            await asyncio.to_thread(tcp.open_channel, 1)
            await asyncio.to_thread(tcp_declare, tcp, "sync")
            published = 0
            batch = b"".join(publish_frames(1, b"m" * body_size, "firehose") for _ in range(64))
            # Publish in batches until the broker holds messages back from the consumer
            # (its connection not writable, messages left in the queue): a few MB at most.
            while not broker.call(_held_back(broker, "firehose")):
                assert time.monotonic() - started < 4, "the websocket never pushed back"
                await asyncio.to_thread(tcp.send, batch)
                published += 64
                await asyncio.to_thread(tcp_declare, tcp, "sync")  # a round trip
            # Still responsive: a publish/get round trip on the TCP connection.
            await asyncio.to_thread(tcp.send, publish_frames(1, b"ping", "sync"))
            assert await asyncio.to_thread(tcp_get, tcp, "sync") == b"ping"
        finally:
            tcp.close_socket()

        received = 0
        while received < published:
            deliver = await slow.expect(commands.Basic.Deliver, 1)
            await slow.expect(header.ContentHeader, 1)
            got_body = b""
            while len(got_body) < body_size:
                got_body += (await slow.expect(body.ContentBody, 1)).value
            assert deliver.delivery_tag == received + 1
            received += 1
        await slow.close()
    assert time.monotonic() - started < 5


def tcp_declare(tcp: RawAMQP, queue: str) -> None:
    tcp.send_method(1, commands.Queue.Declare(queue=queue))
    tcp.expect_method(commands.Queue.DeclareOk, channel=1)


def tcp_get(tcp: RawAMQP, queue: str) -> bytes:
    tcp.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
    tcp.expect_method(commands.Basic.GetOk, channel=1)
    return tcp.expect_content()[1]


def _small_receive_buffer(addr_info: Any) -> Any:
    import socket

    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    return sock


def _held_back(broker: BrokerThread, queue: str) -> Any:
    """On the broker's loop: is the websocket consumer's connection unwritable and
    ``queue`` left with messages?"""

    def check() -> bool:
        protocols = [
            p for p in broker.amqp_listener.protocols if isinstance(p.transport, WebSocketTransport)
        ]
        conn = protocols[0].conn if protocols else None
        held = conn is not None and not conn.writable
        return held and broker.broker.get_vhost("/").queues[queue].message_count > 0

    return check


async def test_stopping_the_http_listener_closes_websockets(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    client = await connect(session, broker)
    await client.handshake()
    protocols = ws_protocols(broker)
    listener = broker.broker.listener("http")
    assert listener is not None
    started = time.monotonic()
    await asyncio.to_thread(broker.run, listener.stop())
    assert time.monotonic() - started < 2
    msg = await client.ws.receive(timeout=TIMEOUT)
    assert close_code(msg, client.ws) == aiohttp.WSCloseCode.GOING_AWAY, msg
    await all_lost(broker, protocols)
