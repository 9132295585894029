"""The scenarios bench/compare.py measures and the keys `--only` takes."""

from __future__ import annotations

from dataclasses import dataclass

import equal_rate  # bench/equal_rate.py, beside this module


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    args: tuple[str, ...]


THROUGHPUT: tuple[Scenario, ...] = (
    Scenario("noack", "1 publisher, 1 consumer, no-ack, 16-byte bodies", ("-x", "1", "-y", "1")),
    Scenario(
        "ack100",
        "manual ack every 100 messages, prefetch 1,000",
        ("-x", "1", "-y", "1", "-a", "100", "-q", "1000"),
    ),
    Scenario(
        "confirm1000",
        "publisher confirms, at most 1,000 unconfirmed",
        ("-x", "1", "-y", "1", "-c", "1000"),
    ),
    Scenario(
        "persistent",
        "persistent messages to a durable queue, confirms (window 1,000), "
        "manual ack every 100 (prefetch 1,000)",
        ("-x", "1", "-y", "1", "-p", "--durable", "-c", "1000", "-a", "100", "-q", "1000"),
    ),
    Scenario("body4k", "4 KiB bodies, no-ack", ("-x", "1", "-y", "1", "-s", "4096")),
    Scenario("4p4c", "4 publishers, 4 consumers on one queue, no-ack", ("-x", "4", "-y", "4")),
    Scenario(
        "fanout10",
        "fanout exchange to 10 queues, one consumer each, no-ack",
        ("-x", "1", "-y", "1", "--queues", "10"),
    ),
)
MEMORY = ("connections1000", "queues10000")
CEILING = "ceiling"
QUEUE_LENGTH = "queuelength"
ALL_KEYS = (CEILING, *MEMORY, QUEUE_LENGTH, *(s.key for s in THROUGHPUT), equal_rate.KEY)
