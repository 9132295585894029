"""A tiny kombu application: stock updates through a direct exchange, and a
consumer that keeps a running total per product."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kombu import Connection, Exchange, Queue

exchange = Exchange("inventory", type="direct", durable=True)
updates = Queue("stock-updates", exchange, routing_key="stock", durable=True)


def send_update(url: str, product: str, delta: int) -> None:
    with Connection(url) as conn:
        producer = conn.Producer(serializer="json")
        producer.publish(
            {"product": product, "delta": delta},
            exchange=exchange,
            routing_key="stock",
            declare=[updates],
            retry=True,
        )


def drain_totals(url: str, timeout: float = 1.0) -> Counter[str]:
    """Consume every waiting update; returns the total change per product."""
    totals: Counter[str] = Counter()

    def on_message(body: dict[str, Any], message: Any) -> None:
        totals[body["product"]] += body["delta"]
        message.ack()

    with Connection(url) as conn, conn.Consumer(updates, callbacks=[on_message], accept=["json"]):
        while True:
            try:
                conn.drain_events(timeout=timeout)
            except TimeoutError:
                return totals
