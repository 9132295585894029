"""The alert consumer: prints every alert the Spark job publishes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pika
from sensors import LIVE, Topology


def consume(
    url: str,
    stop: threading.Event,
    on_alert: Callable[[dict[str, object]], None],
    topology: Topology = LIVE,
) -> None:
    """Consume the topology's alerts queue until ``stop`` is set."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        for method, _props, body in channel.consume(topology.alerts_queue, inactivity_timeout=0.2):
            if stop.is_set():
                break
            if method is None:
                continue
            on_alert(json.loads(body))
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
    finally:
        connection.close()


def show(alert: dict[str, object]) -> None:
    print(f"ALERT {alert['sensor']}: {alert['value']} at {alert['time']}", flush=True)
