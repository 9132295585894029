"""The memory alarm (RabbitMQ's vm_memory_high_watermark) blocks publishers with
connection.blocked, as the free-disk alarm does; both share one set of alarms.

The blocking tests stay on sockets with pika: a blocked connection stops
reading, and what shows that is a publisher's bytes waiting in the kernel
(docs/testing.md). What the management API and the metrics show, and the
limit, are read in memory (tests/harness, ``harness.http()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread
from harness import Harness
from metricshelp import scrape_api, value
from pikahelp import record_blocking, wait_until

from warren.config import Config, ConfigError

#: A limit no test process reaches: only injected readings raise the alarm.
LIMIT = 2**40


def wait_for(conn: pika.BlockingConnection, predicate: Callable[[], bool]) -> None:
    wait_until(conn, predicate, timeout=10)


def get(b: Harness, path: str) -> tuple[int, Any]:
    reply = b.http().request("GET", path)
    return reply.status, reply.json()


def _inject(b: BrokerThread | Harness) -> None:
    """The broker's memory reading is the test's from now on: ``b.reading[0]`` bytes."""
    reading = [LIMIT // 2]
    b.reading = reading  # type: ignore[union-attr]

    def inject() -> None:
        b.broker.resource_alarms.memory_reader = lambda: reading[0]
        b.broker.resource_alarms.check_memory()

    b.call(inject)


@pytest.fixture
def mem_broker(broker_factory: Callable[..., BrokerThread]) -> Iterator[BrokerThread]:
    """A socket broker whose memory reading is the test's."""
    b = broker_factory(memory_high_watermark_absolute=LIMIT)
    _inject(b)
    yield b


@pytest.fixture
def mem_harness(tmp_path: Path) -> Iterator[Harness]:
    """An in-memory broker whose memory reading is the test's."""
    with Harness(tmp_path / "data", memory_high_watermark_absolute=LIMIT) as b:
        _inject(b)
        yield b


def set_memory(b: BrokerThread | Harness, used: int) -> bool:
    b.reading[0] = used  # type: ignore[union-attr]
    return b.call(b.broker.resource_alarms.check_memory)


def set_disk_alarm(b: BrokerThread | Harness, raised: bool) -> bool:
    def change() -> bool:
        b.broker.config.free_disk_min = 2**62 if raised else 0
        return b.broker.resource_alarms.check_disk()

    return b.call(change)


def test_memory_alarm_blocks_publisher_consumer_drains_then_unblocked(
    mem_broker: BrokerThread,
) -> None:
    b = mem_broker
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    events = record_blocking(publisher)
    try:
        ch = publisher.channel()
        ch.queue_declare("mem")
        ch.basic_publish("", "mem", b"before")
        ch.queue_declare("mem", passive=True)  # the publish is in before the alarm

        assert set_memory(b, LIMIT + 1) is True
        assert b.call(lambda: (b.broker.mem_alarm, b.broker.disk_alarm)) == (True, False)
        ch.basic_publish("", "mem", b"during")
        wait_for(publisher, lambda: events == [("Connection.Blocked", "low on memory")])

        # A consumer on another connection still gets what was published before.
        got: list[bytes] = []
        cch = consumer.channel()
        cch.basic_consume("mem", lambda c, m, _p, body: got.append(body), auto_ack=True)
        wait_for(consumer, lambda: got == [b"before"])
        # The publisher's socket is not read while blocked: "during" stays unrouted.
        assert cch.queue_declare("mem", passive=True).method.message_count == 0
        assert got == [b"before"]

        # RabbitMQ clears the alarm at the limit (raised only above it).
        assert set_memory(b, LIMIT) is False
        wait_for(
            publisher,
            lambda: (
                events == [("Connection.Blocked", "low on memory"), ("Connection.Unblocked", "")]
            ),
        )
        wait_for(consumer, lambda: got == [b"before", b"during"])
        ch.basic_publish("", "mem", b"after")
        wait_for(consumer, lambda: got == [b"before", b"during", b"after"])
    finally:
        publisher.close()
        consumer.close()


def test_both_alarms_unblock_only_when_both_clear(mem_broker: BrokerThread) -> None:
    b = mem_broker
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    events = record_blocking(publisher)
    try:
        ch = publisher.channel()
        ch.queue_declare("both")
        assert set_disk_alarm(b, True) is True
        assert set_memory(b, LIMIT * 2) is True
        assert b.call(lambda: sorted(b.broker.alarms)) == ["disk", "memory"]
        ch.basic_publish("", "both", b"x")
        # Once per block, naming every alarm as RabbitMQ does.
        wait_for(publisher, lambda: events == [("Connection.Blocked", "low on memory & disk")])

        assert set_memory(b, 0) is False
        assert b.call(lambda: sorted(b.broker.alarms)) == ["disk"]
        publisher.process_data_events(time_limit=0.2)
        assert events == [("Connection.Blocked", "low on memory & disk")]

        assert set_disk_alarm(b, False) is False
        assert b.call(lambda: b.broker.alarms) == set()
        wait_for(publisher, lambda: len(events) == 2)
        assert events[1] == ("Connection.Unblocked", "")
        assert ch.queue_declare("both", passive=True).method.message_count == 1

        # The disk alarm alone says so.
        assert set_disk_alarm(b, True) is True
        ch.basic_publish("", "both", b"y")
        wait_for(publisher, lambda: len(events) == 3)
        assert events[2] == ("Connection.Blocked", "low on disk")
        assert set_disk_alarm(b, False) is False
        wait_for(publisher, lambda: len(events) == 4)
    finally:
        publisher.close()


def test_management_api_and_metrics_show_the_memory_alarm(mem_harness: Harness) -> None:
    b = mem_harness
    status, nodes = get(b, "/api/nodes")
    assert status == 200
    [node] = nodes
    assert node["mem_alarm"] is False
    assert node["mem_used"] == LIMIT // 2
    assert node["mem_limit"] == LIMIT
    assert get(b, "/api/health/checks/alarms") == (200, {"status": "ok"})
    assert value(scrape_api(b.http()), "rabbitmq_alarms_memory_used_watermark") == 0

    set_memory(b, LIMIT + 10)
    status, nodes = get(b, "/api/nodes")
    assert (nodes[0]["mem_alarm"], nodes[0]["mem_used"]) == (True, LIMIT + 10)
    status, body = get(b, "/api/health/checks/alarms")
    assert status == 503
    assert body == {
        "status": "failed",
        "reason": "There are alarms in effect in the cluster",  # RabbitMQ 3.10-3.13
        "alarms": [{"node": node["name"], "resource": "memory"}],
    }
    metrics = scrape_api(b.http())
    assert value(metrics, "rabbitmq_alarms_memory_used_watermark") == 1
    assert value(metrics, "rabbitmq_resident_memory_limit_bytes") == LIMIT
    assert value(metrics, "rabbitmq_process_resident_memory_bytes") > 0

    set_disk_alarm(b, True)
    _, body = get(b, "/api/health/checks/alarms")
    assert [a["resource"] for a in body["alarms"]] == ["memory", "disk space"]
    set_disk_alarm(b, False)
    set_memory(b, 1)
    assert get(b, "/api/health/checks/alarms") == (200, {"status": "ok"})


def test_limit_is_a_fraction_of_ram_unless_absolute(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", memory_high_watermark=0.5) as b:
        _fraction_of_ram(b)


def _fraction_of_ram(b: Harness) -> None:
    total = b.call(lambda: b.broker.resource_alarms.total_memory)
    assert total > 0
    assert b.call(b.broker.resource_alarms.memory_limit) == int(total * 0.5)
    # The real sample: a test process is far below half the RAM.
    assert b.call(b.broker.resource_alarms.check_memory) is False
    assert b.call(lambda: b.broker.mem_used) > 0

    def absolute() -> int:
        b.broker.config.memory_high_watermark_absolute = 12345
        return b.broker.resource_alarms.memory_limit()

    assert b.call(absolute) == 12345


def test_config_parses_both_settings(tmp_path: Path) -> None:
    assert Config().memory_high_watermark == 0.4
    assert Config().memory_high_watermark_absolute == 0
    path = tmp_path / "warren.ini"
    path.write_text(
        "[main]\nmemory_high_watermark = 0.6\nmemory_high_watermark_absolute = 1073741824\n"
    )
    c = Config.from_ini(path)
    assert c.memory_high_watermark == 0.6
    assert c.memory_high_watermark_absolute == 1073741824
    path.write_text("[main]\nmemory_high_watermark = .25\n")
    assert Config.from_ini(path).memory_high_watermark == 0.25
    for bad in ("1.5", "-0.1", "lots", "nan"):
        path.write_text(f"[main]\nmemory_high_watermark = {bad}\n")
        with pytest.raises(ConfigError, match="memory_high_watermark"):
            Config.from_ini(path)
    path.write_text("[main]\nmemory_high_watermark_absolute = -1\n")
    with pytest.raises(ConfigError, match="memory_high_watermark_absolute"):
        Config.from_ini(path)
