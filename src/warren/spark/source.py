"""The ``warren`` data source: batch and streaming reads of stream queues, and the sink.

Planning runs on the driver (in a Python planner process): it asks the
broker for each stream's bounds and cuts ``[start, end)`` into partitions.
Reading runs in the executors: each partition opens its own connection
(never pickled: readers carry only options and offsets) and closes it when
its range is read or the task stops.

A streaming query's offsets are ``{queue: next offset}``; ``-1`` stands for
"the first offset the stream will have", which a query that starts on an
empty stream records until the stream has messages.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from warren.client import AMQPError
from warren.spark.columns import columns, schema_ddl, to_batch
from warren.spark.connection import DataLossError, SourceError, data_loss
from warren.spark.listing import matching_streams, super_stream_partitions
from warren.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    Position,
    SourceOptions,
    include_headers,
    redact,
)
from warren.spark.stream import Bounds, Planner, read_range

T = TypeVar("T")

__all__ = ["WarrenDataSource", "OffsetRange", "split", "spread", "allocate"]

log = logging.getLogger("warren.spark")

#: In a streaming offset: the stream was empty, start at its first offset.
UNRESOLVED = -1


@contextlib.contextmanager
def _message_first() -> Iterator[None]:
    """Let Warren's own errors reach the user message first.

    Spark puts a failing Python data source's traceback before its message, so
    the line a user sees first is ``Traceback (most recent call last):``. An
    OptionError or SourceError says all there is to fix, so for those the
    worker is asked (pyspark's SPARK_HIDE_TRACEBACK, what the session setting
    ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets) to send
    ``<type>: <message>`` alone. pyspark ends a worker process after an error,
    so the setting dies with it. Other errors keep their traceback.
    """
    try:
        yield
    except (OptionError, SourceError):
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


def _plain(method: Callable[..., T]) -> Callable[..., T]:
    """``_message_first`` around a method that returns (not a generator)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with _message_first():
            return method(*args, **kwargs)

    return wrapper


def _streams(options: SourceOptions) -> list[str]:
    """The streams to read now: those named, those subscribePattern matches, or the
    super stream's partitions."""
    if options.super_stream is not None:
        return super_stream_partitions(
            options.endpoint.uri(),
            options.management_url,
            options.super_stream,
            options.poll_timeout_ms / 1000,
        )
    if options.pattern is None:
        return list(options.queues)
    return matching_streams(
        options.endpoint.uri(),
        options.management_url,
        options.pattern,
        options.poll_timeout_ms / 1000,
    )


class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of one queue: what one task reads, and the cluster
    follower (host:port) it reads them from, None for the ``url``'s node."""

    def __init__(self, queue: str, start: int, end: int, replica: str | None = None) -> None:
        super().__init__((queue, start, end, replica))
        self.queue = queue
        self.start = start
        self.end = end
        self.replica = replica

    def __repr__(self) -> str:
        where = f", {self.replica!r}" if self.replica else ""
        return f"OffsetRange({self.queue!r}, {self.start}, {self.end}{where})"


def spread(parts: list[OffsetRange], replicas: Sequence[str]) -> list[OffsetRange]:
    """The partitions dealt round-robin over ``replicas`` (unchanged without any)."""
    if not replicas:
        return parts
    return [
        OffsetRange(p.queue, p.start, p.end, replicas[i % len(replicas)])
        for i, p in enumerate(parts)
    ]


def _plan(planner: Planner, options: SourceOptions, parts: list[OffsetRange]) -> list[OffsetRange]:
    if options.read_from != "replicas":
        return parts
    replicas = list(options.replicas) or planner.replicas()
    if not replicas:
        log.info(
            "readFrom=replicas: no follower serves stream reads; reading from %s",
            redact(options.url),
        )
    return spread(parts, replicas)


def split(
    ranges: Sequence[tuple[str, int, int]], min_partitions: int, max_per_partition: int | None
) -> list[OffsetRange]:
    """Cut the ranges into about ``min_partitions`` pieces (more when a piece would exceed
    ``max_per_partition``), in proportion to their sizes; empty ranges are dropped."""
    ranges = [(q, s, e) for q, s, e in ranges if e > s]
    total = sum(e - s for _, s, e in ranges)
    out: list[OffsetRange] = []
    for queue, start, end in ranges:
        size = end - start
        parts = max(1, round(min_partitions * size / total))
        if max_per_partition:
            parts = max(parts, -(-size // max_per_partition))
        parts = min(parts, size)
        for i in range(parts):
            lo = start + size * i // parts
            hi = start + size * (i + 1) // parts
            out.append(OffsetRange(queue, lo, hi))
    return out


def allocate(available: dict[str, int], limit: int) -> dict[str, int]:
    """How many records to take from each queue so that the total is at most ``limit``, in
    proportion to what each has (Kafka's maxOffsetsPerTrigger does the same)."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    take = {q: n * limit // total for q, n in available.items()}
    left = limit - sum(take.values())
    for q in sorted(available, key=lambda q: available[q] - take[q], reverse=True):
        if left <= 0:
            break
        if take[q] < available[q]:
            take[q] += 1
            left -= 1
    return take


def _start(
    planner: Planner, options: SourceOptions, queue: str, position: Position, bounds: Bounds
) -> int | None:
    """Where a read of ``queue`` starts, or None while the stream is empty."""
    if bounds.empty:
        return None
    assert bounds.first is not None and bounds.end is not None
    if position.kind == EARLIEST:
        return bounds.first
    if position.kind == LATEST:
        return bounds.end
    if position.kind == "timestamp":
        offset = planner.offset_at(queue, position.value, bounds)
        if offset == bounds.end and options.timestamp_strategy == "error":
            raise OptionError(
                "startingOffsetsByTimestampStrategy",
                f"no message of queue {queue!r} was published at or after {position.value} "
                "(epoch ms); set it to latest to start at the end",
            )
        return offset
    if position.value < bounds.first:
        data_loss(queue, position.value, bounds.first, options.fail_on_data_loss)
        return bounds.first
    return position.value


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    with _message_first():
        yield from _batches(options, partition)


def _batches(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, OffsetRange):  # Spark's placeholder for "no partitions"
        return
    raw_headers = options.include_headers is True
    start = partition.start
    if partition.replica:
        # A follower holds what the leader confirmed; one that is down or behind
        # by more than replicaTimeoutMs leaves the rest of the range to the leader.
        try:
            for rows in read_range(
                options.endpoint.at(partition.replica),
                partition.queue,
                start,
                partition.end,
                prefetch=options.prefetch,
                poll_timeout_ms=options.replica_timeout_ms,
                fail_on_data_loss=options.fail_on_data_loss,
                raw_headers=raw_headers,
            ):
                if len(rows):
                    start = rows.last_offset + 1
                yield to_batch(rows, partition.queue, options.include_headers)
            return
        except DataLossError:
            raise
        except (SourceError, OptionError, OSError, EOFError) as exc:
            log.warning(
                "reading %s offsets [%d, %d) from follower %s failed (%s); reading them from %s",
                partition.queue,
                start,
                partition.end,
                partition.replica,
                exc,
                redact(options.url),
            )
    yield from _read_resuming(options, partition.queue, start, partition.end)


def _read_resuming(
    options: SourceOptions, queue: str, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    """Offsets ``[start, end)`` from the leader; a lost connection or a stall is
    resumed after the last offset read, on a new connection (connect() waits
    for the broker as the retry options say), at most ``maxRetries`` times in
    a row without progress: a broker restart under a running task costs no
    row and repeats none."""
    retries = 0
    while True:
        try:
            for rows in read_range(
                options.endpoint,
                queue,
                start,
                end,
                prefetch=options.prefetch,
                poll_timeout_ms=options.poll_timeout_ms,
                fail_on_data_loss=options.fail_on_data_loss,
                raw_headers=options.include_headers is True,
            ):
                if len(rows):
                    start = rows.last_offset + 1
                    retries = 0
                yield to_batch(rows, queue, options.include_headers)
            return
        except (DataLossError, OptionError):
            raise
        except (SourceError, OSError, EOFError) as exc:
            retries += 1
            if retries > options.endpoint.max_retries:
                raise
            log.warning(
                "reading %s offsets [%d, %d) from %s stopped (%s); resuming at %d",
                queue,
                start,
                end,
                options.endpoint.describe(),
                exc,
                start,
            )


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if got != list(columns(options.include_headers)):
        raise OptionError(
            "schema",
            "the warren source's columns are fixed; do not set a schema "
            f"(got {schema.simpleString()})",
        )


class BatchReader(DataSourceReader):
    """``spark.read.format("warren")``: the offsets between the two options, now."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    @_plain
    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        ranges = []
        with Planner(o.endpoint, o.poll_timeout_ms) as planner:
            for queue in _streams(o):
                bounds = planner.bounds(queue)
                start = _start(planner, o, queue, o.starting[queue], bounds)
                if start is None:
                    continue
                assert bounds.end is not None
                ending = o.ending[queue]
                if ending.kind == LATEST:
                    end = bounds.end
                elif ending.kind == "timestamp":
                    at = planner.offset_at(queue, ending.value, bounds)
                    end = bounds.end if at is None else at
                else:
                    end = min(ending.value, bounds.end)
                ranges.append((queue, start, end))
            return _plan(planner, o, split(ranges, o.min_partitions, o.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("warren")``: micro-batches of new offsets.

    Spark keeps one reader per query in its planner process: ``last_trigger``
    (for minOffsetsPerTrigger) lives as long as the query runs, as Kafka's does.
    """

    def __init__(self, options: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        #: Set by trigger(availableNow=True): the ends to stop at.
        self.target: dict[str, int] | None = None
        #: One planning connection for the query's life (Spark asks for the
        #: latest offsets many times a second when the query is idle).
        self._planner: Planner | None = None
        self.clock = clock
        self.last_trigger: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled to the executors without the planner's connection."""
        state = self.__dict__.copy()
        state["_planner"] = None
        return state

    def _planning(self, work: Callable[[Planner], T]) -> T:
        """``work`` with the query's planner, connected on first use; a planner
        that lost its connection (a broker restart, a leader that moved) is
        replaced and the work done again, once, on a new connection (connect()
        itself waits for a broker as the retry options say)."""
        for attempt in (1, 2):
            planner = self._planner
            if planner is None:
                o = self.options
                planner = self._planner = Planner(o.endpoint, o.poll_timeout_ms)
            try:
                return work(planner)
            except (DataLossError, OptionError):
                raise
            except (SourceError, AMQPError, OSError, EOFError) as exc:
                self._close_planner()
                if attempt == 2:
                    raise
                log.warning("planning lost the broker (%s); connecting again", exc)
        raise AssertionError("unreachable")

    def _close_planner(self) -> None:
        planner, self._planner = self._planner, None
        if planner is not None:
            with contextlib.suppress(Exception):
                planner.client.abort()

    def stop(self) -> None:
        planner, self._planner = self._planner, None
        if planner is not None:
            planner.close()

    @_plain
    def initialOffset(self) -> dict[str, int]:
        o = self.options

        def work(planner: Planner) -> dict[str, int]:
            offsets = {}
            for queue in _streams(o):
                start = _start(planner, o, queue, o.starting[queue], planner.bounds(queue))
                offsets[queue] = UNRESOLVED if start is None else start
            return offsets

        return self._planning(work)

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxRecordsPerTrigger as ReadMaxRows; minOffsetsPerTrigger alone as ReadMinRows
        (with both, latestOffset takes the minimum from the options): any limit but
        ReadAllAvailable (Trigger.Once) makes latestOffset apply both."""
        o = self.options
        if o.max_records_per_trigger is not None:
            return ReadMaxRows(o.max_records_per_trigger)
        if o.min_records_per_trigger is not None:
            return ReadMinRows(o.min_records_per_trigger)
        return ReadAllAvailable()

    @_plain
    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._planning(
            lambda p: {q: self._end(p.bounds(q)) for q in _streams(self.options)}
        )

    @staticmethod
    def _end(bounds: Bounds) -> int:
        return UNRESOLVED if bounds.end is None else bounds.end

    @_plain
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        o = self.options
        ends: dict[str, int] = {}
        available: dict[str, int] = {}
        firsts: dict[str, int] = {}
        queues = _streams(o)
        for queue in sorted(set(start) - set(queues)):
            self._gone(queue)
        bounds_of = self._planning(lambda p: {q: p.bounds(q) for q in queues})
        for queue in queues:
            # A stream subscribePattern finds after the start: from its first offset.
            at = int(start.get(queue, UNRESOLVED))
            ends[queue] = at
            bounds = bounds_of[queue]
            end = self._end(bounds)
            if self.target is not None:
                target = self.target.get(queue, UNRESOLVED)
                end = target if target == UNRESOLVED else min(end, target)
            if end == UNRESOLVED:
                continue
            assert bounds.first is not None
            lo = bounds.first if at == UNRESOLVED else at
            if lo < bounds.first:
                data_loss(queue, lo, bounds.first, o.fail_on_data_loss)
                lo = bounds.first
            if end < lo:
                self._went_back(queue, lo, end)
                lo = bounds.first
            firsts[queue] = lo
            available[queue] = end - lo
        if isinstance(limit, ReadAllAvailable):
            take = available
        else:
            if self._delay(sum(available.values())):
                return {q: int(v) for q, v in start.items()}
            take = (
                allocate(available, limit.max_rows) if isinstance(limit, ReadMaxRows) else available
            )
        for queue, n in take.items():
            if n > 0:
                ends[queue] = firsts[queue] + n
        return ends

    def _delay(self, available: int) -> bool:
        """minOffsetsPerTrigger: hold the batch back while fewer offsets wait, unless
        maxTriggerDelay has passed since the last one (Kafka's rule; not under
        trigger(availableNow=True), which must end)."""
        least = self.options.min_records_per_trigger
        if least is None or self.target is not None or available == 0:
            return False
        now = self.clock()
        if self.last_trigger is None:
            self.last_trigger = now
        if (
            available >= least
            or (now - self.last_trigger) * 1000 >= self.options.max_trigger_delay_ms
        ):
            self.last_trigger = now
            return False
        return True

    def _went_back(self, queue: str, at: int, end: int) -> None:
        what = (
            f"queue {queue!r} ends at offset {end}, before offset {at} this query has read up "
            "to: the stream was deleted and declared again"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{what}; set failOnDataLoss to false to read the new stream from its start"
            )
        log.warning("%s; reading it from its first offset (failOnDataLoss=false)", what)

    def _gone(self, queue: str) -> None:
        ss = self.options.super_stream
        what = (
            f"stream {queue!r}, which subscribePattern matched, is gone (deleted)"
            if ss is None
            else f"stream {queue!r} is no longer a partition of super stream {ss!r}"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{what}: what it held beyond this query's offsets is lost; set "
                "failOnDataLoss to false to go on without it"
            )
        log.warning("%s; going on without it (failOnDataLoss=false)", what)

    @_plain
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch's ranges, from the oldest offset kept where retention went past
        the start, from the first where the stream was declared again."""
        o = self.options
        todo = {q: int(hi) for q, hi in end.items() if int(hi) != UNRESOLVED}
        if not todo:
            return []

        def work(planner: Planner) -> list[OffsetRange]:
            ranges = []  # afresh when _planning does the work again on a new connection
            for queue, hi in todo.items():
                lo = int(start.get(queue, UNRESOLVED))
                first = planner.first(queue)
                if first is None:
                    continue
                if hi < lo:  # declared again (latestOffset warned): the new stream's start
                    lo = first
                elif lo != UNRESOLVED and first > lo:
                    data_loss(queue, lo, first, o.fail_on_data_loss)
                ranges.append((queue, max(lo, first), hi))
            return _plan(planner, o, split(ranges, o.min_partitions, o.max_records_per_partition))

        return self._planning(work)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: a stream keeps its messages whoever has read them."""


class _RefusedStreamReader(DataSourceStreamReader):
    """A streaming read whose options were refused.

    pyspark's streaming runner loses an error raised while it creates the
    reader (its cleanup then fails on the reader it never got, and that error
    is the one reported), so the refusal is raised from the first call instead.
    """

    def __init__(self, error: OptionError) -> None:
        self.error = error

    @_plain
    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error

    @_plain
    def initialOffset(self) -> dict[str, int]:
        raise self.error

    @_plain
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        raise self.error

    @_plain
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error


class WarrenDataSource(DataSource):
    """``format("warren")``: stream queues of Warren (or RabbitMQ) as a table, and a sink."""

    @classmethod
    def name(cls) -> str:
        return "warren"

    @_plain
    def schema(self) -> str:
        return schema_ddl(include_headers(self.options))

    @_plain
    def reader(self, schema: StructType) -> DataSourceReader:
        options = SourceOptions.parse(self.options, streaming=False)
        _check_schema(schema, options)
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = SourceOptions.parse(self.options, streaming=True)
            _check_schema(schema, options)
        except OptionError as exc:
            return _RefusedStreamReader(exc)
        return StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from warren.spark.sink import batch_writer

        if overwrite:  # nothing to overwrite: messages are only ever added
            raise OptionError("mode", "the warren sink publishes messages: use mode('append')")
        return batch_writer(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from warren.spark.sink import stream_writer

        return stream_writer(dict(self.options), schema)
