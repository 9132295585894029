"""A read task's hot loop: deliveries in received bytes to column lists.

A delivery is three frames: basic.deliver (delivery tag, exchange, routing
key), the content header (body size, properties with the x-stream-offset
header) and the body. :meth:`Scanner.feed` walks them in a buffer of many
deliveries and appends to :class:`Rows`; nothing is built per message but
the body slice and the values that vary.

Two paths, as in ``warren perf``'s consumers:

* the general one reads each delivery field by field; header values other
  than the stream's own are decoded with Warren's table codec;
* once a delivery has been read whole, its bytes become a template: every
  byte but the delivery tag, the x-stream-offset and x-stream-timestamp values
  and the body is fixed. Later deliveries of the same shape (same exchange,
  routing key, body size, properties) are recognised with four
  ``startswith`` checks and read with one ``unpack_from``; their exchange,
  routing key and other headers are the template's.
"""

from __future__ import annotations

import datetime
import json
import struct
from collections.abc import Callable
from typing import Any

from warren.amqp import spec
from warren.core.table import decode_field_value
from warren.spark.column_buffers import ColumnBuffers, native_scan
from warren.spark.connection import SourceError, data_loss

__all__ = ["Rows", "Scanner", "header_bytes", "header_text", "OFFSET_HEADER", "TIMESTAMP_HEADER"]

OFFSET_HEADER = "x-stream-offset"
TIMESTAMP_HEADER = "x-stream-timestamp"
#: The two headers as Warren and RabbitMQ write them: name, type 'l', 8 bytes.
_OFFSET_ENTRY = b"\x0fx-stream-offsetl"
_STAMP_ENTRY = b"\x12x-stream-timestampl"

_FRAME = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_DELIVER_ARGS = struct.Struct(">QBB")  # delivery tag, redelivered, exchange name length
_HEADER = struct.Struct(">3xI4xQH")  # from a header frame's start: size, body size, flags
_DELIVER = spec.BasicDeliver.INDEX
_CANCEL = spec.BasicCancel.INDEX
_CLOSES = (spec.ConnectionClose.INDEX, spec.ChannelClose.INDEX)
_F_HEADERS = 0x2000
_NOT_HEADERS = 0xDFFF


class Rows:
    """Deliveries gathered for one Arrow batch, column by column (columns.py builds it).

    ``extra`` lists ``(row, properties)`` for messages with properties other
    than headers: the flag word and those properties' bytes, without the
    headers table, so that equal ones (say delivery-mode 2 everywhere) are
    decoded once per batch.

    A batch's rows are in the lists (the Python paths) or in ``buffers`` (the
    C loop), never in both.
    """

    __slots__ = (
        "offsets",
        "stamps",
        "exchanges",
        "keys",
        "bodies",
        "header_counts",
        "header_keys",
        "header_values",
        "extra",
        "size",
        "buffers",
    )

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.exchanges: list[bytes] = []
        self.keys: list[bytes] = []
        self.bodies: list[bytes] = []
        self.header_counts: list[int] = []
        self.header_keys: list[str] = []
        #: str, or bytes when the scanner keeps header values raw (includeHeaders).
        self.header_values: list[Any] = []
        self.extra: list[tuple[int, bytes]] = []
        self.size = 0  # body bytes
        self.buffers = ColumnBuffers()

    def __len__(self) -> int:
        return len(self.offsets) + len(self.buffers)

    @property
    def last_offset(self) -> int:
        """The offset of the batch's last row (it has one)."""
        return self.buffers.last_offset if len(self.buffers) else self.offsets[-1]


def header_text(value: Any) -> str | None:
    """A header value as the string the ``headers`` map column holds: strings as they
    are, bytes as UTF-8 (invalid bytes replaced), tables and arrays as JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, list | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def header_bytes(value: Any) -> bytes | None:
    """A header value as the ``value`` of includeHeaders' (key, binary value) column:
    byte arrays and strings exactly as they came (a long string's raw bytes), anything
    else as the UTF-8 of its text in the ``headers`` map column."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    text = header_text(value)
    return None if text is None else text.encode()


class _Template:
    """The fixed bytes of one delivery shape, relative to the delivery's start.

    Holes are the bytes that may differ: 8-byte integers (delivery tag, offset,
    x-stream-timestamp), read with one ``unpack_from``, and up to two string
    header values of the template's length (say a per-message id), sliced.
    The fixed bytes between them are up to six segments, each checked with
    ``startswith``; as every length field is among them, a delivery that
    matches has the template's layout.
    """

    __slots__ = (
        "length",
        "s0",
        "s1",
        "s2",
        "s3",
        "s4",
        "s5",
        "r1",
        "r2",
        "r3",
        "r4",
        "r5",
        "few",
        "ints",
        "ints_at",
        "i_offset",
        "i_stamp",
        "texts",
        "body_at",
        "body_end",
        "exchange",
        "key",
        "header_keys",
        "header_values",
        "header_count",
        "extra",
    )

    def __init__(
        self,
        buf: bytes,
        start: int,
        length: int,
        ints: list[tuple[int, str]],
        texts: list[tuple[int, int, int]],
        body_at: int,
        body_len: int,
        exchange: bytes,
        key: bytes,
        header_keys: list[str],
        header_values: list[Any],
        extra: bytes | None,
    ) -> None:
        holes = sorted([(at, 8) for at, _ in ints] + [(at, size) for at, size, _ in texts])
        segments = []
        prev = start
        for at, size in holes:
            segments.append((prev, at))
            prev = at + size
        segments.append((prev, body_at))
        assert len(segments) <= 6, "at most five holes"
        self.few = len(segments) <= 4
        segments += [(body_at, body_at)] * (6 - len(segments))
        rel = [a - start for a, _ in segments]
        s = [buf[a:b] for a, b in segments]
        self.s0, self.s1, self.s2, self.s3, self.s4, self.s5 = s
        _, self.r1, self.r2, self.r3, self.r4, self.r5 = rel
        self.length = length
        ints = sorted(ints)
        gaps = [ints[i][0] - ints[i - 1][0] - 8 for i in range(1, len(ints))]
        self.ints = struct.Struct(">q" + "".join(f"{g}xq" for g in gaps))
        self.ints_at = ints[0][0] - start
        kinds = [kind for _, kind in ints]
        self.i_offset = kinds.index("offset")
        self.i_stamp = kinds.index("stamp") if "stamp" in kinds else -1
        self.texts = tuple((at - start, at - start + size, index) for at, size, index in texts)
        self.body_at = body_at - start
        self.body_end = self.body_at + body_len
        self.exchange = exchange
        self.key = key
        self.header_keys = header_keys
        self.header_values = header_values
        self.header_count = len(header_keys)
        self.extra = extra


class Scanner:
    """Reads deliveries of offsets ``[start, end)`` out of the bytes a consumer receives.

    ``feed`` takes a buffer and returns how much of it was used and how many
    bytes (from there) it needs before it can go on; full batches wait in
    ``ready``. ``done`` is set once offset ``end - 1`` (or a later one) was seen.
    """

    def __init__(
        self,
        queue: str,
        start: int,
        end: int,
        *,
        fail_on_data_loss: bool = True,
        batch_rows: int = 16384,
        batch_bytes: int = 16 << 20,
        first_retained: Callable[[], int | None] | None = None,
        raw_headers: bool = False,
        native: bool = True,
    ) -> None:
        self.queue = queue
        #: The C loop for deliveries of the common shape (None: Python only).
        self.native = native_scan if native else None
        #: Header values as bytes (includeHeaders=true) rather than text.
        self.raw_headers = raw_headers
        #: Asked when the first delivery comes after ``start``: the stream's first offset.
        #: Offsets can have no message (RabbitMQ gives one to each segment's tracking
        #: chunk), so a later first delivery is data loss only if retention is past start.
        self.first_retained = first_retained
        self.start = start
        self.last = end - 1
        self.fail_on_data_loss = fail_on_data_loss
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.rows = Rows()
        self.ready: list[Rows] = []
        self.done = False
        self.first_seen = -1
        self.tag = 0  # the last delivery tag
        self.unacked = 0
        self.template: _Template | None = None
        #: Deliveries read by the general path before the next template is made; doubles
        #: (to 4096) while templates go unused, so unique shapes cost no template each.
        self.backoff = 1
        self.until_template = 0
        self.template_hits = 0

    def take(self) -> list[Rows]:
        """Full batches, and at the end the last partial one."""
        if self.done and len(self.rows):
            self.ready.append(self.rows)
            self.rows = Rows()
        ready, self.ready = self.ready, []
        return ready

    def feed(self, buf: bytes) -> tuple[int, int]:
        """Read the complete deliveries at the start of ``buf``; returns (bytes used, bytes
        needed after them to make progress)."""
        n = len(buf)
        pos = 0
        need = 7
        start = self.start
        last = self.last
        rows = self.rows
        startswith = buf.startswith
        t = self.template
        raw = self.raw_headers
        count = 0
        hits = 0
        native = self.native
        while n - pos >= 7 and not self.done:
            if native is not None and not rows.offsets:
                pos, got, tag, status, offset = native(
                    buf,
                    pos,
                    start,
                    last,
                    self.first_seen >= 0,
                    self.batch_rows,
                    self.batch_bytes,
                    rows.buffers.columns,
                )
                if got:
                    count += got
                    self.tag = tag
                if status == 1:
                    self.done = True
                    break
                if status == 2:  # the first delivery: was data lost?
                    self._first(offset)
                    continue
                if status == 4:  # incomplete: the general path says how many bytes it needs
                    pass
                elif status == 3 or len(rows.buffers):  # full, or a Python path's row next
                    self.ready.append(rows)
                    rows = self.rows = Rows()
                    if status == 3:
                        continue
                if n - pos < 7:
                    break
            if (
                t is not None
                and n - pos >= t.length
                and startswith(t.s0, pos)
                and startswith(t.s1, pos + t.r1)
                and startswith(t.s2, pos + t.r2)
                and startswith(t.s3, pos + t.r3)
                and (t.few or (startswith(t.s4, pos + t.r4) and startswith(t.s5, pos + t.r5)))
                and buf[pos + t.length - 1] == 0xCE
            ):
                ints = t.ints.unpack_from(buf, pos + t.ints_at)
                offset = ints[t.i_offset]
                self.tag = ints[0]
                count += 1
                hits += 1
                if (offset < start or offset > last or self.first_seen < 0) and not self._admit(
                    offset
                ):
                    pos += t.length
                    continue
                rows.offsets.append(offset)
                rows.stamps.append(ints[t.i_stamp] if t.i_stamp >= 0 else None)
                rows.exchanges.append(t.exchange)
                rows.keys.append(t.key)
                rows.bodies.append(buf[pos + t.body_at : pos + t.body_end])
                rows.header_counts.append(t.header_count)
                if t.header_count:
                    values = rows.header_values
                    base = len(values)
                    values.extend(t.header_values)
                    rows.header_keys.extend(t.header_keys)
                    if raw:
                        for a, b, i in t.texts:
                            values[base + i] = buf[pos + a : pos + b]
                    else:
                        for a, b, i in t.texts:
                            values[base + i] = buf[pos + a : pos + b].decode("utf-8", "replace")
                if t.extra is not None:
                    rows.extra.append((len(rows.offsets) - 1, t.extra))
                rows.size += t.body_end - t.body_at
                pos += t.length
                if offset == last:
                    self.done = True
                elif len(rows.offsets) >= self.batch_rows or rows.size >= self.batch_bytes:
                    self.ready.append(rows)
                    rows = self.rows = Rows()
                continue
            used = self._general(buf, pos, n)
            if used < 0:
                need = -used
                break
            if used == 0:  # a frame that is not a delivery
                ftype, _ch, size = _FRAME.unpack_from(buf, pos)
                pos += 8 + size
                continue
            count += 1
            pos += used
            if self.template is not t:
                self.template_hits += hits
                hits = 0
                t = self.template
            rows = self.rows
        self.unacked += count
        self.template_hits += hits
        return pos, need

    def _admit(self, offset: int) -> bool:
        """The rarely taken checks: the first delivery (was data lost?), offsets before the
        range (a chunk's start), the end of the range."""
        if self.first_seen < 0:
            self._first(offset)
        if offset > self.last:
            self.done = True
            return False
        return offset >= self.start

    def _first(self, offset: int) -> None:
        """The first delivery: was data lost before it?"""
        self.first_seen = offset
        if offset > self.start:
            self._data_loss(offset)

    def _data_loss(self, first: int) -> None:
        if self.first_retained is not None:
            retained = self.first_retained()
            if retained is not None and retained <= self.start:
                return  # offsets without messages, not a loss
        data_loss(self.queue, self.start, first, self.fail_on_data_loss)

    def _frame_error(self, buf: bytes, pos: int, ftype: int, size: int) -> None:
        """Raise for a frame that ends the read; return for one to skip."""
        if ftype == 8:  # heartbeat
            return
        if ftype != 1:
            raise SourceError(f"unexpected frame type {ftype} while reading {self.queue!r}")
        idx = _U32.unpack_from(buf, pos + 7)[0]
        if idx in _CLOSES:
            method = spec.decode_method(buf[pos + 7 : pos + 7 + size])
            code = getattr(method, "reply_code", 0)
            text = getattr(method, "reply_text", "")
            raise SourceError(f"the broker closed the read of {self.queue!r}: {code} {text}")
        if idx == _CANCEL:
            raise SourceError(f"queue {self.queue!r} was deleted while being read")

    def _general(self, buf: bytes, pos: int, n: int) -> int:
        """Read one delivery at ``pos`` field by field. Returns its length; 0 for a frame
        that is no delivery (skipped by the caller); -k when k bytes from ``pos`` are
        needed first."""
        ftype, _ch, size = _FRAME.unpack_from(buf, pos)
        fend = pos + 7 + size  # the method frame's end octet
        if fend >= n:
            return -(fend + 1 - pos)
        if ftype != 1 or _U32.unpack_from(buf, pos + 7)[0] != _DELIVER:
            self._frame_error(buf, pos, ftype, size)
            return 0
        p = pos + 12 + buf[pos + 11]  # past the consumer tag
        dtag_at = p
        tag, _redelivered, ex_len = _DELIVER_ARGS.unpack_from(buf, p)
        ex_at = p + 10
        rk_at = ex_at + ex_len
        rk_end = rk_at + 1 + buf[rk_at]
        h = fend + 1  # the content header frame
        if n - h < 21:
            return -(h + 21 - pos)
        hsize, body_size, flags = _HEADER.unpack_from(buf, h)
        hend = h + 7 + hsize
        if hend >= n:
            return -(hend + 1 - pos)
        b = hend + 1  # the first body frame
        body_at = b + 7
        single = True
        if body_size == 0:
            body = b""
            after = b
        else:
            if n - b < 7:
                return -(b + 8 + body_size - pos)
            bsize = _U32.unpack_from(buf, b + 3)[0]
            if bsize == body_size:
                after = b + 8 + bsize
                if after > n:
                    return -(after - pos)
                body = buf[body_at : after - 1]
            else:
                single = False
                parts = []
                got = 0
                q = b
                while got < body_size:
                    if n - q < 7:
                        break
                    fsize = _U32.unpack_from(buf, q + 3)[0]
                    if q + 8 + fsize > n:
                        break
                    parts.append(buf[q + 7 : q + 7 + fsize])
                    got += fsize
                    q += 8 + fsize
                if got < body_size:
                    return -(q + 8 + (body_size - got) - pos)
                body = b"".join(parts)
                after = q
        self.tag = tag
        rows = self.rows
        # Properties: flags, content-type and -encoding (before the headers), headers.
        props = h + 19
        offset = -1
        stamp = None
        offset_at = stamp_at = 0
        hcount = 0
        texts: list[tuple[int, int, int]] = []
        extra = None
        plain = True  # the offset and time as Warren writes them: a template can follow
        if flags & _F_HEADERS:
            t = props + 2
            if flags & 0x8000:
                t += 1 + buf[t]
            if flags & 0x4000:
                t += 1 + buf[t]
            table_at = t
            tend = t + 4 + _U32.unpack_from(buf, t)[0]
            t += 4
            startswith = buf.startswith
            while t < tend:
                klen = buf[t]
                if klen == 15 and startswith(_OFFSET_ENTRY, t):
                    offset_at = t + 17
                    offset = _I64.unpack_from(buf, offset_at)[0]
                    t += 25
                    continue
                if klen == 18 and startswith(_STAMP_ENTRY, t):
                    stamp_at = t + 20
                    stamp = _I64.unpack_from(buf, stamp_at)[0]
                    t += 28
                    continue
                v = t + 1 + klen
                key = buf[t + 1 : v].decode("utf-8", "replace")
                if buf[v] == 0x53:  # 'S', a long string: the common case, inline
                    t = v + 5 + _U32.unpack_from(buf, v + 1)[0]
                    text: Any = buf[v + 5 : t]
                    if not self.raw_headers:
                        text = text.decode("utf-8", "replace")
                    texts.append((v + 5, t - v - 5, hcount))
                else:
                    value, t = decode_field_value(buf, v)
                    if key == OFFSET_HEADER and isinstance(value, int):
                        offset = value
                        plain = False
                        continue
                    if key == TIMESTAMP_HEADER:
                        plain = False
                        if isinstance(value, datetime.datetime):
                            stamp = int(value.timestamp() * 1000)
                        elif isinstance(value, int):
                            stamp = value
                        continue
                    text = header_bytes(value) if self.raw_headers else header_text(value)
                rows.header_keys.append(key)
                rows.header_values.append(text)
                hcount += 1
            if flags & _NOT_HEADERS:
                extra = buf[props:table_at] + buf[tend:hend]
        elif flags:
            extra = buf[props:hend]
        if offset < 0:
            from warren.spark.options import OptionError

            raise OptionError(
                "queue",
                f"queue {self.queue!r} delivered a message without x-stream-offset: "
                "it is not a stream queue",
            )
        length = after - pos
        self.until_template -= 1
        if (
            single
            and plain
            and offset_at
            and self.until_template <= 0
            and len(texts) <= (2 if stamp_at else 3)
        ):
            self._new_template(
                buf,
                pos,
                length,
                dtag_at,
                offset_at,
                stamp_at,
                texts,
                body_at if body_size else after,
                body_size,
                ex_at,
                rk_at,
                rk_end,
                hcount,
                extra,
            )
        if (offset < self.start or offset > self.last or self.first_seen < 0) and not self._admit(
            offset
        ):
            if hcount:
                del rows.header_keys[-hcount:]
                del rows.header_values[-hcount:]
            return length
        rows.offsets.append(offset)
        rows.stamps.append(stamp)
        rows.exchanges.append(buf[ex_at:rk_at])
        rows.keys.append(buf[rk_at + 1 : rk_end])
        rows.bodies.append(body)
        rows.header_counts.append(hcount)
        if extra is not None:
            rows.extra.append((len(rows.offsets) - 1, extra))
        rows.size += body_size
        if offset == self.last:
            self.done = True
        elif len(rows.offsets) >= self.batch_rows or rows.size >= self.batch_bytes:
            self.ready.append(rows)
            self.rows = Rows()
        return length

    def _new_template(
        self,
        buf: bytes,
        pos: int,
        length: int,
        dtag_at: int,
        offset_at: int,
        stamp_at: int,
        texts: list[tuple[int, int, int]],
        body_at: int,
        body_size: int,
        ex_at: int,
        rk_at: int,
        rk_end: int,
        hcount: int,
        extra: bytes | None,
    ) -> None:
        """Make this delivery the template, unless templates keep going unused."""
        if self.template is not None and self.template_hits < 2:
            self.backoff = min(self.backoff * 2, 4096)
        else:
            self.backoff = 1
        self.until_template = self.backoff
        self.template_hits = 0
        holes = [(dtag_at, "tag"), (offset_at, "offset")]
        if stamp_at:
            holes.append((stamp_at, "stamp"))
        rows = self.rows
        keys = rows.header_keys[len(rows.header_keys) - hcount :]
        values = rows.header_values[len(rows.header_values) - hcount :]
        self.template = _Template(
            buf,
            pos,
            length,
            holes,
            texts,
            body_at,
            body_size,
            buf[ex_at:rk_at],
            buf[rk_at + 1 : rk_end],
            keys,
            values,
            extra,
        )
