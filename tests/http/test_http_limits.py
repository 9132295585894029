"""Request bodies the management API takes: a limit per request, a budget for all of
them at once, JSON of bounded depth, arguments that AMQP can hold.

RabbitMQ 3.10.8 (Debian's, with the CVE-2023-46118 fix) refuses a definitions
upload over its limit with 400 {"error":"bad_request","reason":"Exceeded HTTP
request body size limit"}, and answers an oversized PUT of a queue with a bare
500; it takes JSON nested 100,000 deep (and then lists it back to clients that
cannot parse it). Warren answers every oversized body with RabbitMQ's 400, before
reading it when its size is announced (before the client sends it when it asks
with ``Expect: 100-continue``); holds the bodies being received within one
budget ([mgmt] body_budget), answering 503 beyond it while other requests are
served; and refuses JSON nested deeper than MAX_JSON_DEPTH, or arguments no AMQP
field table can hold, with 400 and nothing created.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from httphelp import Api, wait_for
from pikahelp import connect

from warren.config import Config, ConfigError
from warren.http.server import HTTPListener
from warren.json_input import MAX_JSON_DEPTH

pytestmark = pytest.mark.timeout(60)

KIB = 1024
LIMITS = {
    "http_max_body_size": 64 * KIB,
    "http_max_definitions_size": 128 * KIB,
    "http_body_budget": 160 * KIB,
}
TOO_LARGE = {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"}
BUSY = {
    "error": "service_unavailable",
    "reason": "too many request bodies being received at once; try again later",
}
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


@pytest.fixture
def small(broker_factory: Callable[..., BrokerThread]) -> BrokerThread:
    """A broker with small body limits, so tests send kilobytes, not megabytes."""
    return broker_factory(**LIMITS)


@pytest.fixture
def opened() -> Iterator[list[http.client.HTTPConnection]]:
    conns: list[http.client.HTTPConnection] = []
    yield conns
    for conn in conns:
        conn.close()


def begin(
    b: BrokerThread,
    opened: list[http.client.HTTPConnection],
    method: str,
    path: str,
    length: int | None,
    **headers: str,
) -> http.client.HTTPConnection:
    """A request whose headers are sent, its body not yet (chunked if no length)."""
    conn = http.client.HTTPConnection("127.0.0.1", b.http_port, timeout=20)
    opened.append(conn)
    conn.putrequest(method, path, skip_accept_encoding=True)
    conn.putheader("Authorization", AUTH)
    conn.putheader("Content-Type", "application/json")
    if length is None:
        conn.putheader("Transfer-Encoding", "chunked")
    else:
        conn.putheader("Content-Length", str(length))
    for key, value in headers.items():
        conn.putheader(key.replace("_", "-"), value)
    conn.endheaders()
    return conn


def chunk(conn: http.client.HTTPConnection, data: bytes) -> None:
    conn.send(b"%x\r\n%s\r\n" % (len(data), data))


def answer(conn: http.client.HTTPConnection) -> tuple[int, Any, dict[str, str]]:
    reply = conn.getresponse()
    body = reply.read()
    return reply.status, json.loads(body) if body else None, dict(reply.getheaders())


def padded(value: dict[str, Any], size: int) -> bytes:
    """``value`` as JSON of exactly ``size`` bytes (blanks after it)."""
    raw = json.dumps(value).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def budget_used(b: BrokerThread) -> int:
    listener = b.broker.listener("http")
    assert isinstance(listener, HTTPListener) and listener.app is not None
    return b.call(lambda: listener.app.budget.used if listener.app else -1)


# -- the limit per request ------------------------------------------------------------------


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    small: BrokerThread, opened: list[http.client.HTTPConnection]
) -> None:
    api = Api(small.http_port)
    conn = begin(small, opened, "PUT", "/api/queues/%2F/big", 64 * KIB + 1)
    assert answer(conn)[:2] == (400, TOO_LARGE)  # not a byte of the body sent
    conn = begin(small, opened, "PUT", "/api/queues/%2F/big", 64 * KIB + 1, Expect="100-continue")
    assert answer(conn)[:2] == (400, TOO_LARGE)  # no "100 Continue": nothing to send
    reply = api.request("PUT", "/api/queues/%2F/big", raw=padded({}, 64 * KIB + 1))
    assert (reply.status, reply.json()) == (400, TOO_LARGE)
    assert api.request("GET", "/api/queues/%2F/big").status == 404
    reply = api.request("PUT", "/api/queues/%2F/big", raw=padded({"durable": True}, 64 * KIB))
    assert reply.status == 201, reply
    assert budget_used(small) == 0


def test_a_chunked_body_is_cut_off_at_the_limit(
    small: BrokerThread, opened: list[http.client.HTTPConnection]
) -> None:
    conn = begin(small, opened, "PUT", "/api/queues/%2F/big", None)
    for _ in range(3):
        chunk(conn, b" " * (30 * KIB))
    assert answer(conn)[:2] == (400, TOO_LARGE)
    conn = begin(small, opened, "PUT", "/api/queues/%2F/small", None)
    chunk(conn, b'{"durable": true}')
    chunk(conn, b" " * (30 * KIB))
    conn.send(b"0\r\n\r\n")
    assert answer(conn)[0] == 201
    api = Api(small.http_port)
    assert [q["name"] for q in api.get("/api/queues/%2F")] == ["small"]
    assert budget_used(small) == 0


def test_a_definitions_upload_may_be_larger(small: BrokerThread) -> None:
    """[mgmt] max_definitions_size for POST /api/definitions (JSON or the web UI's
    form upload); every other body stays within max_body_size."""
    api = Api(small.http_port)
    queues = [
        {"name": f"q{i}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        for i in range(1000)
    ]
    document = json.dumps({"queues": queues}).encode()
    assert 64 * KIB < len(document) < 128 * KIB
    assert api.request("POST", "/api/definitions", raw=document).status == 204
    assert len(api.get("/api/queues/%2F")) == 1000
    reply = api.request("POST", "/api/definitions", raw=padded({}, 128 * KIB + 1))
    assert (reply.status, reply.json()) == (400, TOO_LARGE)
    boundary = "warren-test-boundary"
    form = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.json"\r\n'
            f"Content-Type: application/json\r\n\r\n"
        ).encode()
        + b" " * (128 * KIB)
        + f"\r\n--{boundary}--\r\n".encode()
    )
    reply = api.request(
        "POST",
        "/api/definitions",
        raw=form,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert (reply.status, reply.json()) == (400, TOO_LARGE)
    reply = api.request("PUT", "/api/queues/%2F/other", raw=document)
    assert (reply.status, reply.json()) == (400, TOO_LARGE)
    assert budget_used(small) == 0


# -- the budget of all bodies at once -----------------------------------------------------------


def test_bodies_beyond_the_budget_are_refused_with_503_and_others_are_served(
    small: BrokerThread, opened: list[http.client.HTTPConnection]
) -> None:
    """A slow upload holds its announced size; a body that would go beyond the budget
    is refused at once (503, Retry-After), before or after it is sent; requests
    without one, and bodies that fit, are served meanwhile."""
    api = Api(small.http_port)
    document = padded({"queues": [{"name": "slow", "vhost": "/", "arguments": {}}]}, 128 * KIB)
    slow = begin(small, opened, "POST", "/api/definitions", len(document))
    slow.send(document[: 64 * KIB])
    wait_for(lambda: budget_used(small) == 128 * KIB, what="the upload to hold its size")
    refused = begin(small, opened, "PUT", "/api/queues/%2F/late", 40 * KIB, Expect="100-continue")
    status, body, headers = answer(refused)
    assert (status, body, headers["Retry-After"]) == (503, BUSY, "1")
    reply = api.request("PUT", "/api/queues/%2F/late", raw=padded({}, 40 * KIB))
    assert (reply.status, reply.json()) == (503, BUSY)
    chunked = begin(small, opened, "PUT", "/api/queues/%2F/late", None)
    chunk(chunked, b" " * (40 * KIB))
    assert answer(chunked)[:2] == (503, BUSY)
    assert api.get("/api/overview")["management_version"]  # not stalled
    assert api.put("/api/queues/%2F/fits", {"durable": True}).status == 201  # 17 bytes fit
    slow.send(document[64 * KIB :])
    assert answer(slow)[0] == 204
    assert budget_used(small) == 0
    assert api.request("PUT", "/api/queues/%2F/late", raw=padded({}, 40 * KIB)).status == 201
    assert sorted(q["name"] for q in api.get("/api/queues/%2F")) == ["fits", "late", "slow"]


def test_the_budget_must_hold_the_largest_body(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="body_budget"):
        Config(http_max_definitions_size=2_000_000, http_body_budget=1_000_000).validate()
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[mgmt]\nmax_body_size = 1000\nmax_definitions_size = 5000\nbody_budget = 9000\n"
    )
    config = Config.from_ini(ini)
    assert (config.http_max_body_size, config.http_max_definitions_size) == (1000, 5000)
    assert config.http_body_budget == 9000
    defaults = Config()
    assert defaults.http_max_body_size == 10_000_000  # RabbitMQ's max_body_size


# -- JSON depth and arguments AMQP can hold --------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_json_nested_too_deep_is_a_400(broker: BrokerThread) -> None:
    """Nested ~990 deep it was a 500 (RecursionError); arguments nested 200 deep were a
    500 that left a durable queue in memory whose definition was never written."""
    api = Api(broker.http_port)
    too_deep = {
        "error": "bad_request",
        "reason": f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
    }
    for raw in (
        b"[" * 990 + b"]" * 990,
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({"arguments": {"x-deep": nested(200)}}).encode(),
    ):
        reply = api.request("PUT", "/api/queues/%2F/deep", raw=raw)
        assert (reply.status, reply.json()) == (400, too_deep)
        reply = api.request("POST", "/api/definitions", raw=raw)
        assert (reply.status, reply.json()) == (400, too_deep)
    # Within the JSON bound, beyond what an AMQP field table may nest: still refused.
    reply = api.put("/api/queues/%2F/deep", {"arguments": {"x-deep": nested(130)}})
    assert reply.status == 400
    assert reply.json()["reason"].startswith("invalid arguments: field tables and arrays nested")
    reply = api.put("/api/queues/%2F/deep", {"arguments": {"x-big": 2**70}})
    assert reply.status == 400
    assert reply.json()["reason"].startswith("invalid arguments: integer")
    queue = {"name": "deep", "vhost": "/", "durable": True, "auto_delete": False}
    reply = api.post("/api/definitions", {"queues": [{**queue, "arguments": {"x": nested(130)}}]})
    assert reply.status == 400
    assert "cannot be an AMQP table" in reply.json()["reason"]
    reply = api.post(
        "/api/bindings/%2F/e/amq.direct/e/amq.fanout", {"arguments": {"x": nested(130)}}
    )
    assert reply.status == 400
    message = {"routing_key": "k", "payload": "x", "payload_encoding": "string"}
    reply = api.post(
        "/api/exchanges/%2F/amq.direct/publish",
        {**message, "properties": {"headers": {"x": nested(130)}}},
    )
    assert reply.status == 400
    assert api.request("GET", "/api/queues/%2F/deep").status == 404
    assert [b for b in api.get("/api/bindings/%2F") if b["source"]] == []


def test_arguments_as_deep_as_amqp_allows_export_and_import_again(
    broker_factory: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    """What a client may declare over AMQP (tables nested 120 deep) goes through the
    definitions export and import: the JSON bound leaves room for it."""
    first = broker_factory(data_dir=tmp_path / "first")
    conn = connect(first)
    deep: Any = {"leaf": 1}
    for _ in range(119):
        deep = {"d": deep}
    conn.channel().queue_declare("deep", durable=True, arguments={"x-deep": deep})
    conn.close()
    exported = Api(first.http_port).request("GET", "/api/definitions")
    assert exported.status == 200
    second = broker_factory(data_dir=tmp_path / "second")
    api = Api(second.http_port)
    assert api.request("POST", "/api/definitions", raw=exported.body).status == 204
    assert api.get("/api/queues/%2F/deep")["arguments"] == {"x-deep": deep}
