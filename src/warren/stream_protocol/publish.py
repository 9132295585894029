"""The hot path's two commands: Publish (client to broker, a batch of
messages) and Deliver (broker to client, one chunk).

A decoded Publish keeps its messages as the one buffer they came in;
``scan`` walks it once and returns where each entry is (offsets into that
buffer), not an object per message, so the broker can copy the entries into
a chunk as they are (a v1 entry is already an osiris data entry). Deliver is
written as a prefix (``deliver_prefix``) followed by the chunk's bytes, which
the broker can send from the segment file without copying them.

    Publish v1: publisher id u8, count u32, then per message: publishing id
        u64, entry (simple, or a sub-entry batch)
    Publish v2: the same with a filter value (string, -1: none) between the
        publishing id and the entry, and simple entries only
    Deliver v1: subscription id u8, chunk; v2: subscription id u8, committed
        chunk id u64, chunk
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Self

from warren.stream_protocol.chunk import DEFAULT_MAX_UNCOMPRESSED, entry_at, simple_entry
from warren.stream_protocol.commands import Command
from warren.stream_protocol.constants import Compression, Key, ResponseCode
from warren.stream_protocol.wire import BytesLike, Reader, StreamProtocolError, put_string

__all__ = [
    "Deliver",
    "Publish",
    "PublishEntries",
    "PublishedMessage",
    "deliver_prefix",
]

_U8_U32: Final = struct.Struct(">BI")
_U64: Final = struct.Struct(">Q")
_I16: Final = struct.Struct(">h")
_ID_SIZE: Final = struct.Struct(">QI")
_SIMPLE_SIZE: Final = struct.Struct(">I")
_REFUSED: Final = ResponseCode.PRECONDITION_FAILED
_DELIVER_V1: Final = struct.Struct(">IHHB")
_DELIVER_V2: Final = struct.Struct(">IHHBQ")


@dataclass(frozen=True, slots=True)
class PublishedMessage:
    """One message of a Publish: ``entry`` is its osiris data entry (see
    chunk.simple_entry / chunk.sub_batch_entry); a filter value needs v2."""

    publishing_id: int
    entry: bytes
    filter_value: str | None = None

    @classmethod
    def simple(cls, publishing_id: int, body: BytesLike, filter_value: str | None = None) -> Self:
        return cls(publishing_id, simple_entry(body), filter_value)


@dataclass(slots=True)
class PublishEntries:
    """Where a Publish's entries are in its ``messages`` buffer: parallel
    lists, one item per entry. ``records`` counts a sub-entry batch's records,
    ``batches`` the sub-entry batches (0: every entry is simple), ``empty``
    those of no record (they hold no offset: not for a chunk record)."""

    publishing_ids: list[int]
    starts: list[int]
    ends: list[int]
    filter_values: list[str | None] | None
    records: int
    batches: int = 0
    empty: int = 0


#: Structs reading the publishing ids of a Publish of ``count`` simple entries
#: of one size: (count, size) -> Struct; bounded.
_UNIFORM: dict[tuple[int, int], struct.Struct] = {}


def _scan_uniform(buf: BytesLike, count: int, end: int) -> PublishEntries | None:
    """Publish v1's scan when every entry is simple and of one size (what a
    batch of like messages is): the size fields checked and the ids read at C
    speed (strided slices, one struct); None when the entries differ, for the
    loop to locate them one by one."""
    if not count:
        return None
    (size,) = _SIMPLE_SIZE.unpack_from(buf, 8)
    step = 12 + size
    if size >= 0x8000_0000 or step * count != end or count > 0xFFFF:
        return None
    field = _SIMPLE_SIZE.pack(size)
    for k in range(4):
        if buf[8 + k :: step] != field[k : k + 1] * count:
            return None
    reader = _UNIFORM.get((count, size))
    if reader is None:
        if len(_UNIFORM) >= 64:
            _UNIFORM.clear()
        reader = _UNIFORM[count, size] = struct.Struct(">" + f"Q{4 + size}x" * count)
    ids = list(reader.unpack_from(buf, 0))
    return PublishEntries(
        ids, list(range(8, end, step)), list(range(step, end + 1, step)), None, count
    )


@dataclass(slots=True)
class Publish(Command):
    """A batch of ``count`` messages, kept as the bytes they came in."""

    KEY = Key.PUBLISH
    VERSIONS = (1, 2)
    publisher_id: int
    count: int
    messages: BytesLike
    filtered: bool = False

    @property
    def version(self) -> int:
        return 2 if self.filtered else 1

    @classmethod
    def of(
        cls, publisher_id: int, messages: Sequence[PublishedMessage], *, v2: bool | None = None
    ) -> Self:
        """A Publish of these messages; v2 when one has a filter value (or when asked)."""
        filtered = any(m.filter_value is not None for m in messages) if v2 is None else v2
        out = bytearray()
        for m in messages:
            out += _U64.pack(m.publishing_id)
            if filtered:
                if m.filter_value is None:
                    out += _I16.pack(-1)
                else:
                    put_string(out, m.filter_value)
            elif m.filter_value is not None:
                raise StreamProtocolError("a filter value needs Publish v2")
            out += m.entry
        return cls(publisher_id, len(messages), bytes(out), filtered)

    def encode_body(self, out: bytearray) -> None:
        try:
            out += _U8_U32.pack(self.publisher_id, self.count)
        except struct.error as exc:
            raise StreamProtocolError(f"publish header out of range: {exc}") from None
        out += self.messages

    @classmethod
    def decode_body(cls, r: Reader, version: int) -> Self:
        publisher_id, count = r.u8(), r.u32()
        return cls(publisher_id, count, r.take(r.remaining()), version == 2)

    def scan(self, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> PublishEntries:
        """Locate every entry, checking the batch is exactly ``count`` well-formed
        messages (RabbitMQ takes sub-entry batches in v1 only). A v1 message
        with a simple entry, the common case, is one unpack."""
        buf, end = self.messages, len(self.messages)
        if self.count * 12 > end:
            raise StreamProtocolError(f"{self.count} messages cannot fit in {end} bytes")
        if self.filtered:
            return self._scan_v2(buf, end)
        uniform = _scan_uniform(buf, self.count, end)
        if uniform is not None:
            return uniform
        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        records = 0
        batches = 0
        empty = 0
        pos = 0
        unpack = _ID_SIZE.unpack_from
        for _ in range(self.count):
            if pos + 12 > end:
                raise StreamProtocolError("Publish ends inside a message")
            pid, size = unpack(buf, pos)
            start = pos + 8
            if size < 0x8000_0000:
                pos = start + 4 + size
                records += 1
            else:
                entry = entry_at(buf, start, end)
                if entry.compression is None or entry.compression > Compression.ZSTD:
                    raise StreamProtocolError("unknown sub-entry compression", _REFUSED)
                if not entry.records:
                    empty += 1
                if entry.uncompressed > max_uncompressed:
                    raise StreamProtocolError("sub-entry batch too large", _REFUSED)
                pos = entry.end
                records += entry.records
                batches += 1
            ids.append(pid)
            starts.append(start)
            ends.append(pos)
        if pos != end:
            raise StreamProtocolError(
                "Publish's messages overrun the frame"
                if pos > end
                else "bytes after a Publish's last message"
            )
        return PublishEntries(ids, starts, ends, None, records, batches, empty)

    def _scan_v2(self, buf: BytesLike, end: int) -> PublishEntries:
        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        filters: list[str | None] = []
        r = Reader(buf)
        for _ in range(self.count):
            ids.append(r.u64())
            if r.i16() == -1:
                filters.append(None)
            else:
                r.pos -= 2
                filters.append(r.string())
            entry = entry_at(buf, r.pos, end)
            if entry.compression is not None:
                raise StreamProtocolError("sub-entry batch in a Publish v2", _REFUSED)
            starts.append(entry.start)
            ends.append(entry.end)
            r.pos = entry.end
        if r.pos != end:
            raise StreamProtocolError("bytes after a Publish's last message")
        return PublishEntries(ids, starts, ends, filters, len(ids))

    def published(self) -> list[PublishedMessage]:
        """The messages as objects (tests and the slow path; the broker uses scan)."""
        e = self.scan()
        buf = bytes(self.messages)
        filters = e.filter_values or [None] * len(e.starts)
        return [
            PublishedMessage(pid, buf[s:t], f)
            for pid, s, t, f in zip(e.publishing_ids, e.starts, e.ends, filters, strict=True)
        ]


@dataclass(slots=True)
class Deliver(Command):
    """One chunk (chunk.Chunk.delivered()) for a subscription; v2 when the
    connection asked for the committed chunk id (ExchangeCommandVersions)."""

    KEY = Key.DELIVER
    VERSIONS = (1, 2)
    subscription_id: int
    chunk: BytesLike
    committed_offset: int | None = None

    @property
    def version(self) -> int:
        return 1 if self.committed_offset is None else 2

    def encode_body(self, out: bytearray) -> None:
        out += deliver_prefix(self.subscription_id, 0, self.committed_offset)[8:]
        out += self.chunk

    @classmethod
    def decode_body(cls, r: Reader, version: int) -> Self:
        subscription_id = r.u8()
        committed = r.u64() if version == 2 else None
        return cls(subscription_id, r.take(r.remaining()), committed)


def deliver_prefix(
    subscription_id: int, chunk_size: int, committed_offset: int | None = None
) -> bytes:
    """The bytes of a Deliver frame before its chunk of ``chunk_size`` bytes."""
    try:
        if committed_offset is None:
            return _DELIVER_V1.pack(chunk_size + 5, Key.DELIVER, 1, subscription_id)
        return _DELIVER_V2.pack(chunk_size + 13, Key.DELIVER, 2, subscription_id, committed_offset)
    except struct.error as exc:
        raise StreamProtocolError(f"deliver header out of range: {exc}") from None
