"""Global QoS as RabbitMQ 4.x's deprecated feature ``global_qos``
(``deprecated_features.permit.global_qos``; Warren's [deprecated_features]
permit.global_qos). Permitted (RabbitMQ 4.0-4.2's default, Warren's): 3.x's
shared channel prefetch, and a quorum queue refuses the consumer (540).
Not permitted (RabbitMQ 4.3's default): basic.qos global=true is answered
qos-ok and taken as per-consumer, as rabbit_channel does, so quorum queues
take such consumers. Either way the use is logged.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before). Counts of what
stays ready are read once the broker's loop has done all it can.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Channel, Harness, connection_error, harness_fixture, wait_until
from harness.channel import ready_count, uniq

from warren.config import Config

broker = harness_fixture()
not_permitted = harness_fixture(permit_global_qos=False)


def consume_two_queues(
    broker: Harness, arguments: dict[str, Any]
) -> tuple[Channel, list[list[bytes]], list[str]]:
    """Five messages in each of two queues, then basic.qos(2, global=true) and a
    consumer of each on one channel: the bodies each consumer got."""
    conn = broker.amqp_connection()
    ch = conn.channel()
    queues = [uniq(), uniq()]
    for q in queues:
        ch.queue_declare(q, durable=True, arguments=arguments)
        for i in range(5):
            ch.basic_publish("", q, b"%d" % i)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=2, global_qos=True)
    got: list[list[bytes]] = [[], []]

    def on(i: int) -> Callable[..., None]:
        return lambda _ch, _m, _p, body: got[i].append(body)

    for i, q in enumerate(queues):
        consumer.basic_consume(q, on(i))
    return ch, got, queues


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_not_permitted_global_qos_is_per_consumer(
    not_permitted: Harness, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker = not_permitted
    arguments = {"x-queue-type": "quorum"} if kind == "quorum" else {}
    with caplog.at_level(logging.ERROR, logger="warren.amqp"):
        ch, got, queues = consume_two_queues(broker, arguments)
        # Two each (global: two in all), and a quorum queue takes the consumers.
        wait_until(ch.connection, lambda: [len(g) for g in got] == [2, 2])
        ch.connection.pump()
    assert [len(g) for g in got] == [2, 2]
    # One delivery pass fills a consumer's prefetch: three stay ready in each.
    assert [ready_count(ch, q) for q in queues] == [3, 3]
    assert [r.getMessage() for r in caplog.records if "global QoS" in r.getMessage()] != []
    ch.connection.close()


def test_permitted_global_qos_is_shared_and_logged(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="warren.amqp"):
        ch, got, queues = consume_two_queues(broker, {})
        wait_until(ch.connection, lambda: sum(map(len, got)) == 2)
        ch.connection.pump()
    assert sum(map(len, got)) == 2
    assert sum(ready_count(ch, q) for q in queues) == 8
    (line,) = [r for r in caplog.records if "global QoS" in r.getMessage()]
    assert line.levelno == logging.WARNING and "deprecated" in line.getMessage()
    # A quorum queue refuses a consumer under it, as RabbitMQ does.
    q = uniq()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    qos = ch.connection.channel()
    qos.basic_qos(prefetch_count=2, global_qos=True)
    reply = connection_error(540, qos.basic_consume, q, lambda *a: None)
    assert reply == f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos"


def test_the_setting_reads_as_rabbitmqs_key(tmp_path: Path) -> None:
    path = tmp_path / "warren.ini"
    assert Config().permit_global_qos is True
    path.write_text("[deprecated_features]\npermit.global_qos = false\n")
    assert Config.from_ini(path).permit_global_qos is False
