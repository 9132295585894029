"""A deduplicated publish that a full disk lost is nacked: its retry must be stored.

A deduplicating queue, stream or exchange records a message's key when it lets
the message in. When a failed write-out (a real ENOSPC on a small tmpfs) then
drops the message's record, the publisher gets a nack and publishes it again
with the same key: before the fix the key was still in the cache, so the retry
was dropped as a duplicate and acked, although nothing of it was stored.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import BrokerThread
from diskhelp import MiB, tmpfs
from pamqp import commands
from test_disk_full import queue_numbers, stream_numbers
from test_disk_full_runs import Publisher, leave_free

#: Where the publishes go: a deduplicating stream, classic queue, or exchange
#: (not durable: its keys live in memory only) in front of a durable queue.
TARGETS = ["stream", "queue", "exchange"]


def declare(pub: Publisher, target: str) -> str:
    """The target's queue (declared, and bound when behind an exchange)."""
    dedup: dict[str, object] = {"x-message-deduplication": True}
    if target == "stream":
        pub.declare("s", **{"x-queue-type": "stream", **dedup})
        return "s"
    if target == "queue":
        pub.declare("s", **dedup)
        return "s"
    amqp = pub.amqp
    amqp.send_method(
        1,
        commands.Exchange.Declare(
            exchange="dx", exchange_type="fanout", durable=False, arguments=dedup
        ),
    )
    amqp.expect_method(commands.Exchange.DeclareOk)
    pub.declare("s")
    amqp.send_method(1, commands.Queue.Bind(queue="s", exchange="dx"))
    amqp.expect_method(commands.Queue.BindOk)
    pub.exchange = "dx"
    return "s"


def republish(pub: Publisher, numbers: list[int]) -> range:
    """Publish ``numbers`` again, the same bodies and keys, in one write."""
    first = pub.published + 1
    pub.amqp.send(b"".join(pub.frames(i, i) for i in numbers))
    pub.published += len(numbers)
    return range(first, pub.published + 1)


@pytest.mark.parametrize("count", [1, 5], ids=["single", "run"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_deduplicated_publish_lost_to_a_full_disk_is_stored_when_retried(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread], target: str, count: int
) -> None:
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        pub = Publisher(b.port)
        queue = declare(pub, target)

        # The disk full: the queue's first write-out fails, its records are
        # dropped and the publishes nacked.
        filler = leave_free(disk, 0)
        lost = list(pub.publish([None] * count))
        pub.settle()
        assert pub.nacked == set(lost)

        # Room again; the publisher retries, with the same keys.
        filler.unlink()
        assert b.call(b.broker.resource_alarms.check_disk) is False
        retried = republish(pub, lost)
        pub.settle()
        assert pub.acked == set(retried), "a retry was not stored"
        pub.amqp.close()
        b.stop()
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        try:
            numbers = (stream_numbers if target == "stream" else queue_numbers)(b.port, queue)
        finally:
            b.stop()
    assert numbers == lost, "acked, not stored"


def http_publish(port: int, number: int) -> tuple[int, object]:
    """Publish message ``number`` (its key ``k<number>``) to the default exchange
    for the queue ``s`` through the HTTP API: the status and the answer."""
    body = {
        "routing_key": "s",
        "payload": f"s:{number}:".ljust(1000, "."),
        "payload_encoding": "string",
        "properties": {
            "delivery_mode": 2,
            "headers": {"x-deduplication-header": f"k{number:06d}"},
        },
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/exchanges/%2F/amq.default/publish",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_an_http_publish_a_full_disk_refused_is_stored_when_retried(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    # The HTTP API's publish into a deduplicating stream: the stream's part of
    # the unit cannot be taken back, its record is dropped by the failed
    # write-out and the answer is a 400; the retry must be stored (before the
    # fix: "routed": true, dropped as a duplicate).
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        pub = Publisher(b.port)
        declare(pub, "stream")
        filler = leave_free(disk, 0)
        status, answer = http_publish(b.http_port, 1)
        assert status == 400, answer
        filler.unlink()
        assert b.call(b.broker.resource_alarms.check_disk) is False
        assert http_publish(b.http_port, 1) == (200, {"routed": True})
        pub.amqp.close_socket()
        b.stop()
        b = broker_factory(data_dir=disk / "data", free_disk_min=0)
        try:
            assert stream_numbers(b.port, "s") == [1], "routed, not stored"
        finally:
            b.stop()
