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

__all__ = [
    "COLUMNS",
    "KAFKA_HEADERS",
    "PROPERTY_COLUMNS",
    "arrow_schema",
    "columns",
    "schema_ddl",
    "to_batch",
]

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

#: includeHeaders=true: Kafka's lossless headers column.
KAFKA_HEADERS = "array<struct<key:string,value:binary>>"
#: Kafka's timestampType: 0 CreateTime (set by the publisher: the AMQP timestamp
#: property), 1 LogAppendTime (set by the broker: x-stream-timestamp).
CREATE_TIME, LOG_APPEND_TIME = 0, 1


def columns(include_headers: bool | None = None) -> tuple[tuple[str, str], ...]:
    """The columns for option includeHeaders: not given, the ``headers`` map; true,
    Kafka's array of (key, binary value); false, no ``headers`` column."""
    headers: tuple[tuple[str, str], ...] = (
        (("headers", "map<string,string>"),)
        if include_headers is None
        else ((("headers", KAFKA_HEADERS),) if include_headers else ())
    )
    return (
        ("queue", "string"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
        ("exchange", "string"),
        ("routing_key", "string"),
        ("body", "binary"),
        *headers,
        *PROPERTY_COLUMNS,
        ("amqp_timestamp", "timestamp"),
    )


COLUMNS = columns()


def schema_ddl(include_headers: bool | None = None) -> str:
    """The schema as Spark DDL (names quoted: ``offset`` and ``type`` are keywords)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in columns(include_headers))


_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,string>": pa.map_(pa.field("key", pa.string(), nullable=False), pa.string()),
    KAFKA_HEADERS: pa.list_(
        pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
    ),
}


def arrow_schema(include_headers: bool | None = None) -> pa.Schema:
    """What Spark expects from a Python data source for these columns (pyspark's
    ``to_arrow_schema(schema, timezone="UTC")``; tests hold the two equal)."""
    kinds = columns(include_headers)
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in kinds])


_SCHEMAS = {h: arrow_schema(h) for h in (None, True, False)}
_MAP_TYPE = _ARROW_TYPES["map<string,string>"]
_LIST_TYPE = _ARROW_TYPES[KAFKA_HEADERS]
_BINARY = pa.binary()
_TIMESTAMP = _ARROW_TYPES["timestamp"]
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


def _headers(rows: Rows, n: int, include_headers: bool | None) -> pa.Array:
    counts = [0, *accumulate(rows.header_counts)] if rows.header_keys else [0] * (n + 1)
    offsets = pa.array(counts, pa.int32())
    keys = pa.array(rows.header_keys, _STRING)
    if include_headers is None:
        values = pa.array(rows.header_values, _STRING)
        return pa.MapArray.from_arrays(offsets, keys, values, type=_MAP_TYPE)
    entries = pa.StructArray.from_arrays(
        [keys, pa.array(rows.header_values, _BINARY)], names=["key", "value"]
    )
    return pa.ListArray.from_arrays(offsets, entries, type=_LIST_TYPE)


def to_batch(rows: Rows, queue: str, include_headers: bool | None = None) -> pa.RecordBatch:
    """One Arrow batch with the source's schema for option includeHeaders (the scanner
    gathered header values as bytes when it is true)."""
    if len(rows.buffers):
        return _from_buffers(rows, queue, include_headers)
    n = len(rows)
    stamps = rows.stamps
    kinds: list[int | None] = [None if s is None else LOG_APPEND_TIME for s in stamps]
    published: list[int | None] | None = None
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
        if seconds is not None:
            if published is None:
                published = [None] * n
            published[row] = seconds * 1000
            if stamps[row] is None:
                stamps[row] = seconds * 1000
                kinds[row] = CREATE_TIME
    arrays: list[pa.Array] = [
        pa.repeat(pa.scalar(queue, _STRING), n),
        pa.array(rows.offsets, pa.int64()),
        _times(stamps),
        pa.array(kinds, pa.int32()),
        _strings(rows.exchanges),
        _strings(rows.keys),
        pa.array(rows.bodies, pa.binary()),
    ]
    if include_headers is not False:
        arrays.append(_headers(rows, n, include_headers))
    for (_, kind), column in zip(PROPERTY_COLUMNS, prop_columns, strict=True):
        arrow_type = _ARROW_TYPES[kind]
        arrays.append(pa.nulls(n, arrow_type) if column is None else pa.array(column, arrow_type))
    arrays.append(pa.nulls(n, _TIMESTAMP) if published is None else _times(published))
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMAS[include_headers])


def _times(ms: list[int | None] | pa.Array) -> pa.Array:
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(_TIMESTAMP)


def _from_buffers(rows: Rows, queue: str, include_headers: bool | None) -> pa.RecordBatch:
    """A batch the C loop read: its columns are the buffers as they are; the rows have
    no header but the stream's own and no other property (what it takes)."""
    n = len(rows.buffers)
    got = rows.buffers.arrays()
    arrays: list[pa.Array] = [
        pa.repeat(pa.scalar(queue, _STRING), n),
        got["offsets"],
        _times(got["stamps"]),
        pa.repeat(pa.scalar(LOG_APPEND_TIME, pa.int32()), n),
        got["exchanges"],
        got["keys"],
        got["bodies"],
    ]
    if include_headers is not False:
        offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))])
        keys = pa.array([], _STRING)
        if include_headers is None:
            arrays.append(
                pa.MapArray.from_arrays(offsets, keys, pa.array([], _STRING), type=_MAP_TYPE)
            )
        else:
            entries = pa.StructArray.from_arrays(
                [keys, pa.array([], _BINARY)], names=["key", "value"]
            )
            arrays.append(pa.ListArray.from_arrays(offsets, entries, type=_LIST_TYPE))
    for _, kind in PROPERTY_COLUMNS:
        arrays.append(pa.nulls(n, _ARROW_TYPES[kind]))
    arrays.append(pa.nulls(n, _TIMESTAMP))
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMAS[include_headers])
