"""Full disks, for real: a small tmpfs as the data directory (docs/storage.md,
"Free-disk alarm"). Fast publishers are blocked within a bounded number of
bytes past free_disk_min, never closed; a disk filled from outside costs the
publishers nacks for what could not be stored, never a confirmed message; a
stop on a full disk closes everything and exits 0.

Timing is the load's: a test lets a write fail before the broker may measure
the full disk (writes_fail_first), and bounds what its publishers write once
the disk is back (recover()).
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from conftest import BrokerThread
from diskhelp import ConfirmPublisher, MiB, eventually, fill, free_bytes, tmpfs
from paho.mqtt.enums import CallbackAPIVersion
from procs import start_warren

DISK = 64 * MiB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", DISK) as where:
        yield where


def start_all(pubs: list[ConfirmPublisher]) -> None:
    for p in pubs:
        p.start()
    for p in pubs:
        p.ready.wait(10)
        assert p.error is None, p.error


def states(pubs: list[ConfirmPublisher]) -> Callable[[], str]:
    """What the publishers have seen, for a failure message."""
    return lambda: "\n".join(p.state() for p in pubs)


def stop_all(pubs: list[ConfirmPublisher]) -> None:
    for p in pubs:
        p.stop(0)  # all stop publishing first: none fills the disk while another waits
    eventually(
        lambda: all(p.finished.is_set() for p in pubs),
        30,
        "every publisher's confirms in and its connection closed",
        states(pubs),
    )
    for p in pubs:
        p.stop()
    for p in pubs:
        assert p.error is None, p.error
        assert p.outstanding == 0, f"{p.queue}: {p.outstanding} publishes never confirmed"


def first_confirms(pubs: list[ConfirmPublisher]) -> None:
    """Wait until every publisher has its first confirms (each within its budget)."""
    eventually(
        lambda: all(len(p.acked) >= 4 for p in pubs),
        30,
        "first confirms",
        states(pubs),
    )


@contextlib.contextmanager
def writes_fail_first(b: BrokerThread) -> Iterator[None]:
    """free_disk_min is 0 inside: only a failed write raises the disk alarm.

    A test that fills the disk from outside to make the broker's writes fail
    does so inside, until it saw what a failed write does (a nack, a refusal,
    a close). Else the broker's own measurement of the free disk (once a
    second) could see the full disk before the clients' messages were
    written, as it did on a busy machine: the alarm blocked the publishers,
    no write failed, there was nothing to nack, and the test then hung in its
    stop (a blocked publisher is not read while the alarm lasts, so the
    confirms of what it had sent could not come). On the way out the limit
    is back and the disk measured again: the alarm holds."""
    limit = b.call(lambda: b.broker.config.free_disk_min)

    def set_limit(value: int) -> bool:
        b.broker.config.free_disk_min = value
        return b.broker.resource_alarms.check_disk()

    b.call(lambda: set_limit(0))
    try:
        yield
    finally:
        raised = b.call(lambda: set_limit(limit))
    assert raised, "the disk alarm is not raised on the full disk"


def fill_then_release(filler: Path, pubs: list[ConfirmPublisher]) -> None:
    """Fill the disk from outside, then let the publishers write as fast as they can."""
    fill(filler)
    for p in pubs:
        p.release()


#: What each publisher may publish once the disk is given back (see recover()).
AFTER_RECOVERY = 4


def recover(b: BrokerThread, filler: Path, pubs: list[ConfirmPublisher]) -> None:
    """Give the disk back (the filler goes) and wait until every publisher was
    unblocked and had what it sent answered, and a few more publishes acked.

    The publishers are limited first: left to publish as fast as they can, they
    filled the disk again before a test thread slowed down by a busy machine
    stopped them, were blocked again, and the publishes they had sent
    meanwhile were never read, so never confirmed: the test hung in its stop
    (not a lost confirm: a blocked publisher is not read until the alarm
    clears, as with RabbitMQ)."""
    acked = [len(p.acked) for p in pubs]
    for p in pubs:
        p.limit(AFTER_RECOVERY)
    filler.unlink()
    assert b.call(b.broker.resource_alarms.check_disk) is False
    eventually(lambda: all(p.done for p in pubs), 60, "publishing resumed", states(pubs))
    assert all(len(p.acked) >= n + AFTER_RECOVERY for p, n in zip(pubs, acked, strict=True)), (
        states(pubs)()
    )
    assert b.call(lambda: b.broker.alarms) == set()
    assert [p.blocking[-1] for p in pubs] == ["Connection.Unblocked"] * len(pubs), states(pubs)()


def queue_numbers(port: int, queue: str) -> list[int]:
    """The publish numbers of every message in ``queue``, in order (consumed)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        got = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append(ConfirmPublisher.number(body))
    finally:
        conn.close()


def health_alarms(b: BrokerThread) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(f"http://127.0.0.1:{b.http_port}/api/health/checks/alarms")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_fast_publishers_are_blocked_a_bounded_amount_past_free_disk_min(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # Four publishers of 1 MiB messages and one of 64 KiB ones, as fast as they can:
    # the broker must block them all before free space falls far below the limit
    # (docs/storage.md: one socket read and the message it completes per
    # publishing connection), and close none of them.
    # The limit leaves room for what is in flight when they are unblocked (up to
    # 4 x 4 MiB + 2 MiB, on top of the overshoot): else they are blocked again.
    limit = 56 * MiB
    with tmpfs(tmp_path / "disk", 96 * MiB) as small_disk:
        fast_publishers_blocked(small_disk, limit, broker_factory)


def fast_publishers_blocked(
    small_disk: Path, limit: int, broker_factory: Callable[..., BrokerThread]
) -> None:
    b = broker_factory(data_dir=small_disk / "data", free_disk_min=limit)
    pubs = [ConfirmPublisher(b.port, f"big{i}", MiB, window=4) for i in range(4)]
    pubs.append(ConfirmPublisher(b.port, "small", 64 * 1024, window=32))
    start_all(pubs)
    try:
        eventually(
            lambda: all("Connection.Blocked" in p.blocking or p.closed for p in pubs),
            60,
            "every publisher blocked",
        )
        assert [p.closed for p in pubs] == [None] * len(pubs)
        assert b.call(lambda: b.broker.alarms) == {"disk"}
        b.call(lambda: None)  # what the broker had read before the block is stored now
        overshoot = limit - free_bytes(small_disk)
        assert overshoot <= 4 * (MiB + 256 * 1024) + 2 * MiB, overshoot
        assert health_alarms(b)[0] == 503
        # Space comes back (the limit is lowered): publishers are unblocked, and
        # what they sent while blocked is taken and confirmed.
        for p in pubs:
            p.stop(0)

        def lower() -> bool:
            b.broker.config.free_disk_min = MiB // 2
            return b.broker.resource_alarms.check_disk()

        assert b.call(lower) is False
        assert health_alarms(b)[0] == 200
    finally:
        stop_all(pubs)
    assert [p.blocking for p in pubs] == [["Connection.Blocked", "Connection.Unblocked"]] * 5
    assert [p.closed for p in pubs] == [None] * len(pubs)
    assert [p.nacked for p in pubs] == [set()] * len(pubs)
    for p in pubs:
        assert queue_numbers(b.port, p.queue) == sorted(p.acked)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_disk_filled_from_outside_nacks_blocks_and_recovers(
    small_disk: Path, broker_factory: Callable[..., BrokerThread], sync: bool
) -> None:
    # Another process fills the disk and the broker's writes fail (free_disk_min
    # 0 meanwhile: writes_fail_first). (sync = false: confirms wait for the
    # write-out at the end of the turn.)
    data = small_disk / "data"
    b = broker_factory(data_dir=data, free_disk_min=MiB, sync=sync)
    pubs = [ConfirmPublisher(b.port, f"q{i}", 32 * 1024, window=32, budget=8) for i in range(3)]
    pubs.append(ConfirmPublisher(b.port, "big", MiB, budget=8))
    start_all(pubs)
    filler = small_disk / "filler"
    try:
        first_confirms(pubs)
        with writes_fail_first(b):
            fill_then_release(filler, pubs)
            # What could not be written is nacked (after its sync round: it may
            # come after connection.blocked).
            eventually(lambda: sum(len(p.nacked) for p in pubs) > 0, 30, "nacks", states(pubs))
        eventually(
            lambda: all("Connection.Blocked" in p.blocking or p.closed for p in pubs),
            30,
            "every publisher blocked",
            states(pubs),
        )
        assert [p.closed for p in pubs] == [None] * len(pubs)
        status, body = health_alarms(b)
        assert status == 503 and body["alarms"] == [  # type: ignore[comparison-overlap]
            {"node": body["alarms"][0]["node"], "resource": "disk space"}  # type: ignore[index]
        ]
        recover(b, filler, pubs)
    finally:
        stop_all(pubs)
    assert [p.closed for p in pubs] == [None] * len(pubs)
    # Exactly the confirmed messages, in order, also after a restart.
    b.stop()
    b = broker_factory(data_dir=data, free_disk_min=MiB)
    for p in pubs:
        assert queue_numbers(b.port, p.queue) == sorted(p.acked), p.queue


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_mqtt_5_publishes_that_could_not_be_stored_are_refused(
    small_disk: Path, broker_factory: Callable[..., BrokerThread], sync: bool
) -> None:
    # sync = false: a PUBACK waits for the write-out at the end of the turn (the
    # client session's rule, as for AMQP confirms), so a dropped one is refused.
    b = broker_factory(data_dir=small_disk / "data", free_disk_min=MiB, sync=sync)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = amqp.channel()
    ch.queue_declare("mq", durable=True)
    ch.queue_bind("mq", "amq.topic", "t.#")
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pub", protocol=mqtt.MQTTv5)
    codes: dict[int, int] = {}  # mid -> PUBACK reason code
    lost: list[object] = []
    client.on_publish = lambda _c, _u, mid, rc, _p: codes.__setitem__(mid, rc.value)
    client.on_disconnect = lambda _c, _u, _f, rc, _p: lost.append(rc)
    client.connect("127.0.0.1", b.mqtt_port)
    client.loop_start()
    numbers: dict[int, int] = {}
    filler = small_disk / "filler"

    def publish(first: int, count: int) -> None:
        for i in range(first, first + count):
            body = f"mq:{i}:".encode().ljust(32 * 1024, b"x")
            numbers[client.publish("t/x", body, qos=1).mid] = i

    try:
        publish(0, 20)
        eventually(lambda: len(codes) == 20, 30, "first acks")
        assert set(codes.values()) == {0}
        with writes_fail_first(b):
            fill(filler)
            publish(20, 60)
            eventually(lambda: 0x97 in codes.values(), 30, "a refusal (quota exceeded)")
        assert b.call(lambda: "disk" in b.broker.alarms)
        filler.unlink()
        assert b.call(b.broker.resource_alarms.check_disk) is False
        eventually(lambda: len(codes) == 80, 60, "every publish answered")
        assert lost == []
    finally:
        client.disconnect()
        client.loop_stop()
    stored = sorted(numbers[mid] for mid, code in codes.items() if code == 0)
    got = []
    while True:
        method, _props, body = ch.basic_get("mq", auto_ack=True)
        if method is None:
            break
        got.append(int(body.split(b":")[1]))
    amqp.close()
    assert set(codes.values()) <= {0, 0x97}
    assert got == stored


def test_mqtt_3_1_1_publishes_that_could_not_be_stored_close_the_connection(
    small_disk: Path, broker_factory: Callable[..., BrokerThread], caplog: pytest.LogCaptureFixture
) -> None:
    """MQTT 3.1.1 has no way to refuse a PUBLISH: the connection is closed
    instead, and no message that was acknowledged is missing."""
    b = broker_factory(data_dir=small_disk / "data", free_disk_min=MiB)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = amqp.channel()
    ch.queue_declare("mq3", durable=True)
    ch.queue_bind("mq3", "amq.topic", "t3.#")
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pub3", protocol=mqtt.MQTTv311)
    acked: set[int] = set()
    lost = threading.Event()
    client.on_publish = lambda _c, _u, mid, _rc, _p: acked.add(mid)
    client.on_disconnect = lambda _c, _u, _f, _rc, _p: lost.set()
    client.reconnect_delay_set(60, 60)  # no reconnect while the test looks
    client.connect("127.0.0.1", b.mqtt_port)
    client.loop_start()
    numbers: dict[int, int] = {}
    try:
        for i in range(10):
            numbers[client.publish("t3/x", f"mq3:{i}:".encode().ljust(32 * 1024, b"x"), 1).mid] = i
        eventually(lambda: len(acked) == 10, 30, "first acks")
        with writes_fail_first(b):
            fill(small_disk / "filler")
            for i in range(10, 80):
                body = f"mq3:{i}:".encode().ljust(32 * 1024, b"x")
                numbers[client.publish("t3/x", body, qos=1).mid] = i
            assert lost.wait(30), "the connection was not closed"
    finally:
        client.loop_stop()
    (small_disk / "filler").unlink()
    assert b.call(b.broker.resource_alarms.check_disk) is False
    got = []
    while True:
        method, _props, body = ch.basic_get("mq3", auto_ack=True)
        if method is None:
            break
        got.append(int(body.split(b":")[1]))
    amqp.close()
    assert "could not be stored (disk full?): closing" in caplog.text
    assert {numbers[mid] for mid in acked} <= set(got)  # nothing acknowledged is lost
    assert got == sorted(got) and set(got) <= set(numbers.values())


def stream_numbers(port: int, queue: str) -> list[int]:
    """The publish numbers of every message in the stream ``queue``, in order."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        count = ch.queue_declare(queue, passive=True).method.message_count
        ch.basic_qos(prefetch_count=max(1, count))
        got: list[int] = []
        ch.basic_consume(
            queue,
            lambda _c, _m, _p, body: got.append(ConfirmPublisher.number(body)),
            arguments={"x-stream-offset": "first"},
        )
        while len(got) < count:
            conn.process_data_events(time_limit=1)
        return got
    finally:
        conn.close()


def test_a_stream_filled_from_outside_nacks_what_it_could_not_store(
    small_disk: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # Streams take a publisher's messages in runs (StreamQueue.publish_run): the
    # messages of a run the full disk lost are nacked, and exactly the confirmed
    # ones are in the stream, in order, also after a restart.
    data = small_disk / "data"
    b = broker_factory(data_dir=data, free_disk_min=MiB)
    stream = {"x-queue-type": "stream", "x-message-deduplication": True}
    pubs = [
        ConfirmPublisher(
            b.port, f"s{i}", 32 * 1024, window=64, arguments=stream, keyed=True, budget=8
        )
        for i in range(2)
    ]
    start_all(pubs)
    filler = small_disk / "filler"
    try:
        first_confirms(pubs)
        with writes_fail_first(b):
            fill_then_release(filler, pubs)
            eventually(lambda: sum(len(p.nacked) for p in pubs) > 0, 30, "nacks", states(pubs))
        eventually(
            lambda: all("Connection.Blocked" in p.blocking or p.closed for p in pubs),
            30,
            "every publisher blocked",
            states(pubs),
        )
        recover(b, filler, pubs)
    finally:
        stop_all(pubs)
    assert [p.closed for p in pubs] == [None] * len(pubs)
    for p in pubs:
        check_stream_against_confirms(stream_numbers(b.port, p.queue), p)
    b.stop()
    b = broker_factory(data_dir=data, free_disk_min=MiB)
    for p in pubs:
        check_stream_against_confirms(stream_numbers(b.port, p.queue), p)


def check_stream_against_confirms(stored: list[int], p: ConfirmPublisher) -> None:
    """Every confirmed publish is in the stream, in publish order, and nothing is
    there that was not published. A nacked message may be stored (a nack says
    the broker did not take responsibility, not that it dropped it: a store
    that lost records after a queue returned nacks all of the run it took),
    never an acked one lost."""
    assert stored == sorted(set(stored)), (p.queue, "out of order or twice")
    missing = sorted(p.acked - set(stored))
    assert not missing, (p.queue, "confirmed but not stored", missing[:10])
    extra = set(stored) - p.acked
    assert extra <= p.nacked, (p.queue, "stored but neither acked nor nacked", sorted(extra)[:10])


def test_sigterm_on_a_full_disk_exits_0_and_keeps_every_confirmed_message(
    small_disk: Path, tmp_path: Path
) -> None:
    data = small_disk / "data"
    proc, port = start_warren(data, "--free-disk-min", str(MiB))
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    pubs = [ConfirmPublisher(port, f"q{i}", 32 * 1024, window=32, budget=8) for i in range(2)]
    pubs.append(ConfirmPublisher(port, "big", MiB, budget=8))
    consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    filler = small_disk / "filler"
    try:
        start_all(pubs)
        first_confirms(pubs)
        # A consumer acks what it takes: its acks are waiting to be written too.
        ch = consumer.channel()
        consumed: list[int] = []
        for _ in range(3):
            method, _props, body = ch.basic_get("q0")
            assert method is not None
            consumed.append(ConfirmPublisher.number(body))
            ch.basic_ack(method.delivery_tag)
        fill_then_release(filler, pubs)
        eventually(
            lambda: all("Connection.Blocked" in p.blocking or p.closed for p in pubs),
            30,
            "every publisher blocked",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pubs:
            p.stop(5)
    reader.join(10)
    out = "".join(lines)
    assert "Traceback" not in out, out[-3000:]
    assert "Warren stopped" in out, out[-3000:]
    assert (data / "delivered.json").exists() or "cannot record what was delivered" in out
    assert not (data / "delivered.json.tmp").exists()
    assert [p.closed[0] if p.closed else None for p in pubs] == [320] * len(pubs)
    filler.unlink()
    proc, port = start_warren(data)
    try:
        for p in pubs:
            kept = set(queue_numbers(port, p.queue))
            if p.queue == "q0":
                kept |= set(consumed)  # acked: may come back or not, never both missing
            assert p.acked <= kept, sorted(p.acked - kept)
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
