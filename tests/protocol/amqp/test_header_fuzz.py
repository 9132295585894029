"""Fuzzing message headers through the broker: "a confirmed message is never
lost, and one client's bad message never hurts another".

Warren validates a message's content-header properties once, at publish
(core/properties.py validate_properties, core/table.py validate_table). What it
confirms must then survive every later path: routing by every exchange type,
dead-lettering for every reason (rejected, expired, maxlen, delivery_limit),
expiry, delivery, reading back by the Python clients (pika, pamqp under
aio-pika, py-amqp) and recovery after a restart; what it refuses must never be
confirmed and never queued. Those later paths decode or edit the headers as
bytes, so a table that slips through validation hurts whoever touches the
message next, perhaps another client's connection.

The tables here are built by hand, byte by byte (``header_tables``), so they
hold what no client encoder writes: every tag RabbitMQ parses with edge
payloads (NaN and infinite floats, timestamps either side of the year 9999,
invalid UTF-8 in strings and keys, empty and duplicate keys, decimals of scale
255), the odd unknown tag or inconsistent length, nesting drawn around the
128-level limit and sizes up to about 60 KB.

Whether a publish should be accepted is decided by an oracle that shares no
code with Warren (``expected``): RabbitMQ's table grammar, parsed here with a
small iterative walker, plus the depth limit, plus the three client decoders
themselves. Grammar failures must close the connection with 501, other
refusals the channel with 406, and neither may be preceded by a basic.ack.

The generated keys avoid the few the broker reads or writes itself (x-death and
the x-first/last-death headers, x-delivery-count, CC, BCC, x-delay, and "route",
which the test puts in front for the headers exchange), so that the publisher's
entries can be compared byte for byte with what comes out. The dead-lettering
test separately puts a publisher's own x-death in front: RabbitMQ 3.x (and
Warren) count a matching entry on, editing only its count.

Replies are read with tests/rawamqp.py's frames (pamqp decodes every frame, so
it is one of the clients reading each delivery), keeping the content header's
raw bytes so the headers can be compared byte for byte with what was published,
and checking that no frame exceeds the negotiated frame_max (a content header
cannot be split, so a copy that grew past it could not be sent correctly).

In memory (issue 29): the broker is a tests/harness Harness and every
connection a MemoryAMQP, the same bytes fed to its AMQPConnection with no
socket; a restart is a new Harness on the same data dir. Delays and TTLs run
on a ManualClock that the test moves past them, where it used to poll the
queues on the wall clock until they had passed.

Tests: (a) publish through every exchange type, (b) dead-lettering for every
reason, including another client's publish pushing the message out of a
length-limited queue, (c) persistent messages across a restart, (d) Warren's
validator against the oracle, without a broker. Examples are derandomized, so
CI runs the same ones every time; minimal reproductions of the Warren bugs this
module found are pinned with @example (see the section before a).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import amqp.serialization
import pamqp.decode
import pika.data
import pytest
from harness import Harness, MemoryAMQP
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from pamqp import base, commands, header, heartbeat
from rawamqp import body_frame, method_frame, raw_frame

from examples import examples
from warren.core.clock import ManualClock
from warren.core.codec_errors import DecodeError, UnsafeValue
from warren.core.table import decode_table, validate_table

M = TypeVar("M", bound=base.Frame)

# A failing example is shrunk by running many more, each waiting out its deadlines:
# room for that, so that the report shows the minimal example.
pytestmark = pytest.mark.timeout(900)

# ---------------------------------------------------------------------------------------
# Constants: the limits under test, written out here rather than imported from Warren.
# ---------------------------------------------------------------------------------------

#: Deepest nesting of tables/arrays accepted, counting the headers table as level 1.
DEPTH_LIMIT = 128
#: The last second of the year 9999 (pika and py-amqp decode timestamps to datetime).
LAST_TIMESTAMP = 253_402_300_799
#: The largest table generated: a content header must fit one frame (frame_max
#: 131072) with the other properties, and dead-lettering adds some 300 bytes.
MAX_TABLE = 100_000

#: Keys the broker reads or writes: the generated headers never use them, so that
#: what the test adds in front (route, x-delay) and what Warren adds (dead-lettering,
#: delivery counts) can be told apart from the publisher's own entries.
DEATH_KEYS = (
    b"x-death",
    b"x-first-death-reason",
    b"x-first-death-queue",
    b"x-first-death-exchange",
    b"x-last-death-reason",
    b"x-last-death-queue",
    b"x-last-death-exchange",
)
WARREN_KEYS = frozenset((*DEATH_KEYS, b"x-delivery-count"))
RESERVED_KEYS = WARREN_KEYS | {b"route", b"x-delay", b"CC", b"BCC", b"x-match"}

# Property flags of class basic (AMQP 0-9-1, 4.2.6.1 / the basic class).
FLAG_HEADERS = 0x2000
FLAG_DELIVERY_MODE = 0x1000
FLAG_EXPIRATION = 0x0100
PROPERTY_TYPES = (  # (flag, type) in wire order
    (0x8000, "shortstr"),  # content-type
    (0x4000, "shortstr"),  # content-encoding
    (0x2000, "table"),  # headers
    (0x1000, "octet"),  # delivery-mode
    (0x0800, "octet"),  # priority
    (0x0400, "shortstr"),  # correlation-id
    (0x0200, "shortstr"),  # reply-to
    (0x0100, "shortstr"),  # expiration
    (0x0080, "shortstr"),  # message-id
    (0x0040, "timestamp"),  # timestamp
    (0x0020, "shortstr"),  # type
    (0x0010, "shortstr"),  # user-id
    (0x0008, "shortstr"),  # app-id
    (0x0004, "shortstr"),  # cluster-id
)

U32 = struct.Struct(">I")


def fuzz_settings(max_examples: int) -> settings:
    """Reproducible settings (CI runs the same examples every time)."""
    return settings(
        max_examples=examples(max_examples),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        derandomize=True,
    )


# ---------------------------------------------------------------------------------------
# The oracle: RabbitMQ's table grammar, the depth limit, and the three client decoders.
# ---------------------------------------------------------------------------------------

# rabbit_binary_parser:parse_field_value/1: the tags RabbitMQ parses and their sizes.
# (Erlang's binary match also fails on a NaN or infinite float; the oracle counts
# those as well formed but unsafe, as Warren does: channel, not connection, closed.)
_FIXED = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("s"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("l"): 8,
    ord("L"): 8,
    ord("f"): 4,
    ord("d"): 8,
    ord("D"): 5,
    ord("T"): 8,
    ord("V"): 0,
}
_LENGTH_PREFIXED = (ord("S"), ord("x"))
_CONTAINERS = (ord("F"), ord("A"))


def grammar_depth(raw: bytes) -> int | None:
    """The nesting depth of ``raw`` (a length-prefixed field table, the whole of it)
    when RabbitMQ's grammar parses it, else None. Iterative: no recursion however
    deep the input."""
    if len(raw) < 4 or U32.unpack_from(raw, 0)[0] != len(raw) - 4:
        return None
    stack = [(len(raw), True)]  # open containers: (end offset, is a table)
    pos, depth = 4, 1
    while stack:
        end, is_table = stack[-1]
        if pos == end:
            stack.pop()
            continue
        if is_table:
            pos += 1 + raw[pos]  # key length and key
            if pos >= end:  # no room for the value's tag
                return None
        tag = raw[pos]
        pos += 1
        if tag in _FIXED:
            pos += _FIXED[tag]
        elif tag in _LENGTH_PREFIXED or tag in _CONTAINERS:
            if pos + 4 > end:
                return None
            child_end = pos + 4 + U32.unpack_from(raw, pos)[0]
            if child_end > end:
                return None
            if tag in _CONTAINERS:
                stack.append((child_end, tag == ord("F")))
                depth = max(depth, len(stack))
                pos += 4
                continue
            pos = child_end
        else:
            return None
        if pos > end:
            return None
    return depth


def decode_pika(raw: bytes) -> Any:
    return pika.data.decode_table(raw, 0)[0]


def decode_pamqp(raw: bytes) -> Any:
    return pamqp.decode.field_table(raw)[1]


def decode_py_amqp(raw: bytes) -> Any:
    return amqp.serialization.loads("F", raw, 0)[0][0]


CLIENTS: dict[str, Callable[[bytes], Any]] = {
    "pika": decode_pika,
    "pamqp": decode_pamqp,
    "py-amqp": decode_py_amqp,
}


def client_errors(raw: bytes) -> dict[str, str]:
    """What each client library says about the table: '' when it decodes it."""
    seen: dict[str, str] = {}
    for name, decode in CLIENTS.items():
        try:
            decode(raw)
        except Exception as exc:  # RecursionError included: a failure like any other
            seen[name] = repr(exc)[:200]
        else:
            seen[name] = ""
    return seen


@dataclass
class Verdict:
    depth: int | None  # None: RabbitMQ's grammar does not parse the bytes
    clients: dict[str, str]  # per client library, its error ('' = decoded)

    @property
    def outcome(self) -> str:
        """'accepted', 'malformed' (501, connection closed) or 'unsafe' (406, channel)."""
        if self.depth is None:
            return "malformed"
        if self.depth > DEPTH_LIMIT or any(self.clients.values()):
            return "unsafe"
        return "accepted"


def expected(raw: bytes) -> Verdict:
    """The oracle's verdict on a headers table (no Warren code involved)."""
    depth = grammar_depth(raw)
    # Client decoders are only asked about grammatical bytes: on others some of
    # them misread lengths (pamqp can even loop), and the verdict is 501 anyway.
    return Verdict(depth, client_errors(raw) if depth is not None else {})


def expected_accepted(raw: bytes) -> bool:
    """Accepted iff RabbitMQ's grammar parses it, it nests at most DEPTH_LIMIT levels,
    and pika, pamqp and py-amqp all decode it."""
    return expected(raw).outcome == "accepted"


# ---------------------------------------------------------------------------------------
# Raw tables: helpers and the hypothesis strategy.
# ---------------------------------------------------------------------------------------


def entry(key: bytes, value: bytes) -> bytes:
    """One table entry: short-string key and tagged value."""
    return bytes([len(key)]) + key + value


def table(body: bytes, length_delta: int = 0) -> bytes:
    """A length-prefixed table around entries (a wrong length when ``length_delta``)."""
    return U32.pack(max(0, len(body) + length_delta)) + body


def wrap(value: bytes, kinds: str) -> bytes:
    """``value`` (a tagged value) wrapped in one container per letter of ``kinds``,
    outermost first: 'F' a table (the value under key 'n'), 'A' an array."""
    for kind in reversed(kinds):
        body = entry(b"n", value) if kind == "F" else value
        value = kind.encode() + U32.pack(len(body)) + body
    return value


def top_entries(raw: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, whole entry bytes) of a grammatical table's top level, in order."""
    out = []
    pos, end = 4, 4 + U32.unpack_from(raw, 0)[0]
    while pos < end:
        start = pos
        key = raw[pos + 1 : pos + 1 + raw[pos]]
        pos += 1 + raw[pos]
        tag = raw[pos]
        pos += 1
        if tag in _FIXED:
            pos += _FIXED[tag]
        else:
            pos += 4 + U32.unpack_from(raw, pos)[0]
        out.append((key, raw[start:pos]))
    return out


def array_items(value: bytes) -> list[bytes]:
    """The tagged items of a grammatical tagged array value (b'A' + length + items)."""
    out = []
    pos, end = 5, 5 + U32.unpack_from(value, 1)[0]
    while pos < end:
        start, tag = pos, value[pos]
        pos += 1 + (_FIXED[tag] if tag in _FIXED else 4 + U32.unpack_from(value, pos + 1)[0])
        out.append(value[start:pos])
    return out


def entry_value(whole_entry: bytes) -> bytes:
    """The tagged value of a table entry (key length, key, tagged value)."""
    return whole_entry[1 + whole_entry[0] :]


_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -math.nan)
_BAD_UTF8 = (b"\xff", b"\xfe\xff", b"a\xc3", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80")
_GOOD_TIMESTAMPS = (0, 1, 2**31 - 1, 2**32 - 1, 2**32, LAST_TIMESTAMP - 1, LAST_TIMESTAMP)
_BAD_TIMESTAMPS = (LAST_TIMESTAMP + 1, LAST_TIMESTAMP + 2, 2**63, 2**64 - 1)
_SCALAR_TAGS = "tbBsuIilLfdDSSSxTV"
_UNKNOWN_TAGS = (b"U", b"Z", b"\x00")
_FIXED_SIZES = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "L": 8}


def _float_bytes(draw: st.DrawFn, fmt: struct.Struct) -> bytes:
    kind = draw(st.sampled_from(["finite"] * 8 + ["bits", "special"]))
    if kind == "finite":
        finite = st.floats(width=32 if fmt is _F32 else 64, allow_nan=False, allow_infinity=False)
        return fmt.pack(draw(finite))
    if kind == "bits":
        return draw(st.binary(min_size=fmt.size, max_size=fmt.size))
    return fmt.pack(draw(st.sampled_from(_SPECIAL_FLOATS)))


def _text_bytes(draw: st.DrawFn, max_size: int = 20) -> bytes:
    kind = draw(st.sampled_from(["text"] * 6 + ["cc", "bad", "bytes"]))
    if kind == "text":
        return draw(st.text(max_size=max_size)).encode()
    if kind == "cc":  # Warren decodes the headers to look for CC/BCC when the bytes say "CC"
        return draw(st.sampled_from([b"CC", b"xCCy", b"BCC", b"\x02CC"]))
    if kind == "bad":  # invalid UTF-8 is fine in a long string
        return draw(st.sampled_from(_BAD_UTF8)) + draw(st.text(max_size=4)).encode()
    return draw(st.binary(max_size=max_size))


def _timestamp(draw: st.DrawFn) -> int:
    kind = draw(st.sampled_from(["edge"] * 4 + ["any"] * 2 + ["after", "huge"]))
    if kind == "edge":
        return draw(st.sampled_from(_GOOD_TIMESTAMPS))
    if kind == "any":
        return draw(st.integers(0, LAST_TIMESTAMP))
    if kind == "after":
        return draw(st.sampled_from(_BAD_TIMESTAMPS))
    return draw(st.integers(LAST_TIMESTAMP + 1, 2**64 - 1))


@st.composite
def keys(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["text"] * 10 + ["dup"] * 3 + ["empty", "long", "bad"]))
    if kind == "text":
        key = draw(st.text(min_size=1, max_size=12)).encode()  # at most 48 bytes
        return b"k" + key if key in RESERVED_KEYS else key
    if kind == "dup":  # a small pool: duplicate keys in one table are common
        return draw(st.sampled_from([b"a", b"dup", "\u00e9".encode()]))
    if kind == "empty":
        return b""
    if kind == "long":
        return b"L" * 255
    return draw(st.sampled_from(_BAD_UTF8))  # refused: pamqp cannot decode the key


@st.composite
def values(draw: st.DrawFn, depth: int = 1) -> bytes:
    """One tagged value as it would sit in a table at nesting level ``depth``."""
    corruption = draw(st.sampled_from(["none"] * 60 + ["unknown-tag", "bad-length"]))
    if corruption == "unknown-tag":
        return draw(st.sampled_from(_UNKNOWN_TAGS)) + draw(st.binary(max_size=8))
    tags = _SCALAR_TAGS + ("FA" if depth < 4 else "")
    tag = draw(st.sampled_from(tags))
    delta = 0
    if corruption == "bad-length":
        delta = draw(st.sampled_from([-4, -3, -2, -1, 1, 2, 3, 4]))
    if tag in _FIXED_SIZES:
        return tag.encode() + draw(
            st.binary(min_size=_FIXED_SIZES[tag], max_size=_FIXED_SIZES[tag])
        )
    if tag == "f":
        return b"f" + _float_bytes(draw, _F32)
    if tag == "d":
        return b"d" + _float_bytes(draw, _F64)
    if tag == "D":
        scale = draw(st.sampled_from([0, 1, 2, 28, 255]) | st.integers(0, 255))
        return b"D" + bytes([scale]) + draw(st.binary(min_size=4, max_size=4))
    if tag == "T":
        return b"T" + struct.pack(">Q", _timestamp(draw))
    if tag == "V":
        return b"V"
    if tag == "S":
        return b"S" + table(_text_bytes(draw), delta)
    if tag == "x":
        return b"x" + table(draw(st.binary(max_size=20)), delta)
    if tag == "F":
        body = b"".join(
            entry(draw(keys()), draw(values(depth + 1))) for _ in range(draw(st.integers(0, 4)))
        )
        return b"F" + table(body, delta)
    body = b"".join(draw(values(depth + 1)) for _ in range(draw(st.integers(0, 4))))
    return b"A" + table(body, delta)


@st.composite
def deep_chains(draw: st.DrawFn) -> bytes:
    """A value whose nesting, counted from the headers table (level 1), is drawn
    around the limit: 2..140 levels, often 127..130."""
    levels = draw(st.integers(2, 140) | st.sampled_from([127, 128, 129, 130]))
    shape = draw(st.sampled_from(["tables", "arrays", "alternating", "random"]))
    n = levels - 1  # containers below the headers table
    if shape == "tables":
        kinds = "F" * n
    elif shape == "arrays":
        kinds = "A" * n
    elif shape == "alternating":
        kinds = ("FA" * n)[:n]
    else:
        kinds = "".join(draw(st.lists(st.sampled_from("FA"), min_size=n, max_size=n)))
    leaf = draw(st.sampled_from([b"V", b"I\x00\x00\x00\x2a", b"S\x00\x00\x00\x01z"]))
    return wrap(leaf, kinds)


@st.composite
def big_values(draw: st.DrawFn) -> bytes:
    """Kilobytes of strings: one long string, or an array of many short ones."""
    size = draw(st.integers(1_000, 60_000))
    pattern = draw(st.binary(min_size=1, max_size=8) | st.just(b"abc"))
    payload = (pattern * (size // len(pattern) + 1))[:size]
    if draw(st.booleans()):
        return b"S" + table(payload)
    chunk = 100
    items = b"".join(b"S" + table(payload[i : i + chunk]) for i in range(0, len(payload), chunk))
    return b"A" + table(items)


@st.composite
def header_tables(draw: st.DrawFn, outer_mutation: bool = True) -> bytes:
    """The raw bytes of a headers field table (length prefix included).

    ``outer_mutation`` allows a wrong length on the table itself: only where the
    headers are the last property, so that the verdict is the table's own.
    """
    entries = [entry(draw(keys()), draw(values())) for _ in range(draw(st.integers(0, 6)))]
    extras = draw(st.sampled_from(["none"] * 5 + ["deep"] * 2 + ["big", "both"]))
    if extras in ("deep", "both"):
        at = draw(st.integers(0, len(entries)))
        entries.insert(at, entry(draw(keys()), draw(deep_chains())))
    if extras in ("big", "both"):
        at = draw(st.integers(0, len(entries)))
        entries.insert(at, entry(draw(keys()), draw(big_values())))
    delta = 0
    if outer_mutation and draw(st.integers(0, 29)) == 29:
        delta = draw(st.sampled_from([-3, -1, 1, 4]))
    raw = table(b"".join(entries), delta)
    assert len(raw) <= MAX_TABLE, len(raw)
    return raw


_INT_TAGS = {  # tag -> (struct format, size) of the integer field types
    "t": (">B", 1),
    "b": (">b", 1),
    "B": (">B", 1),
    "s": (">h", 2),
    "u": (">H", 2),
    "I": (">i", 4),
    "i": (">I", 4),
    "l": (">q", 8),
    "L": (">q", 8),
}
_COUNT_EDGES = (0, 1, 41, -1, 2**31 - 1, 2**63 - 2, 2**63 - 1, -(2**63))


@st.composite
def death_counts(draw: st.DrawFn) -> bytes | None:
    """The tagged ``count`` of a publisher's own x-death entry (None: no count)."""
    kind = draw(st.sampled_from(["long"] * 4 + ["int", "other", "absent"]))
    if kind == "long":
        return b"l" + struct.pack(">q", draw(st.sampled_from(_COUNT_EDGES)))
    if kind == "int":
        tag = draw(st.sampled_from(sorted(_INT_TAGS)))
        fmt, size = _INT_TAGS[tag]
        return tag.encode() + draw(st.binary(min_size=size, max_size=size))
    if kind == "other":  # not an integer: a float, a string, void
        return draw(st.sampled_from([b"d" + _F64.pack(2.5), b"S" + table(b"7"), b"V"]))
    return None


def count_after(count: bytes | None) -> int | None:
    """The count a matching x-death entry must have after one more death: the old
    integer plus one (None when that does not fit a long: not specified), and 1 when
    the entry had no integer count. A boolean is not one (clients decode it as
    true/false; RabbitMQ 3.x fails adding 1 to it): it starts again at 1, as core/
    dead_letter.py does."""
    if count is None or count[:1] == b"t" or chr(count[0]) not in _INT_TAGS:
        return 1
    fmt, _ = _INT_TAGS[chr(count[0])]
    (old,) = struct.unpack_from(fmt, count, 1)
    return old + 1 if old + 1 < 2**63 else None


@dataclass(frozen=True)
class PriorDeaths:
    """An x-death array of the publisher's own; the test names the queue and reason
    of the entry that matches the death to come (when there is one)."""

    before: tuple[bytes, ...]  # array items (tagged values) before the matching entry
    matching: bool
    count: bytes | None  # the matching entry's tagged count
    fields: bytes  # the matching entry's further entries
    after: tuple[bytes, ...]

    def items(self, queue: str, reason: str) -> tuple[list[bytes], int | None]:
        """The array's items, and the index of the matching entry (or None)."""
        if not self.matching:
            return [*self.before, *self.after], None
        body = entry(b"queue", b"S" + table(queue.encode())) + self.fields
        body += entry(b"reason", b"S" + table(reason.encode()))
        if self.count is not None:
            body = entry(b"count", self.count) + body
        return [*self.before, b"F" + table(body), *self.after], len(self.before)


@st.composite
def prior_deaths(draw: st.DrawFn) -> PriorDeaths:
    def other_items() -> tuple[bytes, ...]:
        return tuple(draw(st.lists(values(2), max_size=3)))

    fields = b""
    for _ in range(draw(st.integers(0, 3))):
        key = draw(keys())
        if key not in (b"count", b"queue", b"reason"):
            fields += entry(key, draw(values(3)))
    if draw(st.integers(0, 3)) == 3:
        # Many small integers: re-encoded (b -> I) they take 2.5 times the bytes.
        # Two sizes only: below and (once re-encoded) above frame_max; nothing to bisect.
        n = draw(st.sampled_from([1_000, 30_000]))
        fields += entry(b"pad", b"A" + table(b"b\x01" * n))
    return PriorDeaths(
        before=other_items(),
        matching=draw(st.integers(0, 3)) > 0,
        count=draw(death_counts()),
        fields=fields,
        after=other_items(),
    )


# ---------------------------------------------------------------------------------------
# Properties: built and taken apart without Warren's code.
# ---------------------------------------------------------------------------------------


def properties(
    headers: bytes, delivery_mode: int | None = None, expiration: str | None = None
) -> bytes:
    flags = FLAG_HEADERS
    out = headers
    if delivery_mode is not None:
        flags |= FLAG_DELIVERY_MODE
        out += bytes([delivery_mode])
    if expiration is not None:
        flags |= FLAG_EXPIRATION
        out += bytes([len(expiration)]) + expiration.encode()
    return struct.pack(">H", flags) + out


@dataclass
class Props:
    flags: int
    values: dict[int, bytes]  # flag -> raw value (tables with their length prefix)

    @property
    def headers(self) -> bytes:
        return self.values[FLAG_HEADERS]


def split_properties(raw: bytes) -> Props:
    """A property list (as the server sent it) split into its raw values."""
    (flags,) = struct.unpack_from(">H", raw, 0)
    assert not flags & 1, f"continued property flags: {raw[:2]!r}"
    pos, out = 2, {}
    for flag, kind in PROPERTY_TYPES:
        if not flags & flag:
            continue
        start = pos
        if kind == "shortstr":
            pos += 1 + raw[pos]
        elif kind == "octet":
            pos += 1
        elif kind == "table":
            pos += 4 + U32.unpack_from(raw, pos)[0]
        else:
            pos += 8
        out[flag] = raw[start:pos]
    assert pos == len(raw), f"property list of {len(raw)} bytes ends at {pos}"
    return Props(flags, out)


# ---------------------------------------------------------------------------------------
# The wire: a raw AMQP connection that keeps every content header's raw bytes.
# ---------------------------------------------------------------------------------------


@dataclass
class Delivery:
    tag: int
    redelivered: bool
    properties: bytes  # raw property list
    body: bytes


@dataclass
class Outcome:
    kind: str  # 'ack', 'nack', 'channel-close' or 'connection-close'
    code: int = 0
    text: str = ""

    @property
    def verdict(self) -> str:
        """In the oracle's terms."""
        if self.kind == "ack":
            return "accepted"
        if (self.kind, self.code) == ("connection-close", 501):
            return "malformed"
        if (self.kind, self.code) == ("channel-close", 406):
            return "unsafe"
        return f"{self.kind} {self.code}"


_peers = itertools.count(41000)


class Wire(MemoryAMQP):
    """One connection with channel 1 open; pamqp decodes every frame read (so it is
    one of the clients reading each message) and content headers are kept raw."""

    def __init__(self, harness: Harness) -> None:
        super().__init__(harness, ("127.0.0.1", next(_peers)), timeout=10.0)
        self.raw_properties: list[bytes] = []
        self.server_closed = False

    @classmethod
    def connect(cls, harness: Harness, confirm: bool = False) -> Wire:
        wire = cls(harness)
        try:
            wire.handshake(heartbeat=0)
            wire.open_channel(1)
            if confirm:
                wire.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        except BaseException:
            wire.close_socket()
            raise
        return wire

    def _take_frame(self) -> tuple[int, Any] | None:
        buf = self.buf
        got = super()._take_frame()
        if got is None or buf[:4] == b"AMQP":
            return got
        (size,) = U32.unpack_from(buf, 3)
        if self.tune is not None:
            # A content header cannot be split: the server must never send one
            # (or any frame) larger than the frame_max both sides agreed on.
            assert 8 + size <= self.tune.frame_max, (
                f"the server sent a {8 + size}-byte frame ({type(got[1]).__name__}) "
                f"over frame_max {self.tune.frame_max}"
            )
        if isinstance(got[1], header.ContentHeader):
            self.raw_properties.append(bytes(buf[7 + 12 : 7 + size]))
        return got

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """A clean connection.close where the server has not closed it, then the socket."""
        if not self.eof and not self.server_closed:
            with contextlib.suppress(AssertionError, OSError):
                self.close()
        self.close_socket()

    # -- requests ----------------------------------------------------------------------
    def call(self, method: base.Frame, reply: type[M]) -> M:
        self.send_method(1, method)
        return self.expect_method(reply, channel=1)

    def exchange(self, name: str, kind: str, arguments: dict[str, Any] | None = None) -> None:
        self.call(
            commands.Exchange.Declare(exchange=name, exchange_type=kind, arguments=arguments),
            commands.Exchange.DeclareOk,
        )

    def queue(self, name: str, durable: bool = False, **arguments: Any) -> None:
        self.call(
            commands.Queue.Declare(queue=name, durable=durable, arguments=arguments or None),
            commands.Queue.DeclareOk,
        )

    def bind(
        self, queue: str, exchange: str, key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        self.call(
            commands.Queue.Bind(
                queue=queue, exchange=exchange, routing_key=key, arguments=arguments
            ),
            commands.Queue.BindOk,
        )

    def delete_queue(self, name: str) -> None:
        self.call(commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)

    def delete_exchange(self, name: str) -> None:
        self.call(commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)

    def barrier(self) -> None:
        """A round trip: everything sent before has been handled."""
        self.call(
            commands.Exchange.Declare(exchange="amq.direct", exchange_type="direct", passive=True),
            commands.Exchange.DeclareOk,
        )

    def publish(self, exchange: str, key: str, props: bytes, body: bytes) -> None:
        self.send(
            method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=key))
            + raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + props)
            + body_frame(1, body)
        )

    def outcome(self) -> Outcome:
        """What the server answered a publish with (in confirm mode)."""
        while True:
            _, frame = self.read_frame()
            if isinstance(frame, heartbeat.Heartbeat):
                continue
            if isinstance(frame, commands.Basic.Ack):
                return Outcome("ack")
            if isinstance(frame, commands.Basic.Nack):
                return Outcome("nack")
            if isinstance(frame, commands.Channel.Close):
                self.send_method(1, commands.Channel.CloseOk())
                return Outcome("channel-close", frame.reply_code or 0, frame.reply_text)
            if isinstance(frame, commands.Connection.Close):
                self.send_method(0, commands.Connection.CloseOk())
                self.server_closed = True
                return Outcome("connection-close", frame.reply_code or 0, frame.reply_text)
            raise AssertionError(f"unexpected frame after a publish: {frame!r}")

    def get(self, queue: str, no_ack: bool = True) -> Delivery | None:
        self.send_method(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
        while True:
            _, frame = self.read_frame()
            if isinstance(frame, commands.Basic.GetEmpty):
                return None
            if isinstance(frame, commands.Basic.GetOk):
                _, body = self.expect_content()
                tag, redelivered = frame.delivery_tag or 0, bool(frame.redelivered)
                return Delivery(tag, redelivered, self.raw_properties[-1], body)
            if not isinstance(frame, heartbeat.Heartbeat):
                raise AssertionError(f"unexpected frame after basic.get: {frame!r}")

    def drain(self, queue: str) -> list[Delivery]:
        out = []
        while (d := self.get(queue)) is not None:
            out.append(d)
        return out


def uniq(prefix: str) -> str:
    return f"fuzz-{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------
# Checks shared by the tests.
# ---------------------------------------------------------------------------------------


def check_refusal(verdict: Verdict, got: Outcome) -> None:
    """The broker's answer matches the oracle's verdict; refusals say why."""
    note(f"oracle: depth={verdict.depth} clients={verdict.clients} -> {verdict.outcome}")
    event(f"oracle: {verdict.outcome}")
    note(f"broker: {got}")
    assert got.verdict == verdict.outcome, f"oracle says {verdict.outcome}, broker {got}"
    if got.verdict == "malformed":
        assert got.text.startswith("FRAME_ERROR - "), got.text
    elif got.verdict == "unsafe":
        assert got.text.startswith("PRECONDITION_FAILED - invalid message: "), got.text


def decoded(raw: bytes) -> dict[str, Any]:
    """The table as each client decodes it (all three must)."""
    out = {}
    for name, decode in CLIENTS.items():
        try:
            out[name] = decode(raw)
        except Exception as exc:
            raise AssertionError(f"{name} cannot decode a delivered table: {exc!r}") from exc
    return out


def without(table_: dict[Any, Any], drop: frozenset[bytes]) -> dict[Any, Any]:
    names = {k.decode() for k in drop} | set(drop)
    return {k: v for k, v in table_.items() if k not in names}


def check_same_headers(published: bytes, received: bytes, ignore: frozenset[bytes]) -> None:
    """The received table holds the published entries byte for byte, in order, apart
    from the ``ignore``d keys; each client decodes both the same way."""
    sent = [(k, e) for k, e in top_entries(published) if k not in ignore]
    got = [(k, e) for k, e in top_entries(received) if k not in ignore]
    assert got == sent, "the headers changed on the way"
    mine, theirs = decoded(published), decoded(received)
    for name in CLIENTS:
        assert without(theirs[name], ignore) == without(mine[name], ignore), name


def check_death(
    published: bytes,
    received: bytes,
    reason: str,
    queue: str,
    original_expiration: str | None = None,
    prior: tuple[list[bytes], int | None] = ([], None),
) -> None:
    """A dead-lettered copy: the publisher's entries as published, then one each of
    x-death and the x-first/last-death headers. x-death starts with this death
    (counted once; or the publisher's own entry for this queue and reason, counted
    once more), followed by the publisher's other x-death items byte for byte."""
    check_same_headers(published, received, WARREN_KEYS)
    added = [k for k, _ in top_entries(received) if k in WARREN_KEYS]
    assert sorted(k for k in added if k != b"x-delivery-count") == sorted(DEATH_KEYS), added
    assert len(set(added)) == len(added), f"a header Warren sets appears twice: {added}"
    old_items, match = prior
    (x_death,) = [entry_value(e) for k, e in top_entries(received) if k == b"x-death"]
    front, *rest = array_items(x_death)
    assert rest == [item for i, item in enumerate(old_items) if i != match], "x-death items"
    assert front[:1] == b"F", front[:1]
    for name, headers in decoded(received).items():
        death = CLIENTS[name](front[1:])
        if match is not None:
            # The publisher's entry for this queue and reason, counted once more.
            old = CLIENTS[name](old_items[match][1:])
            want_count = count_after(_entry_count(old_items[match]))
            assert without(death, frozenset({b"count"})) == without(old, frozenset({b"count"}))
            if want_count is not None:
                assert death["count"] == want_count, (name, death["count"], want_count)
            assert isinstance(death["count"], int), (name, death)
        else:
            want = {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "exchange": "",
                "routing-keys": [queue],
            }
            assert {k: death.get(k) for k in want} == want, f"{name} reads x-death {death}"
            assert death.get("original-expiration") == original_expiration, (name, death)
            assert "time" in death, (name, death)
        assert headers["x-death"][0] == death, name
        for prefix in ("x-first-death-", "x-last-death-"):
            seen = [headers[prefix + k] for k in ("reason", "queue", "exchange")]
            assert seen == [reason, queue, ""], (name, prefix, seen)


def _entry_count(item: bytes) -> bytes | None:
    """The tagged count of an x-death item (a tagged table), None when it has none."""
    entries = top_entries(item[1:])
    counts = [entry_value(e) for k, e in entries if k == b"count"]
    return counts[0] if counts else None


# ---------------------------------------------------------------------------------------
# Minimal reproductions of Warren bugs this module found (all fixed), run first by
# every test they apply to (@example), so that they stay fixed.
# ---------------------------------------------------------------------------------------

EMPTY_TABLE = table(b"")
#: 1. A non-UTF-8 key (unsafe, 406) before an unknown tag 'Z' (malformed: RabbitMQ
#: cannot parse the table): Warren reported the first problem it met, 406 instead of
#: 501; validate_table now reads the whole table before calling it unsafe.
UNSAFE_THEN_MALFORMED = table(entry(b"\xff", b"V") + entry(b"", b"Z"))
#: 2. The publisher's own x-death entry for the queue and reason, count 2^63-1:
#: counting it on overflowed the long Warren encodes (struct.error), so no copy was
#: made; the count now stays at the largest long.
LAST_COUNT = PriorDeaths((), True, b"l" + struct.pack(">q", 2**63 - 1), b"", ())
#: 3. Such an entry with 30,000 'b' integers (60 KB), and one with a non-UTF-8 string:
#: the entry was decoded and re-encoded (types changed, the copy grew past frame_max);
#: now only its count is rewritten.
GROWING_ENTRY = PriorDeaths((), True, None, entry(b"pad", b"A" + table(b"b\x01" * 30_000)), ())
RETYPED_ENTRY = PriorDeaths((), True, None, entry(b"s", b"S" + table(b"\xed\xa0\x80")), ())
#: 4. An x-death count that is a boolean: not an integer, so it starts again at 1
#: (the oracle counted true as 1 and wanted 2; RabbitMQ 3.x fails on it).
BOOLEAN_COUNT = PriorDeaths((), True, b"t\x01", b"", ())


# ---------------------------------------------------------------------------------------
# a. Publish through every exchange type.
# ---------------------------------------------------------------------------------------

ROUTING_KEY = "k.fuzz"
ROUTE_ENTRY = entry(b"route", b"S" + table(b"yes"))
EXCHANGE_KINDS = (
    # (kind, exchange arguments, binding key, binding arguments)
    ("direct", None, ROUTING_KEY, None),
    ("fanout", None, "", None),
    ("topic", None, "k.*", None),
    ("headers", None, "", {"x-match": "all", "route": "yes"}),
    ("x-consistent-hash", None, "1", None),
    ("x-delayed-message", {"x-delayed-type": "direct"}, ROUTING_KEY, None),
)


@dataclass
class Topology:
    broker: Harness
    exchanges: dict[str, str] = field(default_factory=dict)  # kind -> exchange
    queues: dict[str, str] = field(default_factory=dict)  # kind -> its queue


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    broker = Harness(tmp_path_factory.mktemp("fuzz-routing"), clock=ManualClock())
    try:
        topo = Topology(broker)
        with Wire.connect(broker) as wire:
            for kind, args, key, bind_args in EXCHANGE_KINDS:
                ex, q = uniq(kind), uniq(f"{kind}-q")
                wire.exchange(ex, kind, args)
                wire.queue(q)
                wire.bind(q, ex, key, bind_args)
                topo.exchanges[kind], topo.queues[kind] = ex, q
        yield topo
    finally:
        broker.stop()


@fuzz_settings(1200)
@example(raw=UNSAFE_THEN_MALFORMED, kind="direct", delay=0)  # Warren bug 1
@given(
    raw=header_tables(),
    kind=st.sampled_from([k for k, _, _, _ in EXCHANGE_KINDS]),
    delay=st.sampled_from([0, 0, 1, 5, 20]),
)
def test_publish_through_every_exchange_type(
    topology: Topology, raw: bytes, kind: str, delay: int
) -> None:
    event(f"exchange: {kind}")
    prefix = ROUTE_ENTRY
    if kind == "x-delayed-message":
        prefix += entry(b"x-delay", b"I" + struct.pack(">i", delay))
    # The fixed entries go in front; a wrong length on the generated table stays wrong.
    published = U32.pack(U32.unpack_from(raw, 0)[0] + len(prefix)) + prefix + raw[4:]
    verdict = expected(published)
    body = uuid.uuid4().bytes
    broker = topology.broker
    with Wire.connect(broker, confirm=True) as pub:
        pub.publish(topology.exchanges[kind], ROUTING_KEY, properties(published), body)
        got = pub.outcome()
    check_refusal(verdict, got)
    if kind == "x-delayed-message":
        # Its delay passes (accepted or not: a message wrongly held is seen here,
        # not by a later example).
        broker.advance(delay)

    with Wire.connect(broker) as admin:
        arrived: dict[str, list[Delivery]] = {}
        for k, q in topology.queues.items():
            arrived.setdefault(k, []).extend(admin.drain(q))
    note(f"arrived: { {k: len(v) for k, v in arrived.items()} }")
    everything = [(k, d) for k, ds in arrived.items() for d in ds]
    if got.kind != "ack":
        assert everything == [], "a refused message was queued"
        return
    assert [(k, d.body) for k, d in everything] == [(kind, body)], "not exactly once, or astray"
    received = split_properties(everything[0][1].properties)
    assert received.flags == FLAG_HEADERS
    check_same_headers(published, received.headers, frozenset({b"x-delay"}))
    if kind == "x-delayed-message":
        (x_delay,) = [e for k, e in top_entries(received.headers) if k == b"x-delay"]
        # A held message's x-delay becomes the negated delay, as the plugin writes it.
        assert x_delay == entry(b"x-delay", b"I" + struct.pack(">i", -delay)), x_delay


# ---------------------------------------------------------------------------------------
# b. Queue features and dead-lettering.
# ---------------------------------------------------------------------------------------

DL_MODES = (
    "reject",
    "nack",
    "expiration",
    "queue-ttl",
    "maxlen",
    "delivery-limit-0",
    "delivery-limit-1",
)
DL_REASONS = {
    "reject": "rejected",
    "nack": "rejected",
    "expiration": "expired",
    "queue-ttl": "expired",
    "maxlen": "maxlen",
    "delivery-limit-0": "delivery_limit",
    "delivery-limit-1": "delivery_limit",
}


@pytest.fixture(scope="module")
def dl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    broker = Harness(tmp_path_factory.mktemp("fuzz-dead-letter"), clock=ManualClock())
    try:
        yield broker
    finally:
        broker.stop()


def _queue_arguments(mode: str, dlx: str, ttl: int) -> dict[str, Any]:
    args: dict[str, Any] = {"x-dead-letter-exchange": dlx}
    if mode == "queue-ttl":
        args["x-message-ttl"] = ttl
    elif mode == "maxlen":
        args["x-max-length"] = 1  # overflow drop-head, the default
    elif mode.startswith("delivery-limit-"):
        args["x-delivery-limit"] = int(mode[-1])
    return args


def _return(admin: Wire, d: Delivery, mode: str) -> None:
    """Give back a delivery as ``mode`` says: dropped (reject/nack) or requeued."""
    if mode == "reject":
        admin.send_method(1, commands.Basic.Reject(delivery_tag=d.tag, requeue=False))
    elif mode == "nack":
        admin.send_method(1, commands.Basic.Nack(delivery_tag=d.tag, requeue=False))
    else:
        admin.send_method(1, commands.Basic.Nack(delivery_tag=d.tag, requeue=True))
    admin.barrier()


@fuzz_settings(800)
# Warren bug 2 (fixed): an x-death count of 2^63-1 could not be counted on. Rejected,
# the message stayed in its queue; over x-max-length, the innocent client's message was
# dead-lettered in its place; expiring on arrival, its publish was nacked.
@example(raw=EMPTY_TABLE, mode="reject", ttl=0, prior=LAST_COUNT)
@example(raw=EMPTY_TABLE, mode="maxlen", ttl=0, prior=LAST_COUNT)
@example(raw=EMPTY_TABLE, mode="queue-ttl", ttl=0, prior=LAST_COUNT)
# Warren bug 3 (fixed): the counted entry was decoded and re-encoded, not edited as
# bytes: its small ints grew (b -> I) until the copy's content header exceeded
# frame_max, and a non-UTF-8 long string became a byte array.
@example(raw=EMPTY_TABLE, mode="reject", ttl=0, prior=GROWING_ENTRY)
@example(raw=EMPTY_TABLE, mode="reject", ttl=0, prior=RETYPED_ENTRY)
@example(raw=EMPTY_TABLE, mode="reject", ttl=0, prior=BOOLEAN_COUNT)
@given(
    raw=header_tables(outer_mutation=False),
    mode=st.sampled_from(DL_MODES),
    ttl=st.sampled_from([0, 1, 20]),
    prior=st.sampled_from([False, False, True]).flatmap(
        lambda yes: prior_deaths() if yes else st.none()
    ),
)
def test_dead_lettering_keeps_headers(
    dl_broker: Harness, raw: bytes, mode: str, ttl: int, prior: PriorDeaths | None
) -> None:
    port = dl_broker  # where each Wire connects
    q, dlq, dlx = uniq("src"), uniq("dlq"), uniq("dlx")
    old_items: list[bytes] = []
    match = None
    published = raw
    if prior is not None:
        # The publisher's own x-death in front (RabbitMQ 3.x counts a matching entry on).
        old_items, match = prior.items(q, DL_REASONS[mode])
        x_death = entry(b"x-death", b"A" + table(b"".join(old_items)))
        published = table(x_death + raw[4:])
    event(f"mode: {mode}; prior x-death: {'none' if prior is None else match is not None}")
    verdict = expected(published)
    expiration = "0" if mode == "expiration" else None
    props = properties(published, expiration=expiration)
    body, innocent = b"generated-" + uuid.uuid4().bytes, b"innocent-" + uuid.uuid4().bytes
    with Wire.connect(port) as admin:
        admin.exchange(dlx, "fanout")
        admin.queue(dlq)
        admin.bind(dlq, dlx)
        admin.queue(q, **_queue_arguments(mode, dlx, ttl))
        try:
            with Wire.connect(port, confirm=True) as pub:
                pub.publish("", q, props, body)
                got = pub.outcome()
            check_refusal(verdict, got)
            accepted = got.kind == "ack"

            if mode == "maxlen":
                # Another client's ordinary message pushes the generated one out (drop-head,
                # dead-lettered on this publish's path): it must get its confirm and keep
                # its connection.
                with Wire.connect(port, confirm=True) as other:
                    other.publish("", q, properties(table(ROUTE_ENTRY)), innocent)
                    assert other.outcome() == Outcome("ack"), "the innocent publish failed"
                    other.barrier()
                    assert not other.server_closed and not other.eof
            elif accepted and mode in ("reject", "nack", "delivery-limit-0", "delivery-limit-1"):
                d = admin.get(q, no_ack=False)
                assert d is not None and d.body == body, "the confirmed message is not there"
                assert d.properties == props, "delivered properties differ from published"
                if mode == "delivery-limit-1":
                    _return(admin, d, mode)  # one requeue is allowed
                    d = admin.get(q, no_ack=False)
                    assert d is not None and d.body == body and d.redelivered
                    redelivered = split_properties(d.properties).headers
                    check_same_headers(published, redelivered, frozenset({b"x-delivery-count"}))
                    counts = [e for k, e in top_entries(redelivered) if k == b"x-delivery-count"]
                    assert counts == [entry(b"x-delivery-count", b"l" + struct.pack(">q", 1))]
                _return(admin, d, mode)

            # Expiry takes a timer: the clock moves past the TTL (expiration "0",
            # the queue's 0, 1 or 20 ms). The other deaths happen before the reply
            # that the test waited for; the loop settles all the same.
            if mode in ("expiration", "queue-ttl"):
                dl_broker.advance((ttl if mode == "queue-ttl" else 0) + 1)
            dl_broker.settle()
            dead = admin.get(dlq) if accepted else None
            rest_dlq, rest_q = admin.drain(dlq), admin.drain(q)
        finally:
            # On a fresh connection: a failed check may have left ``admin`` mid-message.
            with Wire.connect(port) as cleanup:
                for name in (q, dlq):
                    cleanup.delete_queue(name)
                cleanup.delete_exchange(dlx)
    names = {body: "generated", innocent: "innocent"}
    in_dlq = [names.get(d.body, repr(d.body)) for d in ([dead] if dead else []) + rest_dlq]
    in_q = [names.get(d.body, repr(d.body)) for d in rest_q]
    note(f"afterwards: dead-letter queue {in_dlq}, source queue {in_q}")
    # Every confirmed message in exactly one place; nothing of a refused one anywhere.
    assert (in_dlq, in_q) == (
        ["generated"] if accepted else [],
        ["innocent"] if mode == "maxlen" else [],
    ), f"dead-letter queue holds {in_dlq}, source queue {in_q} (generated {got.verdict})"
    if not accepted:
        return
    assert dead is not None
    copy = split_properties(dead.properties)
    assert copy.flags == FLAG_HEADERS, "expiration not removed from the copy"
    check_death(published, copy.headers, DL_REASONS[mode], q, expiration, (old_items, match))


# ---------------------------------------------------------------------------------------
# c. Persistent messages across a restart.
# ---------------------------------------------------------------------------------------


class Restartable:
    """A broker on a data directory that the test restarts."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.broker = Harness(data_dir)

    def restart(self) -> None:
        self.broker.stop()
        self.broker = Harness(self.data_dir)


@pytest.fixture(scope="module")
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restartable]:
    holder = Restartable(tmp_path_factory.mktemp("fuzz-restart"))
    try:
        yield holder
    finally:
        holder.broker.stop()


@fuzz_settings(80)
@given(raws=st.lists(header_tables(outer_mutation=False), min_size=1, max_size=10))
def test_persistent_headers_survive_a_restart(restartable: Restartable, raws: list[bytes]) -> None:
    q = uniq("durable")
    with Wire.connect(restartable.broker) as admin:
        admin.queue(q, durable=True)
    published: list[tuple[bytes, bytes]] = []  # (properties, body) of the confirmed ones
    pub: Wire | None = None
    try:
        for i, raw in enumerate(raws):
            verdict = expected(raw)
            props, body = properties(raw, delivery_mode=2), f"{i}-{uuid.uuid4()}".encode()
            if pub is None:
                pub = Wire.connect(restartable.broker, confirm=True)
            pub.publish("", q, props, body)
            got = pub.outcome()
            note(f"message {i}: {len(raw)} bytes")
            check_refusal(verdict, got)
            if got.kind == "ack":
                published.append((props, body))
            else:  # the channel or the connection is gone: start over on a new one
                pub.shutdown()
                pub = None
    finally:
        if pub is not None:
            pub.shutdown()

    restartable.restart()
    with Wire.connect(restartable.broker) as admin:
        recovered = admin.drain(q)
        admin.delete_queue(q)
    assert [d.body for d in recovered] == [b for _, b in published], "lost, added or reordered"
    for (props, _), d in zip(published, recovered, strict=True):
        assert d.properties == props, "properties changed across the restart"
        decoded(split_properties(d.properties).headers)


# ---------------------------------------------------------------------------------------
# d. Warren's validator against the oracle, without a broker.
# ---------------------------------------------------------------------------------------


@fuzz_settings(2000)
@example(raw=UNSAFE_THEN_MALFORMED)  # Warren bug 1
@given(raw=header_tables())
def test_validate_table_agrees_with_the_oracle(raw: bytes) -> None:
    verdict = expected(raw)
    try:
        end = validate_table(raw, 0, len(raw))
    except DecodeError as exc:
        seen, why = "malformed", repr(exc)
    except UnsafeValue as exc:
        seen, why = "unsafe", repr(exc)
    else:
        # A table shorter than its bytes leaves bytes after the last property: malformed.
        seen = "accepted" if end == len(raw) else "malformed"
        why = f"returned {end} for {len(raw)} bytes"
    note(f"oracle: depth={verdict.depth} clients={verdict.clients}; validate_table: {why}")
    event(f"oracle: {verdict.outcome}")
    assert seen == verdict.outcome
    with contextlib.suppress(DecodeError):  # and nothing else may escape
        decode_table(raw, 0)
