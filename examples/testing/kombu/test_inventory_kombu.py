"""Testing a kombu application against Warren: the plain amqp:// transport
(py-amqp), a fresh vhost per test."""

from __future__ import annotations

from typing import Any

import inventory
from kombu import Connection


def test_totals_per_product(warren_vhost: Any) -> None:
    for product, delta in [("apple", 5), ("pear", 2), ("apple", -3)]:
        inventory.send_update(warren_vhost.url, product, delta)
    assert inventory.drain_totals(warren_vhost.url, timeout=0.5) == {"apple": 2, "pear": 2}


def test_simple_queue(warren_vhost: Any) -> None:
    with Connection(warren_vhost.url) as conn:
        queue = conn.SimpleQueue("simple")
        queue.put({"hello": "warren"})
        message = queue.get(timeout=5)
        message.ack()
        assert message.payload == {"hello": "warren"}
        queue.close()
