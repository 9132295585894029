"""Durability across restarts of the same data dir: definitions, messages, users."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import BrokerThread
from damage_helpers import data_end

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def connect(b: BrokerThread) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., BrokerThread]]:
    """start(**settings) starts a broker on the same data dir, stopping the previous one."""
    current: list[BrokerThread] = []
    from conftest import start_broker

    def start(**settings: Any) -> BrokerThread:
        if current:
            # 10,000 queues' stores are synced at the stop: slow on a busy disk.
            current.pop().stop(timeout=180)
        # (and read back at the start: the same on a busy machine, in pure Python)
        b = start_broker(tmp_path / "data", start_timeout=180, **settings)
        current.append(b)
        return b

    yield start
    for b in current:
        b.stop()


def drain(ch: Any, queue: str) -> list[tuple[bytes, bool]]:
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


def test_durable_definitions_survive_restart(restartable: Callable[..., BrokerThread]) -> None:
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        ch.exchange_declare("dx", "topic", durable=True, arguments={"alternate-exchange": "ae"})
        ch.exchange_declare("ae", "fanout", durable=True)
        ch.exchange_declare("tx", "direct", durable=False)
        ch.queue_declare("dq", durable=True, arguments={"x-custom": 7})
        ch.queue_declare("tq", durable=False)
        ch.queue_declare("xq", durable=True, exclusive=True)
        ch.queue_declare("gone", durable=True)
        ch.queue_bind("dq", "dx", "a.#")
        ch.queue_bind("dq", "ae")
        ch.queue_bind("tq", "dx", "t")
        ch.exchange_bind("dx", "amq.topic", "e2e.#")
        ch.queue_delete("gone")
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        ch.exchange_declare("dx", passive=True)
        ch.exchange_declare("ae", passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.exchange_declare("tx", passive=True)
        assert info.value.reply_code == 404
        ch = conn.channel()
        for missing in ("tq", "xq", "gone"):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                ch.queue_declare(missing, passive=True)
            assert info.value.reply_code == 404
            ch = conn.channel()
        # Redeclaring with the same arguments is accepted: they were restored.
        ch.queue_declare("dq", durable=True, arguments={"x-custom": 7})
        ch.basic_publish("dx", "a.b.c", b"via topic")
        ch.basic_publish("dx", "unroutable", b"via ae")
        ch.basic_publish("amq.topic", "e2e.x.y", b"via e2e")
        assert [body for body, _ in drain(ch, "dq")] == [b"via topic", b"via ae", b"via e2e"]


def test_persistent_messages_survive_restart_in_order(
    restartable: Callable[..., BrokerThread],
) -> None:
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("q", durable=True)
        ch.queue_declare("tq", durable=False)
        for i in range(500):
            ch.basic_publish("", "q", b"p%d" % i, PERSISTENT)
            if i % 2:
                ch.basic_publish("", "q", b"t%d" % i, TRANSIENT)
        ch.basic_publish("", "tq", b"x", PERSISTENT)
        # Two messages delivered but not acked when the broker stops come back.
        ch.basic_qos(prefetch_count=2)
        got = []
        for method, _props, body in ch.consume("q", inactivity_timeout=5):
            got.append((method.delivery_tag, body))
            if len(got) == 2:
                break
        ch.basic_ack(got[0][0])
        ch.queue_declare("q", passive=True)  # round trip: the ack has been processed
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        bodies = [body for body, _ in drain(ch, "q")]
        # Transient messages are gone; the acked one never comes back.
        assert bodies == [b"p%d" % i for i in range(1, 500)]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.queue_declare("tq", passive=True)


def test_after_a_clean_restart_exactly_the_delivered_messages_are_redelivered(
    restartable: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    """As RabbitMQ 3.10 answers the same script (classic queues, version 1 or 2):
    the two messages got without an ack when the broker stops come back with
    redelivered set, the three never delivered without it; the same after a
    second clean restart in which nothing was read; a priority queue per level."""
    b = restartable()
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q", durable=True)
    ch.queue_declare("pq", durable=True, arguments={"x-max-priority": 5})
    for i in range(5):
        ch.basic_publish("", "q", b"m%d" % i, PERSISTENT)
    for i, priority in enumerate([1, 5, 1, 5]):
        props = pika.BasicProperties(delivery_mode=2, priority=priority)
        ch.basic_publish("", "pq", b"p%d" % i, props)
    for queue in ("q", "q", "pq"):
        method, _props, _body = ch.basic_get(queue)
        assert method is not None and not method.redelivered
    b = restartable()  # stopped with the three unacked (their connection is closed: 320)
    assert not (tmp_path / "data" / "delivered.json").exists()  # read and removed
    b = restartable()  # a second clean restart: nothing read in between
    with connect(b) as conn:
        ch = conn.channel()
        assert drain(ch, "q") == [
            (b"m0", True), (b"m1", True), (b"m2", False), (b"m3", False), (b"m4", False),
        ]  # fmt: skip
        # p1 (priority 5) was delivered; p3 (5) and the priority 1 ones were not.
        assert drain(ch, "pq") == [(b"p1", True), (b"p3", False), (b"p0", False), (b"p2", False)]


def test_definitions_log_is_compacted_under_churn(
    restartable: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    b = restartable(sync=False)
    with connect(b) as conn:
        ch = conn.channel()
        ch.queue_declare("keep", durable=True)
        for i in range(3000):
            ch.queue_declare(f"churn-{i}", durable=True)
            ch.queue_delete(f"churn-{i}")
    logs = list((tmp_path / "data" / "vhosts").glob("*/definitions.log"))
    assert len(logs) == 1
    assert logs[0].stat().st_size < 200_000  # 6000 lines uncompacted would be far larger
    b = restartable()
    with connect(b) as conn:
        conn.channel().queue_declare("keep", passive=True)


def test_users_and_permissions_persist(restartable: Callable[..., BrokerThread]) -> None:
    b = restartable()

    def add_user() -> None:
        b.broker.users.add_user("alice", "s3cret", ["management"])
        b.broker.users.set_permissions("alice", "/", "^alice-.*", ".*", ".*")
        b.broker.save_users()

    b.call(add_user)
    b = restartable()
    params = pika.ConnectionParameters(
        "127.0.0.1", b.port, credentials=pika.PlainCredentials("alice", "s3cret")
    )
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare("alice-q")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("bob-q")
        assert info.value.reply_code == 403


def test_drained_queue_leaves_only_the_write_segment(
    restartable: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    b = restartable(segment_size=64 * 1024)
    body = b"x" * 1000
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("big", durable=True)
        for _ in range(500):
            ch.basic_publish("", "big", body, PERSISTENT)
        (qdir,) = (tmp_path / "data" / "vhosts").glob("*/queues/*")
        assert len(list(qdir.glob("msgs.*"))) >= 7
        assert len(drain(ch, "big")) == 500
        ch.queue_declare("big", passive=True)  # acks processed
        assert len(list(qdir.glob("msgs.*"))) == 1  # only the segment being written
    b = restartable(segment_size=64 * 1024)
    assert len(list(qdir.glob("msgs.*"))) <= 1


def test_damaged_queue_file_does_not_stop_the_broker(
    restartable: Callable[..., BrokerThread], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("ok", durable=True)
        ch.queue_declare("bad", durable=True)
        for i in range(10):
            ch.basic_publish("", "ok", b"ok%d" % i, PERSISTENT)
            ch.basic_publish("", "bad", b"bad%d" % i, PERSISTENT)
    b.stop()
    vhost_dir = next((tmp_path / "data" / "vhosts").iterdir())
    import hashlib

    bad_dir = vhost_dir / "queues" / hashlib.sha1(b"bad").hexdigest()
    (seg,) = bad_dir.glob("msgs.*")
    data = bytearray(seg.read_bytes())
    data[data_end(seg) - 3] ^= 0xFF  # corrupt the last record's CRC
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="warren.store"):
        b = restartable()
    assert any(seg.name in r.getMessage() for r in caplog.records)
    with connect(b) as conn:
        ch = conn.channel()
        assert [body for body, _ in drain(ch, "ok")] == [b"ok%d" % i for i in range(10)]
        assert [body for body, _ in drain(ch, "bad")] == [b"bad%d" % i for i in range(9)]


def _fd_count() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


# What it checks is how many descriptors the store's recovery holds, the same in
# both builds; at this size it costs 46 s of the pure pass (14 s compiled), where the
# store's recovery runs in this module's and test_segment_store's other restarts.
@pytest.mark.passes("compiled")
# Its own waits allow a busy machine minutes (the declarations 300 s, each start
# 180 s); the suite's 120 s would cut them short (it did, at a load of 16).
@pytest.mark.timeout(900)
def test_ten_thousand_durable_queues_restart_within_fd_limits(
    restartable: Callable[..., BrokerThread],
) -> None:
    import resource

    from warren.core.message import Message
    from warren.core.properties import BasicProperties

    n = 10_000
    raw_props = BasicProperties(delivery_mode=2).encode()
    b = restartable(sync=False)
    baseline = _fd_count()

    def declare_all() -> None:
        vhost = b.broker.vhosts["/"]
        for i in range(n):
            vhost.declare_queue(f"many-{i}", durable=True)
        for i in range(n):
            vhost.router.publish(vhost.default_exchange, Message("", f"many-{i}", raw_props, b"m"))

    b.call(declare_all, timeout=300)
    b = restartable(sync=False)
    after_restart = _fd_count()
    # Recovered idle queues hold no files open: the count does not scale with queues.
    assert after_restart - baseline < 100, (baseline, after_restart)
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert after_restart < soft

    def count() -> int:
        vhost = b.broker.vhosts["/"]
        return sum(vhost.queues[f"many-{i}"].message_count for i in range(n))

    assert b.call(count) == n


def test_only_durable_queues_allocate_segment_space_ahead(
    restartable: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    """A durable queue's segment file is allocated ahead of its data (its syncs
    then change no file size: docs/storage.md, "Writing"); a transient queue's,
    never synced, grows as it is written."""
    b = restartable()
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("transient-q", durable=False)
        for queue in ("durable-q", "transient-q"):
            ch.basic_publish("", queue, b"x" * 100, PERSISTENT)
    data = tmp_path / "data"
    durable = [p for p in data.glob("vhosts/**/msgs.*") if p.stat().st_size]
    transient = list(data.glob("transient/**/msgs.*"))
    assert len(durable) == 1 and len(transient) == 1
    assert durable[0].stat().st_size >= 64 * 1024
    assert transient[0].stat().st_size < 1024
