"""A shovel or federation link whose peer stops answering never holds up a
broker stop, and gives up on it within its timeouts.

The peer here is a socket that accepts TCP, answers the AMQP protocol header
with connection.start and then goes silent (mid-handshake), or completes the
handshake and goes silent at the link's first queue.declare (mid-RPC). The
handshake and each RPC are bounded by the link's ``connection_timeout`` and
``rpc_timeout`` on the broker's clock; a stop ends at once whatever the link
awaits. Nothing waits for time to pass: the clock is a ManualClock."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api
from pamqp import commands
from rawamqp import Closed, RawAMQP, Timeout

from warren.core.clock import ManualClock
from warren.links import CONNECTION_TIMEOUT_MS, RPC_TIMEOUT_MS, Timeouts

#: Far more than a stop takes (seconds), far less than aiormq's heartbeat grace (3 min).
PROMPT = 10.0


class SilentPeer:
    """A peer that plays the server's side of AMQP up to ``stage`` ("handshake":
    after connection.start; "declare": at the first queue or exchange declare), then reads
    and answers nothing. ``reached`` is set there; ``closed`` once the link
    closed its socket."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reached = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.server.settimeout(PROMPT * 3)
        sock, _ = self.server.accept()
        peer = RawAMQP.__new__(RawAMQP)
        super(RawAMQP, peer).__init__(PROMPT * 3)
        peer.sock = sock
        try:
            peer.read_frame()  # the protocol header
            peer.send_method(
                0,
                commands.Connection.Start(
                    server_properties={"capabilities": {"publisher_confirms": True}},
                    mechanisms="PLAIN",
                    locales="en_US",
                ),
            )
            if self.stage == "declare":
                peer.expect_method(commands.Connection.StartOk)
                peer.send_method(0, commands.Connection.Tune(2047, 131072, 0))
                peer.expect_method(commands.Connection.TuneOk)
                peer.expect_method(commands.Connection.Open)
                peer.send_method(0, commands.Connection.OpenOk())
                while True:
                    ch, method = peer.read_frame()
                    if isinstance(method, commands.Channel.Open):
                        peer.send_method(ch, commands.Channel.OpenOk())
                    elif isinstance(method, commands.Confirm.Select):
                        peer.send_method(ch, commands.Confirm.SelectOk())
                    elif isinstance(method, commands.Queue.Declare | commands.Exchange.Declare):
                        break
            self.reached.set()
            while True:  # silent: read what comes, answer nothing
                peer.read_frame()
        except Closed:
            self.closed.set()
        except Timeout:
            pass
        finally:
            peer.close_socket()

    def close(self) -> None:
        self.server.close()


@pytest.fixture(params=["handshake", "declare"])
def silent(request: pytest.FixtureRequest) -> Iterator[SilentPeer]:
    peer = SilentPeer(request.param)
    yield peer
    peer.close()


def _shovel(broker: BrokerThread, port: int, query: str = "", **extra: Any) -> None:
    value = {
        "src-uri": "amqp://",
        "src-queue": "x",
        "dest-uri": f"amqp://guest:guest@127.0.0.1:{port}/%2F{query}",
        "dest-queue": "y",
        **extra,
    }
    assert Api(broker.http_port).put("/api/parameters/shovel/%2F/s", {"value": value}).status == 201


def _federate(broker: BrokerThread, port: int, query: str = "", **extra: Any) -> None:
    api = Api(broker.http_port)
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{port}/%2F{query}", **extra}
    assert api.put("/api/parameters/federation-upstream/%2F/origin", {"value": value}).status == 201
    policy = {
        "pattern": "^fed$",
        "apply-to": "exchanges",
        "definition": {"federation-upstream": "origin"},
    }
    assert api.put("/api/policies/%2F/fed", policy).status in (201, 204)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        conn.channel().exchange_declare("fed", "topic")


LINKS: dict[str, Callable[..., None]] = {"shovel": _shovel, "federation": _federate}


@pytest.mark.parametrize("kind", sorted(LINKS))
def test_a_stop_while_the_peer_is_silent_is_prompt(
    tmp_path: Path, silent: SilentPeer, kind: str
) -> None:
    a = start_broker(tmp_path / "a", clock=ManualClock())
    try:
        LINKS[kind](a, silent.port)
        assert silent.reached.wait(PROMPT), f"the {kind} never got to the {silent.stage}"
        a.stop(timeout=PROMPT)
        assert silent.closed.wait(PROMPT), "the link left its socket open"
    finally:
        a.stop()


def _links(broker: BrokerThread, kind: str) -> Any:
    return broker.broker.parameter_components[
        "shovel" if kind == "shovel" else "federation-upstream"
    ]


def _failed(broker: BrokerThread, kind: str) -> dict[str, Any]:
    """The link once it failed (woken by its changes of state, no polling)."""
    failed = "terminated" if kind == "shovel" else "error"

    if kind == "shovel":

        async def wait() -> dict[str, Any]:
            shovel = _links(broker, kind).shovels[("/", "s")]
            return await shovel.wait_for_state(lambda s: s == failed, PROMPT)

        info: dict[str, Any] = broker.run(wait(), PROMPT + 5)
        return info

    def check(links: list[dict[str, Any]]) -> dict[str, Any] | None:
        return links[0] if links and links[0]["status"] == failed else None

    info = broker.run(_links(broker, kind).wait_for(check, PROMPT), PROMPT + 5)
    return info


def _state(broker: BrokerThread, kind: str) -> str:
    status = broker.call(_links(broker, kind).status)
    (link,) = status
    return str(link.get("state") or link.get("status"))


@pytest.mark.parametrize("kind", sorted(LINKS))
def test_a_silent_peer_fails_the_link_after_its_timeout(
    tmp_path: Path, silent: SilentPeer, kind: str
) -> None:
    """``connection_timeout`` bounds the handshake, ``rpc_timeout`` each RPC
    (URI query parameters, ms), on the broker's clock: the link fails with a
    reason that says so, closes its socket and will try again."""
    name = "connection_timeout" if silent.stage == "handshake" else "rpc_timeout"
    a = start_broker(tmp_path / "a", clock=ManualClock())
    try:
        LINKS[kind](a, silent.port, query=f"?{name}=5000")
        assert silent.reached.wait(PROMPT), f"the {kind} never got to the {silent.stage}"
        a.advance(4999)
        assert _state(a, kind) == "starting"
        a.advance(1)
        info = _failed(a, kind)
        reason = info.get("reason") or info.get("error")
        assert reason is not None and "no answer within 5 s" in reason, info
        assert silent.closed.wait(PROMPT), "the link left its socket open"
    finally:
        a.stop()


def test_timeouts_are_read_from_the_uri() -> None:
    assert Timeouts.of("amqp://h/%2F") == Timeouts(CONNECTION_TIMEOUT_MS, RPC_TIMEOUT_MS)
    assert Timeouts.of("amqp://h/%2F?connection_timeout=10000&rpc_timeout=2500") == Timeouts(
        10000, 2500
    )
    with pytest.raises(ValueError, match="connection_timeout must be a positive"):
        Timeouts.of("amqp://h/%2F?connection_timeout=soon")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/parameters/shovel/%2F/s",
            {"value": {"src-uri": "amqp://h?rpc_timeout=0", "src-queue": "a",
                       "dest-uri": "amqp://", "dest-queue": "b"}},
        ),
        (
            "/api/parameters/shovel/%2F/s",
            {"value": {"src-uri": "amqp://", "src-queue": "a",
                       "dest-uri": ["amqp://", "amqp://h?connection_timeout=soon"],
                       "dest-queue": "b"}},
        ),
        (
            "/api/parameters/federation-upstream/%2F/u",
            {"value": {"uri": "amqp://h?connection_timeout=-5"}},
        ),
    ],
    ids=["shovel-rpc-timeout", "shovel-dest-connection-timeout", "upstream-connection-timeout"],
)
def test_a_bad_timeout_is_refused_when_saved(tmp_path: Path, path: str, body: Any) -> None:
    """A URI whose connection_timeout or rpc_timeout is not a positive number of
    milliseconds is refused with the definition (400, the value named), not left
    to fail the link when it first connects."""
    broker = start_broker(tmp_path)
    try:
        api = Api(broker.http_port)
        reply = api.put(path, body)
        assert reply.status == 400, reply
        reason = reply.json()["reason"]
        assert "must be a positive number of milliseconds" in reason, reason
        assert api.get(path.rsplit("/", 1)[0]) == []
    finally:
        broker.stop()
