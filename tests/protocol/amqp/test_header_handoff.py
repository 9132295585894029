"""Another protocol on the AMQP port, by its protocol header (warren/header_handoff.py).

The composition root (warren.app) will register AMQP 1.0's headers; here the
test registers its own small protocol, which answers the header it got and
echoes, on a real broker's sockets: plain TCP, TLS, a header cut across TCP
writes, and WebSocket on the HTTP port; 0-9-1 clients must not notice.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aio_pika
import aiohttp
import pytest
from pamqp import commands, frame
from rawamqp import PROTOCOL_HEADER
from tlshelp import write_pki

from warren.amqp.server import HANDSHAKE_TIMEOUT_MS, AMQPListener
from warren.app import Broker, default_listeners
from warren.config import Config
from warren.core.clock import ManualClock
from warren.header_handoff import PENDING, choose
from warren.node import HeaderHandoffs

pytestmark = [pytest.mark.timeout(60)]

AMQP1 = b"AMQP\x00\x01\x00\x00"
AMQP1_SASL = b"AMQP\x03\x01\x00\x00"
TIMEOUT = 5.0


class Echo(asyncio.Protocol):
    """The other protocol: echoes every byte (so the AMQP 1.0 header is answered
    with itself, as an AMQP 1.0 server does) and closes on ``bye``."""

    made: list[Echo] = []

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = b""
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) or hasattr(transport, "write")
        self.transport = transport  # type: ignore[assignment]
        Echo.made.append(self)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.received += data
        self.transport.write(data)
        if self.received.endswith(b"bye"):
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


HANDOFFS: HeaderHandoffs = {AMQP1: Echo, AMQP1_SASL: Echo}


# -- choose(), in memory --------------------------------------------------------------
def test_choose_waits_only_while_a_header_may_still_match() -> None:
    assert choose(HANDOFFS, b"") == PENDING
    assert choose(HANDOFFS, b"AMQP") == PENDING
    assert choose(HANDOFFS, b"AMQP\x00\x01\x00") == PENDING
    assert choose(HANDOFFS, AMQP1) is Echo
    assert choose(HANDOFFS, AMQP1_SASL + b"more") is Echo
    # 0-9-1's header, and anything else, is decided at the first byte it differs.
    assert choose(HANDOFFS, b"AMQP\x00\x00") is None
    assert choose(HANDOFFS, PROTOCOL_HEADER) is None
    assert choose(HANDOFFS, b"G") is None
    assert choose({}, b"") is None


def test_choose_prefers_the_longest_registered_header() -> None:
    def short() -> asyncio.Protocol:
        return asyncio.Protocol()

    def long() -> asyncio.Protocol:
        return asyncio.Protocol()

    table: dict[bytes, Callable[[], asyncio.Protocol]] = {b"AB": short, b"ABCD": long}
    assert choose(table, b"ABC") == PENDING
    assert choose(table, b"ABCD") is long
    assert choose(table, b"ABCX") is short


# -- on a broker's sockets --------------------------------------------------------------
Scenario = Callable[[], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Scenario], None]:
    """Runs a scenario on asyncio's loop, and again on uvloop's (as ``warren`` runs):
    their transports' set_protocol, plain and TLS, are each their own."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if request.param == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    def run_scenario(scenario: Scenario) -> None:
        Echo.made.clear()
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(scenario(), 30))

    return run_scenario


def _config(tmp_path: Path, **settings: object) -> Config:
    settings.setdefault("amqp_port", 0)
    return Config(
        data_dir=str(tmp_path / "data"),
        http_port=0,
        mqtt_port=-1,
        stream_port=-1,
        stream_tls_port=-1,
        prometheus_port=-1,
        auth_failure_delay=0,
        auth_failures_per_minute=0,
        **settings,  # type: ignore[arg-type]
    )


def serve(
    tmp_path: Path,
    handoffs: HeaderHandoffs = HANDOFFS,
    clock: ManualClock | None = None,
    **settings: object,
) -> Broker:
    """A broker (``async with``) with the standard listeners, its AMQP port handing
    ``handoffs`` over, on ``clock`` when given."""
    config = _config(tmp_path, **settings)
    return Broker(config, listeners=default_listeners(config, handoffs), clock=clock)


def amqp_listener(broker: Broker) -> AMQPListener:
    listener = broker.listener("amqp")
    assert isinstance(listener, AMQPListener)
    return listener


def http_port(broker: Broker) -> int:
    listener = broker.listener("http")
    assert listener is not None
    return listener.port


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), TIMEOUT)


async def wait_until(condition: Callable[[], bool]) -> None:
    """Until the broker (on this loop) has done what ``condition`` checks."""
    async with asyncio.timeout(TIMEOUT):
        while not condition():
            await asyncio.sleep(0.005)


def holding(listener: AMQPListener, head: bytes) -> Callable[[], bool]:
    """Whether one of the listener's clients has sent ``head`` and is still undecided."""
    return lambda: any(p._head == head for p in listener.protocols)


async def echo_round(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After the header: bytes echoed, then the other protocol's own close."""
    writer.write(b"hello")
    assert await read_exactly(reader, 5) == b"hello"
    writer.write(b"bye")
    assert await read_exactly(reader, 3) == b"bye"
    assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
    writer.close()


@pytest.mark.parametrize("header", [AMQP1, AMQP1_SASL])
def test_an_amqp1_header_goes_to_the_registered_protocol(
    run: Callable[[Scenario], None], tmp_path: Path, header: bytes
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(header)
            assert await read_exactly(reader, 8) == header
            await echo_round(reader, writer)
            # The 0-9-1 side let go of it: not tracked, not listed as a connection.
            assert not amqp_listener(broker).protocols
            assert not broker.connections
            assert len(Echo.made) == 1

    run(scenario)


def test_the_header_and_what_follows_in_one_write(
    run: Callable[[Scenario], None], tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(AMQP1 + b"frame")
            assert await read_exactly(reader, 13) == AMQP1 + b"frame"
            await echo_round(reader, writer)

    run(scenario)


def test_a_header_cut_across_tcp_writes(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            listener = amqp_listener(broker)
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            sent = b""
            for piece in (b"A", b"MQ", b"P\x00", b"\x01\x00", b"\x00"):
                writer.write(piece)
                await writer.drain()
                sent += piece
                if len(sent) < 8:
                    # Read by the broker, undecided: the AMQP listener's, nothing answered.
                    await wait_until(holding(listener, sent))
                    assert not Echo.made
            assert await read_exactly(reader, 8) == AMQP1
            await echo_round(reader, writer)

    run(scenario)


def test_over_tls(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")

    async def scenario() -> None:
        tls = {"amqp_tls_port": 0, "tls_cert": pki["server"], "tls_key": pki["server.key"]}
        async with serve(tmp_path, **tls) as broker:
            ctx = ssl.create_default_context(cafile=pki["ca"])
            port = amqp_listener(broker).tls_port
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
            for piece in (AMQP1_SASL[:3], AMQP1_SASL[3:]):
                writer.write(piece)
                await writer.drain()
            assert await read_exactly(reader, 8) == AMQP1_SASL
            transport = Echo.made[0].transport
            assert transport is not None and transport.get_extra_info("ssl_object") is not None
            await echo_round(reader, writer)

    run(scenario)


def test_a_client_stopping_inside_its_header_times_out(
    run: Callable[[Scenario], None], tmp_path: Path
) -> None:
    """The handshake's timeout (on the broker's clock) covers the header too."""

    async def scenario() -> None:
        clock = ManualClock()
        async with serve(tmp_path, clock=clock) as broker:
            listener = amqp_listener(broker)
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(b"AMQ")
            await wait_until(holding(listener, b"AMQ"))
            clock.advance(HANDSHAKE_TIMEOUT_MS - 1)
            assert holding(listener, b"AMQ")()
            clock.advance(1)
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
            writer.close()
            assert not listener.protocols and not Echo.made

    run(scenario)


# -- 0-9-1 unaffected ---------------------------------------------------------------------
def test_091_clients_are_unaffected(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
            connection = await asyncio.wait_for(aio_pika.connect(url), TIMEOUT)
            async with connection:
                channel = await connection.channel()
                queue = await channel.declare_queue("handoff-q")
                await channel.default_exchange.publish(
                    aio_pika.Message(b"body"), routing_key="handoff-q"
                )
                message = await queue.get(timeout=TIMEOUT)
                assert message is not None and message.body == b"body"
                await message.ack()
            assert not Echo.made

    run(scenario)


def test_091_header_cut_across_writes(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            for piece in (PROTOCOL_HEADER[:5], PROTOCOL_HEADER[5:]):
                writer.write(piece)
                await writer.drain()
            head = await read_exactly(reader, 7)
            body = await read_exactly(reader, int.from_bytes(head[3:7], "big") + 1)
            _, _, start = frame.unmarshal(head + body)
            assert isinstance(start, commands.Connection.Start)
            writer.close()

    run(scenario)


@pytest.mark.parametrize("header", [b"HTTP/1.1", b"AMQP\x02\x01\x00\x00"])
def test_an_unknown_header_gets_091s_header_and_the_close(
    run: Callable[[Scenario], None], tmp_path: Path, header: bytes
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(header)
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == PROTOCOL_HEADER
            writer.close()
            assert not Echo.made

    run(scenario)


def test_without_handoffs_an_amqp1_header_is_unknown(
    run: Callable[[Scenario], None], tmp_path: Path
) -> None:
    """As before AMQP 1.0 (and as RabbitMQ 3.10 without its rabbitmq_amqp1_0 plugin)."""

    async def scenario() -> None:
        async with serve(tmp_path, handoffs={}) as broker:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(AMQP1)
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == PROTOCOL_HEADER
            writer.close()
            assert not amqp_listener(broker).handoffs

    run(scenario)


def test_stopping_closes_a_client_still_sending_its_header(
    run: Callable[[Scenario], None], tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as broker:
            listener = amqp_listener(broker)
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.amqp_port)
            writer.write(b"AMQP")
            await wait_until(holding(listener, b"AMQP"))
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()

    run(scenario)


# -- over WebSocket on the HTTP port ---------------------------------------------------------
@pytest.mark.parametrize("path", ["/ws", "/ws/amqp"])
def test_websocket_amqp_subprotocol(
    run: Callable[[Scenario], None], tmp_path: Path, path: str
) -> None:
    """RabbitMQ 4's AMQP 1.0 over WebSocket (``/ws``, subprotocol ``amqp``); the
    0-9-1 endpoint hands a 1.0 header over in the same way."""

    async def scenario() -> None:
        async with serve(tmp_path) as broker, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{http_port(broker)}{path}"
            async with session.ws_connect(url, protocols=["amqp"]) as ws:
                assert ws.protocol == "amqp"
                await ws.send_bytes(AMQP1[:4])
                await ws.send_bytes(AMQP1[4:] + b"hello")
                got = b""
                while len(got) < 13:
                    got += await asyncio.wait_for(ws.receive_bytes(), TIMEOUT)
                assert got == AMQP1 + b"hello"
                await ws.send_bytes(b"bye")
                assert await asyncio.wait_for(ws.receive_bytes(), TIMEOUT) == b"bye"
                msg = await asyncio.wait_for(ws.receive(), TIMEOUT)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert len(Echo.made) == 1
            await asyncio.wait_for(Echo.made[0].lost, TIMEOUT)

    run(scenario)


def test_websocket_091_on_ws(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    """/ws is the AMQP port's protocols over WebSocket: 0-9-1 is still 0-9-1's."""

    async def scenario() -> None:
        async with serve(tmp_path) as broker, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{http_port(broker)}/ws"
            async with session.ws_connect(url, protocols=["amqp"]) as ws:
                await ws.send_bytes(PROTOCOL_HEADER)
                data = await asyncio.wait_for(ws.receive_bytes(), TIMEOUT)
                _, _, start = frame.unmarshal(data)
                assert isinstance(start, commands.Connection.Start)
            assert not Echo.made

    run(scenario)


def test_no_ws_endpoint_without_handoffs(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, handoffs={}) as broker, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{http_port(broker)}/ws"
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await session.ws_connect(url)

    run(scenario)
