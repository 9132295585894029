"""The fields monitoring agents read from the management API, with the types they
decode them as.

Read from their public sources: Telegraf's ``rabbitmq`` input
(plugins/inputs/rabbitmq/rabbitmq.go: Go structs, so an ``int64`` field must be
a JSON integer, or the whole answer fails to decode), Datadog's ``rabbitmq``
check (datadog_checks/rabbitmq/const.py: paths read with ``float``) and
kbudde/rabbitmq_exporter (exporter_*.go: flattened keys read as numbers, the
queue's ``idle_since`` parsed as a time). Each path is checked on an object
that has done what the field counts (a queue that was published to and
consumed from), after two rate samples.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from conftest import BrokerThread
from httphelp import Api, wait_for
from pikahelp import barrier, connect

pytestmark = pytest.mark.timeout(60)

INT, FLOAT, NUMBER, BOOL, STR, LIST = "int", "float", "number", "bool", "str", "list"

_MESSAGE_STATS = [
    ("message_stats.ack", INT),
    ("message_stats.ack_details.rate", NUMBER),
    ("message_stats.deliver", INT),
    ("message_stats.deliver_details.rate", NUMBER),
    ("message_stats.deliver_get", INT),
    ("message_stats.deliver_get_details.rate", NUMBER),
    ("message_stats.deliver_no_ack_details.rate", NUMBER),
    ("message_stats.publish", INT),
    ("message_stats.publish_details.rate", NUMBER),
    ("message_stats.redeliver", INT),
    ("message_stats.redeliver_details.rate", NUMBER),
]

OVERVIEW = [
    ("queue_totals.messages", INT),
    ("queue_totals.messages_ready", INT),
    ("queue_totals.messages_unacknowledged", INT),
    ("queue_totals.messages_details.rate", NUMBER),
    ("queue_totals.messages_ready_details.rate", NUMBER),
    ("queue_totals.messages_unacknowledged_details.rate", NUMBER),
    ("object_totals.channels", INT),
    ("object_totals.connections", INT),
    ("object_totals.consumers", INT),
    ("object_totals.exchanges", INT),
    ("object_totals.queues", INT),
    ("message_stats.confirm", INT),
    ("message_stats.confirm_details.rate", NUMBER),
    ("message_stats.return_unroutable", INT),
    ("message_stats.return_unroutable_details.rate", NUMBER),
    ("message_stats.drop_unroutable", INT),
    ("message_stats.drop_unroutable_details.rate", NUMBER),
    ("listeners", LIST),
    ("node", STR),
    ("erlang_version", STR),
    ("rabbitmq_version", STR),
    ("cluster_name", STR),
    *_MESSAGE_STATS,
]

NODE = [
    ("name", STR),
    ("disk_free", INT),
    ("disk_free_limit", INT),
    ("disk_free_alarm", BOOL),
    ("fd_total", INT),
    ("fd_used", INT),
    ("mem_limit", INT),
    ("mem_used", INT),
    ("mem_alarm", BOOL),
    ("proc_total", INT),
    ("proc_used", INT),
    ("run_queue", INT),
    ("sockets_total", INT),
    ("sockets_used", INT),
    ("running", BOOL),
    ("uptime", INT),
    ("partitions", LIST),
    ("mnesia_disk_tx_count", INT),
    ("mnesia_disk_tx_count_details.rate", NUMBER),
    ("mnesia_ram_tx_count", INT),
    ("mnesia_ram_tx_count_details.rate", NUMBER),
    ("gc_num", INT),
    ("gc_num_details.rate", NUMBER),
    ("gc_bytes_reclaimed", INT),
    ("gc_bytes_reclaimed_details.rate", NUMBER),
    ("io_read_avg_time", NUMBER),
    ("io_read_avg_time_details.rate", NUMBER),
    ("io_read_bytes", INT),
    ("io_read_bytes_details.rate", NUMBER),
    ("io_write_avg_time", NUMBER),
    ("io_write_avg_time_details.rate", NUMBER),
    ("io_write_bytes", INT),
    ("io_write_bytes_details.rate", NUMBER),
    ("mem_used_details.rate", NUMBER),
    ("fd_used_details.rate", NUMBER),
    ("sockets_used_details.rate", NUMBER),
    ("proc_used_details.rate", NUMBER),
    ("disk_free_details.rate", NUMBER),
]

QUEUE = [
    ("name", STR),
    ("node", STR),
    ("vhost", STR),
    ("durable", BOOL),
    ("auto_delete", BOOL),
    ("policy", None),
    ("state", STR),
    ("idle_since", "time"),
    ("consumers", INT),
    ("consumer_utilisation", NUMBER),
    ("messages", INT),
    ("messages_details.rate", NUMBER),
    ("messages_ready", INT),
    ("messages_ready_details.rate", NUMBER),
    ("messages_unacknowledged", INT),
    ("messages_unacknowledged_details.rate", NUMBER),
    ("messages_ready_ram", INT),
    ("messages_unacknowledged_ram", INT),
    ("messages_ram", INT),
    ("messages_persistent", INT),
    ("message_bytes", INT),
    ("message_bytes_ready", INT),
    ("message_bytes_unacknowledged", INT),
    ("message_bytes_ram", INT),
    ("message_bytes_persistent", INT),
    ("head_message_timestamp", None),
    ("arguments", dict),
    ("effective_policy_definition", dict),
    *_MESSAGE_STATS,
]

EXCHANGE = [
    ("name", STR),
    ("type", STR),
    ("vhost", STR),
    ("internal", BOOL),
    ("durable", BOOL),
    ("auto_delete", BOOL),
    ("message_stats.publish_in", INT),
    ("message_stats.publish_in_details.rate", NUMBER),
    ("message_stats.publish_out", INT),
    ("message_stats.publish_out_details.rate", NUMBER),
]

CONNECTION = [
    ("name", STR),
    ("vhost", STR),
    ("state", STR),
    ("node", STR),
    ("user", STR),
    ("protocol", STR),
    ("peer_host", STR),
    ("channels", INT),
    ("recv_oct", INT),
    ("recv_cnt", INT),
    ("send_oct", INT),
    ("send_cnt", INT),
    ("send_pend", INT),
    ("client_properties", dict),
]

#: kbudde/rabbitmq_exporter's channel_status labels.
CHANNEL = [
    ("vhost", STR),
    ("node", STR),
    ("name", STR),
    ("user", STR),
    ("state", STR),
    ("confirm", BOOL),
    ("transactional", BOOL),
]

#: Telegraf reads it for every node, and drops the node's metrics when it cannot.
MEMORY = [
    *[
        (f"memory.{key}", INT)
        for key in (
            "connection_readers",
            "connection_writers",
            "connection_channels",
            "connection_other",
            "queue_procs",
            "queue_slave_procs",
            "plugins",
            "other_proc",
            "metrics",
            "mgmt_db",
            "mnesia",
            "other_ets",
            "binary",
            "msg_index",
            "code",
            "atom",
            "other_system",
            "allocated_unused",
            "reserved_unallocated",
        )
    ],
    ("memory.total.rss", INT),
]

#: What agents read that Warren does not serve, and why.
ABSENT = {
    "memory": "a queue's Erlang process heap (Telegraf and Datadog read 0 when absent)",
}


def _check(where: str, answer: dict[str, Any], fields: list[tuple[str, Any]]) -> list[str]:
    problems = []
    for path, kind in fields:
        value: Any = answer
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                problems.append(f"{where}: {path} missing")
                break
            value = value[key]
        else:
            if not _is(value, kind):
                problems.append(f"{where}: {path} is {value!r}, not {kind}")
    return problems


def _is(value: Any, kind: Any) -> bool:
    if kind is None:  # a nullable value of its own type (a policy name, a timestamp)
        return value is None or isinstance(value, str | int)
    if kind is dict:
        return isinstance(value, dict)
    if kind == "time":
        return isinstance(value, str) and bool(datetime.datetime.fromisoformat(value))
    if kind == LIST:
        return isinstance(value, list)
    if isinstance(value, bool):
        return kind == BOOL
    if kind == INT:
        return isinstance(value, int)  # a Go int64 field refuses 1.0
    if kind in (NUMBER, FLOAT):
        return isinstance(value, int | float)
    return kind == STR and isinstance(value, str)


def test_every_field_monitoring_agents_read_is_there_with_its_type(
    hand_sampled_broker: BrokerThread,
) -> None:
    broker = hand_sampled_broker
    api = Api(broker.http_port)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("agents.x", "direct")
    ch.queue_declare("agents.q", durable=True)
    ch.queue_bind("agents.q", "agents.x", "k")
    for _ in range(3):
        ch.basic_publish("agents.x", "k", b"payload")
    ch.basic_publish("agents.x", "nowhere", b"lost")
    method, _, _ = ch.basic_get("agents.q")
    assert method is not None
    ch.basic_ack(method.delivery_tag)
    ch.basic_consume("agents.q", lambda *a: None, auto_ack=True)
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("agents.q", lambda *a: None)
    barrier(ch)
    broker.call(lambda: broker.broker.sample_stats(1_795_000_000.0))
    wait_for(lambda: api.get("/api/queues/%2F/agents.q")["messages_ready"] == 0, what="delivery")
    broker.call(lambda: broker.broker.sample_stats(1_795_000_005.0))

    problems = _check("overview", api.get("/api/overview"), OVERVIEW)
    [node] = api.get("/api/nodes")
    problems += _check("node", node, NODE)
    memory = api.get(f"/api/nodes/{node['name']}/memory")
    problems += _check("memory", memory, MEMORY)
    queue = api.get("/api/queues/%2F/agents.q")
    problems += _check("queue", queue, [f for f in QUEUE if f[0] not in ABSENT])
    [listed] = [q for q in api.get("/api/queues") if q["name"] == "agents.q"]
    problems += _check("queues[]", listed, [f for f in QUEUE if f[0] not in ABSENT])
    [exchange] = [e for e in api.get("/api/exchanges") if e["name"] == "agents.x"]
    problems += _check("exchange", exchange, EXCHANGE)
    [connection] = api.get("/api/connections")
    problems += _check("connection", connection, CONNECTION)
    [channel] = api.get("/api/channels")
    problems += _check("channel", channel, CHANNEL)
    assert not problems, "\n".join(problems)
    assert memory["memory"]["total"]["rss"] == memory["memory"]["other_system"] > 0
    assert all(key not in queue for key in ABSENT)  # still absent: the list stays honest
    conn.close()
