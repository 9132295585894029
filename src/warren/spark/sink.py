"""The sink: ``df.write.format("warren")`` and ``df.writeStream.format("warren")``.

Each task publishes its partition on its own connection with publisher
confirms and returns only when the broker has confirmed every message; a
nack or a lost connection fails the task. The deduplication key of a row is
``<write id>:<batch>:<partition>:<row>``: for a streaming query the write id
is the query's id (kept in its checkpoint) and the batch its batch id, so a
micro-batch replayed after a failure republishes the same keys, and a queue
declared with ``x-message-deduplication`` drops them. For a batch write the
write id is drawn once on the driver, so a retried task repeats its keys.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from warren.spark.options import SinkOptions
from warren.spark.publish import Encoder, Publisher, SinkPlan, check_exchange

__all__ = ["Published", "batch_writer", "stream_writer"]

log = logging.getLogger("warren.spark")

#: The local properties Spark's micro-batch execution sets on every task.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class Published(WriterCommitMessage):
    """What one task published (and the broker confirmed)."""

    partition: int
    count: int


def _plan(options: dict[str, str], schema: StructType) -> SinkPlan:
    sink = SinkOptions.parse(options)
    plan = SinkPlan.from_schema(sink, [(f.name, f.dataType.simpleString()) for f in schema.fields])
    check_exchange(sink)
    return plan


def _publish(
    plan: SinkPlan, write_id: str, batch: str, batches: Iterator[pa.RecordBatch]
) -> Published:
    """Publish one partition; the connection opens with the first row, not before."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    prefix = f"{write_id}:{batch}:{partition}:"
    publisher: Publisher | None = None
    row = 0
    try:
        for record_batch in batches:
            if record_batch.num_rows == 0:
                continue
            if publisher is None:
                publisher = Publisher(plan.options).open()
                encoder = Encoder(plan, prefix, publisher.frame_max)
            for frames, count in encoder.encode(record_batch, row):
                publisher.send(frames, count)
            row += record_batch.num_rows
        if publisher is not None:
            publisher.flush()
            publisher.close()
            publisher = None
    finally:
        if publisher is not None:
            publisher.abort()
    return Published(partition, row)


class BatchWriter(DataSourceArrowWriter):
    """``df.write``: one write id for the whole job, drawn on the driver."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return _publish(self.plan, self.write_id, "0", iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("warren sink: %d messages confirmed (write %s)", total, self.write_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Published messages cannot be taken back; a retry repeats their keys."""


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: keys from the query id and the micro-batch id."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if query is None or batch is None:
            raise RuntimeError(
                f"warren sink: Spark set no {QUERY_ID_PROPERTY} / {BATCH_ID_PROPERTY} on this "
                "task, so its messages would have no stable deduplication key"
            )
        return _publish(self.plan, query, batch, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("warren sink: batch %d, %d messages confirmed", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published messages cannot be taken back; the replay repeats their keys."""


def batch_writer(options: dict[str, str], schema: StructType) -> BatchWriter:
    return BatchWriter(_plan(options, schema))


def stream_writer(options: dict[str, str], schema: StructType) -> StreamWriter:
    return StreamWriter(_plan(options, schema))
