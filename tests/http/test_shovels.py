"""Dynamic shovels between real brokers: defined through the management API
(runtime parameters of the ``shovel`` component), moving messages with every
ack mode, reporting their state, surviving a restart of either end, deleting
themselves after src-delete-after, posting to an HTTP endpoint, and exported
and imported with the definitions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from aiohttp import web
from conftest import BrokerThread, start_broker
from httphelp import Api

from warren import Config
from warren.core.clock import ManualClock
from warren.shovel.component import ShovelComponent

PERSISTENT = pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id="m-1")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[BrokerThread, BrokerThread]]:
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _publish(port: int, queue: str, count: int, start: int = 0, exchange: str = "") -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        if not exchange:
            ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(start, start + count):
            ch.basic_publish(exchange, queue, b"msg-%d" % i, PERSISTENT)


def _receive(port: int, queue: str, count: int, timeout: float = 30) -> list[tuple[Any, bytes]]:
    """Consume ``count`` messages (waiting for each at most ``timeout`` s)."""
    got: list[tuple[Any, bytes]] = []
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
            if method is None:
                break
            ch.basic_ack(method.delivery_tag)
            got.append((props, body))
            if len(got) == count:
                break
        ch.cancel()
    return got


def _count(port: int, queue: str) -> int:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def _uri(b: BrokerThread) -> str:
    return f"amqp://guest:guest@127.0.0.1:{b.port}/%2F"


def _shovels(broker: BrokerThread) -> ShovelComponent:
    component = broker.broker.parameter_components["shovel"]
    assert isinstance(component, ShovelComponent)
    return component


def _wait_state(broker: BrokerThread, name: str, state: str, timeout: float = 30) -> dict[str, Any]:
    """Wait on the broker's loop until the shovel is in ``state`` (woken by each
    change of it: LinkRunner.wait_for_state, no polling); what GET /api/shovels
    lists for it at that change. A TimeoutError says the state it was in."""

    async def wait() -> dict[str, Any]:
        shovel = _shovels(broker).shovels[("/", name)]
        return await shovel.wait_for_state(lambda s: s == state, timeout)

    return broker.run(wait(), timeout + 5)


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_a_queue_is_moved_to_another_broker(
    pair: tuple[BrokerThread, BrokerThread], ack_mode: str
) -> None:
    a, b = pair
    _publish(a.port, "outbox", 100)
    api = Api(a.http_port)
    reply = api.put(
        "/api/parameters/shovel/%2F/move",
        {
            "value": {
                "src-uri": "amqp://",
                "src-queue": "outbox",
                "dest-uri": _uri(b),
                "dest-queue": "inbox",
                "ack-mode": ack_mode,
            }
        },
    )
    assert reply.status == 201, reply
    got = _receive(b.port, "inbox", 100)
    assert [body for _p, body in got] == [b"msg-%d" % i for i in range(100)]
    assert got[0][0].content_type == "text/plain" and got[0][0].delivery_mode == 2
    _wait_state(a, "move", "running")
    (status,) = [s for s in api.get("/api/shovels") if s["name"] == "move"]
    assert status["state"] == "running"
    assert status["vhost"] == "/" and status["type"] == "dynamic"
    assert status["src_queue"] == "outbox" and status["dest_queue"] == "inbox"
    assert "guest:guest" not in status["dest_uri"]  # the password is not shown
    assert _count(a.port, "outbox") == 0
    # It keeps running: later messages follow.
    _publish(a.port, "outbox", 10, start=100)
    assert len(_receive(b.port, "inbox", 10)) == 10
    assert api.get("/api/parameters/shovel/%2F/move")["value"]["ack-mode"] == ack_mode
    assert api.delete("/api/parameters/shovel/%2F/move").status == 204
    assert api.get("/api/shovels") == []


def test_an_exchange_shovel_adds_forward_and_timestamp_headers(
    pair: tuple[BrokerThread, BrokerThread],
) -> None:
    a, b = pair
    api = Api(a.http_port)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", a.port)) as conn:
        conn.channel().exchange_declare("events", "topic", durable=True)
    reply = api.put(
        "/api/parameters/shovel/%2F/events",
        {
            "value": {
                "src-uri": "amqp://",
                "src-exchange": "events",
                "src-exchange-key": "order.*",
                "dest-uri": _uri(b),
                "dest-queue": "orders",
                "dest-add-forward-headers": True,
                "dest-add-timestamp-header": True,
            }
        },
    )
    assert reply.status == 201
    _wait_state(a, "events", "running")
    _publish(a.port, "order.created", 3, exchange="events")
    _publish(a.port, "invoice.sent", 2, exchange="events")  # not bound: stays behind
    got = _receive(b.port, "orders", 3)
    assert [body for _p, body in got] == [b"msg-0", b"msg-1", b"msg-2"]
    headers = got[0][0].headers
    (record,) = headers["x-shovelled"]
    assert record["shovel-name"] == "events" and record["src-exchange"] == "events"
    assert record["dest-queue"] == "orders" and record["shovel-type"] == "dynamic"
    assert abs(headers["x-shovelled-timestamp"] - time.time()) < 60
    assert _count(b.port, "orders") == 0


def test_src_delete_after_queue_length_moves_the_backlog_and_deletes_the_shovel(
    pair: tuple[BrokerThread, BrokerThread],
) -> None:
    a, b = pair
    _publish(a.port, "old", 25)
    api = Api(a.http_port)
    value = {
        "src-uri": "amqp://",
        "src-queue": "old",
        "dest-uri": _uri(b),
        "dest-queue": "new",
        "src-delete-after": "queue-length",
    }
    assert api.put("/api/parameters/shovel/%2F/drain", {"value": value}).status == 201
    assert len(_receive(b.port, "new", 25)) == 25

    def gone(shovels: list[dict[str, Any]]) -> bool | None:
        return True if all(s["name"] != "drain" for s in shovels) else None

    # Woken as shovels come, go and change state; the finished shovel clears its
    # parameter, which stops it.
    a.run(_shovels(a).wait_for(gone, 30), 35)
    assert api.request("GET", "/api/parameters/shovel/%2F/drain").status == 404
    _publish(a.port, "old", 5, start=25)  # after it: they stay
    assert _count(a.port, "old") == 5


def test_a_shovel_restarts_when_its_destination_comes_back(tmp_path: Path) -> None:
    """It waits its reconnect-delay on the broker's clock (a ManualClock here),
    then starts again and moves what waited at the source."""
    a = start_broker(tmp_path / "a", clock=ManualClock())
    b = start_broker(tmp_path / "b")
    port_b = b.port
    try:
        api = Api(a.http_port)
        value = {
            "src-uri": "amqp://",
            "src-queue": "q",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{port_b}/%2F",
            "dest-queue": "q",
            "reconnect-delay": 0.2,
        }
        assert api.put("/api/parameters/shovel/%2F/s", {"value": value}).status == 201
        _wait_state(a, "s", "running")
        b.stop()
        status = _wait_state(a, "s", "terminated")
        assert status["reason"]
        _publish(a.port, "q", 20)  # while the destination is down: they wait at the source
        b = BrokerThread(
            Config(
                data_dir=str(tmp_path / "b"),
                amqp_port=port_b,
                http_port=0,
                mqtt_port=0, stream_port=0, prometheus_port=0,
                auth_failure_delay=0,
            )
        ).start()
        shovel = _shovels(a).shovels[("/", "s")]
        assert a.call(lambda: shovel.state) == "terminated"  # the clock stands still
        a.advance(200)  # its reconnect-delay
        got = _receive(port_b, "q", 20)
        assert sorted(body for _p, body in got) == sorted(b"msg-%d" % i for i in range(20))
        _wait_state(a, "s", "running")
    finally:
        a.stop()
        b.stop()


def test_shovels_are_definitions_and_survive_a_restart(tmp_path: Path) -> None:
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    try:
        api = Api(a.http_port)
        value = {"src-uri": "amqp://", "src-queue": "x", "dest-uri": _uri(b), "dest-queue": "y"}
        assert api.put("/api/parameters/shovel/%2F/keep", {"value": value}).status == 201
        exported = api.get("/api/definitions")
        assert {"vhost": "/", "component": "shovel", "name": "keep", "value": value} in exported[
            "parameters"
        ]
        a.stop()
        a = start_broker(tmp_path / "a")  # the same data dir: the shovel runs again
        _publish(a.port, "x", 5)
        assert len(_receive(b.port, "y", 5)) == 5
        # Imported into a third broker, it runs there too.
        c = start_broker(tmp_path / "c")
        try:
            assert Api(c.http_port).post("/api/definitions", exported).status in (200, 201, 204)
            _wait_state(c, "keep", "running")
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


def test_bad_definitions_are_refused_with_the_reason(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    reply = api.put("/api/parameters/shovel/%2F/bad", {"value": {"src-uri": "amqp://"}})
    assert reply.status == 400
    text = reply.json()["reason"]
    assert "dest-uri" in text and "src-queue or src-exchange" in text
    reply = api.put(
        "/api/parameters/shovel/%2F/bad",
        {"value": {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "ack-mode": "x"}},
    )
    assert reply.status == 400 and "ack-mode" in reply.json()["reason"]
    reply = api.put("/api/parameters/nonesuch/%2F/x", {"value": {}})
    assert reply.status == 400 and "component nonesuch not found" in reply.json()["reason"]


class _HttpSink:
    """An aiohttp server on its own loop thread that records the POSTs it gets."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.got = threading.Condition()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            with self.got:
                self.posts.append((request.path, dict(request.headers), body))
                self.got.notify_all()
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    def wait(self, count: int, timeout: float = 30) -> None:
        with self.got:
            assert self.got.wait_for(lambda: len(self.posts) >= count, timeout), self.posts

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def test_an_http_destination_gets_each_message_posted(broker: BrokerThread) -> None:
    sink = _HttpSink()
    try:
        api = Api(broker.http_port)
        value = {
            "src-uri": "amqp://",
            "src-queue": "webhooks",
            "dest-uri": f"http://127.0.0.1:{sink.port}/hook",
        }
        assert api.put("/api/parameters/shovel/%2F/web", {"value": value}).status == 201
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
            ch = conn.channel()
            ch.queue_declare("webhooks", durable=True)
            ch.basic_publish(
                "",
                "webhooks",
                b'{"id": 1}',
                pika.BasicProperties(
                    content_type="application/json", message_id="abc", headers={"tenant": "t1"}
                ),
            )
        sink.wait(1)
        path, headers, body = sink.posts[0]
        assert path == "/hook" and body == b'{"id": 1}'
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Message-Id"] == "abc" and headers["X-tenant"] == "t1"
        assert headers["X-Shovel"] == "web"
        assert _count(broker.port, "webhooks") == 0
    finally:
        sink.stop()


def test_shovels_to_and_from_rabbitmq(broker: BrokerThread, rabbitmq: Any) -> None:
    api = Api(broker.http_port)
    # Warren -> RabbitMQ
    _publish(broker.port, "to-rabbit", 50)
    value = {
        "src-uri": "amqp://",
        "src-queue": "to-rabbit",
        "dest-uri": rabbitmq.url,
        "dest-queue": "from-warren",
        "dest-add-forward-headers": True,
    }
    assert api.put("/api/parameters/shovel/%2F/out", {"value": value}).status == 201
    got = _receive(rabbitmq.port, "from-warren", 50)
    assert [body for _p, body in got] == [b"msg-%d" % i for i in range(50)]
    assert got[0][0].headers["x-shovelled"][0]["shovel-name"] == "out"
    # RabbitMQ -> Warren
    _publish(rabbitmq.port, "to-warren", 50)
    value = {
        "src-uri": rabbitmq.url,
        "src-queue": "to-warren",
        "dest-uri": "amqp://",
        "dest-queue": "from-rabbit",
    }
    assert api.put("/api/parameters/shovel/%2F/in", {"value": value}).status == 201
    got = _receive(broker.port, "from-rabbit", 50)
    assert [body for _p, body in got] == [b"msg-%d" % i for i in range(50)]
    assert _count(rabbitmq.port, "to-warren") == 0


def test_an_exchange_destination_routes_with_its_key(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.exchange_declare("routed", "direct", durable=True)
        ch.queue_declare("by-key", durable=True)
        ch.queue_bind("by-key", "routed", "the-key")
    _publish(broker.port, "to-route", 3)
    value = {
        "src-uri": "amqp://",
        "src-queue": "to-route",
        "dest-uri": "amqp://",
        "dest-exchange": "routed",
        "dest-exchange-key": "the-key",
    }
    assert api.put("/api/parameters/shovel/%2F/route", {"value": value}).status == 201
    status = _wait_state(broker, "route", "running")
    assert status["dest_exchange"] == "routed" and status["dest_exchange_key"] == "the-key"
    got = _receive(broker.port, "by-key", 3)
    assert [body for _p, body in got] == [b"msg-%d" % i for i in range(3)]
