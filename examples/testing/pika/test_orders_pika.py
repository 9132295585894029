"""Testing a pika application against Warren: no Docker, a fresh vhost per test.

``warren_vhost`` (from Warren's pytest plugin, loaded automatically once
warren is installed) is a vhost created for this test and deleted after it,
so the queue ``orders`` starts empty in every test.
"""

from __future__ import annotations

from typing import Any

import orders


def test_orders_are_processed_in_order(warren_vhost: Any) -> None:
    for n in range(3):
        orders.place_order(warren_vhost.url, {"id": n, "item": "widget"})
    seen: list[int] = []
    assert orders.process_orders(warren_vhost.url, lambda o: seen.append(o["id"])) == 3
    assert seen == [0, 1, 2]
    assert orders.process_orders(warren_vhost.url, seen.append) == 0


def test_a_failing_order_is_not_redelivered(warren_vhost: Any) -> None:
    orders.place_order(warren_vhost.url, {"id": 1, "item": "bad"})

    def explode(order: dict[str, Any]) -> None:
        raise ValueError(order["item"])

    assert orders.process_orders(warren_vhost.url, explode) == 0
    assert orders.process_orders(warren_vhost.url, explode) == 0  # rejected, not requeued
