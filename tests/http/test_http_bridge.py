"""The HTTP bridge (/bridge/, docs/http-bridge.md) with real clients: aiohttp over
the HTTP port on one side, pika over AMQP on the other. Timeouts (long-poll
waits, visibility, idle consumers, the SSE heartbeat) run on a ManualClock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
import pytest_asyncio
from conftest import BrokerThread
from httphelp import Api
from mqttclient import Client

from warren.config import Config
from warren.core.clock import ManualClock
from warren.http.bridge import HEARTBEAT_MS
from warren.http.bridge_consumer import REQUESTS_PER_SECOND

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


@pytest.fixture
def b(broker_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_factory(clock=ManualClock(), http_bridge_max_body_size=4096)


@pytest_asyncio.fixture
async def http(b: BrokerThread) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        base_url=f"http://127.0.0.1:{b.http_port}", headers=AUTH
    ) as session:
        yield session


def amqp(b: BrokerThread) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))


def declare(b: BrokerThread, queue: str) -> None:
    with amqp(b) as conn:
        conn.channel().queue_declare(queue, durable=True)


def publish(b: BrokerThread, queue: str, *bodies: bytes) -> None:
    with amqp(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(content_type="text/plain"))


def depth(b: BrokerThread, queue: str) -> int:
    return int(b.call(lambda: b.broker.vhosts["/"].queues[queue].message_count))


async def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + 30
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return result


def waiting(b: BrokerThread) -> bool:
    """Whether some bridge consumer's request waits on the clock."""
    bridge = b.broker.listener("http").app.bridge  # type: ignore[attr-defined]
    return bool(b.call(lambda: any(s._wake is not None for s in bridge.consumers.values())))


def lost_connections(b: BrokerThread) -> int:
    """The HTTP connections the broker's HTTP server has lost while their
    handler still runs (as an SSE stream's does until its next heartbeat)."""
    runner = b.broker.listener("http")._runner  # type: ignore[attr-defined]
    return int(b.call(lambda: sum(h.transport is None for h in runner.server.connections)))


async def consumer(http: aiohttp.ClientSession, queue: str, **options: Any) -> str:
    async with http.post(f"/bridge/queues/%2F/{queue}/consumers", json=options) as reply:
        assert reply.status == 201, await reply.text()
        return str((await reply.json())["id"])


async def poll(http: aiohttp.ClientSession, cid: str, **query: Any) -> list[dict[str, Any]]:
    async with http.get(f"/bridge/consumers/{cid}/messages", params=query) as reply:
        assert reply.status == 200, await reply.text()
        return list(await reply.json())


# -- publishing -----------------------------------------------------------------------------


async def test_raw_publish_reaches_a_pika_consumer_with_its_properties(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "jobs")
    headers = {
        "Content-Type": "application/json",
        "X-Warren-Routing-Key": "jobs",
        "X-Warren-Delivery-Mode": "2",
        "X-Warren-Message-Id": "m-1",
        "X-Warren-Priority": "3",
        "X-Warren-Header-Tenant": "acme",
    }
    async with http.post(
        "/bridge/exchanges/%2F/amq.default", data=b'{"n":1}', headers=headers
    ) as r:
        assert (r.status, await r.json()) == (201, {"routed": True})
    with amqp(b) as conn:
        method, props, body = conn.channel().basic_get("jobs", auto_ack=True)
    assert body == b'{"n":1}' and method.routing_key == "jobs"
    assert props.content_type == "application/json"
    assert (props.delivery_mode, props.message_id, props.priority) == (2, "m-1", 3)
    assert props.headers == {"tenant": "acme"}
    # Nowhere to go: accepted, not routed.
    headers["X-Warren-Routing-Key"] = "nobody"
    async with http.post("/bridge/exchanges/%2F/amq.default", data=b"x", headers=headers) as r:
        assert (r.status, await r.json()) == (202, {"routed": False})


async def test_mqtt_topic_and_json_lines(b: BrokerThread, http: aiohttp.ClientSession) -> None:
    with amqp(b) as conn:
        ch = conn.channel()
        ch.queue_declare("temps")
        ch.queue_bind("temps", "amq.topic", "sensors.*.temp")
    subscriber = Client(b.mqtt_port, "watcher", username="guest", password="guest")
    subscriber.connect()
    subscriber.subscribe("sensors/+/temp", qos=1)
    async with http.post("/bridge/topics/%2F/sensors/room1/temp", data=b"21.5") as r:
        assert r.status == 201
    got = subscriber.next()
    subscriber.close()
    assert (got.topic, got.payload, got.qos) == ("sensors/room1/temp", b"21.5", 1)
    lines = (
        json.dumps({"routing_key": "sensors.a.temp", "payload": "1"})
        + "\n"
        + json.dumps({"routing_key": "other", "payload": "aGk=", "payload_encoding": "base64"})
        + "\n"
    )
    async with http.post("/bridge/exchanges/%2F/amq.topic?format=jsonl", data=lines) as r:
        assert (r.status, await r.json()) == (200, {"outcomes": ["routed", "unroutable"]})
    with amqp(b) as conn:
        ch = conn.channel()
        first = ch.basic_get("temps", auto_ack=True)
        second = ch.basic_get("temps", auto_ack=True)
    assert (first[0].routing_key, first[2]) == ("sensors.room1.temp", b"21.5")
    assert (first[0].exchange, second[2]) == ("amq.topic", b"1")
    async with http.post("/bridge/topics/%2F/sensors/%2B/temp", data=b"x") as r:
        assert r.status == 400  # a filter, not a topic name


# -- consuming ------------------------------------------------------------------------------


async def test_long_poll_ack_and_nack(b: BrokerThread, http: aiohttp.ClientSession) -> None:
    declare(b, "work")
    publish(b, "work", b"one", b"two")
    cid = await consumer(http, "work", prefetch=5)
    # A consumer of the queue as the management API counts them.
    assert Api(b.http_port).get("/api/queues/%2F/work")["consumers"] == 1
    got = await poll(http, cid, max=10)
    assert [m["payload"] for m in got] == ["one", "two"]
    assert got[0]["properties"]["content_type"] == "text/plain"
    async with http.post(f"/bridge/consumers/{cid}/ack", json={"ids": [got[0]["id"]]}) as r:
        assert await r.json() == {"settled": 1, "unknown": []}
    async with http.post(f"/bridge/consumers/{cid}/nack", json={"ids": [got[1]["id"], 999]}) as r:
        assert await r.json() == {"settled": 1, "unknown": [999]}
    again = await poll(http, cid, max=10)
    assert [(m["payload"], m["redelivered"]) for m in again] == [("two", True)]
    async with http.post(f"/bridge/consumers/{cid}/ack", json={"ids": [again[0]["id"]]}) as r:
        assert r.status == 200
    assert depth(b, "work") == 0
    async with http.delete(f"/bridge/consumers/{cid}") as r:
        assert r.status == 204
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 404


async def test_long_poll_waits_on_the_node_clock(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "later")
    cid = await consumer(http, "later")
    # Nothing comes: the answer is empty once the wait has passed on the node clock.
    task = asyncio.create_task(poll(http, cid, wait=20))
    await until(lambda: waiting(b), "the poll to wait")
    b.advance(19_000)
    await asyncio.sleep(0.1)
    assert not task.done()
    b.advance(1_000)
    assert await task == []
    # A message published while one waits ends the wait at once; a second poll
    # of the same consumer meanwhile is refused.
    task = asyncio.create_task(poll(http, cid, wait=20))
    await until(lambda: waiting(b), "the poll to wait")
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 409
    publish(b, "later", b"now")
    assert [m["payload"] for m in await task] == ["now"]


async def test_unacked_go_back_after_the_visibility_timeout_and_when_idle(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "vis")
    publish(b, "vis", b"m")
    cid = await consumer(http, "vis", visibility_timeout=10, idle_timeout=120)
    first = await poll(http, cid)
    assert [m["redelivered"] for m in first] == [False]
    assert depth(b, "vis") == 0  # out for 10 s: not ready for anyone else
    b.advance(10_000)
    second = await poll(http, cid)
    assert [(m["payload"], m["redelivered"]) for m in second] == [("m", True)]
    async with http.post(f"/bridge/consumers/{cid}/ack", json={"ids": [first[0]["id"]]}) as r:
        assert await r.json() == {"settled": 0, "unknown": [first[0]["id"]]}
    # Nobody uses the consumer for its idle timeout: it is closed, the message goes
    # back, and pika gets it.
    b.advance(120_000)
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 404
    with amqp(b) as conn:
        method, _props, body = conn.channel().basic_get("vis", auto_ack=True)
    assert (body, method.redelivered) == (b"m", True)


async def test_server_sent_events_and_a_dropped_stream(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "sse")
    publish(b, "sse", b"a", b"b", b"c")
    cid = await consumer(http, "sse", prefetch=2, visibility_timeout=3600)
    events: list[dict[str, Any]] = []
    reply = await http.get(f"/bridge/consumers/{cid}/events")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    while len(events) < 2:  # the prefetch: two unacked at most
        line = await reply.content.readline()
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    assert [e["payload"] for e in events] == ["a", "b"]
    async with http.post(f"/bridge/consumers/{cid}/ack", json={"ids": [events[0]["id"]]}) as r:
        assert await r.json() == {"settled": 1, "unknown": []}
    while True:
        line = await reply.content.readline()
        if line.startswith(b"data: "):
            assert json.loads(line[6:])["payload"] == "c"
            break
    # The client goes away with "b" and "c" unacked: noticed by the next
    # heartbeat at the latest, the consumer closes and both go back.
    reply.close()
    await until(lambda: lost_connections(b), "the server to see the drop")
    assert depth(b, "sse") == 0
    b.advance(HEARTBEAT_MS)
    await until(lambda: depth(b, "sse") == 2, "the unacked to go back")
    await until(lambda: not waiting(b), "the stream to end")
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 404
    with amqp(b) as conn:
        ch = conn.channel()
        bodies = [ch.basic_get("sse", auto_ack=True)[2] for _ in range(2)]
    assert sorted(bodies) == [b"b", b"c"]


# -- refusals -------------------------------------------------------------------------------


async def test_auth_permissions_and_body_limit(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "secret")
    api = Api(b.http_port)
    assert api.put("/api/users/reader", {"password": "pw", "tags": ""}).status == 201
    perms = {"configure": "", "write": "", "read": "^secret$"}
    assert api.put("/api/permissions/%2F/reader", perms).status == 201
    url = "/bridge/exchanges/%2F/amq.default"
    reader = {"Authorization": aiohttp.encode_basic_auth("reader", "pw")}
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{b.http_port}") as anon:
        async with anon.post(url, data=b"x") as r:
            assert r.status == 401
        async with anon.post(
            url, data=b"x", headers={"Authorization": aiohttp.encode_basic_auth("guest", "bad")}
        ) as r:
            assert r.status == 401
        async with anon.post(url, data=b"x", headers=reader) as r:
            assert r.status == 403  # no write on the exchange
        async with anon.post("/bridge/queues/%2F/secret/consumers", headers=reader) as r:
            assert r.status == 201  # no management tag needed: read on the queue is enough
            cid = (await r.json())["id"]
        async with anon.get(f"/bridge/consumers/{cid}/messages") as r:
            assert r.status == 401
        async with http.get(f"/bridge/consumers/{cid}/messages") as r:
            assert r.status == 404  # another user's consumer
    # Topic permissions hold for an MQTT topic as for an MQTT publisher.
    assert api.put("/api/users/sensor", {"password": "pw", "tags": ""}).status == 201
    perms = {"configure": "", "write": ".*", "read": ""}
    assert api.put("/api/permissions/%2F/sensor", perms).status == 201
    topic = {"exchange": "amq.topic", "write": "^sensors\\.", "read": ".*"}
    assert api.put("/api/topic-permissions/%2F/sensor", topic).status == 201
    sensor = {"Authorization": aiohttp.encode_basic_auth("sensor", "pw")}
    async with http.post("/bridge/topics/%2F/sensors/a", data=b"1", headers=sensor) as r:
        assert r.status == 202  # allowed (and no queue bound)
    async with http.post("/bridge/topics/%2F/alarms/a", data=b"1", headers=sensor) as r:
        assert r.status == 403
    # Another connection's exclusive queue, or an exclusive consumer's: locked.
    with amqp(b) as conn:
        ch = conn.channel()
        ch.queue_declare("mine", exclusive=True)
        async with http.post("/bridge/queues/%2F/mine/consumers") as r:
            assert r.status == 409
        ch.queue_declare("solo")
        ch.basic_consume("solo", lambda *a: None, exclusive=True)
        async with http.post("/bridge/queues/%2F/solo/consumers") as r:
            assert r.status == 403  # AMQP's 403 ACCESS_REFUSED, as RabbitMQ's
    declare(b, "other")
    async with http.post("/bridge/queues/%2F/other/consumers", headers=reader) as r:
        assert r.status == 403  # no read on that queue
    async with http.post(url, data=b"x" * 5000, headers={"X-Warren-Routing-Key": "secret"}) as r:
        assert r.status == 413
    # Refused before it is sent when the client asks first (curl does over 1 KiB).
    big = {"X-Warren-Routing-Key": "secret"}
    async with http.post(url, data=b"x" * 5000, headers=big, expect100=True) as r:
        assert r.status == 413
    async with http.post(url, data=b"x" * 2000, headers=big, expect100=True) as r:
        assert r.status == 201
    async with http.post(url, data=b"x" * 2000, headers=big) as r:
        assert r.status == 201
    assert depth(b, "secret") == 2


async def test_envelope_nack_without_requeue_and_a_deleted_queue(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    with amqp(b) as conn:
        ch = conn.channel()
        ch.queue_declare("dead")
        ch.queue_declare(
            "live", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
        )
    envelope = {"routing_key": "live", "payload": "x", "properties": {"user_id": "mallory"}}
    url = "/bridge/exchanges/%2F/amq.default?format=envelope"
    async with http.post(url, json=envelope) as r:
        assert r.status == 403  # user_id must be the user's, as over AMQP
    envelope["properties"] = {"user_id": "guest", "type": "t"}
    async with http.post(url, json=envelope) as r:
        assert (r.status, await r.json()) == (201, {"routed": True})
    cid = await consumer(http, "live")
    (msg,) = await poll(http, cid)
    assert msg["properties"]["type"] == "t"
    async with http.post(
        f"/bridge/consumers/{cid}/nack", json={"ids": [msg["id"]], "requeue": False}
    ) as r:
        assert await r.json() == {"settled": 1, "unknown": []}
    assert (depth(b, "live"), depth(b, "dead")) == (0, 1)  # dead-lettered
    # The queue goes while a poll waits: the poll ends empty, the consumer with it.
    task = asyncio.create_task(poll(http, cid, wait=30))
    await until(lambda: waiting(b), "the poll to wait")
    with amqp(b) as conn:
        conn.channel().queue_delete("live")
    assert await task == []
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 404


async def test_requests_of_a_consumer_are_rate_limited(
    b: BrokerThread, http: aiohttp.ClientSession
) -> None:
    declare(b, "busy")
    cid = await consumer(http, "busy")
    for _ in range(REQUESTS_PER_SECOND):  # the burst
        assert await poll(http, cid) == []
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert (r.status, r.headers["Retry-After"]) == (429, "1")
    b.advance(1000 / REQUESTS_PER_SECOND)  # one more, a tenth of a second on
    assert await poll(http, cid) == []
    async with http.get(f"/bridge/consumers/{cid}/messages") as r:
        assert r.status == 429


# -- settings and restarts ------------------------------------------------------------------


async def test_the_bridge_limits_are_settings(
    broker_factory: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[mgmt]\nbridge_max_wait = 5\nbridge_visibility_timeout = 7\n"
        "bridge_max_visibility_timeout = 20\nbridge_max_consumers_per_user = 2\n"
    )
    settings = {
        f.name: getattr(Config.from_ini(ini), f.name)
        for f in dataclasses.fields(Config)
        if f.name.startswith("http_bridge_")
    }
    assert settings["http_bridge_max_wait"] == 5
    b = broker_factory(clock=ManualClock(), **settings)
    declare(b, "limits")
    async with aiohttp.ClientSession(
        base_url=f"http://127.0.0.1:{b.http_port}", headers=AUTH
    ) as http:
        url = "/bridge/queues/%2F/limits/consumers"
        async with http.post(url) as reply:
            made = await reply.json()
        assert made["visibility_timeout"] == 7  # the setting's default
        async with http.post(url, json={"visibility_timeout": 21}) as reply:
            assert reply.status == 400
            assert "visibility_timeout must be from 1 to 20" in await reply.text()
        cid = await consumer(http, "limits", visibility_timeout=20)
        async with http.post(url) as reply:  # a third: over the user's two
            assert reply.status == 429
        async with http.get(f"/bridge/consumers/{cid}/messages", params={"wait": 6}) as reply:
            assert reply.status == 400
        publish(b, "limits", b"x")
        assert [m["payload"] for m in await poll(http, cid, wait=5)] == ["x"]


async def test_a_consumer_is_gone_after_a_restart_and_its_messages_are_back(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    """Bridge consumers live in memory: after a restart the old id answers 404
    with what to do, and the new consumer gets what the old one had not acked."""
    b = broker_factory()
    declare(b, "kept")
    with amqp(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in (b"one", b"two"):
            ch.basic_publish("", "kept", body, pika.BasicProperties(delivery_mode=2))
    async with aiohttp.ClientSession(
        base_url=f"http://127.0.0.1:{b.http_port}", headers=AUTH
    ) as http:
        cid = await consumer(http, "kept", prefetch=10)
        got = await poll(http, cid, max=10)
        assert [m["payload"] for m in got] == ["one", "two"]
        async with http.post(f"/bridge/consumers/{cid}/ack", json={"ids": [got[0]["id"]]}) as r:
            assert await r.json() == {"settled": 1, "unknown": []}
    b.stop()
    b = broker_factory()
    async with aiohttp.ClientSession(
        base_url=f"http://127.0.0.1:{b.http_port}", headers=AUTH
    ) as http:
        for method, path in (
            ("GET", f"/bridge/consumers/{cid}/messages"),
            ("POST", f"/bridge/consumers/{cid}/ack"),
            ("DELETE", f"/bridge/consumers/{cid}"),
        ):
            async with http.request(method, path, json={"ids": [got[1]["id"]]}) as r:
                assert r.status == 404
                body = await r.json()
            assert body["error"] == "consumer_not_found"
            assert "broker restarted" in body["reason"] and "POST /bridge/queues/" in body["reason"]
        again = await poll(http, await consumer(http, "kept"), max=10)
        assert [(m["payload"], m["redelivered"]) for m in again] == [("two", True)]
