"""Column buffers the C read loop fills: the rows of one batch without a Python object each.

``warren._fastpath.scan_stream_deliveries`` (src/warren/_fastpath_spark.c)
appends each delivery of the stream's common shape (no properties but the
stream's own two headers) to eight bytearrays: offsets and timestamps as
int64, and body, exchange and routing key as Arrow's binary layout (data,
int32 end offsets). :meth:`ColumnBuffers.arrays` hands them to Arrow as they
are (``pa.Array.from_buffers``), so a batch costs a few C calls whatever its
length. spark/scan.py's Python loop is the reference and the fallback
(WARREN_PURE_PYTHON=1, no C build, other shapes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import warren

__all__ = ["ColumnBuffers", "native_scan"]

_native = warren.native_module("_fastpath")
#: The C read loop, or None (pure Python: scan.py's loop reads every delivery).
native_scan: Callable[..., tuple[int, int, int, int, int]] | None = (
    None if _native is None else getattr(_native, "scan_stream_deliveries", None)
)

_INT64 = pa.int64()
_I64 = struct.Struct("=q")  # native order, as the C loop writes
_BINARY = pa.binary()
_STRING = pa.string()


class ColumnBuffers:
    """The eight columns ``scan_stream_deliveries`` appends to (see the module docstring)."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        zero = bytes(4)  # Arrow's offsets start with 0
        self.columns: tuple[bytearray, ...] = (
            bytearray(),  # offsets, int64
            bytearray(),  # x-stream-timestamp, int64 ms
            bytearray(),  # body data
            bytearray(zero),  # body ends, int32
            bytearray(),  # exchange data
            bytearray(zero),  # exchange ends
            bytearray(),  # routing key data
            bytearray(zero),  # routing key ends
        )

    def __len__(self) -> int:
        return len(self.columns[0]) // 8

    @property
    def last_offset(self) -> int:
        """The last row's offset (there is one)."""
        last: int = _I64.unpack_from(self.columns[0], len(self.columns[0]) - 8)[0]
        return last

    @property
    def size(self) -> int:
        """Body bytes."""
        return len(self.columns[2])

    def arrays(self) -> dict[str, pa.Array]:
        """offsets (int64), stamps (int64 ms), bodies (binary), exchanges and keys (string,
        UTF-8 checked by the cast as the Python path's)."""
        c = self.columns
        n = len(self)

        def binary(data: bytearray, ends: bytearray) -> pa.Array:
            return pa.Array.from_buffers(_BINARY, n, [None, pa.py_buffer(ends), pa.py_buffer(data)])

        return {
            "offsets": pa.Array.from_buffers(_INT64, n, [None, pa.py_buffer(c[0])]),
            "stamps": pa.Array.from_buffers(_INT64, n, [None, pa.py_buffer(c[1])]),
            "bodies": binary(c[2], c[3]),
            "exchanges": binary(c[4], c[5]).cast(_STRING),
            "keys": binary(c[6], c[7]).cast(_STRING),
        }

    def to_lists(self) -> dict[str, list[Any]]:
        """The same as Python lists (tests compare them with the Python path's)."""
        return {name: array.to_pylist() for name, array in self.arrays().items()}
