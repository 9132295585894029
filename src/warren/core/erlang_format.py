"""Erlang term formatting, for the reply texts RabbitMQ builds with io_lib:format.

Many RabbitMQ error explanations embed Erlang terms: the octets of a bad frame
(``<<0,20,0,10>>``), a header value (``<<"any-of">>``), a reason tuple
(``{value_negative,-1}``). Clients log these texts verbatim, so Warren writes
them the same way: ``~w`` (:func:`binary_w`) never abbreviates; ``~p``
(:func:`binary_p`, :func:`string_p`, :func:`term_p`) shows printable binaries
and strings as quoted text and, like Erlang's pretty printer, wraps a numeric
binary that does not fit in the 80-column line it starts in.

Texts are built as bytes (RabbitMQ echoes a client's octets unchanged) and
returned decoded with ``surrogateescape``, which Warren's encoders reverse, so
the octets on the wire are exactly RabbitMQ's.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

__all__ = [
    "Binary",
    "binary_p",
    "binary_w",
    "field_type",
    "frame_octets",
    "last_column",
    "string_p",
    "tagged_tuple_p",
    "term_p",
]

#: Erlang's default line length for ``~p``.
LINE_LENGTH = 80

# Control characters Erlang counts as printable, and how io_lib writes them.
_ESCAPES = {
    0x08: b"\\b",
    0x09: b"\\t",
    0x0A: b"\\n",
    0x0B: b"\\v",
    0x0C: b"\\f",
    0x0D: b"\\r",
    0x1B: b"\\e",
    0x22: b'\\"',
    0x5C: b"\\\\",
}


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _printable(data: bytes) -> bool:
    """io_lib's printable_latin1_list: the test ``~p`` applies to strings and binaries."""
    return all(0x20 <= b <= 0x7E or b >= 0xA0 or b in _ESCAPES for b in data)


def _quoted(data: bytes) -> bytes:
    out = bytearray(b'"')
    for b in data:
        esc = _ESCAPES.get(b)
        if esc is None:
            out.append(b)
        else:
            out += esc
    out += b'"'
    return bytes(out)


def binary_w(data: bytes) -> str:
    """``~w`` of a binary: ``<<0,0,10,97>>``, always numeric, never wrapped."""
    return "<<" + ",".join(str(b) for b in data) + ">>"


def binary_p(data: bytes, column: int = 1, line_length: int = LINE_LENGTH) -> str:
    """``~p`` of a binary that starts at ``column`` (1-based) of the current line.

    Printable octets become ``<<"text">>``; others a numeric binary, wrapped as
    io_lib_pretty wraps one that does not fit on the rest of the line.
    """
    if not data:
        return "<<>>"
    if _printable(data):
        return _text(b"<<" + _quoted(data) + b">>")
    parts = [str(b) for b in data]
    total = 4 + sum(len(p) for p in parts) + len(parts) - 1
    if total < line_length - column:
        return "<<" + ",".join(parts) + ">>"
    width = max(8, min(line_length - column - 2, total - 4))
    indent = "\n" + " " * (column + 1)
    out = ["<<"]
    room = width
    for part in parts[:-1]:
        size = len(part) + 1
        if room - size < 0:
            out.append(indent)
            room = width - size
        else:
            room -= size
        out.append(part + ",")
    last = parts[-1]
    if len(last) > room:
        out.append(indent)
    out.append(last + ">>")
    return "".join(out)


def string_p(text: str | bytes) -> str:
    """``~p`` of an Erlang string (a list of octets): ``"text"``, or ``[1,2]``."""
    data = _raw(text)
    if _printable(data):
        return _text(_quoted(data))
    return "[" + ",".join(str(b) for b in data) + "]"


class Binary:
    """A byte array (type tag 'x') where it must not pass for a string: an
    argument RabbitMQ checks by type (``{unacceptable_type,binary}``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def field_type(value: Any) -> str:
    """RabbitMQ's name for the AMQP field type of a decoded table value.

    Decoded integers do not remember their wire type; they are named as every
    common client encodes them (32-bit ``signedint``, else ``long``). A
    declare's arguments do remember it: core/table_tags.py's wire_type.
    """
    if isinstance(value, Binary):
        return "binary"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str | bytes | bytearray | memoryview):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def _float_p(value: float) -> str:
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = f"{mantissa}e{int(exponent)}"
    return text


def term_p(value: Any) -> str:
    """``~p`` of a field value as RabbitMQ holds it (strings are binaries)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str | bytes | bytearray | memoryview):
        return binary_p(_raw(value) if isinstance(value, str) else bytes(value))
    if isinstance(value, float):
        return _float_p(value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return f"{{{scale},{unscaled}}}"
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    if value is None:
        return "undefined"
    if isinstance(value, dict):
        rows = [f"{{{binary_p(_raw(k))},{field_type(v)},{term_p(v)}}}" for k, v in value.items()]
        return "[" + ",".join(rows) + "]"
    if isinstance(value, list | tuple):
        return "[" + ",".join(f"{{{field_type(v)},{term_p(v)}}}" for v in value) + "]"
    return repr(value)


def tagged_tuple_p(
    tag: str, *elements: str, column: int = 1, line_length: int = LINE_LENGTH
) -> str:
    """``~p`` of ``{tag, E1, ...}`` whose elements are already-written atomic terms.

    On one line when it fits after ``column``, else broken as io_lib_pretty
    breaks a tagged tuple of atomic elements.
    """
    items = [tag, *elements]
    total = 1 + sum(len(i) for i in items) + len(items)
    if total < line_length - column or not elements:
        return "{" + ",".join(items) + "}"
    tag_ind = len(tag) + 2
    tag_col = column + tag_ind
    half = line_length // 2
    # io_lib_pretty's choice of indentation for the elements after the tag.
    if total + tag_col < line_length or tag_col < half:
        t_ind = -1
    elif tag_ind > 4 and (total + column + 4 <= line_length or column + 4 <= half):
        t_ind = 4
    else:
        t_ind = 1
    out = ["{", tag]
    if t_ind > 0 and tag_ind > t_ind:
        indent = " " * (column - 1 + t_ind)
        col0, col, width = column + t_ind, tag_col, 1 + len(tag)
    else:
        indent = " " * (column - 1 + tag_ind)
        col0, width = tag_col, 2 + len(tag)
        first = elements[0]
        depth = 1 if len(elements) == 1 else 0
        fits = len(first) < line_length - col0 - depth and width + len(first) + depth <= total
        out.append("," + first)
        used = len(first) if fits else line_length
        elements = elements[1:]
        col, width = col0 + used, width + used
    for i, element in enumerate(elements):
        last = i == len(elements) - 1
        size = 1 + len(element)
        if (not last and size + 1 < line_length - col and width + size + 1 <= total) or (
            last and size < line_length - col - 1 and width + size + 1 <= total
        ):
            out.append("," + element)
            col, width = col + size, width + size
        else:
            out.append(",\n" + indent + element)
            col, width = col0 + len(element), len(element)
    out.append("}")
    return "".join(out)


def frame_octets(frame_type: int, payload: bytes) -> str:
    """RabbitMQ's ``type ~p, ~s octets = ~p`` for a frame it could not take."""
    if len(payload) <= 16:
        prefix = f"type {frame_type}, all octets = "
    else:
        prefix = f"type {frame_type}, first 16 octets = "
        payload = payload[:16]
    return prefix + binary_p(payload, column=len(prefix) + 1)


def last_column(text: str) -> int:
    """The 1-based column after ``text``, as io_lib tracks it across newlines."""
    return len(text) - (text.rfind("\n") + 1) + 1
