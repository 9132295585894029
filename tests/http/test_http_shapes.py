"""Every GET endpoint's answer, key by key and type by type, against RabbitMQ 3.10's.

tools/mgmt_shapes.py sets up one scenario (queues with ready, unacknowledged,
persistent and transient messages, consumers, exchanges, bindings, two
connections, a user with permissions) and reduces every answer to its shape
(key sets and value types, recursively) and its facts (message counts, bytes,
flags, counters). ``rabbitmq_mgmt_shapes.json`` is RabbitMQ's, recorded with
``python tools/mgmt_shapes.py --json tests/http/rabbitmq_mgmt_shapes.json``
against a private RabbitMQ (tests/rabbitmq_proc.py); here the same scenario
runs against Warren, and every difference must be one of
:data:`DELIBERATE_DIFFERENCES` (each with its reason, and each still seen:
a stale entry fails too).
"""

from __future__ import annotations

import fnmatch
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mgmt_shapes  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RECORDING = json.loads(
    (Path(__file__).with_name("rabbitmq_mgmt_shapes.json")).read_text(encoding="utf-8")
)

_ERLANG = "the Erlang VM's own figures (garbage collector, reductions, process state)"
_RAM = (
    "Warren's ready messages are in its segment files (read through the page "
    "cache), not the process's memory: *_ram counts what the process holds "
    "(messages delivered and not yet acknowledged), paged_out what is on disk"
)

#: (pattern of a difference line, reason). Patterns are fnmatch's.
DELIBERATE_DIFFERENCES: list[tuple[str, str]] = [
    ("*.garbage_collection: missing", _ERLANG),
    ("*.reductions: missing", _ERLANG),
    ("*.reductions_details: missing", _ERLANG),
    ("*.backing_queue_status: missing", "RabbitMQ's classic queue internals (q1..q4, delta)"),
    ("*.memory: missing", "no per-queue heap: queues share one Python process"),
    ("*.message_bytes_ram: * != *", _RAM),
    ("*.messages_ram: * != *", _RAM),
    ("*.messages_ready_ram: * != *", _RAM),
    ("*channel *.idle_since: missing", "channels do not record when they were last used"),
    ("/api/channels/*.idle_since: missing", "channels do not record when they were last used"),
    ("/api/extensions: order *", "federation's and shovel's UI scripts too (api_ui.py)"),
    ("/api/global-parameters cluster_name: extra", "Warren lists the node's cluster_name"),
    ("/api/nodes* node.being_drained: extra", "RabbitMQ 3.13's key (maintenance mode)"),
    ("/api/nodes/{node}*.being_drained: extra", "RabbitMQ 3.13's key (maintenance mode)"),
    ("/api/nodes*.listeners: extra", "Warren's nodes list their listeners too"),
    (
        "/api/nodes*.io_*: missing",
        "no seeks, syncs or reopen counts timed per call: io_read/write counts and "
        "bytes are the process's (/proc/self/io)",
    ),
    ("/api/nodes*.msg_store_*: missing", "no RabbitMQ message store"),
    ("/api/nodes*.queue_index_*: missing", "no RabbitMQ queue index"),
    ("/api/nodes*.metrics_gc_queue_length: missing", _ERLANG),
    ("/api/nodes*.net_ticktime: missing", "no Erlang distribution (clusters use etcd)"),
    ("/api/nodes*.ra_open_file_metrics: missing", "no Raft log (Ra)"),
    (
        "/api/overview*.listeners[].socket_opts: type *",
        "Warren's listeners have no Erlang socket options: {} for each",
    ),
    ("*/api/queues* shapes/q.stream.leader: extra", "RabbitMQ 3.13 lists a stream's leader"),
    ("/api/queues/shapes/q.stream.leader: extra", "RabbitMQ 3.13 lists a stream's leader"),
    (
        "/api/queues/shapes?disable_stats=true* shapes/q.stream.*",
        "RabbitMQ 3.10 answers a stream there with null placeholders (exclusive, totals, "
        "type_specific) and no counts; Warren gives a stream what it gives other queues",
    ),
    (
        "*/api/overview*.message_stats.disk_*: missing",
        "disk reads and writes are not counted per message",
    ),
]


def _allowed(line: str) -> bool:
    return any(fnmatch.fnmatchcase(line, pattern) for pattern, _ in DELIBERATE_DIFFERENCES)


def test_every_endpoint_answers_as_rabbitmq_does(hand_sampled_broker: BrokerThread) -> None:
    broker = hand_sampled_broker
    start = 1_795_000_000.0

    def settle(http: mgmt_shapes.Http) -> None:
        broker.call(lambda: broker.broker.sample_stats(start))
        deadline = time.monotonic() + 10
        while not mgmt_shapes.settled(http):  # deliveries land on the broker's loop
            assert time.monotonic() < deadline, "the scenario never settled"
            time.sleep(0.02)
        broker.call(lambda: broker.broker.sample_stats(start + 5))

    recorded = mgmt_shapes.record(broker.port, broker.http_port, settle)
    differences = mgmt_shapes.compare(RECORDING["endpoints"], recorded)
    unexpected = [d for d in differences if not _allowed(d)]
    assert not unexpected, "differences from RabbitMQ:\n" + "\n".join(unexpected)
    stale = [
        p
        for p, _ in DELIBERATE_DIFFERENCES
        if not any(fnmatch.fnmatchcase(d, p) for d in differences)
    ]
    assert not stale, f"deliberate differences no longer seen: {stale}"


def test_the_recording_covers_every_get_endpoint() -> None:
    """The recording reads every GET route the object listings serve."""
    paths: set[str] = {p.split("?")[0] for p in RECORDING["endpoints"]}
    for prefix in (
        "/api/overview",
        "/api/nodes",
        "/api/connections",
        "/api/channels",
        "/api/consumers",
        "/api/exchanges",
        "/api/queues",
        "/api/bindings",
        "/api/vhosts",
        "/api/users",
        "/api/permissions",
        "/api/whoami",
        "/api/extensions",
    ):
        assert any(p.startswith(prefix) for p in paths), prefix


def _get(answer: Any, path: str) -> Any:
    for key in path.split("/"):
        answer = answer[key]
    return answer


def test_recorded_rabbitmq_has_what_the_comparison_relies_on() -> None:
    """The recording holds the facts the known bugs were about (so a re-recording
    that lost them would be noticed)."""
    queue = RECORDING["endpoints"]["/api/queues/shapes/q.unacked"]
    assert queue["facts"]["message_bytes_unacknowledged"] == 20
    assert queue["facts"]["messages_persistent"] == 2
    assert "rate" in _get(queue["shape"], "messages_details")
    overview = RECORDING["endpoints"]["/api/overview"]["shape"]
    assert isinstance(overview["churn_rates"], dict)
    assert overview["queue_totals"]["messages_ready_details"] == {"rate": "float"}
