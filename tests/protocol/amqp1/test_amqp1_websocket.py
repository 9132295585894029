"""AMQP 1.0 over WebSocket (RabbitMQ 4's ``/ws``, subprotocol ``amqp``): Qpid
Proton's engine exchanging its bytes over aiohttp's WebSocket client with the
embedded broker's HTTP port, and a raw socket timing out in its handshake."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import aiohttp
import pika
import pytest

from warren.core.clock import ManualClock

proton = pytest.importorskip("proton")

pytestmark = [pytest.mark.timeout(60)]


async def _run(ws: aiohttp.ClientWebSocketResponse, transport, done: Callable[[], bool]) -> None:
    """Move proton's bytes over ``ws`` until ``done()``."""
    while True:
        pending = transport.pending()
        if pending > 0:
            await ws.send_bytes(bytes(transport.peek(pending)))
            transport.pop(pending)
        if done():
            return
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        data = memoryview(msg.data)
        while data:
            room = transport.capacity()
            transport.push(bytes(data[:room]))
            data = data[room:]


def test_publish_and_consume_over_websocket(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare("wsq")
    conn.close()
    port = broker.broker.listener("http").port

    async def scenario() -> None:
        connection = proton.Connection()
        connection.container = "ws-client"
        connection.hostname = "vhost:/"
        connection.user, connection.password = "guest", "guest"
        transport = proton.Transport()
        sasl = transport.sasl()
        sasl.allowed_mechs("PLAIN")
        sasl.allow_insecure_mechs = True
        transport.bind(connection)
        connection.open()
        session = connection.session()
        session.open()
        sender = session.sender("s")
        sender.target.address = "/queues/wsq"
        sender.open()
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/ws"
            async with http.ws_connect(url, protocols=["amqp"]) as ws:
                assert ws.protocol == "amqp"
                await _run(ws, transport, lambda: sender.credit > 0)
                delivery = sender.delivery("d1")
                sender.send(proton.Message(body="over websocket").encode())
                sender.advance()
                await _run(ws, transport, lambda: delivery.remote_state != 0)
                assert delivery.remote_state == proton.Delivery.ACCEPTED
                receiver = session.receiver("r")
                receiver.source.address = "/queues/wsq"
                receiver.open()
                receiver.flow(1)
                await _run(ws, transport, lambda: receiver.current is not None)
                got = receiver.current
                data = receiver.recv(got.pending)
                receiver.advance()
                message = proton.Message()
                message.decode(data)
                assert message.body == "over websocket"
                got.update(proton.Delivery.ACCEPTED)
                got.settle()
                connection.close()
                await _run(
                    ws, transport, lambda: bool(connection.state & proton.Endpoint.REMOTE_CLOSED)
                )

    asyncio.run(scenario())


def test_handshake_timeout_on_the_brokers_clock(broker_factory) -> None:
    b = broker_factory(clock=ManualClock())
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as sock:
        sock.sendall(b"AMQP\x03\x01\x00\x00")
        got = b""
        while b"PLAIN" not in got:
            got += sock.recv(4096)
        assert got.startswith(b"AMQP\x03\x01\x00\x00")
        listener = b.broker.listener("amqp1")
        assert len(listener.protocols) == 1
        b.advance(10_001)
        sock.settimeout(10)
        assert sock.recv(4096) == b""  # closed
