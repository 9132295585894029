"""The options of the ``warren`` data source, parsed once on the driver.

Spark hands a data source its options as a case-insensitive map of strings.
Everything is validated here, before a task starts, so that a typo fails the
query with a message naming the option instead of a stack trace from an
executor. Nothing here imports pyspark: the parsed objects are plain frozen
dataclasses that pickle to the executors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from warren.spark.endpoint import ENDPOINT_OPTIONS, Endpoint, redact, replica_url
from warren.spark.option_values import OptionError, non_negative_int
from warren.spark.option_values import boolean as _bool
from warren.spark.option_values import get as _get

__all__ = [
    "replica_url",
    "ENDPOINT_OPTIONS",
    "EARLIEST",
    "Endpoint",
    "LATEST",
    "DEFAULT_DEDUP_HEADER",
    "KAFKA_INSTEAD",
    "OptionError",
    "Position",
    "Positions",
    "SOURCE_OPTIONS",
    "include_headers",
    "SinkOptions",
    "SourceOptions",
    "redact",
]

#: Where a query starts, before it is resolved against a stream's bounds.
EARLIEST = "earliest"
LATEST = "latest"
#: The header Warren's deduplication reads unless a queue names another one
#: (``x-deduplication-header``, as core/dedup.py's DEFAULT_HEADER).
DEFAULT_DEDUP_HEADER = "x-deduplication-header"


@dataclass(frozen=True)
class Position:
    """A starting or ending position: ``earliest``, ``latest``, an offset or a time.

    Exactly one of the fields is meaningful: ``kind`` is ``"earliest"``,
    ``"latest"``, ``"offset"`` (``value`` is the offset) or ``"timestamp"``
    (``value`` is milliseconds since the epoch).
    """

    kind: str
    value: int = 0

    @classmethod
    def parse(cls, option: str, raw: Any, allowed: tuple[str, ...]) -> Position:
        """One position as the user wrote it (a string, or an int from a JSON map)."""
        expected = _expected(allowed)
        if isinstance(raw, bool):
            raise OptionError(option, f"expected {expected}, got {raw!r}")
        if isinstance(raw, int) and raw in (-2, -1):  # Kafka's JSON: -2 earliest, -1 latest
            text = EARLIEST if raw == -2 else LATEST
        elif isinstance(raw, int):
            text = str(raw)
        elif isinstance(raw, str):
            text = raw.strip()
        else:
            raise OptionError(option, f"expected {expected}, got {raw!r}")
        lower = text.lower()
        if lower in (EARLIEST, LATEST) and lower in allowed:
            return cls(lower)
        if lower.startswith("timestamp:") and "timestamp" in allowed:
            ms = non_negative_int(text[len("timestamp:") :])
            if ms is None:
                raise OptionError(option, f"expected timestamp:<epoch milliseconds>, got {text!r}")
            return cls("timestamp", ms)
        offset = non_negative_int(text)
        if offset is not None:
            return cls("offset", offset)
        raise OptionError(option, f"expected {expected}, got {text!r}")


def _expected(allowed: tuple[str, ...]) -> str:
    words = [w for w in (EARLIEST, LATEST) if w in allowed] + ["an offset (an integer >= 0)"]
    if "timestamp" in allowed:
        words.append("timestamp:<epoch milliseconds>")
    words.append("or a JSON object of these by queue name")
    return ", ".join(words)


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    value = non_negative_int(raw)
    if value is None or value == 0:
        raise OptionError(name, f"expected a positive integer, got {raw!r}")
    return value


class Positions(dict[str, Position]):
    """Positions by queue name; a queue not named (one a pattern finds later) takes
    ``default``."""

    def __init__(self, default: Position, by_queue: Mapping[str, Position] | None = None) -> None:
        super().__init__(by_queue or {})
        self.default = default

    def __missing__(self, queue: str) -> Position:
        return self.default


def _by_queue(name: str, text: str, known: Any) -> dict[str, Any]:
    """A JSON object by queue name; Kafka's ``{"topic": {"0": x}}`` form is taken too (a
    stream is one partition). ``known(queue)`` says whether a queue may be named."""
    try:
        by_queue = json.loads(text)
    except ValueError as exc:
        raise OptionError(name, f"invalid JSON: {exc}") from None
    if not isinstance(by_queue, dict):
        raise OptionError(name, "expected a JSON object of positions by queue name")
    unknown = sorted(q for q in by_queue if not known(q))
    if unknown:
        raise OptionError(name, f"names queues not subscribed to: {', '.join(unknown)}")
    out = {}
    for queue, value in by_queue.items():
        if isinstance(value, dict):
            if set(value) != {"0"}:
                raise OptionError(name, f'a stream is one partition, "0": got {value!r}')
            value = value["0"]
        out[queue] = value
    return out


def _positions(
    options: Mapping[str, str],
    names: tuple[str, str, str],
    known: Any,
    default: str,
    allowed: tuple[str, ...],
) -> Positions:
    """Kafka's three ways to give a position per queue, the first given wins: one time for
    all (``startingTimestamp``), times by queue (``startingOffsetsByTimestamp``), offsets
    (one for all, or a JSON object by queue, which may hold ``timestamp:`` values)."""
    fallback = Position.parse(names[2], default, allowed)
    ts_name, by_ts_name, name = names
    raw_ts = _get(options, ts_name)
    if raw_ts is not None:
        ms = non_negative_int(raw_ts)
        if ms is None:
            raise OptionError(ts_name, f"expected epoch milliseconds, got {raw_ts!r}")
        return Positions(Position("timestamp", ms))
    raw_by_ts = _get(options, by_ts_name)
    if raw_by_ts is not None:
        by_queue = {}
        for queue, value in _by_queue(by_ts_name, raw_by_ts, known).items():
            ms = value if isinstance(value, int) and not isinstance(value, bool) else -1
            if ms < 0:
                raise OptionError(by_ts_name, f"expected epoch milliseconds, got {value!r}")
            by_queue[queue] = Position("timestamp", ms)
        return Positions(fallback, by_queue)
    raw = _get(options, name)
    text = (raw if raw is not None else default).strip()
    if text.startswith("{"):
        by_queue = {
            q: Position.parse(name, v, allowed) for q, v in _by_queue(name, text, known).items()
        }
        return Positions(fallback, by_queue)
    return Positions(Position.parse(name, text, allowed))


def _either(options: Mapping[str, str], *names: str) -> tuple[str, str | None]:
    """The one of ``names`` (aliases) that is given, and its value."""
    given = [(n, v) for n in names if (v := _get(options, n)) is not None]
    if len(given) > 1:
        raise OptionError(given[1][0], f"give option '{given[0][0]}' or '{given[1][0]}', not both")
    return given[0] if given else (names[0], None)


_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(options: Mapping[str, str], name: str, default: int) -> int:
    """A duration as Spark writes them: ``15m``, ``30s``, ``500ms``, or milliseconds."""
    raw = _get(options, name)
    if raw is None:
        return default
    match = _DURATION.fullmatch(raw)
    if match is None:
        raise OptionError(name, f"expected a duration such as 15m, 30s or 500ms, got {raw!r}")
    return int(match[1]) * _UNIT_MS[(match[2] or "").lower()]


#: Every option the source reads (Spark matches names in any case).
SOURCE_OPTIONS = ENDPOINT_OPTIONS + (
    "queue", "subscribe", "subscribePattern", "superStream", "managementUrl",
    "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "endingOffsets", "endingTimestamp",
    "endingOffsetsByTimestamp", "maxRecordsPerTrigger", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "failOnDataLoss", "includeHeaders",
    "minPartitions", "maxRecordsPerPartition", "prefetch", "pollTimeoutMs",
    "kafkaConsumer.pollTimeoutMs", "readFrom", "replicas", "replicaTimeoutMs",
)  # fmt: skip
#: What Spark itself may pass to any data source (``load(path)``).
SPARK_OPTIONS = ("path", "paths")
_NO_GROUP = "Warren's source uses no consumer group: a query's offsets live in its checkpoint"
#: Kafka options that have no meaning here, and what to use instead.
KAFKA_INSTEAD = {
    "kafka.bootstrap.servers": "use option 'url' (amqp://user:password@host:port/vhost)",
    "assign": "use option 'subscribe' (or 'queue'): a stream is one partition, nothing to assign",
    "topic": "a sink option; to read, use option 'subscribe' (or 'queue')",
    "groupidprefix": _NO_GROUP,
    "kafka.group.id": _NO_GROUP,
}


def _refuse_unknown(options: Mapping[str, str], known: tuple[str, ...]) -> None:
    """An option nobody reads is a typo or a Kafka habit: say so rather than ignore it."""
    names = {n.lower() for n in known + SPARK_OPTIONS}
    for key in options:
        lower = key.lower()
        if lower in names:
            continue
        hint = KAFKA_INSTEAD.get(lower)
        if hint is None and lower.startswith("kafka."):
            hint = "Kafka client settings have no Warren equivalent; the broker and vhost are in "
            hint += "option 'url', TLS and logins in 'tls.*', 'username', 'password', 'token'"
        raise OptionError(
            key, f"unknown option{'; ' + hint if hint else ''} (known: {', '.join(known)})"
        )


def include_headers(options: Mapping[str, str]) -> bool | None:
    """Option includeHeaders (it shapes the schema): None when not given."""
    if _get(options, "includeHeaders") is None:
        return None
    return _bool(options, "includeHeaders", False)


@dataclass(frozen=True)
class SourceOptions:
    """Everything the reader needs, batch or streaming."""

    url: str
    endpoint: Endpoint
    #: The streams named (``queue`` or ``subscribe``); empty with a ``pattern`` or a
    #: ``super_stream``.
    queues: tuple[str, ...]
    starting: dict[str, Position]
    ending: dict[str, Position]
    fail_on_data_loss: bool
    min_partitions: int
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    prefetch: int
    poll_timeout_ms: int
    #: "leader": tasks read from ``url``; "replicas": from the cluster's followers
    #: (``replicas``, or those the leader announces), the leader as the fallback.
    read_from: str = "leader"
    replicas: tuple[str, ...] = ()
    replica_timeout_ms: int = 5000
    #: subscribePattern: the streams of the vhost whose whole name matches, listed at
    #: every planning through the management API at ``management_url``.
    pattern: str | None = None
    management_url: str | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    #: None: the ``headers`` map column; True: Kafka's array of (key, binary value);
    #: False: no ``headers`` column.
    include_headers: bool | None = None
    #: A start time after a stream's last message: "latest" (its end) or "error".
    timestamp_strategy: str = "latest"
    #: superStream: its partitions, listed in order at every planning through the
    #: management API (the exchange's bindings) at ``management_url``.
    super_stream: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        _refuse_unknown(options, SOURCE_OPTIONS)
        endpoint = Endpoint.parse(options)
        url = endpoint.urls[0]
        queues, pattern, super_stream = _subscription(options)

        def known(queue: str) -> bool:
            if super_stream is not None:  # positions are by partition (stream) name
                return queue != super_stream
            return queue in queues if pattern is None else pattern.fullmatch(queue) is not None

        # Kafka's defaults: a streaming query starts at the end, a batch read at the start.
        starting = _positions(
            options,
            ("startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets"),
            known,
            LATEST if streaming else EARLIEST,
            (EARLIEST, LATEST, "timestamp"),
        )
        ending_names = ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
        if streaming:
            for name in ending_names:
                if _get(options, name) is not None:
                    raise OptionError(name, "only for batch reads (a stream has no end)")
            ending = Positions(Position(LATEST))
        else:
            ending = _positions(options, ending_names, known, LATEST, (LATEST, "timestamp"))
            _check_range(starting, ending, queues)
        strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "latest").lower()
        if strategy not in ("latest", "error"):
            raise OptionError(
                "startingOffsetsByTimestampStrategy", f"expected latest or error, got {strategy!r}"
            )
        limit_name, _ = _either(options, "maxRecordsPerTrigger", "maxOffsetsPerTrigger")
        max_per_trigger = _positive(options, limit_name, None)
        min_per_trigger = _positive(options, "minOffsetsPerTrigger", None)
        if not streaming:
            for name in (limit_name, "minOffsetsPerTrigger", "maxTriggerDelay"):
                if _get(options, name) is not None:
                    raise OptionError(name, "only for streaming reads")
        min_partitions = _positive(options, "minPartitions", os.cpu_count() or 1)
        assert min_partitions is not None
        prefetch = _positive(options, "prefetch", 2000)
        assert prefetch is not None
        poll_name, _ = _either(options, "pollTimeoutMs", "kafkaConsumer.pollTimeoutMs")
        poll_timeout = _positive(options, poll_name, 60_000)
        assert poll_timeout is not None
        read_from = (_get(options, "readFrom") or "leader").strip().lower()
        if read_from not in ("leader", "replicas"):
            raise OptionError("readFrom", f"expected leader or replicas, got {read_from!r}")
        raw_replicas = _get(options, "replicas") or ""
        replicas = tuple(r.strip() for r in raw_replicas.split(",") if r.strip())
        for replica in replicas:
            host, _, port = replica.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise OptionError("replicas", f"expected host:port, got {replica!r}")
        if replicas and read_from != "replicas":
            raise OptionError("replicas", "only with readFrom=replicas")
        replica_timeout = _positive(options, "replicaTimeoutMs", 5000)
        assert replica_timeout is not None
        management = _get(options, "managementUrl")
        if management is not None and pattern is None and super_stream is None:
            raise OptionError("managementUrl", "only with subscribePattern or superStream")
        if management is not None and urlsplit(management).scheme not in ("http", "https"):
            raise OptionError("managementUrl", f"expected an http(s):// URL, got {management!r}")
        return cls(
            url=url,
            endpoint=endpoint,
            queues=queues,
            starting=starting,
            ending=ending,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            min_partitions=min_partitions,
            max_records_per_partition=_positive(options, "maxRecordsPerPartition", None),
            max_records_per_trigger=max_per_trigger,
            prefetch=min(prefetch, 65535),
            poll_timeout_ms=poll_timeout,
            read_from=read_from,
            replicas=replicas,
            replica_timeout_ms=replica_timeout,
            pattern=None if pattern is None else pattern.pattern,
            management_url=management,
            min_records_per_trigger=min_per_trigger,
            max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", 15 * 60_000),
            include_headers=include_headers(options),
            timestamp_strategy=strategy,
            super_stream=super_stream,
        )


def _subscription(
    options: Mapping[str, str],
) -> tuple[tuple[str, ...], re.Pattern[str] | None, str | None]:
    """The streams to read: a list (``queue``, or Kafka's ``subscribe``), a pattern, or a
    super stream's partitions."""
    name, raw = _either(options, "queue", "subscribe", "subscribePattern", "superStream")
    if raw is None or not raw.strip():
        raise OptionError(
            "queue",
            "required: the stream queue to read, or a comma-separated list "
            "(or option 'subscribe', 'subscribePattern', a regular expression, "
            "or 'superStream', a super stream's name)",
        )
    if name == "superStream":
        return (), None, raw.strip()
    if name == "subscribePattern":
        try:
            return (), re.compile(raw), None
        except re.error as exc:
            raise OptionError(name, f"not a regular expression: {exc}") from None
    queues = tuple(q.strip() for q in raw.split(","))
    if any(not q for q in queues):
        raise OptionError(name, f"empty queue name in {raw!r}")
    if len(set(queues)) != len(queues):
        raise OptionError(name, f"a queue is listed twice in {raw!r}")
    return queues, None, None


def _check_range(starting: Positions, ending: Positions, queues: tuple[str, ...]) -> None:
    for q in {*queues, *starting, *ending}:
        s, e = starting[q], ending[q]
        if s.kind == "offset" and e.kind == "offset" and s.value > e.value:
            raise OptionError(
                "endingOffsets",
                f"ending offset {e.value} of queue {q!r} is before startingOffsets {s.value}",
            )
        if s.kind == "timestamp" and e.kind == "timestamp" and s.value > e.value:
            raise OptionError(
                "endingTimestamp", f"ending time {e.value} of queue {q!r} is before the start"
            )
        if s.kind == LATEST and e.kind == "offset":
            raise OptionError(
                "startingOffsets", "latest cannot start a batch read with an ending offset"
            )


@dataclass(frozen=True)
class SinkOptions:
    """Where and how the sink publishes."""

    url: str
    endpoint: Endpoint
    exchange: str
    routing_key: str | None
    routing_key_column: str | None
    dedup_header: str
    persistent: bool
    max_unconfirmed: int
    #: Publish mandatory and fail the task on a basic.return (Kafka-style name:
    #: as ``failOnDataLoss``); false drops rows no queue takes.
    fail_on_unroutable: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        endpoint = Endpoint.parse(options)
        url = endpoint.urls[0]
        exchange = _get(options, "exchange")
        topic = _get(options, "topic")
        if exchange is not None and topic is not None:
            raise OptionError("topic", "give exchange or topic (Kafka's name for it), not both")
        exchange = (exchange if exchange is not None else topic) or ""
        routing_key = _get(options, "routingKey")
        column = _get(options, "routingKeyColumn")
        if routing_key is not None and column is not None:
            raise OptionError("routingKeyColumn", "give routingKey or routingKeyColumn, not both")
        if column is not None and not column.strip():
            raise OptionError("routingKeyColumn", "empty column name")
        for name, value in (("exchange", exchange), ("routingKey", routing_key or "")):
            if len(value.encode()) > 255:
                raise OptionError(name, "longer than 255 bytes")
        header = _get(options, "deduplicationHeader") or DEFAULT_DEDUP_HEADER
        if len(header.encode()) > 255:
            raise OptionError("deduplicationHeader", "longer than 255 bytes")
        max_unconfirmed = _positive(options, "maxUnconfirmed", 10_000)
        assert max_unconfirmed is not None
        return cls(
            url=url,
            endpoint=endpoint,
            exchange=exchange,
            routing_key=routing_key,
            routing_key_column=column.strip() if column is not None else None,
            dedup_header=header,
            persistent=_bool(options, "persistent", True),
            max_unconfirmed=max_unconfirmed,
            fail_on_unroutable=_bool(options, "failOnUnroutable", True),
        )
