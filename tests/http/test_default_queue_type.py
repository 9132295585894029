"""A vhost's default queue type (RabbitMQ 3.11+'s vhost metadata ``default_queue_type``).

RabbitMQ 3.10.8 (recorded by tools/mgmt_gaps.py) takes the key in a vhost PUT
and ignores it: its queues stay classic. Warren follows RabbitMQ 3.13 (its
source: rabbit_mgmt_wm_vhost, rabbit_vhost, rabbit_amqqueue's
augment_declare_args, rabbit_definitions; 4.x's validation texts): the vhost
keeps it (and lists it, exports and imports it), and a queue declared there
without ``x-queue-type`` gets it when it can be of that type (durable, not
exclusive, not auto-delete, for quorum queues and streams) and ``classic``
otherwise, written into its arguments as RabbitMQ writes it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import BrokerThread
from httphelp import Api

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mgmt_gaps  # noqa: E402

# The tool's own (tests/http/test_mgmt_compat.py loads mgmt_compat afresh).
Client = mgmt_gaps.Client

pytestmark = pytest.mark.timeout(60)

RECORDED = json.loads(Path(__file__).with_name("rabbitmq_gap_answers.json").read_text())[
    "default_queue_type"
]
Factory = Callable[..., BrokerThread]
V = mgmt_gaps.V


def _queues(api: Api, vhost: str = V) -> dict[str, dict[str, Any]]:
    cols = "?columns=name,type,durable,exclusive,auto_delete,arguments"
    return {q["name"]: q for q in api.get(f"/api/queues/{vhost}{cols}")}


def test_the_recorded_scenario(broker: BrokerThread) -> None:
    answers = mgmt_gaps.default_queue_type(Client(f"http://127.0.0.1:{broker.http_port}"), broker.port)
    # As RabbitMQ 3.10.8: the PUT is accepted, the vhost has RabbitMQ 3.13's keys.
    assert answers["vhost put"] == RECORDED["vhost put"] == 201
    assert answers["vhost keys"] == RECORDED["vhost keys"]
    # Then RabbitMQ 3.13's: the vhost keeps it and its queues get it.
    assert RECORDED["vhost default_queue_type"] == "undefined"  # 3.10 ignores it
    assert answers["vhost default_queue_type"] == "quorum"
    assert {q["name"]: (q["type"], q["arguments"]) for q in answers["queues"]} == {
        "amqp-durable": ("quorum", {"x-queue-type": "quorum"}),
        "amqp-exclusive": ("classic", {"x-queue-type": "classic"}),
        "amqp-transient": ("classic", {"x-queue-type": "classic"}),
        "http-durable": ("quorum", {"x-queue-type": "quorum"}),
    }
    assert {q["name"] for q in RECORDED["queues"]} == {q["name"] for q in answers["queues"]}
    assert answers["definitions vhost"] == {
        "name": mgmt_gaps.DQT_VHOST,
        "description": "",
        "tags": [],
        "default_queue_type": "quorum",
        "metadata": {"default_queue_type": "quorum", "description": "", "tags": []},
    }


def test_declarations_in_a_quorum_vhost(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    assert api.request("PUT", f"/api/vhosts/{V}").status == 201
    conn = pika.BlockingConnection(pika.URLParameters(f"{broker.url}{V}"))
    ch = conn.channel()
    ch.queue_declare("before", durable=True)  # declared while the vhost has no default
    assert api.request("PUT", f"/api/vhosts/{V}", {"default_queue_type": "quorum"}).status == 204
    vhost = api.get(f"/api/vhosts/{V}")
    assert vhost["default_queue_type"] == "quorum"
    assert vhost["metadata"]["default_queue_type"] == "quorum"
    ch.queue_declare("auto", durable=True, auto_delete=True)
    ch.queue_declare("stream", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare("classic", durable=True, arguments={"x-queue-type": "classic"})
    types = {name: q["type"] for name, q in _queues(api).items()}
    assert types == {"before": "classic", "auto": "classic", "stream": "stream", "classic": "classic"}
    # As 3.13: a redeclaration without x-queue-type gets the default too, which a
    # classic queue made before does not have.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("before", durable=True)
    assert info.value.reply_code == 406
    assert "inequivalent arg 'x-queue-type' for queue 'before'" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("", durable=True)  # server-named: a quorum queue cannot be
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    )
    ch = conn.channel()
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    conn.close()
    # Clearing it: queues declared then are classic again, those made stay.
    assert api.request("PUT", f"/api/vhosts/{V}", {"default_queue_type": "undefined"}).status == 204
    assert api.get(f"/api/vhosts/{V}")["default_queue_type"] == "undefined"
    assert "default_queue_type" not in api.get(f"/api/vhosts/{V}")["metadata"]
    assert api.request("PUT", f"/api/queues/{V}/after", {"durable": True}).status == 201
    assert _queues(api)["after"]["type"] == "classic"


def test_refused_values_change_nothing(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    for value, reason in (
        ("bogus", "bogus is not a valid queue type"),
        ("", "default_queue_type must not be an empty string"),
        (1, "1 is not a valid default_queue_type value"),
    ):
        reply = api.request("PUT", "/api/vhosts/refused", {"default_queue_type": value})
        assert (reply.status, reply.json()) == (400, {"error": "bad_request", "reason": reason})
        assert api.request("GET", "/api/vhosts/refused").status == 404
    # RabbitMQ 3.11.0's name for the key is taken too.
    assert api.request("PUT", "/api/vhosts/old-key", {"defaultqueuetype": "stream"}).status == 201
    assert api.get("/api/vhosts/old-key")["default_queue_type"] == "stream"


def test_kept_across_restarts_exported_and_imported(
    tmp_path: Path, broker_factory: Factory
) -> None:
    b = broker_factory(data_dir=tmp_path / "one")
    api = Api(b.http_port)
    assert api.request("PUT", f"/api/vhosts/{V}", {"default_queue_type": "quorum"}).status == 201
    b.stop()
    b = broker_factory(data_dir=tmp_path / "one")
    api = Api(b.http_port)
    assert api.get(f"/api/vhosts/{V}")["default_queue_type"] == "quorum"
    exported = api.get("/api/definitions")
    [entry] = [v for v in exported["vhosts"] if v["name"] == V]
    assert list(entry) == ["name", "description", "tags", "default_queue_type", "metadata"]
    # Into another broker, with a queue that says no type: it becomes a quorum queue.
    exported["queues"] = [
        {"name": "imported", "vhost": V, "durable": True, "auto_delete": False, "arguments": {}}
    ]
    other = Api(broker_factory(data_dir=tmp_path / "two").http_port)
    assert other.request("POST", "/api/definitions", exported).status == 204
    assert other.get(f"/api/vhosts/{V}")["default_queue_type"] == "quorum"
    assert _queues(other)["imported"]["type"] == "quorum"
    # A RabbitMQ 3.13 export says it in the metadata only.
    doc = {"vhosts": [{"name": "v313", "metadata": {"default_queue_type": "stream"}}]}
    assert other.request("POST", "/api/definitions", doc).status == 204
    assert other.get("/api/vhosts/v313")["default_queue_type"] == "stream"
    bad = {"vhosts": [{"name": "v-bad", "metadata": {"default_queue_type": "bogus"}}]}
    reply = other.request("POST", "/api/definitions", bad)
    assert reply.status == 400 and "bogus is not a valid queue type" in reply.json()["reason"]
    assert other.request("GET", "/api/vhosts/v-bad").status == 404


def test_mqtt_queues_stay_classic(broker: BrokerThread) -> None:
    """RabbitMQ's MQTT plugin declares its queues with their type (classic), not
    through the vhost's default."""
    api = Api(broker.http_port)
    assert api.request("PUT", f"/api/vhosts/{V}", {"default_queue_type": "quorum"}).status == 201
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert api.request("PUT", f"/api/permissions/{V}/guest", perms).status in (201, 204)
    client = mgmt_gaps.MqttClient(broker.mqtt_port, "dqt", clean=False)
    assert client.subscribe("t/x") == {"suback": [1], "closed": False}
    client.stop()
    [queue] = _queues(api).values()
    assert queue["type"] == "classic" and queue["arguments"] == {}
