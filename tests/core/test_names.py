"""Names that are not UTF-8, hold CR/LF or are too long, at every door that makes one.

The reference is RabbitMQ 3.10.8, observed with tests/rawamqp.py and curl: a
short string that is not UTF-8 in any method but basic.publish closes the
connection with 501 FRAME_ERROR "Malformed UTF-8 in shortstr" (class 0,
method 0); basic.publish takes exchange and routing key as bytes; the queue and
exchange names of exchange.* and queue.* methods lose their CR and LF; the API
shows bytes it cannot decode as U+FFFD and percent-encodes them in
``properties_key``. Warren does better where RabbitMQ accepts what it cannot
show or address: the API refuses names over 255 bytes (RabbitMQ: queue names
only) and names that are not UTF-8 (RabbitMQ takes ``%FF``), a definitions
import refuses a lone surrogate, and a name kept from before these rules (an old
data directory) is listed, exported and reachable instead of making every
listing answer 500. A hypothesis test sends names through AMQP and reads every
listing back.

In memory (issue 29): tests/harness brokers, raw frames over MemoryAMQP (RawAMQP's
interface), pika's calls over it (harness.channel), the management API through
``harness.http()``; a restart is a new Harness on the same data dir. A
federation upstream's name is checked on a socket broker (warren.app's
component, which connects).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import BrokerThread
from harness import Harness, MemoryAMQP, MemoryHTTP, harness_fixture
from httphelp import Api  # noqa: E402 - tests/http's helper, not a package
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import AMQPFrames, body_frame, header_frame, raw_frame

import warren.core.vhost
from examples import examples
from warren.cli import main as warren_main

pytestmark = pytest.mark.timeout(120)

MALFORMED = (501, "FRAME_ERROR - Malformed UTF-8 in shortstr", 0, 0)

#: Every listing that shows names, and the definitions exports.
LISTINGS = (
    "/api/queues",
    "/api/queues/%2F",
    "/api/exchanges",
    "/api/exchanges/%2F",
    "/api/bindings",
    "/api/bindings/%2F",
    "/api/definitions",
    "/api/definitions/%2F",
    "/api/consumers",
    "/api/channels",
    "/api/connections",
    "/api/vhosts",
    "/api/users",
    "/api/policies",
    "/api/parameters",
    "/api/overview",
)


broker = harness_fixture()


@pytest.fixture
def api(broker: Harness) -> MemoryHTTP:
    return broker.http()


@pytest.fixture
def raw(broker: Harness) -> Iterator[Callable[[], MemoryAMQP]]:
    """Raw connections to ``broker``, handshaken with channel 1 open; closed at the end."""
    made: list[MemoryAMQP] = []

    def factory() -> MemoryAMQP:
        client = broker.amqp()
        made.append(client)
        client.handshake()
        client.open_channel(1)
        return client

    yield factory
    for client in made:
        client.close_socket()


def every_listing_answers(api: MemoryHTTP | Api) -> dict[str, Any]:
    """GET every listing; each must be 200 with JSON that is valid UTF-8."""
    out = {}
    for path in LISTINGS:
        reply = api.request("GET", path)
        assert reply.status == 200, (path, reply)
        reply.body.decode("utf-8")  # strict: no lone surrogate, no stray byte
        out[path] = reply.json()
    return out


# -- raw method payloads (pamqp cannot put bytes that are not UTF-8 in a shortstr) ----------


def ss(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def queue_declare(name: bytes, durable: bool = True, passive: bool = False) -> bytes:
    flags = (1 if passive else 0) | (2 if durable else 0)
    return struct.pack(">HHH", 50, 10, 0) + ss(name) + bytes([flags]) + b"\0\0\0\0"


def exchange_declare(name: bytes, type_: bytes = b"direct") -> bytes:
    return struct.pack(">HHH", 40, 10, 0) + ss(name) + ss(type_) + b"\x02" + b"\0\0\0\0"


def queue_bind(queue: bytes, exchange: bytes, key: bytes) -> bytes:
    return struct.pack(">HHH", 50, 20, 0) + ss(queue) + ss(exchange) + ss(key) + b"\0\0\0\0\0"


def exchange_bind(dest: bytes, source: bytes, key: bytes) -> bytes:
    return struct.pack(">HHH", 40, 30, 0) + ss(dest) + ss(source) + ss(key) + b"\0\0\0\0\0"


def queue_delete(name: bytes) -> bytes:
    return struct.pack(">HHH", 50, 40, 0) + ss(name) + b"\0"


def basic_get(queue: bytes) -> bytes:
    return struct.pack(">HHH", 60, 70, 0) + ss(queue) + b"\1"


def basic_publish(exchange: bytes, key: bytes) -> bytes:
    return struct.pack(">HHH", 60, 40, 0) + ss(exchange) + ss(key) + b"\0"


def publish(client: AMQPFrames, exchange: bytes, key: bytes, body: bytes, persistent: bool) -> None:
    """basic.publish with exchange and routing key as raw bytes, then its content."""
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    client.send(raw_frame(1, 1, basic_publish(exchange, key)))
    client.send(header_frame(1, len(body), props) + body_frame(1, body))


# -- AMQP: short strings that are not UTF-8 -----------------------------------------------

NOT_UTF8 = {
    "queue.declare, a stray byte": queue_declare(b"orders-\xff"),
    "queue.declare, an overlong NUL": queue_declare(b"q\xc0\x80"),
    "queue.declare, an encoded surrogate": queue_declare(b"q\xed\xa0\x80"),
    "exchange.declare, its name": exchange_declare(b"ex-\xff"),
    "exchange.declare, its type": exchange_declare(b"ex", b"dir\xff"),
    "queue.bind, the routing key": queue_bind(b"", b"amq.direct", b"rk-\xff"),
    "queue.bind, the queue": queue_bind(b"q\xff", b"amq.direct", b"rk"),
    "exchange.bind, the routing key": exchange_bind(b"amq.fanout", b"amq.direct", b"k\xff"),
    "queue.delete": queue_delete(b"orders-\xff"),
    "queue.purge": struct.pack(">HHH", 50, 30, 0) + ss(b"q\xff") + b"\0",
    "basic.get": basic_get(b"q\xff"),
    "basic.consume, the tag": struct.pack(">HHH", 60, 20, 0) + ss(b"q") + ss(b"t\xff") + b"\0" * 5,
    "basic.cancel": struct.pack(">HH", 60, 30) + ss(b"t\xff") + b"\0",
    "channel.close, the text": struct.pack(">HHH", 20, 40, 200) + ss(b"t\xff") + b"\0" * 4,
}


@pytest.mark.parametrize("payload", NOT_UTF8.values(), ids=list(NOT_UTF8))
def test_a_short_string_that_is_not_utf8_closes_the_connection_as_rabbitmq(
    raw: Callable[[], MemoryAMQP], api: MemoryHTTP, payload: bytes
) -> None:
    client = raw()
    client.send(raw_frame(1, 1, payload))
    assert client.expect_close() == MALFORMED
    assert client.wait_eof()
    listings = every_listing_answers(api)
    assert [q["name"] for q in listings["/api/queues"]] == []
    assert not [x for x in listings["/api/exchanges"] if x["name"].startswith("ex")]


def test_connection_open_with_a_vhost_that_is_not_utf8(broker: Harness, api: MemoryHTTP) -> None:
    client = broker.amqp()
    try:
        client.handshake(open_connection=False)
        client.send(raw_frame(1, 0, struct.pack(">HH", 10, 40) + ss(b"v\xff") + ss(b"") + b"\0"))
        assert client.expect_close() == MALFORMED
    finally:
        client.close_socket()
    every_listing_answers(api)


def test_publish_takes_a_routing_key_that_is_not_utf8_and_the_api_shows_it(
    broker: Harness, raw: Callable[[], MemoryAMQP], api: MemoryHTTP
) -> None:
    """As RabbitMQ: basic.publish's strings are bytes; the API shows the routing key
    with U+FFFD (RabbitMQ 3.10: "r\\ufffd\\u0000")."""
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("fanq")
    ch.queue_bind("fanq", "amq.fanout")
    client = raw()
    client.send_method(1, commands.Confirm.Select())
    client.expect_method(commands.Confirm.SelectOk)
    publish(client, b"amq.fanout", b"r\xff\x00", b"abc", persistent=False)
    client.expect_method(commands.Basic.Ack)
    # An exchange name that is not UTF-8 names no exchange: 404, as RabbitMQ.
    publish(client, b"x\xff", b"k", b"abc", persistent=False)
    code, text, class_id, method_id = client.expect_channel_close(1)
    assert (code, class_id, method_id) == (404, 60, 40)
    assert text.startswith("NOT_FOUND - no exchange 'x")
    every_listing_answers(api)
    got = api.post(
        "/api/queues/%2F/fanq/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
    )
    assert got.status == 200, got
    assert b'"routing_key":"r\xef\xbf\xbd\\u0000"' in got.body
    assert got.json()[0]["payload"] == "abc"
    conn.close()


# -- AMQP: CR and LF ---------------------------------------------------------------------------


def test_cr_and_lf_leave_queue_and_exchange_names_as_in_rabbitmq(
    raw: Callable[[], MemoryAMQP], api: MemoryHTTP
) -> None:
    client = raw()
    client.send(raw_frame(1, 1, queue_declare(b"a\nb")))
    assert client.expect_method(commands.Queue.DeclareOk).queue == "ab"
    client.send(raw_frame(1, 1, exchange_declare(b"ex\r\nx")))
    client.expect_method(commands.Exchange.DeclareOk)
    client.send(raw_frame(1, 1, queue_bind(b"a\nb", b"ex\nx", b"k\nk")))
    client.expect_method(commands.Queue.BindOk)
    client.send(raw_frame(1, 1, queue_declare(b"\r\n", durable=False)))  # "": server-named
    assert client.expect_method(commands.Queue.DeclareOk).queue.startswith("amq.gen-")
    bindings = api.get("/api/bindings/%2F")
    # The routing key keeps them: it is not a name.
    assert [(b["source"], b["destination"], b["routing_key"]) for b in bindings if b["source"]] == [
        ("exx", "ab", "k\nk")
    ]
    # basic.get keeps them, as RabbitMQ's: no queue "a\nb".
    client.send(raw_frame(1, 1, basic_get(b"a\nb")))
    assert client.expect_channel_close(1) == (
        404,
        "NOT_FOUND - no queue 'a\nb' in vhost '/'",
        60,
        70,
    )
    # The management API declares as AMQP does.
    assert api.put("/api/queues/%2F/nl%0Anl").status == 201
    assert api.request("GET", "/api/queues/%2F/nlnl").status == 200
    names = {q["name"] for q in api.get("/api/queues/%2F")}
    assert {"ab", "nlnl"} <= names and not any("\n" in n for n in names)


# -- the management API -----------------------------------------------------------------------

LONG = "a" * 256
LONG_UTF8 = "é" * 128  # 256 bytes
MAX_UTF8 = "é" * 127 + "a"  # 255 bytes
_POLICY = {"pattern": "^zz", "definition": {"max-length": 1}}

#: (path, body, GET path that must then answer 404) for each API door that names something.
DOORS: dict[str, tuple[str, Any, str]] = {
    "queue": ("/api/queues/%2F/{}", {}, "/api/queues/%2F/{}"),
    "exchange": ("/api/exchanges/%2F/{}", {"type": "direct"}, "/api/exchanges/%2F/{}"),
    "vhost": ("/api/vhosts/{}", {}, "/api/vhosts/{}"),
    "user": ("/api/users/{}", {"password": "pw", "tags": ""}, "/api/users/{}"),
    "policy": ("/api/policies/%2F/{}", _POLICY, "/api/policies/%2F/{}"),
    "operator policy": ("/api/operator-policies/%2F/{}", _POLICY, "/api/operator-policies/%2F/{}"),
    "parameter": (
        "/api/parameters/federation-upstream/%2F/{}",
        {"value": {"uri": "amqp://127.0.0.1:1"}},
        "/api/parameters/federation-upstream/%2F/{}",
    ),
    "global parameter": ("/api/global-parameters/{}", {"value": 1}, "/api/global-parameters/{}"),
}
_KIND_WORD = {"operator policy": "policy", "global parameter": "parameter"}


@pytest.mark.parametrize("door", [door for door in DOORS if door != "parameter"])
def test_the_api_refuses_names_over_255_bytes_or_not_utf8(api: MemoryHTTP, door: str) -> None:
    _refuses_names(api, door)


def test_the_api_refuses_parameter_names_over_255_bytes_or_not_utf8(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    """On a socket broker: the federation-upstream component is warren.app's
    (the harness's core broker has none), and the upstream it stores connects."""
    _refuses_names(Api(broker_factory().http_port), "parameter")


def _refuses_names(api: MemoryHTTP | Api, door: str) -> None:
    put, body, get = DOORS[door]
    kind = _KIND_WORD.get(door, door)
    for name, size in ((LONG, 256), (LONG_UTF8, 256)):
        reply = api.request("PUT", put.format(quote(name)), body)
        assert reply.status == 400, reply
        assert reply.json() == {
            "error": "bad_request",
            "reason": f"{kind} should be less than 255 bytes, actually was {size}\n",
        }
        assert api.request("GET", get.format(quote(name))).status == 404
    reply = api.request("PUT", put.format("orders-%FF"), body)
    assert reply.status == 400, reply
    assert reply.json()["reason"] == f"{kind} 'orders-\ufffd' is not valid UTF-8 (b'orders-\\xff')"
    assert api.request("GET", get.format("orders-%FF")).status == 404
    reply = api.request("PUT", put.format(quote(MAX_UTF8)), body)
    assert reply.status in (201, 204), reply
    assert api.request("GET", get.format(quote(MAX_UTF8))).status == 200
    every_listing_answers(api)


def test_the_api_refuses_routing_keys_over_255_bytes(api: MemoryHTTP) -> None:
    """RabbitMQ 3.10 took a 300-byte routing key in a publish or a binding (Warren's
    publish answered 500): no AMQP client could have sent or be sent one."""
    assert api.put("/api/queues/%2F/q").status == 201
    message = {"properties": {}, "payload": "x", "payload_encoding": "string"}
    too_long = {
        "error": "bad_request",
        "reason": "routing_key should be less than 255 bytes, actually was 300\n",
    }
    reply = api.post("/api/exchanges/%2F/amq.direct/publish", {**message, "routing_key": "r" * 300})
    assert (reply.status, reply.json()) == (400, too_long)
    reply = api.post("/api/bindings/%2F/e/amq.direct/q/q", {"routing_key": "r" * 300})
    assert (reply.status, reply.json()) == (400, too_long)
    assert [b for b in api.get("/api/bindings/%2F") if b["source"]] == []
    assert api.post("/api/bindings/%2F/e/amq.direct/q/q", {"routing_key": MAX_UTF8}).status == 201
    reply = api.post("/api/exchanges/%2F/amq.direct/publish", {**message, "routing_key": MAX_UTF8})
    assert reply.json() == {"routed": True}
    assert api.get("/api/queues/%2F/q")["messages"] == 1


LONE_SURROGATE = {
    "a queue name": b'{"queues":[{"name":"q\\ud800","vhost":"/","durable":true,"auto_delete":false,"arguments":{}}]}',
    "an argument": b'{"queues":[{"name":"q","vhost":"/","durable":true,"auto_delete":false,"arguments":{"k":"\\udcff"}}]}',
    "a routing key": b'{"bindings":[{"source":"amq.direct","vhost":"/","destination":"amq.fanout","destination_type":"exchange","routing_key":"\\ude00x","arguments":{}}]}',
    "encoded in the bytes": b'{"vhosts":[{"name":"v\xed\xa0\x80"}]}',
}


@pytest.mark.parametrize("document", LONE_SURROGATE.values(), ids=list(LONE_SURROGATE))
def test_a_definitions_import_with_a_lone_surrogate_is_refused(
    api: MemoryHTTP, document: bytes
) -> None:
    """RabbitMQ 3.10 imports it (204) and stores a name no UTF-8 decoder reads;
    Warren answered 500 and kept nothing showable. Refused: 400, nothing imported."""
    reply = api.request("POST", "/api/definitions", raw=document)
    assert reply.status == 400, reply
    assert "lone surrogate" in reply.json()["reason"]
    listings = every_listing_answers(api)
    assert listings["/api/queues"] == []
    assert [v["name"] for v in listings["/api/vhosts"]] == ["/"]
    assert [b for b in listings["/api/bindings"] if b["source"]] == []


def test_a_definitions_import_with_names_over_255_bytes_is_refused(api: MemoryHTTP) -> None:
    for category, entry, where in (
        (
            "queues",
            {"name": LONG, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
            f"queues[0] '{LONG}'",
        ),
        (
            "exchanges",
            {
                "name": LONG,
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            },
            f"exchanges[0] '{LONG}'",
        ),
        ("vhosts", {"name": LONG}, f"vhosts[0] '{LONG}'"),
        ("users", {"name": LONG, "password_hash": "", "tags": ""}, f"users[0] '{LONG}'"),
        (
            "bindings",
            {
                "source": "amq.direct",
                "vhost": "/",
                "destination": "amq.fanout",
                "destination_type": "exchange",
                "routing_key": LONG,
                "arguments": {},
            },
            "bindings[0]",
        ),
    ):
        reply = api.post("/api/definitions", {category: [entry]})
        assert reply.status == 400, (category, reply)
        kind = {"queues": "queue", "exchanges": "exchange", "vhosts": "vhost", "users": "user"}.get(
            category, "routing_key"
        )
        assert (
            reply.json()["reason"]
            == f"{where}: {kind} should be less than 255 bytes, actually was 256"
        )
    listings = every_listing_answers(api)
    assert listings["/api/queues"] == []
    assert [u["name"] for u in listings["/api/users"]] == ["guest"]


def test_warren_users_refuses_the_names_the_api_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`warren users add` on a stopped broker writes users.json itself: same rules."""
    data = str(tmp_path / "data")
    assert warren_main(["users", "-D", data, "add", LONG, "pw"]) == 1
    assert "user should be less than 255 bytes, actually was 256" in capsys.readouterr().err
    assert warren_main(["users", "-D", data, "add", "u-\udcff", "pw"]) == 1  # argv's b"u-\xff"
    assert "is not valid UTF-8" in capsys.readouterr().err
    assert warren_main(["users", "-D", data, "add", MAX_UTF8, "pw"]) == 0
    assert warren_main(["users", "-D", data, "list"]) == 0
    assert MAX_UTF8 in capsys.readouterr().out


# -- a data directory from before: names kept, shown, reachable --------------------------------

OLD = "orders-\udcff"  # b"orders-\xff" as Warren's AMQP decoding kept it


def test_names_from_before_the_rules_are_listed_and_their_messages_kept(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older Warren took ``queue.declare("orders-\\xff")`` from any user; the queue,
    its binding and its messages are in the data directory. After the restart every
    listing answers 200 (it answered 500 for everyone), the queue shows as
    "orders-\\ufffd", a clear warning names it, and its messages can be taken (POST
    .../orders-%FF/get) before it is deleted."""
    # The older Warren: no name check in the core, and a raw client publishing.
    monkeypatch.setattr(warren.core.vhost, "check_name", lambda kind, name: None)
    b = Harness(tmp_path / "data")

    def legacy() -> None:
        vhost = b.broker.vhosts["/"]
        q = vhost.declare_queue(OLD, durable=True)
        vhost.declare_exchange("ex-\udcff", "direct", durable=True)
        vhost.bind(vhost.exchanges["amq.direct"], q, "rk-\udcff")

    b.call(legacy)
    client = b.amqp()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Confirm.Select())
    client.expect_method(commands.Confirm.SelectOk)
    for i in range(5):
        publish(client, b"", b"orders-\xff", b"m%d" % i, persistent=True)
        client.expect_method(commands.Basic.Ack)
    client.close()
    client.close_socket()
    b.stop()
    monkeypatch.undo()

    caplog.set_level(logging.WARNING, logger="warren.vhost")
    with Harness(tmp_path / "data") as b:
        _listed_and_kept(b, caplog)


def _listed_and_kept(b: Harness, caplog: pytest.LogCaptureFixture) -> None:
    warned = [r.getMessage() for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert any("queue 'orders-\ufffd'" in w and "'orders-%FF'" in w for w in warned), warned
    assert any("exchange 'ex-\ufffd'" in w for w in warned), warned
    assert any("routing key 'rk-\ufffd'" in w for w in warned), warned
    api = b.http()
    listings = every_listing_answers(api)
    queue = next(q for q in listings["/api/queues"] if q["name"] == "orders-\ufffd")
    assert queue["messages"] == 5
    assert "ex-\ufffd" in [x["name"] for x in listings["/api/exchanges"]]
    binding = next(x for x in listings["/api/bindings"] if x["source"] == "amq.direct")
    assert (binding["destination"], binding["routing_key"]) == ("orders-\ufffd", "rk-\ufffd")
    assert binding["properties_key"] == "rk-%FF"  # the bytes, as RabbitMQ writes them
    assert [q["name"] for q in listings["/api/definitions"]["queues"]] == ["orders-\ufffd"]
    assert api.request("GET", "/metrics/per-object").status == 200
    assert api.get("/api/queues/%2F/orders-%FF")["messages"] == 5
    got = api.post(
        "/api/queues/%2F/orders-%FF/get",
        {"count": 10, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )
    assert [m["payload"] for m in got.json()] == [f"m{i}" for i in range(5)]
    assert api.delete("/api/queues/%2F/orders-%FF").status == 204
    assert api.delete("/api/exchanges/%2F/ex-%FF").status == 204
    listings = every_listing_answers(api)
    assert listings["/api/queues"] == []


# -- every name the broker takes, through AMQP, then every listing ----------------------------

_NAME_CHARS = st.characters(blacklist_categories=("Cs",))  # any character but surrogates


def _fits(name: str) -> bool:
    stripped = name.replace("\r", "").replace("\n", "")
    return len(stripped.encode()) < 255  # one byte more is prefixed below


names = st.text(_NAME_CHARS, max_size=80).filter(_fits)
# A queue name without CR/LF, so that the declare-ok names the queue asked for
# (the test above sends them).
queue_names = names.filter(lambda n: "\r" not in n and "\n" not in n)
keys = st.text(_NAME_CHARS, max_size=80).filter(lambda k: len(k.encode()) <= 255)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(queue=queue_names, exchange=names, key=keys, stray=st.binary(min_size=1, max_size=8))
def test_every_listing_survives_every_name_amqp_takes(
    broker: Harness, queue: str, exchange: str, key: str, stray: bytes
) -> None:
    api = broker.http()
    queue, exchange = "q" + queue, "x" + exchange  # apart from each other and "s-"
    # Raw frames (pika's calls, not pamqp's: pamqp's methods refuse such names).
    conn = broker.amqp()
    try:
        conn.handshake()
        conn.open_channel(1)
        conn.send(raw_frame(1, 1, queue_declare(queue.encode())))
        q = conn.expect_method(commands.Queue.DeclareOk).queue
        conn.send(raw_frame(1, 1, exchange_declare(exchange.encode(), b"topic")))
        conn.expect_method(commands.Exchange.DeclareOk)
        x = exchange.replace("\r", "").replace("\n", "")
        conn.send(raw_frame(1, 1, queue_bind(q.encode(), exchange.encode(), key.encode())))
        conn.expect_method(commands.Queue.BindOk)
        conn.send_method(1, commands.Confirm.Select())
        conn.expect_method(commands.Confirm.SelectOk)
        # As RabbitMQ, basic.publish keeps CR and LF.
        publish(conn, x.encode(), key.encode(), b"hello", persistent=False)
        conn.expect_method(commands.Basic.Ack)
    finally:
        conn.close_socket()
    assert q == queue
    # Bytes that may not be UTF-8: refused as RabbitMQ refuses them, or taken.
    client = broker.amqp()
    try:
        client.handshake()
        client.open_channel(1)
        client.send(raw_frame(1, 1, queue_declare(b"s-" + stray, durable=False)))
        reply = client.read_frame()[1]
        try:
            (b"s-" + stray).decode()
        except UnicodeDecodeError:
            assert isinstance(reply, commands.Connection.Close), reply
            assert reply.reply_code == 501
        else:
            assert isinstance(reply, commands.Queue.DeclareOk | commands.Channel.Close), reply
    finally:
        client.close_socket()
    listings = every_listing_answers(api)
    assert q in [i["name"] for i in listings["/api/queues"]]
    assert x in [i["name"] for i in listings["/api/exchanges"]]
    assert (x, q, key) in [
        (b["source"], b["destination"], b["routing_key"]) for b in listings["/api/bindings"]
    ]
    assert q in [i["name"] for i in listings["/api/definitions"]["queues"]]
    for path in (
        f"/api/queues/%2F/{quote(q, safe='')}",
        f"/api/queues/%2F/{quote(q, safe='')}/bindings",
        f"/api/exchanges/%2F/{quote(x, safe='')}",
        f"/api/exchanges/%2F/{quote(x, safe='')}/bindings/source",
        "/metrics/per-object",
    ):
        reply = api.request("GET", path)
        assert reply.status == 200, (path, reply)
    assert api.get(f"/api/queues/%2F/{quote(q, safe='')}")["messages"] >= 1
