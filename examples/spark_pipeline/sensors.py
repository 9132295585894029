"""The pipeline's topology and its sensors: readings published over AMQP with pika.

The live run and ``--once`` each have their own topology (``LIVE``, ``ONCE``).
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

#: A reading above this is an alert.
THRESHOLD = 80.0


@dataclass(frozen=True)
class Topology:
    """The names one run of the pipeline uses: readings exchange -> stream, alerts
    exchange -> printer queue."""

    readings_exchange: str
    readings_stream: str
    alerts_exchange: str
    alerts_queue: str

    def queues(self) -> tuple[str, str]:
        return (self.readings_stream, self.alerts_queue)

    def exchanges(self) -> tuple[str, str]:
        return (self.readings_exchange, self.alerts_exchange)


#: The live run's: it goes on where the last one stopped (the stream keeps the
#: readings, the checkpoints the offsets and the watermark).
LIVE = Topology("sensors", "sensor-readings", "sensor-alerts", "sensor-alerts-printer")
#: --once's own, deleted and declared again by every --once: its simulated hour
#: (of 2026-01-01) never meets the live run's readings of today, which would move
#: the watermark past it and drop it as late data.
ONCE = Topology(
    "sensors-once", "sensor-readings-once", "sensor-alerts-once", "sensor-alerts-once-printer"
)


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


def declare(
    channel: pika.adapters.blocking_connection.BlockingChannel, topology: Topology = LIVE
) -> None:
    """Readings: exchange -> stream. Alerts: a topic exchange -> a deduplicating queue,
    so an alert that the Spark sink publishes twice (a replayed micro-batch) arrives once."""
    channel.exchange_declare(topology.readings_exchange, "fanout", durable=True)
    channel.queue_declare(
        topology.readings_stream,
        durable=True,
        arguments={"x-queue-type": "stream", "x-max-length-bytes": 200_000_000},
    )
    channel.queue_bind(topology.readings_stream, topology.readings_exchange)
    channel.exchange_declare(topology.alerts_exchange, "topic", durable=True)
    channel.queue_declare(
        topology.alerts_queue,
        durable=True,
        arguments={"x-message-deduplication": True, "x-cache-size": 100_000},
    )
    channel.queue_bind(topology.alerts_queue, topology.alerts_exchange, "alert.#")


def delete(channel: pika.adapters.blocking_connection.BlockingChannel, topology: Topology) -> None:
    """Remove a topology's queues and exchanges (and every reading and alert in them)."""
    for queue in topology.queues():
        channel.queue_delete(queue)
    for exchange in topology.exchanges():
        channel.exchange_delete(exchange)


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
    channel: pika.adapters.blocking_connection.BlockingChannel,
    batch: list[Reading],
    topology: Topology = LIVE,
) -> None:
    """Publish one round, persistent and confirmed (the channel is in confirm mode)."""
    for reading in batch:
        channel.basic_publish(
            topology.readings_exchange,
            reading.sensor,
            reading.body(),
            pika.BasicProperties(content_type="application/json", delivery_mode=2),
        )
