"""RabbitMQ 4's /management node (src/warren/amqp1/management_node.py), driven
directly with request messages on the in-memory harness broker.

Requests are built and encoded by python-qpid-proton (what RabbitMQ's Python
client builds them with), decoded by warren.amqp1.message; replies are encoded
by Warren and decoded by proton. The broker's state is read through the vhost.
The expected statuses and texts are RabbitMQ 4's (rabbit_amqp_management and
its test suites); where Warren differs, docs/amqp1.md says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.held_syncs import HeldSyncs
from harness.management_node import NODE, NodePair, proton

from warren.amqp1.codec import DecodeError
from warren.amqp1.management_node import INVALID_FIELD, ManagementError, decode_request
from warren.amqp1.message import AmqpValue

broker = harness_fixture()


@pytest.fixture
def pair(broker: Harness) -> Iterator[NodePair]:
    yield NodePair(broker)


# -- queues ---------------------------------------------------------------------------
def test_declare_a_queue_then_again(pair: NodePair) -> None:
    status, body = pair.status("PUT", "/queues/q1", {"durable": True, "arguments": {}})
    assert status == "201"
    assert body == {
        "leader": NODE,
        "message_count": 0,
        "consumer_count": 0,
        "name": "q1",
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        "type": "classic",
        "arguments": {},
        "replicas": body["replicas"],
    }
    assert isinstance(body["message_count"], proton.ulong)
    assert isinstance(body["consumer_count"], proton.uint)
    assert list(body["replicas"].elements) == [NODE]
    q = pair.vhost.queues["q1"]
    assert (q.durable, q.auto_delete, q.exclusive) == (True, False, False)
    assert pair.status("PUT", "/queues/q1", {"durable": True})[0] == "200"


def test_declare_defaults_and_typed_arguments(pair: NodePair) -> None:
    """No body keys: durable, not exclusive, not auto-deleted. Arguments keep
    their AMQP 1.0 types as RabbitMQ 4 converts them (a long stays a long)."""
    status, body = pair.status(
        "PUT", "/queues/q", {"arguments": {"x-max-length": 5, "x-overflow": "reject-publish"}}
    )
    assert status == "201"
    assert body["durable"] is True
    assert body["arguments"] == {"x-max-length": 5, "x-overflow": "reject-publish"}
    assert isinstance(body["arguments"]["x-max-length"], int)
    assert pair.vhost.queues["q"].arguments == {"x-max-length": 5, "x-overflow": "reject-publish"}


@pytest.mark.parametrize("queue_type", ["quorum", "stream"])
def test_declare_quorum_queues_and_streams(pair: NodePair, queue_type: str) -> None:
    status, body = pair.status("PUT", "/queues/r", {"arguments": {"x-queue-type": queue_type}})
    assert status == "201"
    assert body["type"] == queue_type
    assert pair.vhost.queues["r"].queue_type == queue_type
    status, body = pair.status("GET", "/queues/r")
    assert (status, body["type"]) == ("200", queue_type)


def test_leader_and_replicas_in_a_cluster(pair: NodePair) -> None:
    """As the HTTP API's leader and members (warren/queue_replicas.py): a quorum
    queue's members are min(its group size, the cluster) of the nodes, in-sync
    first; a classic queue's one replica is the leader that serves it.
    (tests/cluster/test_amqp1_failover.py asks real nodes.)"""
    status = {
        "enabled": True,
        "node": "n1",
        "in_sync_replicas": ["n1", "n3", "n4"],
        "followers": [{"node": n} for n in ("n2", "n3", "n4")],
    }
    pair.node.node_name, pair.node.cluster = None, lambda: status
    arguments = {"x-queue-type": "quorum"}
    body = pair.status("PUT", "/queues/qq", {"arguments": arguments})[1]
    assert (body["leader"], list(body["replicas"].elements)) == ("n1", ["n1", "n3", "n4"])
    arguments["x-quorum-initial-group-size"] = 2
    body = pair.status("PUT", "/queues/pair", {"arguments": arguments})[1]
    assert (body["leader"], list(body["replicas"].elements)) == ("n1", ["n1", "n3"])
    body = pair.status("GET", "/queues/qq")[1]
    assert list(body["replicas"].elements) == ["n1", "n3", "n4"]
    body = pair.status("PUT", "/queues/cq", {})[1]
    assert (body["leader"], list(body["replicas"].elements)) == ("n1", ["n1"])


def test_the_vhost_default_queue_type(broker: Harness) -> None:
    broker.call(lambda: broker.broker.vhosts["/"].metadata.set_default_queue_type("quorum"))
    pair = NodePair(broker)
    assert pair.status("PUT", "/queues/d", {})[1]["type"] == "quorum"


def test_an_inequivalent_redeclaration_is_409(pair: NodePair) -> None:
    pair.status("PUT", "/queues/q", {"durable": True})
    status, text = pair.status("PUT", "/queues/q", {"durable": False})
    assert status == "409"
    assert "inequivalent arg 'durable'" in text
    status, text = pair.status("PUT", "/queues/q", {"arguments": {"x-max-length": 1}})
    assert status == "409"
    assert "x-max-length" in text


def test_invalid_arguments_are_409_what_a_queue_type_refuses_400(pair: NodePair) -> None:
    status, text = pair.status("PUT", "/queues/q", {"arguments": {"x-max-length": "ten"}})
    assert status == "409"
    assert "x-max-length" in text
    stream = {"x-queue-type": "stream"}
    assert pair.status(
        "PUT", "/queues/q", {"arguments": {**stream, "x-dead-letter-exchange": "dlx"}}
    ) == (
        "409",
        "invalid arg 'x-dead-letter-exchange' for queue 'q' in vhost '/' "
        "of queue type rabbit_stream_queue",
    )
    assert pair.status("PUT", "/queues/q", {"auto_delete": True, "arguments": stream}) == (
        "400",
        "invalid property 'auto-delete' for queue 'q' in vhost '/'",
    )
    assert "q" not in pair.vhost.queues


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/queues/", {}, "400", "declare queue with empty name not allowed"),
        (
            "/queues/a%0Ab",
            {},
            "400",
            "Bad name 'a\nb': line feed and carriage return characters not allowed",
        ),
        (
            "/queues/amq.q",
            {},
            "403",
            "queue 'amq.q' in vhost '/' starts with reserved prefix 'amq.'",
        ),
        ("/queues/q", {"durable": "yes"}, "400", "bad queue property 'durable': 'yes'"),
        ("/queues/q", {"colour": True}, "400", "bad queue property 'colour'"),
        ("/queues/q", {"arguments": {1: 2}}, "400", "unsupported argument 1"),
        ("/queues/q", None, "400", "bad queue body: a map is expected"),
        ("/queues/a%ZZ", {}, "400", "bad percent-encoding in 'a%ZZ'"),
        ("/queues/🐇", {}, "400", "failed to normalize URI '/queues/🐇'"),
        ("queues/q", {}, "400", "bad request target 'queues/q'"),
    ],
)
def test_bad_declarations(pair: NodePair, path: str, body: Any, status: str, text: str) -> None:
    assert pair.status("PUT", path, body) == (status, text)
    assert not [name for name in pair.vhost.queues if not name.startswith("amq.")]


def test_percent_encoded_names(pair: NodePair) -> None:
    assert pair.status("PUT", "/queues/my%20%F0%9F%90%87%2Fq", {})[0] == "201"
    assert "my 🐇/q" in pair.vhost.queues


def test_the_queue_limit_is_403(broker: Harness) -> None:
    broker.call(lambda: broker.broker.vhosts["/"].set_limits({"max-queues": 0}))
    pair = NodePair(broker)
    assert pair.status("PUT", "/queues/q", {}) == (
        "403",
        "cannot declare queue 'q': queue limit in vhost '/' (0) is reached",
    )


def test_exclusive_queues_belong_to_the_connection(broker: Harness) -> None:
    """Another connection cannot redeclare it (400: RabbitMQ 4's answer to a
    locked queue) nor delete it, but may look at it."""
    mine, theirs = NodePair(broker), NodePair(broker)
    status, body = mine.status("PUT", "/queues/x", {"exclusive": True, "durable": False})
    assert (status, body["exclusive"]) == ("201", True)
    assert mine.vhost.queues["x"].exclusive_owner is mine.owner
    status, text = theirs.status("PUT", "/queues/x", {"exclusive": True, "durable": False})
    assert status == "400"
    assert "cannot obtain exclusive access to locked queue 'x'" in text
    assert theirs.status("GET", "/queues/x")[0] == "200"
    assert theirs.status("DELETE", "/queues/x")[0] == "400"
    assert theirs.status("DELETE", "/queues/x/messages")[0] == "400"
    bind = {"source": "amq.direct", "destination_queue": "x", "binding_key": "k"}
    assert theirs.status("POST", "/bindings", bind)[0] == "400"
    assert mine.status("POST", "/bindings", bind) == ("204", None)
    assert theirs.status("DELETE", "/bindings/src=amq.direct;dstq=x;key=k;args=")[0] == "400"
    # Redeclared not exclusive by its own connection: locked all the same.
    assert mine.status("PUT", "/queues/x", {"durable": False})[0] == "400"
    assert mine.status("DELETE", "/queues/x")[0] == "200"


def test_get_a_queue(pair: NodePair, broker: Harness) -> None:
    pair.status("PUT", "/queues/g", {})
    with broker.amqp_connection() as conn:
        ch = conn.channel()
        for _ in range(3):
            ch.basic_publish("", "g", b"m")
        ch.barrier()
    status, body = pair.status("GET", "/queues/g")
    assert status == "200"
    assert (body["name"], body["message_count"], body["consumer_count"]) == ("g", 3, 0)
    assert pair.status("GET", "/queues/nope") == (
        "404",
        "queue 'nope' in vhost '/' not found",
    )


def test_purge_and_delete_count_the_messages(pair: NodePair, broker: Harness) -> None:
    pair.status("PUT", "/queues/p", {})
    with broker.amqp_connection() as conn:
        ch = conn.channel()
        for _ in range(4):
            ch.basic_publish("", "p", b"m")
        ch.barrier()
    status, body = pair.status("DELETE", "/queues/p/messages")
    assert (status, body) == ("200", {"message_count": 4})
    assert isinstance(body["message_count"], proton.ulong)
    assert pair.vhost.queues["p"].message_count == 0
    with broker.amqp_connection() as conn:
        ch = conn.channel()
        ch.basic_publish("", "p", b"m")
        ch.barrier()
    assert pair.status("DELETE", "/queues/p") == ("200", {"message_count": 1})
    assert "p" not in pair.vhost.queues
    # Deleting a missing queue succeeds; purging one is 404.
    assert pair.status("DELETE", "/queues/p") == ("200", {"message_count": 0})
    assert pair.status("DELETE", "/queues/p/messages") == ("404", "no queue 'p' in vhost '/'")


def test_a_stream_cannot_be_purged(pair: NodePair) -> None:
    pair.status("PUT", "/queues/s", {"arguments": {"x-queue-type": "stream"}})
    assert pair.status("DELETE", "/queues/s/messages") == (
        "400",
        "purge not supported by queue 's' in vhost '/'",
    )


# -- exchanges ------------------------------------------------------------------------
def test_declare_and_delete_an_exchange(pair: NodePair) -> None:
    body = {"type": "topic", "durable": True, "auto_delete": False, "internal": False,
            "arguments": {}}  # fmt: skip
    assert pair.status("PUT", "/exchanges/e1", body) == ("204", None)
    ex = pair.vhost.exchanges["e1"]
    assert (ex.type, ex.durable, ex.auto_delete, ex.internal) == ("topic", True, False, False)
    assert pair.status("PUT", "/exchanges/e1", body) == ("204", None)
    status, text = pair.status("PUT", "/exchanges/e1", {"type": "fanout"})
    assert status == "409"
    assert "inequivalent arg 'type'" in text
    assert pair.status("DELETE", "/exchanges/e1") == ("204", None)
    assert "e1" not in pair.vhost.exchanges
    assert pair.status("DELETE", "/exchanges/e1") == ("204", None)


def test_exchange_defaults(pair: NodePair) -> None:
    assert pair.status("PUT", "/exchanges/d", {})[0] == "204"
    ex = pair.vhost.exchanges["d"]
    assert (ex.type, ex.durable, ex.auto_delete, ex.internal) == ("direct", True, False, False)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "text"),
    [
        ("PUT", "/exchanges/e", {"type": "nope"}, "400", "unknown exchange type 'nope'"),
        ("PUT", "/exchanges/", {}, "403", "operation not permitted on the default exchange"),
        (
            "PUT",
            "/exchanges/amq.new",
            {},
            "403",
            "exchange 'amq.new' in vhost '/' starts with reserved prefix 'amq.'",
        ),
        ("PUT", "/exchanges/e", {"kind": "x"}, "400", "bad exchange property 'kind'"),
        ("DELETE", "/exchanges/", None, "403", "operation not permitted on the default exchange"),
        (
            "DELETE",
            "/exchanges/amq.direct",
            None,
            "403",
            "exchange 'amq.direct' in vhost '/' starts with reserved prefix 'amq.'",
        ),
    ],
)
def test_bad_exchange_requests(
    pair: NodePair, method: str, path: str, body: Any, status: str, text: str
) -> None:
    assert pair.status(method, path, body) == (status, text)
    assert "e" not in pair.vhost.exchanges and "amq.new" not in pair.vhost.exchanges
    assert "amq.direct" in pair.vhost.exchanges


def test_a_predeclared_exchange_redeclared_equivalently(pair: NodePair) -> None:
    assert pair.status("PUT", "/exchanges/amq.direct", {"type": "direct"}) == ("204", None)


# -- bindings -------------------------------------------------------------------------
def test_bind_list_and_unbind_a_queue(pair: NodePair) -> None:
    pair.status("PUT", "/queues/bq", {})
    body = {"source": "amq.topic", "destination_queue": "bq", "binding_key": "a.*",
            "arguments": {}}  # fmt: skip
    assert pair.status("POST", "/bindings", body) == ("204", None)
    ex, q = pair.vhost.exchanges["amq.topic"], pair.vhost.queues["bq"]
    assert ex.find_binding(q, "a.*", {}) is not None
    assert pair.status("POST", "/bindings", body) == ("204", None)  # again: no change
    status, listed = pair.status("GET", "/bindings?src=amq.topic&dstq=bq&key=a.%2A")
    location = "/bindings/src=amq.topic;dstq=bq;key=a.%2A;args="
    assert (status, listed) == (
        "200",
        [
            {
                "source": "amq.topic",
                "destination_queue": "bq",
                "binding_key": "a.*",
                "arguments": {},
                "location": location,
            }
        ],
    )
    assert pair.status("GET", "/bindings?src=amq.topic&dstq=bq&key=b")[1] == []
    assert pair.status("DELETE", location) == ("204", None)
    assert ex.find_binding(q, "a.*", {}) is None
    assert pair.status("DELETE", location) == ("204", None)  # a missing binding


def test_bind_an_exchange_with_arguments(pair: NodePair) -> None:
    """A binding with arguments is found again through its location's hash."""
    pair.status("PUT", "/exchanges/dst", {"type": "fanout"})
    args = {"x-match": "all", "k": "v"}
    body = {"source": "amq.headers", "destination_exchange": "dst", "binding_key": "",
            "arguments": args}  # fmt: skip
    assert pair.status("POST", "/bindings", body) == ("204", None)
    src, dst = pair.vhost.exchanges["amq.headers"], pair.vhost.exchanges["dst"]
    assert src.find_binding(dst, "", args) is not None
    [listed] = pair.status("GET", "/bindings?src=amq.headers&dste=dst&key=")[1]
    assert listed["destination_exchange"] == "dst"
    assert listed["arguments"] == args
    location = listed["location"]
    assert location.startswith("/bindings/src=amq.headers;dste=dst;key=;args=")
    assert not location.endswith("args=")
    assert pair.status("DELETE", "/bindings/src=amq.headers;dste=dst;key=;args=") == ("204", None)
    assert src.find_binding(dst, "", args) is not None  # other arguments: not this one
    assert pair.status("DELETE", location) == ("204", None)
    assert src.find_binding(dst, "", args) is None


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (
            {"source": "amq.direct", "destination_queue": "none", "binding_key": "k"},
            "400",
            "no queue 'none' in vhost '/'",
        ),
        (
            {"source": "nope", "destination_queue": "bq", "binding_key": "k"},
            "400",
            "no exchange 'nope' in vhost '/'",
        ),
        (
            {"source": "", "destination_queue": "bq", "binding_key": "k"},
            "403",
            "operation not permitted on the default exchange",
        ),
        (
            {"source": "amq.headers", "destination_queue": "bq", "arguments": {"x-match": "x"}},
            "400",
            None,
        ),
        ({"source": "amq.direct", "binding_key": "k"}, "400", None),
        ({"source": "amq.direct", "destination_queue": "bq", "colour": "red"}, "400", None),
    ],
)
def test_bad_bindings(pair: NodePair, body: dict[str, Any], status: str, text: str | None) -> None:
    pair.status("PUT", "/queues/bq", {})
    got_status, got_text = pair.status("POST", "/bindings", body)
    assert got_status == status
    if text is not None:
        assert got_text == text
    assert not pair.vhost.exchanges["amq.direct"].bindings


def test_bad_binding_paths(pair: NodePair) -> None:
    assert pair.status("DELETE", "/bindings/src=x;dstz=q;key=;args=") == (
        "400",
        "bad binding path segment 'src=x;dstz=q;key=;args='",
    )
    status, text = pair.status("GET", "/bindings?src=x&key=k")
    assert status == "400"
    assert "missing 'dste' or 'dstq'" in text


# -- the request's envelope -------------------------------------------------------------
def test_unknown_paths_and_methods(pair: NodePair) -> None:
    assert pair.status("GET", "/vhosts/x")[0] == "404"
    assert pair.status("GET", "/queues/q/consumers")[0] == "404"
    assert pair.status("POST", "/queues/q", {})[0] == "405"
    assert pair.status("GET", "/exchanges/amq.direct")[0] == "405"
    # A user of the user store keeps its login (tests/core/test_oauth2.py: tokens).
    assert pair.status("PUT", "/auth/tokens", b"token")[0] == "204"
    assert pair.status("GET", "/auth/tokens")[0] == "405"


def test_the_correlation_id_is_the_message_id_as_it_came(pair: NodePair, broker: Harness) -> None:
    for message_id in (uuid.uuid4(), proton.ulong(7), b"\x00\x01", "text"):
        pair.send("GET", "/queues/none", message_id=message_id)
        broker.settle()
        [reply] = pair.replies
        pair.replies.clear()
        assert reply.correlation_id == message_id


def test_a_request_needs_reply_to_me(pair: NodePair) -> None:
    with pytest.raises(ManagementError) as refused:
        pair.send("GET", "/queues/q", reply_to="/queues/mine")
    assert refused.value.condition == INVALID_FIELD


# -- durability and order -------------------------------------------------------------
def test_a_durable_declare_is_answered_once_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the sync round's file syncs held, the broker has done all it can and
    the declare's reply is not out, nor the reply to a GET sent after it (replies
    keep their requests' order); let go, both come, in order."""
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        pair = NodePair(harness)
        harness.settle()
        syncs.hold()
        try:
            declare = pair.send("PUT", "/queues/held", {"durable": True})
            look = pair.send("GET", "/queues/held")
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()
            assert pair.replies == []
            assert "held" in pair.vhost.queues
        finally:
            syncs.release()
        harness.settle()
        assert [(r.correlation_id, r.subject) for r in pair.replies] == [
            (declare, "201"),
            (look, "200"),
        ]
        pair.replies.clear()
        # A transient queue writes no definition: answered at once.
        syncs.hold()
        try:
            pair.send("PUT", "/queues/transient", {"durable": False})
            assert [r.subject for r in pair.replies] == ["201"]
        finally:
            syncs.release()


def test_closing_drops_the_replies_still_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        pair = NodePair(harness)
        harness.settle()
        syncs.hold()
        try:
            pair.send("PUT", "/queues/held", {"durable": True})
            assert syncs.waiting.wait(30), "no sync round started"
            harness.call(pair.node.close)
        finally:
            syncs.release()
        harness.settle()
        assert pair.replies == []


def test_symbols_stand_for_their_text(pair: NodePair) -> None:
    """RabbitMQ 4's clients send strings; a symbol key or value is taken as the
    text it spells, and kept as plain text."""
    sym = proton.symbol
    assert pair.status("PUT", "/exchanges/sx", {sym("type"): sym("fanout")}) == ("204", None)
    assert pair.vhost.exchanges["sx"].type == "fanout"
    pair.status("PUT", "/queues/sq", {})
    body = {sym("source"): sym("sx"), sym("destination_queue"): sym("sq"), "binding_key": sym("k")}
    assert pair.status("POST", "/bindings", body) == ("204", None)
    [binding] = pair.vhost.exchanges["sx"].bindings.values()
    assert type(binding.routing_key) is str
    assert binding.routing_key == "k"


def test_decode_request_takes_what_the_node_reads() -> None:
    """The properties and an amqp-value; other sections are left out, and a
    request may have no body section at all (a GET, a DELETE)."""
    full = proton.Message(
        id="m",
        address="/queues/q",
        subject="PUT",
        reply_to="$me",
        durable=True,
        annotations={proton.symbol("x-opt-a"): 1},
        properties={"k": "v"},
        body={"durable": True},
        inferred=False,
    )
    request = decode_request(full.encode())
    assert request.properties is not None
    assert (request.properties.to, request.properties.subject) == ("/queues/q", "PUT")
    assert request.body == [AmqpValue({"durable": True})]
    assert (request.header, request.message_annotations, request.application_properties) == (
        None,
        None,
        None,
    )
    bare = proton.Message(id="m", address="/queues/q", subject="GET", reply_to="$me")
    assert decode_request(bare.encode()).body == []
    with pytest.raises(DecodeError):
        decode_request(b"\x00\x53\x77\xa1\x05ab")
