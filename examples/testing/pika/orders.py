"""A tiny pika application: orders go into a durable queue, a worker drains it.

The code takes a connection URL, as real applications read it from their
configuration; the tests hand it Warren's instead of a RabbitMQ server's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pika

QUEUE = "orders"


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def place_order(url: str, order: dict[str, Any]) -> None:
    """Publish one order, persistent, with publisher confirms."""
    conn = connect(url)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(QUEUE, durable=True)
        ch.basic_publish(
            "",
            QUEUE,
            json.dumps(order).encode(),
            pika.BasicProperties(content_type="application/json", delivery_mode=2),
        )
    finally:
        conn.close()


def process_orders(url: str, handle: Callable[[dict[str, Any]], None]) -> int:
    """Hand every waiting order to ``handle``; ack on success, dead-letter-style
    reject (no requeue) when it raises. Returns how many were handled."""
    conn = connect(url)
    handled = 0
    try:
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        while True:
            method, _props, body = ch.basic_get(QUEUE)
            if method is None:
                return handled
            try:
                handle(json.loads(body))
            except Exception:
                ch.basic_reject(method.delivery_tag, requeue=False)
            else:
                ch.basic_ack(method.delivery_tag)
                handled += 1
    finally:
        conn.close()
