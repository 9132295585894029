"""What RabbitMQ's own management UI needs from the API, checked at the API level
(tests/ui/test_rabbitmq_ui.py drives the UI itself). Each answer is RabbitMQ
3.10.8's, asked with the same requests (tests/rabbitmq_proc.py, plugins
rabbitmq_management, rabbitmq_federation_management, rabbitmq_shovel_management).
"""

from __future__ import annotations

import base64
import time
from urllib.parse import quote

import pytest
from conftest import BrokerThread
from httphelp import Api
from pikahelp import barrier, connect, uniq

pytestmark = pytest.mark.timeout(60)

RANGES = "msg_rates_age=60&msg_rates_incr=5&data_rates_age=60&data_rates_incr=5"


def test_auth_settings_are_read_without_credentials(broker: BrokerThread) -> None:
    """The UI's index page reads /api/auth before its login form: a 404 there left
    3.10's UI on luck and breaks later ones."""
    reply = Api(broker.http_port).anonymous().request("GET", "/api/auth")
    assert reply.status == 200, reply
    settings = reply.json()
    assert settings["enable_uaa"] is False and settings["oauth_enabled"] is False
    assert settings["uaa_client_id"] == "" and settings["uaa_location"] == ""


def test_extensions_name_the_ui_scripts(broker: BrokerThread) -> None:
    """The UI's pages are registered by the scripts /api/extensions names
    (dispatcher.js is rabbitmq_management's own): with none, no page opens."""
    names = [e["javascript"] for e in Api(broker.http_port).get("/api/extensions")]
    assert names == ["dispatcher.js", "federation.js", "shovel.js"]


def test_feature_flags(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    flags = api.get("/api/feature-flags")
    assert [f["name"] for f in flags] == [
        "classic_mirrored_queue_version",
        "drop_unroutable_metric",
        "empty_basic_get_metric",
        "implicit_default_bindings",
        "maintenance_mode_status",
        "quorum_queue",
        "stream_queue",
        "user_limits",
        "virtual_host_metadata",
    ]
    quorum = next(f for f in flags if f["name"] == "quorum_queue")
    assert quorum == {
        "name": "quorum_queue",
        "desc": "Support queues of type `quorum`",
        "doc_url": "https://www.rabbitmq.com/quorum-queues.html",
        "state": "enabled",
        "stability": "stable",
        "provided_by": "rabbit",
    }
    assert [f["name"] for f in api.get("/api/feature-flags?sort=name&sort_reverse=true")][0] == (
        "virtual_host_metadata"
    )
    assert api.put("/api/feature-flags/quorum_queue/enable").status == 204
    refused = api.put("/api/feature-flags/no_such_flag/enable")
    assert (refused.status, refused.json()) == (400, {"error": "bad_request", "reason": "unsupported"})
    assert api.request("GET", "/api/feature-flags/quorum_queue/enable").status == 405

    assert api.put("/api/users/ff-monitor", {"password": "p", "tags": "monitoring"}).status == 201
    monitor = api.as_user("ff-monitor", "p")
    for method, path in (("GET", "/api/feature-flags"), ("PUT", "/api/feature-flags/quorum_queue/enable")):
        reply = monitor.request(method, path, {} if method == "PUT" else None)
        assert (reply.status, reply.json()) == (
            401, {"error": "not_authorised", "reason": "Not administrator user"}
        )


def test_a_channel_gives_its_rates_history_when_asked(hand_sampled_broker: BrokerThread) -> None:
    """The channel page asks for msg_rates_age: each message_stats ``*_details``
    needs ``samples`` then, or its chart throws (``samples.length``)."""
    broker = hand_sampled_broker
    api = Api(broker.http_port)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q)
    start = float((int(time.time()) // 5 + 1) * 5)  # samples fall on multiples of 5 s
    broker.call(lambda: broker.broker.sample_stats(start))
    for _ in range(10):
        ch.basic_publish("", q, b"m")
    ch.basic_get(q, auto_ack=True)
    barrier(ch)
    broker.call(lambda: broker.broker.sample_stats(start + 5))

    [listed] = api.get(f"/api/channels?{RANGES}")
    one = api.get(f"/api/channels/{quote(listed['name'], safe='')}?{RANGES}")
    for channel in (listed, one):
        stats = channel["message_stats"]
        details = {k: v for k, v in stats.items() if k.endswith("_details")}
        assert {"publish_details", "confirm_details", "get_no_ack_details"} <= set(details)
        for key, value in details.items():
            assert "samples" in value and "avg_rate" in value, (key, value)
        assert stats["publish_details"]["samples"][0]["sample"] == 10
        assert stats["publish_details"]["rate"] == 2.0
    plain = api.get(f"/api/channels/{quote(listed['name'], safe='')}")["message_stats"]
    assert plain["publish_details"] == {"rate": 2.0}  # no history unless asked
    conn.close()


def test_idle_since_only_while_the_queue_is_idle(hand_sampled_broker: BrokerThread) -> None:
    """RabbitMQ gives ``idle_since`` once a queue has stopped working and none
    while it works; the UI shows a queue with one as "idle"."""
    broker = hand_sampled_broker
    api = Api(broker.http_port)
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    barrier(ch)
    # After the declaration (its last use), and not on a whole millisecond: the
    # sampler's clock is time.time()'s, which the history keeps to the ms.
    start = time.time() + 1.0004
    broker.call(lambda: broker.broker.sample_stats(start))
    ch.basic_publish("", q, b"m")
    ch.basic_get(q, auto_ack=True)
    barrier(ch)
    broker.call(lambda: broker.broker.sample_stats(start + 5))
    busy = api.get(f"/api/queues/%2F/{q}")
    assert busy["state"] == "running" and "idle_since" not in busy
    listed = next(x for x in api.get("/api/queues/%2F") if x["name"] == q)
    assert "idle_since" not in listed

    broker.call(lambda: broker.broker.sample_stats(start + 10))  # nothing moved since
    idle = api.get(f"/api/queues/%2F/{q}")
    ms = int((start + 5) * 1000)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000))
    assert idle["idle_since"] == f"{when}.{ms % 1000:03d}+00:00"
    conn.close()


def test_a_quorum_queue_has_the_dead_letter_counts_its_page_shows(
    hand_sampled_broker: BrokerThread,
) -> None:
    broker = hand_sampled_broker
    api = Api(broker.http_port)
    q = uniq()
    assert api.put(f"/api/queues/%2F/{q}", {"durable": True, "arguments": {"x-queue-type": "quorum"}}).status == 201
    queue = api.get(f"/api/queues/%2F/{q}")
    assert (queue["messages_dlx"], queue["message_bytes_dlx"]) == (0, 0)
    assert "idle_since" not in queue  # RabbitMQ 3.10's quorum queues have none
    for x in api.get("/api/queues/%2F"):
        if x["name"] == q:
            assert (x["messages_dlx"], x["message_bytes_dlx"]) == (0, 0)


def test_definitions_download_link_carries_its_credentials(broker: BrokerThread) -> None:
    """The UI's "Download broker definitions" opens
    ``api/definitions?download=<file>&auth=<base64 user:password>`` as a page: no
    Authorization header. RabbitMQ takes ``auth`` there, and only there."""
    api = Api(broker.http_port)
    anonymous = api.anonymous()
    token = quote(base64.b64encode(b"guest:guest").decode(), safe="")
    for path in ("/api/definitions", "/api/definitions/%2F"):
        reply = anonymous.request("GET", f"{path}?download=rabbit%20defs.json&auth={token}")
        assert reply.status == 200, reply
        assert reply.headers["Content-Disposition"] == 'attachment; filename="rabbit defs.json"'
        assert "queues" in reply.json()
    assert anonymous.request("GET", f"/api/overview?auth={token}").status == 401

    assert api.put("/api/users/defs-monitor", {"password": "p", "tags": "monitoring"}).status == 201
    for credentials, reason in (
        (b"guest:wrong", "Login failed"),
        (b"defs-monitor:p", "Not administrator user"),
    ):
        token = quote(base64.b64encode(credentials).decode(), safe="")
        reply = anonymous.request("GET", f"/api/definitions?auth={token}")
        assert (reply.status, reply.json()["reason"]) == (401, reason)
    # Not base64 at all: refused as any bad credentials (RabbitMQ 3.10 answers 500).
    reply = anonymous.request("GET", "/api/definitions?auth=not%20base64!")
    assert (reply.status, reply.json()["reason"]) == (401, "Login failed")


def test_a_dynamic_shovel_is_deleted_by_its_status_path(broker: BrokerThread) -> None:
    """The UI's "Delete this shovel" is DELETE /api/shovels/vhost/{vhost}/{name}."""
    api = Api(broker.http_port)
    value = {"src-uri": "amqp://", "src-queue": uniq("src"), "dest-uri": "amqp://",
             "dest-queue": uniq("dest")}
    assert api.put("/api/parameters/shovel/%2F/ui-delete", {"value": value}).status == 201
    assert api.request("DELETE", "/api/shovels/vhost/%2F/ui-delete").status == 204
    assert api.request("GET", "/api/parameters/shovel/%2F/ui-delete").status == 404
    assert all(s["name"] != "ui-delete" for s in api.get("/api/shovels"))
    for path in ("/api/shovels/vhost/%2F/ui-delete", "/api/shovels/vhost/no-such-vhost/x"):
        reply = api.request("DELETE", path)
        assert (reply.status, reply.json()["error"]) == (404, "Object Not Found")


def test_node_memory_and_binary_breakdowns_when_asked(broker: BrokerThread) -> None:
    """The node page's "Memory details" and "Binary references" buttons read
    /api/nodes/{node}?memory=true and ?binary=true."""
    api = Api(broker.http_port)
    name = api.get("/api/overview")["node"]
    node = api.get(f"/api/nodes/{name}")
    assert "memory" not in node and "binary" not in node
    memory = api.get(f"/api/nodes/{name}?memory=true")["memory"]
    assert memory["strategy"] == "rss" and memory["total"]["rss"] > 0
    assert memory == {**api.get(f"/api/nodes/{name}/memory")["memory"], "total": memory["total"],
                      "other_system": memory["other_system"]}
    # No Erlang binary heap: what RabbitMQ answers when it cannot tell.
    assert api.get(f"/api/nodes/{name}?binary=true")["binary"] == "not_available"
