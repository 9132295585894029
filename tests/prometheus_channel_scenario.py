"""One client script for the per-channel Prometheus series by exchange and queue,
run against RabbitMQ 3.10 (tests/record_rabbitmq_channel_series.py, which keeps
its answers in tests/data/rabbitmq_prometheus_channel_series.json) and against
Warren (tests/http/test_metrics_channels.py), and what both answers are reduced to.

Channel A publishes with confirms: to a fanout exchange bound to two queues,
to the default exchange, and unroutable to a direct exchange (mandatory: a
return; not: a drop). Channel B takes from the queues: basic.get with and
without ack, a get on an empty queue, a consumer with acks that rejects one
delivery back (a redelivery), and a no-ack consumer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pika
from pika.adapters.blocking_connection import BlockingChannel
from prometheus_client.parser import text_string_to_metric_families

#: The detailed endpoint's query for the three per-channel groups.
DETAILED = (
    "/metrics/detailed?family=channel_exchange_metrics&family=channel_queue_metrics"
    "&family=channel_queue_exchange_metrics"
)

#: (family without prefix, labels sorted, value), channel labels as "A" or "B".
Series = list[tuple[str, tuple[tuple[str, str], ...], float]]

#: The families the scenario compares (without rabbitmq_ / rabbitmq_detailed_).
FAMILIES = (
    "channel_messages_published_total",
    "channel_messages_confirmed_total",
    "channel_messages_unroutable_returned_total",
    "channel_messages_unroutable_dropped_total",
    "channel_get_ack_total",
    "channel_get_total",
    "channel_messages_delivered_ack_total",
    "channel_messages_delivered_total",
    "channel_messages_redelivered_total",
    "channel_messages_acked_total",
    "channel_get_empty_total",
    "queue_messages_published_total",
)


def run(conn: pika.BlockingConnection, prefix: str) -> None:
    """The traffic; names start with ``prefix``. Returns once every message is
    settled (the queues empty, nothing unacked), both channels still open."""
    a = conn.channel()
    a.confirm_delivery()
    q1, q2, empty = f"{prefix}-q1", f"{prefix}-q2", f"{prefix}-empty"
    fan, nowhere = f"{prefix}-fan", f"{prefix}-nowhere"
    for q in (q1, q2, empty):
        a.queue_declare(q)
    a.exchange_declare(fan, "fanout")
    a.exchange_declare(nowhere, "direct")
    a.queue_bind(q1, fan)
    a.queue_bind(q2, fan)
    for _ in range(3):
        a.basic_publish(fan, "", b"fanned")
    for _ in range(2):
        a.basic_publish("", q1, b"direct")
    with contextlib.suppress(pika.exceptions.UnroutableError):  # the return
        a.basic_publish(nowhere, "k", b"returned", mandatory=True)
    a.basic_publish(nowhere, "k", b"dropped")

    b = conn.channel()
    got = b.basic_get(q1, auto_ack=False)
    assert got[0] is not None
    b.basic_ack(got[0].delivery_tag)
    assert b.basic_get(q1, auto_ack=True)[0] is not None
    assert b.basic_get(empty, auto_ack=True)[0] is None
    seen: list[int] = []

    def on_q2(ch: BlockingChannel, method: object, _props: object, _body: bytes) -> None:
        tag = method.delivery_tag  # type: ignore[attr-defined]
        if not seen:
            ch.basic_reject(tag, requeue=True)
        else:
            ch.basic_ack(tag)
        seen.append(tag)

    b.basic_consume(q2, on_q2)
    no_ack: list[bytes] = []
    b.basic_consume(q1, lambda _c, _m, _p, body: no_ack.append(body), auto_ack=True)
    _wait(conn, lambda: len(seen) == 4 and len(no_ack) == 3)
    for q in (q1, q2):
        assert b.queue_declare(q, passive=True).method.message_count == 0


def reduce(text: str, prefix: str) -> Series:
    """The samples of FAMILIES in an exposition (``prefix``: ``rabbitmq_`` or
    ``rabbitmq_detailed_``), channels named "A" (the one that published) and
    "B", sorted: what RabbitMQ and Warren are compared on."""
    samples = [
        (s.name.removeprefix(prefix), dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix) and s.name.removeprefix(prefix) in FAMILIES
    ]
    publishers = {
        labels["channel"]
        for name, labels, _ in samples
        if name == "channel_messages_published_total" and "channel" in labels
    }
    out: Series = []
    for name, labels, value in samples:
        if "channel" in labels:
            labels["channel"] = "A" if labels["channel"] in publishers else "B"
        out.append((name, tuple(sorted(labels.items())), value))
    return sorted(out)


def _wait(conn: pika.BlockingConnection, done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        conn.process_data_events(time_limit=0.01)
    raise AssertionError("the scenario's deliveries did not arrive")
