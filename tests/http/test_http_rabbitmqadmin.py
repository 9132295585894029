"""RabbitMQ's own command-line client, rabbitmqadmin, against Warren's management API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import BrokerThread
from httphelp import Api
from pika.exceptions import ConnectionClosedByBroker
from pikahelp import connect

RABBITMQADMIN = shutil.which("rabbitmqadmin") or "/usr/bin/rabbitmqadmin"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which(RABBITMQADMIN) is None, reason="rabbitmqadmin is not installed"),
]


def admin(broker: BrokerThread, *args: str) -> str:
    cmd = [RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port), "-u", "guest",
           "-p", "guest", *args]
    # Its own Python (#!/usr/bin/python3); run it with ours when that one is missing.
    if shutil.which("python3") is None:
        cmd.insert(0, sys.executable)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_declare_list_publish_get(broker: BrokerThread) -> None:
    out = admin(broker, "declare", "queue", "name=jobs", "durable=true")
    assert "queue declared" in out
    admin(broker, "declare", "exchange", "name=ex", "type=topic")
    admin(broker, "declare", "binding", "source=ex", "destination=jobs", "routing_key=a.*")
    listed = json.loads(admin(broker, "-f", "raw_json", "list", "queues"))
    assert [(q["name"], q["durable"], q["messages"]) for q in listed] == [("jobs", True, 0)]
    table = admin(broker, "list", "queues", "name", "messages")
    assert "jobs" in table
    assert "Message published" in admin(broker, "publish", "exchange=ex", "routing_key=a.b",
                                        "payload=hello")
    assert "Message published but NOT routed" in admin(
        broker, "publish", "exchange=ex", "routing_key=b", "payload=lost"
    )
    got = json.loads(admin(broker, "-f", "raw_json", "get", "queue=jobs", "ackmode=ack_requeue_true"))
    assert [(m["payload"], m["routing_key"], m["exchange"]) for m in got] == [("hello", "a.b", "ex")]
    assert Api(broker.http_port).get("/api/queues/%2F/jobs")["messages"] == 1
    got = json.loads(admin(broker, "-f", "raw_json", "get", "queue=jobs", "ackmode=ack_requeue_false"))
    assert got[0]["payload"] == "hello"
    assert Api(broker.http_port).get("/api/queues/%2F/jobs")["messages"] == 0
    bindings = json.loads(admin(broker, "-f", "raw_json", "list", "bindings"))
    assert {(b["source"], b["destination"], b["routing_key"]) for b in bindings} == {
        ("", "jobs", "jobs"),
        ("ex", "jobs", "a.*"),
    }
    admin(broker, "delete", "queue", "name=jobs")
    assert json.loads(admin(broker, "-f", "raw_json", "list", "queues")) == []


def test_overview_vhosts_users_and_definitions(broker: BrokerThread, tmp_path: object) -> None:
    assert "3.10.8" in admin(broker, "show", "overview")
    admin(broker, "declare", "vhost", "name=v1")
    admin(broker, "declare", "user", "name=u1", "password=pw", "tags=monitoring")
    admin(broker, "declare", "permission", "vhost=v1", "user=u1", "configure=.*", "write=.*",
          "read=.*")
    vhosts = json.loads(admin(broker, "-f", "raw_json", "list", "vhosts"))
    assert [v["name"] for v in vhosts] == ["/", "v1"]
    users = json.loads(admin(broker, "-f", "raw_json", "list", "users"))
    assert {u["name"] for u in users} == {"guest", "u1"}
    path = f"{tmp_path}/defs.json"
    admin(broker, "export", path)
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    assert {"name": "v1"}.items() <= data["vhosts"][1].items()
    admin(broker, "delete", "vhost", "name=v1")
    admin(broker, "import", path)
    assert [v["name"] for v in json.loads(admin(broker, "-f", "raw_json", "list", "vhosts"))] == [
        "/",
        "v1",
    ]
    conns = json.loads(admin(broker, "-f", "raw_json", "list", "connections"))
    assert conns == []


def test_connections_channels_consumers_and_close(broker: BrokerThread) -> None:
    conn = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("work")
        ch.basic_consume("work", lambda *a: None, consumer_tag="c1")
        conns = json.loads(admin(broker, "-f", "raw_json", "list", "connections"))
        assert [c["user"] for c in conns] == ["guest"]
        channels = json.loads(admin(broker, "-f", "raw_json", "list", "channels"))
        assert [c["consumer_count"] for c in channels] == [1]
        consumers = json.loads(admin(broker, "-f", "raw_json", "list", "consumers"))
        assert [c["consumer_tag"] for c in consumers] == ["c1"]
        admin(broker, "purge", "queue", "name=work")
        admin(broker, "close", "connection", f"name={conns[0]['name']}")
        with pytest.raises(ConnectionClosedByBroker):
            while True:
                conn.process_data_events(0.05)
    finally:
        if conn.is_open:
            conn.close()


def test_rates_and_node_figures_in_its_tables(hand_sampled_broker: BrokerThread) -> None:
    """rabbitmqadmin asks for dotted columns (``?columns=``) and prints them flat:
    the rate objects and the node's figures come out as RabbitMQ's would."""
    broker = hand_sampled_broker
    conn = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("rated")
        broker.call(lambda: broker.broker.sample_stats(1_795_000_000.0))
        for _ in range(10):
            ch.basic_publish("", "rated", b"x")
        ch.exchange_declare("amq.direct", passive=True)  # a round trip: all routed
        broker.call(lambda: broker.broker.sample_stats(1_795_000_005.0))
        rows = admin(
            broker, "-f", "tsv", "list", "queues", "name", "messages",
            "messages_details.rate", "message_stats.publish", "message_stats.publish_details.rate",
        ).splitlines()
        assert rows[1].split("\t") == ["rated", "10", "2.0", "10", "2.0"]
        [node] = json.loads(admin(broker, "-f", "raw_json", "list", "nodes"))
        assert node["mem_used"] > 0 and node["disk_free"] > 0 and node["fd_used"] > 0
        overview = admin(broker, "-f", "tsv", "show", "overview", "queue_totals.messages",
                         "queue_totals.messages_details.rate", "churn_rates.queue_declared")
        assert overview.splitlines()[1].split("\t") == ["10", "2.0", "1"]
    finally:
        conn.close()
