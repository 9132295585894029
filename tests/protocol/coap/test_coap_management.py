"""CoAP clients in the management API and the Prometheus metrics: aiocoap's
client observes and publishes; /api/connections lists its source address with
protocol "CoAP", /api/consumers its observation, DELETE closes it (its
observation ends), and it is forgotten when idle on the broker's ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiocoap
import pytest
from aiocoap import Code, Message
from coaphelp import HOST, Raw, coap_port
from conftest import BrokerThread, start_broker
from httphelp import Api
from metricshelp import scrape, value

from warren.coap import codec as C
from warren.core.clock import ManualClock

pytestmark = [pytest.mark.timeout(120)]

IDLE_S = 60


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path,
        clock=ManualClock(),
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
        coap_client_idle_timeout=IDLE_S,
    )
    try:
        yield b
    finally:
        b.stop()


def api(b: BrokerThread) -> Api:
    listener = b.broker.listener("http")
    assert listener is not None
    return Api(listener.port)


def coap_connections(b: BrokerThread) -> list[dict[str, Any]]:
    return [c for c in api(b).get("/api/connections") if c["protocol"] == "CoAP"]


def coap_queues(b: BrokerThread) -> list[str]:
    return b.call(
        lambda: [q for q in b.broker.vhosts["/"].queues if q.startswith("coap-subscription-")]
    )


def run(coro_fn: Any) -> Any:
    async def main() -> Any:
        ctx = await aiocoap.Context.create_client_context()
        try:
            return await asyncio.wait_for(coro_fn(ctx), 60)
        finally:
            await ctx.shutdown()

    return asyncio.run(main())


def test_an_observer_is_listed_closed_and_its_observation_ended(broker: BrokerThread) -> None:
    base = f"coap://{HOST}:{coap_port(broker)}/ps"
    admin = api(broker)

    async def scenario(ctx: aiocoap.Context) -> None:
        req = ctx.request(Message(code=Code.GET, uri=f"{base}/room/+/temp", observe=0))
        assert (await req.response).code == Code.CONTENT
        post = Message(code=Code.POST, uri=f"{base}/room/1/temp", payload=b"21")
        assert (await ctx.request(post).response).code == Code.CHANGED
        notes = req.observation.__aiter__()
        assert (await notes.__anext__()).payload == b"21"

        conns = await asyncio.to_thread(coap_connections, broker)
        assert len(conns) == 1
        conn = conns[0]
        assert (conn["user"], conn["vhost"], conn["peer_host"]) == ("guest", "/", HOST)
        assert conn["observations"] == 1 and conn["state"] == "running"
        assert conn["recv_cnt"] >= 2 and conn["send_cnt"] >= 3  # GET, POST, ACK / answers
        assert conn["port"] == coap_port(broker) and conn["timeout"] == IDLE_S
        consumers = await asyncio.to_thread(admin.get, "/api/consumers")
        [consumer] = [
            c for c in consumers if c["channel_details"]["connection_name"] == conn["name"]
        ]
        assert consumer["queue"]["name"] == coap_queues(broker)[0]
        assert consumer["ack_required"] is True

        m = await asyncio.to_thread(scrape, broker)
        assert value(m, "rabbitmq_connections") == 1
        assert value(m, "rabbitmq_global_consumers", protocol="coap") == 1

        closed = await asyncio.to_thread(
            admin.delete, "/api/connections/" + conn["name"].replace(" ", "%20").replace(">", "%3E")
        )
        assert closed.status == 204
        # A 5.03 notification ends the observation there (aiocoap may pass it on first).
        codes = []
        with pytest.raises(StopAsyncIteration):
            for _ in range(2):
                codes.append((await notes.__anext__()).code)
        assert set(codes) <= {Code.SERVICE_UNAVAILABLE}
        assert coap_queues(broker) == []
        assert await asyncio.to_thread(coap_connections, broker) == []
        # Its next request lists it again.
        assert (await ctx.request(post).response).code == Code.CHANGED
        assert len(await asyncio.to_thread(coap_connections, broker)) == 1

    run(scenario)


def test_an_idle_client_is_forgotten_unless_it_observes(broker: BrokerThread) -> None:
    base = f"coap://{HOST}:{coap_port(broker)}/ps"

    async def publish_only(ctx: aiocoap.Context) -> None:
        post = Message(code=Code.POST, uri=f"{base}/idle/x", payload=b"1")
        assert (await ctx.request(post).response).code == Code.CHANGED

    run(publish_only)
    assert len(coap_connections(broker)) == 1
    broker.advance(IDLE_S * 1000 - 1000)
    assert len(coap_connections(broker)) == 1
    broker.advance(2000)
    assert coap_connections(broker) == []

    async def observe(ctx: aiocoap.Context) -> None:
        req = ctx.request(Message(code=Code.GET, uri=f"{base}/idle/#", observe=0))
        assert (await req.response).code == Code.CONTENT
        await asyncio.to_thread(broker.advance, IDLE_S * 3000)
        conns = await asyncio.to_thread(coap_connections, broker)
        assert len(conns) == 1 and conns[0]["observations"] == 1

    run(observe)


def test_connection_limits_bound_the_clients_listed(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path,
        clock=ManualClock(),
        stream_port=-1,
        prometheus_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
        max_connections=1,
    )
    first, second = Raw(coap_port(b)), Raw(coap_port(b))
    try:
        b.call(lambda: b.broker.users.set_limit("guest", "max-connections", 1))
        first.request(C.POST, "ps/cap/x", payload=b"1")
        assert first.receive().code == Code.CHANGED
        # Listed already: counted by the node's and the user's limits, not refused.
        first.request(C.POST, "ps/cap/x", payload=b"2")
        assert first.receive().code == Code.CHANGED
        second.request(C.POST, "ps/cap/x", payload=b"3")
        refused = second.receive()  # the user's limit
        assert refused.code == Code.SERVICE_UNAVAILABLE and b"user connection limit" in (
            refused.payload
        )
        b.call(lambda: b.broker.users.set_limit("guest", "max-connections", 10))
        second.request(C.POST, "ps/cap/x", payload=b"4")
        refused = second.receive()  # the node's
        assert (refused.code, refused.opt.max_age) == (Code.SERVICE_UNAVAILABLE, 5)
        assert [c["peer_port"] for c in coap_connections(b)] == [first.sock.getsockname()[1]]
    finally:
        first.close()
        second.close()
        b.stop()


def test_a_login_as_another_user_lists_the_address_anew(broker: BrokerThread) -> None:
    broker.call(lambda: broker.broker.users.add_user("dev", "secret"))
    broker.call(lambda: broker.broker.users.set_permissions("dev", "/"))
    client = Raw(coap_port(broker))
    try:
        client.request(C.POST, "ps/who/x", payload=b"1")
        assert client.receive().code == Code.CHANGED
        [guest] = coap_connections(broker)
        client.request(C.POST, "ps/who/x", query=("u=dev", "p=secret"), payload=b"2")
        assert client.receive().code == Code.CHANGED
        [dev] = coap_connections(broker)
        assert (guest["user"], dev["user"], dev["name"]) == ("guest", "dev", guest["name"])
        m = scrape(broker)
        assert value(m, "rabbitmq_connections_opened_total") == 2
        assert value(m, "rabbitmq_connections_closed_total") == 1
    finally:
        client.close()
