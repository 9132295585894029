"""Webhook targets made through the management API and the definitions
(docs/webhooks.md): PUT and DELETE /api/webhooks/<name>, the definitions'
``webhooks``, kept across restarts in <data_dir>/webhooks.json.

warren.app's broker over its sockets (the API over HTTP, a pika client) and an
aiohttp receiver on a loop of its own: each test waits for what the receiver
gets, a condition, never for time to pass.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import refused_start, start_broker
from httphelp import Api
from test_webhooks import Receiver

from warren.store.damage import DamagedFile
from warren.webhooks.saved import SAVED_FILE


class ReceiverThread:
    """A Receiver on a loop of its own thread (the broker runs on another)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.rx = Receiver()
        asyncio.run_coroutine_threadsafe(self.rx.start(), self.loop).result(10)

    def events(self, count: int) -> list[str]:
        """The names of the first ``count`` events, once that many arrived."""
        rx = self.rx
        done = asyncio.run_coroutine_threadsafe(rx.until(lambda: len(rx.got) >= count), self.loop)
        done.result(30)
        return [e["event"] for e in rx.events()[:count]]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.rx.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def receiver() -> Iterator[ReceiverThread]:
    rx = ReceiverThread()
    yield rx
    rx.stop()


def _declare(port: int, queue: str) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        conn.channel().queue_declare(queue, durable=False)


def test_a_target_made_through_the_api_survives_a_restart(
    tmp_path: Path, receiver: ReceiverThread
) -> None:
    data = tmp_path / "data"
    b = start_broker(data)
    try:
        api = Api(b.http_port)
        assert api.get("/api/webhooks") == []
        target = {"url": receiver.rx.url, "events": ["queue.*"], "secret": "k", "buffer": 50}
        assert api.put("/api/webhooks/ops", target).status == 201
        assert api.put("/api/webhooks/ops", target).status == 204  # set again
        listed = api.get("/api/webhooks/ops")
        assert listed["source"] == "api" and listed["signed"] and "secret" not in listed
        _declare(b.port, "q1")
        assert receiver.events(1) == ["queue.created"]
        # A bad target or name is refused with what is wrong.
        reply = api.put("/api/webhooks/bad", {"url": "ftp://x"})
        assert reply.status == 400 and "url must be an http" in reply.json()["reason"]
        reply = api.put("/api/webhooks/bad", {"name": "other", "url": "http://x/"})
        assert reply.status == 400
        assert api.request("GET", "/api/webhooks/nope").status == 404
        # Only an administrator changes them.
        api.put("/api/users/mon", {"password": "pw", "tags": "monitoring"})
        reply = api.as_user("mon", "pw").put("/api/webhooks/x", {"url": "http://x/"})
        assert reply.status == 401
    finally:
        b.stop()
    saved = json.loads((data / SAVED_FILE).read_text())
    assert saved["targets"][0]["name"] == "ops" and saved["targets"][0]["buffer"] == 50
    b = start_broker(data)
    try:
        api = Api(b.http_port)
        (listed,) = api.get("/api/webhooks")
        assert listed["name"] == "ops" and listed["source"] == "api"
        _declare(b.port, "q2")
        assert receiver.events(2) == ["queue.created", "queue.created"]
        assert json.loads(receiver.rx.got[1][1])["properties"]["name"] == "q2"
        assert api.delete("/api/webhooks/ops").status == 204
        assert api.delete("/api/webhooks/ops").status == 404
        assert api.get("/api/webhooks") == []
        # With no target left the broker listens to nothing: no event is built.
        assert not b.broker.events
    finally:
        b.stop()
    b = start_broker(data)
    try:
        assert Api(b.http_port).get("/api/webhooks") == []
    finally:
        b.stop()


def test_the_files_targets_are_listed_and_never_changed_by_the_api(tmp_path: Path) -> None:
    path = tmp_path / "webhooks.json"
    path.write_text(json.dumps([{"name": "ops", "url": "http://127.0.0.1:1/h"}]))
    b = start_broker(tmp_path / "data", webhooks_file=str(path))
    try:
        api = Api(b.http_port)
        assert api.get("/api/webhooks/ops")["source"] == "file"
        reply = api.put("/api/webhooks/ops", {"url": "http://127.0.0.1:2/h"})
        assert reply.status == 400 and "webhooks file" in reply.json()["reason"]
        assert api.delete("/api/webhooks/ops").status == 400
        # The definitions export the API's targets only, and cannot replace the file's.
        assert api.put("/api/webhooks/mine", {"url": "http://127.0.0.1:3/h"}).status == 201
        exported = api.get("/api/definitions")
        assert exported["webhooks"] == [{"name": "mine", "url": "http://127.0.0.1:3/h"}]
        reply = api.post("/api/definitions", {"webhooks": [{"name": "ops", "url": "http://x/"}]})
        assert reply.status == 400 and "webhooks file" in reply.json()["reason"]
    finally:
        b.stop()


def test_webhooks_go_through_the_definitions(tmp_path: Path, receiver: ReceiverThread) -> None:
    b = start_broker(tmp_path / "a")
    try:
        api = Api(b.http_port)
        target = {"url": receiver.rx.url, "events": "exchange.*", "vhosts": ["/"], "secret": "s"}
        assert api.put("/api/webhooks/ex", target).status == 201
        exported = api.get("/api/definitions")
    finally:
        b.stop()
    assert exported["webhooks"] == [
        {
            "name": "ex",
            "url": receiver.rx.url,
            "events": ["exchange.*"],
            "vhosts": ["/"],
            "secret": "s",
        }
    ]
    # Imported into another broker, through the API and through load_definitions.
    b = start_broker(tmp_path / "b")
    try:
        api = Api(b.http_port)
        reply = api.post("/api/definitions", {"webhooks": [{"name": "ex", "url": "ftp://x"}]})
        assert reply.status == 400 and "url must be" in reply.json()["reason"]
        assert api.get("/api/webhooks") == []
        assert api.post("/api/definitions", exported).status == 204
        (listed,) = api.get("/api/webhooks")
        assert listed["name"] == "ex" and listed["signed"]
        assert api.put("/api/exchanges/%2F/e1", {"type": "fanout"}).status == 201
        assert receiver.events(1) == ["exchange.created"]
    finally:
        b.stop()
    definitions = tmp_path / "defs.json"
    definitions.write_text(json.dumps(exported))
    b = start_broker(tmp_path / "c", load_definitions=str(definitions))
    try:
        assert [t["name"] for t in Api(b.http_port).get("/api/webhooks")] == ["ex"]
    finally:
        b.stop()


def test_a_damaged_webhooks_file_in_the_data_dir_refuses_the_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / SAVED_FILE).write_text('{"targets": [')
    problem = refused_start(data)
    assert isinstance(problem, DamagedFile) and problem.path.name == SAVED_FILE
    # Set aside, the broker starts without the API's targets and says so.
    b = start_broker(data, damaged_metadata="set-aside")
    try:
        assert Api(b.http_port).get("/api/webhooks") == []
    finally:
        b.stop()
    assert [p.name.startswith(SAVED_FILE + ".damaged-") for p in data.iterdir()].count(True) == 1
