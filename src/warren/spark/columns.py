"""The source's columns: the Spark schema and the Arrow batches the reader yields.

A task hands Spark ``pyarrow.RecordBatch`` objects rather than tuples: Spark
then skips its per-row conversion, and the reader builds each column from one
Python list with a single C call. Columns that no message of a batch sets
(most AMQP properties, usually) are all-null arrays that cost nothing per row.
"""

from __future__ import annotations

import struct
from itertools import accumulate
from typing import Any

import pyarrow as pa

from warren.spark.scan import Rows

__all__ = ["COLUMNS", "PROPERTY_COLUMNS", "arrow_schema", "schema_ddl", "to_batch"]

#: The AMQP properties that become columns, in flag-bit order after headers
#: (``timestamp`` is the ``timestamp`` column; cluster-id is deprecated).
PROPERTY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("delivery_mode", "int"),
    ("priority", "int"),
    ("correlation_id", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("message_id", "string"),
    ("type", "string"),
    ("user_id", "string"),
    ("app_id", "string"),
)

COLUMNS: tuple[tuple[str, str], ...] = (
    ("queue", "string"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("exchange", "string"),
    ("routing_key", "string"),
    ("body", "binary"),
    ("headers", "map<string,string>"),
    *PROPERTY_COLUMNS,
)


def schema_ddl() -> str:
    """The schema as Spark DDL (names quoted: ``offset`` and ``type`` are keywords)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)


_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,string>": pa.map_(pa.field("key", pa.string(), nullable=False), pa.string()),
}


def arrow_schema() -> pa.Schema:
    """What Spark expects from a Python data source for COLUMNS (pyspark's
    ``to_arrow_schema(schema, timezone="UTC")``; tests hold the two equal)."""
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS])


_SCHEMA = arrow_schema()
_MAP_TYPE = _ARROW_TYPES["map<string,string>"]
_STRING = pa.string()
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# Property flag bits (AMQP 0-9-1 basic class, most significant first).
_F_CONTENT_TYPE = 0x8000
_F_CONTENT_ENCODING = 0x4000
_F_HEADERS = 0x2000
_F_TIMESTAMP = 0x0040
#: (flag, column index in PROPERTY_COLUMNS or -1, AMQP type) after the headers.
_TAIL: tuple[tuple[int, int, str], ...] = (
    (0x1000, 2, "octet"),
    (0x0800, 3, "octet"),
    (0x0400, 4, "shortstr"),
    (0x0200, 5, "shortstr"),
    (0x0100, 6, "shortstr"),
    (0x0080, 7, "shortstr"),
    (_F_TIMESTAMP, -1, "timestamp"),
    (0x0020, 8, "shortstr"),
    (0x0010, 9, "shortstr"),
    (0x0008, 10, "shortstr"),
    (0x0004, -2, "shortstr"),  # cluster-id: skipped
)


def _shortstr(raw: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + raw[pos]
    return raw[pos + 1 : end].decode("utf-8", "replace"), end


def _properties(raw: bytes) -> tuple[list[Any], int | None]:
    """The property columns' values and the timestamp property (seconds) of one message,
    from its properties without the headers table (scan.Rows.extra)."""
    values: list[Any] = [None] * len(PROPERTY_COLUMNS)
    flags = _U16.unpack_from(raw, 0)[0]
    pos = 2
    if flags & _F_CONTENT_TYPE:
        values[0], pos = _shortstr(raw, pos)
    if flags & _F_CONTENT_ENCODING:
        values[1], pos = _shortstr(raw, pos)
    seconds = None
    for flag, column, kind in _TAIL:
        if not flags & flag:
            continue
        if kind == "octet":
            values[column] = raw[pos]
            pos += 1
        elif kind == "timestamp":
            seconds = _U64.unpack_from(raw, pos)[0]
            pos += 8
        else:
            text, pos = _shortstr(raw, pos)
            if column >= 0:
                values[column] = text
    return values, seconds


def _strings(raw: list[bytes]) -> pa.Array:
    """UTF-8 bytes to a string column in C (invalid UTF-8 raises, as it must not occur:
    AMQP short strings from Warren and RabbitMQ are validated UTF-8)."""
    return pa.array(raw, pa.binary()).cast(_STRING)


def to_batch(rows: Rows, queue: str) -> pa.RecordBatch:
    """One Arrow batch with the source's schema."""
    n = len(rows)
    stamps = rows.stamps
    prop_columns: list[list[Any] | None] = [None] * len(PROPERTY_COLUMNS)
    decoded: dict[bytes, tuple[list[Any], int | None]] = {}
    for row, raw in rows.extra:
        got = decoded.get(raw)
        if got is None:
            got = decoded[raw] = _properties(raw)
        values, seconds = got
        for i, value in enumerate(values):
            if value is not None:
                column = prop_columns[i]
                if column is None:
                    column = prop_columns[i] = [None] * n
                column[row] = value
        if stamps[row] is None and seconds is not None:
            stamps[row] = seconds * 1000
    counts = rows.header_counts
    if rows.header_keys:
        offsets = [0, *accumulate(counts)]
        headers = pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            pa.array(rows.header_keys, _STRING),
            pa.array(rows.header_values, _STRING),
            type=_MAP_TYPE,
        )
    else:
        headers = pa.MapArray.from_arrays(
            pa.array([0] * (n + 1), pa.int32()),
            pa.array([], _STRING),
            pa.array([], _STRING),
            type=_MAP_TYPE,
        )
    arrays: list[pa.Array] = [
        pa.repeat(pa.scalar(queue, _STRING), n),
        pa.array(rows.offsets, pa.int64()),
        pa.array(stamps, pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        _strings(rows.exchanges),
        _strings(rows.keys),
        pa.array(rows.bodies, pa.binary()),
        headers,
    ]
    for (_, kind), column in zip(PROPERTY_COLUMNS, prop_columns, strict=True):
        arrow_type = _ARROW_TYPES[kind]
        arrays.append(pa.nulls(n, arrow_type) if column is None else pa.array(column, arrow_type))
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMA)
