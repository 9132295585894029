"""The pipeline's topology and its sensors: readings published over AMQP with pika.

A reading is a JSON body ``{"sensor": "s3", "value": 21.4, "time": "2026-...Z"}``
published to the exchange ``sensors`` (fanout), which feeds the stream queue
``sensor-readings``. Values wander around 50 and now and then spike above the
alert threshold, as a flaky sensor does.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pika

READINGS_EXCHANGE = "sensors"
READINGS_STREAM = "sensor-readings"
ALERTS_EXCHANGE = "sensor-alerts"
ALERTS_QUEUE = "sensor-alerts-printer"
#: A reading above this is an alert.
THRESHOLD = 80.0


@dataclass(frozen=True)
class Reading:
    sensor: str
    value: float
    time: dt.datetime

    def body(self) -> bytes:
        stamp = self.time.astimezone(dt.UTC).isoformat(timespec="milliseconds")
        return json.dumps(
            {"sensor": self.sensor, "value": self.value, "time": stamp.replace("+00:00", "Z")}
        ).encode()


def declare(channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    """Readings: exchange -> stream. Alerts: a topic exchange -> a deduplicating queue,
    so an alert the Spark sink publishes twice (a replayed micro-batch) arrives once."""
    channel.exchange_declare(READINGS_EXCHANGE, "fanout", durable=True)
    channel.queue_declare(
        READINGS_STREAM,
        durable=True,
        arguments={"x-queue-type": "stream", "x-max-length-bytes": 200_000_000},
    )
    channel.queue_bind(READINGS_STREAM, READINGS_EXCHANGE)
    channel.exchange_declare(ALERTS_EXCHANGE, "topic", durable=True)
    channel.queue_declare(
        ALERTS_QUEUE,
        durable=True,
        arguments={"x-message-deduplication": True, "x-cache-size": 100_000},
    )
    channel.queue_bind(ALERTS_QUEUE, ALERTS_EXCHANGE, "alert.#")


def readings(
    sensors: int, start: dt.datetime, step: dt.timedelta, seed: int = 7
) -> Iterator[list[Reading]]:
    """Rounds of one reading per sensor, ``step`` apart from ``start`` on."""
    rng = random.Random(seed)
    level = [50.0 + rng.uniform(-10, 10) for _ in range(sensors)]
    at = start
    while True:
        batch = []
        for i in range(sensors):
            level[i] = min(75.0, max(0.0, level[i] + rng.gauss(0, 2)))
            spike = rng.random() < 0.02
            value = round(level[i] + (rng.uniform(25, 40) if spike else 0.0), 2)
            batch.append(Reading(f"s{i + 1}", value, at))
        yield batch
        at += step


def publish(
    channel: pika.adapters.blocking_connection.BlockingChannel, batch: list[Reading]
) -> None:
    """Publish one round, persistent and confirmed (the channel is in confirm mode)."""
    for reading in batch:
        channel.basic_publish(
            READINGS_EXCHANGE,
            reading.sensor,
            reading.body(),
            pika.BasicProperties(content_type="application/json", delivery_mode=2),
        )
