"""Webhooks (warren.webhooks, docs/webhooks.md): broker events POSTed to a local
aiohttp receiver, signed, in order, retried with backoff on the broker's clock.

The broker is the in-memory harness on a ManualClock; the receiver is an aiohttp
server on the harness's loop, so a test runs the loop until the receiver has
what it waits for (a condition, bounded by the harness's real-time timeout) and
moves the clock for every backoff and timeout: nothing sleeps for time to pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from aiohttp import web
from conftest import start_broker
from harness.broker import Harness
from httphelp import Api
from metricshelp import samples, value

from warren.app import Broker as AppBroker
from warren.cli import main as warren_main
from warren.config import Config, ConfigError
from warren.core.clock import ManualClock
from warren.metrics.render import render
from warren.metrics.snapshot import snapshot
from warren.webhooks import Webhooks, WebhookTarget, load_targets, parse_targets, sign


class Receiver:
    """A webhook receiver: answers ``fail`` POSTs with 503 first (or none at all
    while ``hang``), then takes them (204), keeping headers and bodies."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.hang = False
        self.attempts = 0
        self.got: list[tuple[dict[str, str], bytes]] = []
        self._changed = asyncio.Event()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.attempts += 1
        self._changed.set()
        if self.hang:
            await self._release.wait()  # unanswered until the receiver stops
        if self.fail > 0:
            self.fail -= 1
            return web.Response(status=503)
        self.got.append((dict(request.headers), body))
        self._changed.set()
        return web.Response(status=204)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait (on the loop) until ``done()``: re-checked at each request."""
        while not done():
            self._changed.clear()
            await self._changed.wait()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]


async def _until(done: Callable[[], bool]) -> None:
    """Run the loop until ``done()`` (a state the sender reaches after I/O)."""
    while not done():
        await asyncio.sleep(0.005)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path / "data", clock=ManualClock()) as harness:
        yield harness


@pytest.fixture
def receiver(broker: Harness) -> Iterator[Receiver]:
    rx = Receiver()
    broker.run(rx.start())
    yield rx
    broker.run(rx.stop())


def _webhooks(broker: Harness, *targets: WebhookTarget) -> Webhooks:
    hooks = Webhooks(list(targets), broker.broker.clock, "warren@test")
    hooks.attach(broker.broker.events)
    broker.broker.webhook_status = hooks.status
    broker.on_stop(lambda: broker.run(hooks.close()))
    return hooks


def _declare(broker: Harness, vhost: str, *queues: str) -> None:
    def declare() -> None:
        v = broker.broker.add_vhost(vhost)
        for name in queues:
            v.declare_queue(name, durable=False)

    broker.call(declare)


def test_an_event_arrives_as_signed_json(broker: Harness, receiver: Receiver) -> None:
    _webhooks(broker, WebhookTarget("t", receiver.url, secret="s3cret"))
    _declare(broker, "/", "q1")
    broker.run(receiver.until(lambda: len(receiver.got) == 1))
    headers, body = receiver.got[0]
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Warren-Signature"] == expected == sign("s3cret", body)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Warren-Event"] == "queue.created"
    document = json.loads(body)
    assert document["event"] == "queue.created"
    assert document["id"] == headers["X-Warren-Delivery"]
    assert document["node"] == "warren@test"
    assert document["timestamp"] == broker.broker.clock.now_ms()
    assert document["properties"] == {
        "name": "q1",
        "durable": False,
        "auto_delete": False,
        "exclusive": False,
        "type": "classic",
        "vhost": "/",
    }


def test_an_unsigned_target_gets_no_signature(broker: Harness, receiver: Receiver) -> None:
    _webhooks(broker, WebhookTarget("t", receiver.url))
    _declare(broker, "/", "q1")
    broker.run(receiver.until(lambda: len(receiver.got) == 1))
    assert "X-Warren-Signature" not in receiver.got[0][0]


def test_events_arrive_in_order(broker: Harness, receiver: Receiver) -> None:
    _webhooks(broker, WebhookTarget("t", receiver.url))
    names = [f"q{i}" for i in range(8)]
    _declare(broker, "/", *names)
    broker.call(lambda: broker.broker.get_vhost("/").delete_queue("q0"))
    broker.run(receiver.until(lambda: len(receiver.got) == 9))
    got = [(e["event"], e["properties"]["name"]) for e in receiver.events()]
    assert got == [("queue.created", n) for n in names] + [("queue.deleted", "q0")]


def test_a_failing_receiver_gets_the_event_after_retries_with_backoff(
    broker: Harness, receiver: Receiver
) -> None:
    receiver.fail = 2
    hooks = _webhooks(broker, WebhookTarget("t", receiver.url, backoff_ms=1000))
    state = hooks.states[0]
    _declare(broker, "/", "q1")
    broker.run(_until(lambda: state.retrying))
    assert receiver.attempts == 1 and state.last_error == "HTTP 503"
    broker.advance(999)  # the first backoff is 1 s: not yet
    broker.pump()
    assert receiver.attempts == 1
    broker.advance(1)
    broker.run(receiver.until(lambda: receiver.attempts == 2))
    broker.run(_until(lambda: state.retries == 2))
    broker.advance(1999)  # then 2 s
    broker.pump()
    assert receiver.attempts == 2
    broker.advance(1)
    broker.run(receiver.until(lambda: len(receiver.got) == 1))
    broker.run(_until(lambda: state.task is None))
    assert receiver.events()[0]["event"] == "queue.created"
    status = hooks.status()[0]
    assert (status["delivered"], status["failed"], status["retries"]) == (1, 0, 2)
    assert status["state"] == "idle"


def test_an_event_is_given_up_after_max_retries(broker: Harness, receiver: Receiver) -> None:
    receiver.fail = 10
    hooks = _webhooks(broker, WebhookTarget("t", receiver.url, max_retries=1, backoff_ms=10))
    state = hooks.states[0]
    _declare(broker, "/", "q1", "q2")
    broker.run(_until(lambda: state.retrying))
    broker.advance(10)
    broker.run(_until(lambda: state.failed == 1))
    # The next event is delivered once the receiver recovers.
    receiver.fail = 0
    broker.run(_until(lambda: state.retrying or bool(receiver.got)))
    broker.advance(10)
    broker.run(receiver.until(lambda: len(receiver.got) == 1))
    assert receiver.events()[0]["properties"]["name"] == "q2"
    assert state.failed == 1 and state.delivered == 1


def test_a_receiver_that_never_answers_blocks_nothing_and_drops_are_counted(
    broker: Harness, receiver: Receiver
) -> None:
    receiver.hang = True
    hooks = _webhooks(broker, WebhookTarget("t", receiver.url, buffer=3, timeout_ms=5000))
    state = hooks.states[0]
    _declare(broker, "/", "first")
    broker.run(receiver.until(lambda: receiver.attempts == 1))  # in flight, unanswered
    # The broker goes on: queues, a connection, publishes and gets.
    conn = broker.amqp_connection()
    ch = conn.channel()
    for i in range(10):
        ch.queue_declare(f"q{i}", durable=False)
    for _ in range(100):
        ch.basic_publish("", "q0", b"x")
    assert ch.basic_get("q0", auto_ack=True)[2] == b"x"
    # first is in flight; connection.created, channel.created and q0..q9 (12 events)
    # left 3 buffered.
    assert state.dropped == 9 and len(state.pending) == 3
    assert [json.loads(p.body)["properties"]["name"] for p in state.pending] == ["q7", "q8", "q9"]
    metrics = samples(broker.run(_scrape(broker)))
    assert value(metrics, "warren_webhook_events_dropped_total", target="t") == 9
    assert value(metrics, "warren_webhook_events_queued", target="t") == 3
    # The POST's timeout is on the broker's clock: a failure, then a retry.
    broker.advance(5000)
    broker.run(_until(lambda: state.retrying))
    assert state.last_error == "no answer within 5000 ms"
    conn.close()


async def _scrape(broker: Harness) -> str:
    return render(await snapshot(broker.broker)).decode()


def test_filters_on_event_names_and_vhosts(broker: Harness, receiver: Receiver) -> None:
    queues_in_v = WebhookTarget(
        "queues", receiver.url + "?t=queues", events=("queue.*",), vhosts=("v*",)
    )
    alarms = WebhookTarget(
        "alarms", receiver.url + "?t=alarms", events=("alarm.*",), vhosts=("v*",)
    )
    _webhooks(broker, queues_in_v, alarms)
    _declare(broker, "/", "not-me")
    _declare(broker, "v1", "me")
    broker.call(lambda: broker.broker.resource_alarms.set_alarm("disk", True))
    broker.call(lambda: broker.broker.resource_alarms.set_alarm("disk", False))
    broker.run(receiver.until(lambda: len(receiver.got) == 3))
    got = sorted((e["event"], e["properties"].get("name", "")) for e in receiver.events())
    assert got == [("alarm.cleared", ""), ("alarm.set", ""), ("queue.created", "me")]
    assert WebhookTarget("x", "http://h/", events=("connection.*",)).wants("connection.closed", "/")
    assert not WebhookTarget("x", "http://h/", vhosts=("a",)).wants("queue.created", "b")


def test_get_api_webhooks_lists_the_targets(broker: Harness, receiver: Receiver) -> None:
    assert broker.http().get("/api/webhooks") == []
    _webhooks(broker, WebhookTarget("t", "http://u:pw@127.0.0.1:1/x", secret="k"))
    (listed,) = broker.http().get("/api/webhooks")
    assert listed["name"] == "t" and listed["url"] == "http://u@127.0.0.1:1/x"
    assert listed["signed"] is True and "secret" not in listed
    assert listed["events"] == ["*"] and listed["dropped"] == 0


def test_the_webhooks_file(tmp_path: Path) -> None:
    path = tmp_path / "webhooks.json"
    path.write_text(
        json.dumps(
            {
                "targets": [
                    {"name": "a", "url": "https://x/h", "events": "queue.*", "secret": "k"},
                    {"url": "http://y/", "vhosts": ["prod", "staging*"], "buffer": 10},
                ]
            }
        )
    )
    a, b = load_targets(path)
    assert a == WebhookTarget("a", "https://x/h", events=("queue.*",), secret="k")
    assert b.name == "webhook-1" and b.vhosts == ("prod", "staging*") and b.buffer == 10
    assert b.backoff(1) == 1000 and b.backoff(3) == 4000 and b.backoff(20) == 60000
    ini = tmp_path / "warren.ini"
    ini.write_text(f"[main]\nwebhooks_file = {path}\n")
    config = Config.from_ini(ini)
    assert config.webhooks_file == str(path)
    # warren.app's broker loads the file and lists the targets.
    config.data_dir = str(tmp_path / "data")
    app_broker = AppBroker(config, listeners=[])
    assert app_broker.webhooks is not None and app_broker.webhook_status is not None
    assert [t["name"] for t in app_broker.webhook_status()] == ["a", "webhook-1"]
    assert app_broker.webhooks.observe in app_broker.events.observers
    asyncio.run(app_broker.stop())


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"x": 1}, "expected a list of targets"),
        ([{"url": "ftp://x"}], "url must be an http:// or https:// URL"),
        ([{"url": "http://x", "retries": 1}], "unknown key 'retries'"),
        ([{"url": "http://x", "buffer": 0}], "buffer must be an integer >= 1"),
        ([{"url": "http://x", "events": []}], "events must be a name glob"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], "two targets"),
    ],
)
def test_a_bad_webhooks_document_is_refused(document: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_targets(document)


def test_a_broker_with_a_webhooks_file_posts_its_events(tmp_path: Path) -> None:
    """warren.app's broker, over its sockets: the file's target gets a pika
    client's connection and queue events, signed; GET /api/webhooks counts them."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    rx = Receiver()
    asyncio.run_coroutine_threadsafe(rx.start(), loop).result(10)
    path = tmp_path / "webhooks.json"
    target = {"name": "t", "url": rx.url, "events": ["connection.*", "queue.*"], "secret": "k"}
    path.write_text(json.dumps([target]))
    b = start_broker(tmp_path / "data", webhooks_file=str(path))
    try:
        params = pika.ConnectionParameters("127.0.0.1", b.port)
        with pika.BlockingConnection(params) as conn:
            conn.channel().queue_declare("q", durable=False)
        done = asyncio.run_coroutine_threadsafe(rx.until(lambda: len(rx.got) == 3), loop)
        done.result(30)
        events = rx.events()
        assert [e["event"] for e in events] == [
            "connection.created",
            "queue.created",
            "connection.closed",
        ]
        assert events[0]["properties"]["peer_host"] == "127.0.0.1"
        for headers, body in rx.got:
            assert headers["X-Warren-Signature"] == sign("k", body)
        api = Api(b.http_port)
        (listed,) = api.get("/api/webhooks")
        assert listed["name"] == "t" and listed["failed"] == 0 and listed["dropped"] == 0
    finally:
        b.stop()
        asyncio.run_coroutine_threadsafe(rx.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_warren_refuses_to_start_with_a_bad_webhooks_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "webhooks.json"
    path.write_text('[{"url": "http://x/", "secret": ""}]')
    ini = tmp_path / "warren.ini"
    ini.write_text(f"[main]\nwebhooks_file = {path}\n")
    argv = ["-c", str(ini), "-D", str(tmp_path / "data"), "--amqp-port", "0"]
    assert warren_main(argv) == 2
    assert "target 'webhook-0': secret must be a non-empty string" in capsys.readouterr().err
