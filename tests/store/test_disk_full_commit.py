"""Units of publishes on a really full disk (a small tmpfs filled by the test):
an AMQP tx.commit and the HTTP API's publish are stored all-or-nothing
(core/commit.py, docs/storage.md "Confirms, transactions and the disk").
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pika
import pytest
from conftest import BrokerThread
from diskhelp import MiB, fill, tmpfs
from pika.exceptions import ChannelClosedByBroker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", 16 * MiB) as where:
        yield where


def drain(port: int, queue: str) -> list[str]:
    """The tag (what comes before the first colon) of every message in ``queue``,
    consumed by a connection of its own."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        got = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append(body.split(b":")[0].decode())
    finally:
        conn.close()


def test_tx_commit_on_a_full_disk_fails_the_channel_and_keeps_nothing(
    small_disk: Path,
    broker_factory: Callable[..., BrokerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # free_disk_min 0: the disk fills from outside; only the failed write raises
    # the alarm (a measurement would block the publisher before its commit).
    data = small_disk / "data"
    b = broker_factory(data_dir=data, free_disk_min=0)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    watcher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    try:
        other = conn.channel()  # a second channel of the same connection
        ch = conn.channel()
        for q in ("tx1", "tx2"):
            ch.queue_declare(q, durable=True)
        # A consumer waiting on tx1 (nothing ready: a publish would go straight to it).
        seen: list[bytes] = []
        wch = watcher.channel()
        tag = wch.basic_consume("tx1", lambda _c, _m, _p, body: seen.append(body), auto_ack=True)
        ch.tx_select()
        ch.basic_publish("", "tx1", b"kept:1", PERSISTENT)
        ch.basic_publish("", "tx2", b"kept:2", PERSISTENT)
        ch.tx_commit()
        watcher.process_data_events(time_limit=0)
        assert [s.split(b":")[0] for s in seen] == [b"kept"]
        # The consumer takes it and acks it in a transaction that fails below.
        getter = conn.channel()
        getter.basic_qos(prefetch_count=10)
        ch.basic_publish("", "tx2", b"kept:3", PERSISTENT)
        ch.tx_commit()
        method, _props, _body = ch.basic_get("tx2")
        assert method is not None

        # Room for a few of the transaction's records only: the first write-outs
        # succeed, the later ones fail.
        filler = small_disk / "filler"
        fill(filler)
        os.truncate(filler, filler.stat().st_size - 64 * 1024)
        ch.basic_ack(method.delivery_tag)
        for i in range(40):  # past a store's 32 KiB buffer: write-outs fail as they go
            body = f"lost:{i}:".encode().ljust(20_000, b".")
            ch.basic_publish("", "tx1" if i % 2 else "tx2", body, PERSISTENT)
        with (
            caplog.at_level(logging.ERROR, "warren.commit"),
            pytest.raises(ChannelClosedByBroker) as closed,
        ):
            ch.tx_commit()
        assert closed.value.reply_code == 406, closed.value
        assert "could not be stored" in closed.value.reply_text
        assert "nothing of the transaction was committed" in closed.value.reply_text
        taken = re.search(
            r"40 published messages could not be written .* (\d+) taken back", caplog.text
        )
        assert taken is not None and int(taken.group(1)) > 0, caplog.text
        # The consumer of tx1 never saw a message of the failed transaction.
        watcher.process_data_events(time_limit=0)
        wch.queue_declare("tx1", passive=True)  # a round trip after the commit's turn
        watcher.process_data_events(time_limit=0)
        assert [s.split(b":")[0] for s in seen] == [b"kept"]
        wch.basic_cancel(tag)
        assert conn.is_open and other.is_open
        # Room again: the connection (blocked by the disk alarm) goes on.
        filler.unlink()
        assert b.call(b.broker.resource_alarms.check_disk) is False
        assert other.queue_declare("tx1", passive=True).method.message_count == 0
        # The failed commit's ack was not applied: kept:3 is back in tx2 (its
        # channel's close gave it back), and not a message of the transaction is there.
        assert drain(b.port, "tx2") == ["kept", "kept"]
        assert drain(b.port, "tx1") == []
        retry = conn.channel()
        retry.tx_select()
        retry.basic_publish("", "tx1", b"again:1", PERSISTENT)
        retry.tx_commit()
    finally:
        watcher.close()
        conn.close()
    # Nothing of the failed transaction comes back at a restart.
    b.stop()
    b = broker_factory(data_dir=data, free_disk_min=0)
    assert drain(b.port, "tx1") == ["again"]
    assert drain(b.port, "tx2") == []


@pytest.mark.asyncio
async def test_http_publish_on_a_full_disk_is_an_error_and_keeps_nothing(
    small_disk: Path,
    broker_factory: Callable[..., BrokerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = broker_factory(data_dir=small_disk / "data", free_disk_min=0)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port)) as conn:
        ch = conn.channel()
        for q in ("h1", "h2"):
            ch.queue_declare(q, durable=True)
            ch.queue_bind(q, "amq.fanout")
    url = f"http://127.0.0.1:{b.http_port}/api/exchanges/%2F/amq.fanout/publish"
    auth = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}

    async def publish(tag: str) -> tuple[int, object]:
        body = {
            "routing_key": "",
            # Larger than what a segment allocates ahead (64 KiB at first): each
            # copy needs space of its own when it is written.
            "payload": f"{tag}:".ljust(200_000, "."),
            "payload_encoding": "string",
            "properties": {"delivery_mode": 2},
        }
        async with aiohttp.ClientSession(headers=auth) as s, s.post(url, json=body) as reply:
            return reply.status, await reply.json()

    assert await publish("kept") == (200, {"routed": True})
    # Room for about one copy of the message: the first queue's write may
    # succeed, the second's fails; neither keeps it.
    filler = small_disk / "filler"
    fill(filler)
    os.truncate(filler, filler.stat().st_size - 300 * 1024)
    with caplog.at_level(logging.ERROR, "warren.commit"):
        status, answer = await publish("lost")
    assert status == 400, answer
    assert answer == {
        "error": "bad_request",
        "reason": "rejected Unable to publish message: the messages could not be stored "
        "(the disk is full or failing).",
    }
    taken = re.search(
        r"publish by user .guest.: 1 published messages could not .* (\d+) taken back", caplog.text
    )
    # The first queue's copy fitted and was taken back out; the second's failed.
    assert taken is not None and taken.group(1) == "1", caplog.text
    filler.unlink()
    assert b.call(b.broker.resource_alarms.check_disk) is False
    assert drain(b.port, "h1") == ["kept"]
    assert drain(b.port, "h2") == ["kept"]
    assert await publish("again") == (200, {"routed": True})
    assert drain(b.port, "h1") == ["again"]


def test_a_failed_commit_leaves_no_deduplication_key_behind(
    small_disk: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # A deduplicating queue and a deduplicating exchange: a transaction that
    # could not be stored is taken back, and so are its keys, or its retry
    # would be dropped as a duplicate of messages that were never kept.
    b = broker_factory(data_dir=small_disk / "data", free_disk_min=0)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    try:
        ch = conn.channel()
        dedup = {"x-message-deduplication": True}
        ch.exchange_declare("dx", "fanout", durable=True, arguments=dedup)
        ch.queue_declare("dq", durable=True, arguments=dedup)
        ch.queue_bind("dq", "dx")

        def publish_all(channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
            for i in range(40):
                props = pika.BasicProperties(
                    delivery_mode=2, headers={"x-deduplication-header": f"k{i}"}
                )
                channel.basic_publish("dx", "", f"m{i}:".encode().ljust(20_000, b"."), props)

        ch.tx_select()
        filler = small_disk / "filler"
        fill(filler)
        os.truncate(filler, filler.stat().st_size - 64 * 1024)
        publish_all(ch)
        with pytest.raises(ChannelClosedByBroker) as closed:
            ch.tx_commit()
        assert closed.value.reply_code == 406
        filler.unlink()
        assert b.call(b.broker.resource_alarms.check_disk) is False
        retry = conn.channel()
        retry.tx_select()
        publish_all(retry)
        retry.tx_commit()
        assert sorted(drain(b.port, "dq")) == sorted(f"m{i}" for i in range(40))
    finally:
        conn.close()
