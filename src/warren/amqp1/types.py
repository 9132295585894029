"""AMQP 1.0 values as Python values (OASIS AMQP 1.0, part 1, "Types").

Most AMQP 1.0 types decode to the Python type a program expects: null to
None, boolean to bool, string to str, binary to bytes, uuid to uuid.UUID,
double to float, long to int, list to list, map to dict. Where two AMQP types
share a Python type and the difference is visible on the wire (a symbol is
not a string; a ulong is not a long; an application property typed uint must
come back out as a uint), the value is one of the thin subclasses here, which
compare and hash as their base type. Encoding follows the same rule the other
way: a plain int is a long, a plain float a double, a plain str a string.

The codec (codec.py) decodes to and encodes from these; nothing else in the
package picks wire types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Described",
    "Float",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
]


class Symbol(str):
    """A symbolic value (ASCII): performative fields, annotation keys, error conditions."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    """A single Unicode character (UTF-32BE on the wire)."""

    __slots__ = ()


class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class Byte(int):
    __slots__ = ()


class Short(int):
    __slots__ = ()


class Int(int):
    __slots__ = ()


class Long(int):
    """An explicit long; a plain int encodes as one too."""

    __slots__ = ()


class Timestamp(int):
    """Milliseconds since the Unix epoch (a signed 64-bit value)."""

    __slots__ = ()


class Float(float):
    """A 32-bit IEEE 754 float; a plain float is a double."""

    __slots__ = ()


class Decimal32(bytes):
    """IEEE 754 decimal32, kept as its 4 bytes (nothing here computes with it)."""

    __slots__ = ()


class Decimal64(bytes):
    """IEEE 754 decimal64, its 8 bytes."""

    __slots__ = ()


class Decimal128(bytes):
    """IEEE 754 decimal128, its 16 bytes."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Described:
    """A described value whose descriptor the codec does not know (an extension
    type, a filter): the descriptor (a ULong code or a Symbol name) and the value."""

    descriptor: Any
    value: Any


@dataclass(frozen=True, slots=True)
class Array:
    """An AMQP array: elements of one type. ``code`` is the element constructor's
    format code (codec.py names them), so an array of uints stays one."""

    code: int
    items: tuple[Any, ...]
