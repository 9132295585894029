"""Dead-lettering: the message a queue republishes to its dead-letter exchange.

RabbitMQ records each death in the ``x-death`` header, an array of tables,
most recent first. A death for the same queue and reason as an earlier one
increments that entry's ``count`` and moves it to the front instead of adding
a new entry, so the array stays bounded however often a message cycles. The
``x-first-death-*`` headers are set once; the ``x-last-death-*`` headers
(RabbitMQ 3.13) follow every death. The per-message ``expiration`` is removed
(it would expire the copy at once) and kept as ``original-expiration``.
"""

from __future__ import annotations

import datetime
import logging
import struct
from typing import Any

from warren.core import properties as props
from warren.core.erlang_format import field_type
from warren.core.errors import PreconditionFailed
from warren.core.message import Message
from warren.core.table import decode_field_value
from warren.core.table_edit import array_items, edit_table, table_entries
from warren.core.table_encode import encode_field_value

log = logging.getLogger("warren.dead_letter")

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"

_UTC = datetime.UTC
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_INT64_MAX = (1 << 63) - 1


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return None


def header_keys(value: Any) -> list[str]:
    """CC/BCC values as routing keys: an array of strings (others are ignored, as in
    RabbitMQ, which only honours a longstr array)."""
    if not isinstance(value, list):
        return []
    return [k for k in (_text(v) for v in value) if k is not None]


def check_routing_headers(headers: dict[str, Any] | None) -> None:
    """Refuse a publish whose CC or BCC header is not an array, as RabbitMQ does."""
    if not headers:
        return
    for key in ("CC", "BCC"):
        value = headers.get(key, [])
        if not isinstance(value, list):
            raise PreconditionFailed(
                f'invalid message: {{unacceptable_type_in_header,"{key}",{field_type(value)}}}'
            )


def routing_keys(msg: Message) -> list[str]:
    """The keys a message was routed with: its routing key, then its CC header."""
    keys = [msg.routing_key]
    headers = msg.headers
    if headers and "CC" in headers:
        keys.extend(header_keys(headers["CC"]))
    return keys


def is_cycle(target_queue: str, headers: dict[str, Any] | None) -> bool:
    """Whether dead-lettering to ``target_queue`` would close a fully automatic cycle.

    As RabbitMQ: walking the deaths from the most recent, if the target queue is
    reached before any death with reason ``rejected``, nothing but expiry or limits
    moved the message around the loop, and it would circle for ever: drop it.
    A rejection anywhere on the loop means a client is involved, so it may go on.
    """
    if not headers:
        return False
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return False
    for death in deaths:
        if not isinstance(death, dict):
            continue
        if _text(death.get("reason")) == REJECTED:
            return False
        if _text(death.get("queue")) == target_queue:
            return True
    return False


def dead_letter(
    msg: Message,
    queue: str,
    reason: str,
    dlx: str,
    dl_routing_key: str | None,
    now_ms: int,
) -> tuple[Message, list[str]]:
    """The copy to publish to ``dlx``, and the routing keys to publish it with.

    Without a dead-letter routing key the copy goes out with the keys the original
    was routed with (routing key and CC); with one, it goes out with that key only
    and the CC header is dropped, as RabbitMQ does.

    Only x-death and the few headers RabbitMQ sets are decoded and written; the
    publisher's other headers and properties are copied as bytes, however deep.
    Raises DecodeError for properties that cannot be read (a record written
    before publish validated them): the caller keeps the original then.
    """
    raw = msg.properties
    offset = props.headers_offset(raw)
    entries: dict[str, tuple[int, int]] = {}
    if offset is not None:
        for key, start, end in table_entries(raw, offset)[0]:
            entries.setdefault(key, (start, end))
    keys = [msg.routing_key]
    cc = entries.get("CC")
    if cc is not None:
        keys.extend(header_keys(_entry_value(raw, cc)))
    expiration = props.peek_expiration(raw)
    death: dict[str, Any] = {
        "count": 1,
        "reason": reason,
        "queue": queue,
        "time": datetime.datetime.fromtimestamp(now_ms // 1000, _UTC),
        "exchange": msg.exchange,
        "routing-keys": keys,
    }
    if expiration is not None:
        death["original-expiration"] = expiration
    first: bytes | None = None
    others: list[bytes] = []
    old = entries.get("x-death")
    if old is not None and raw[old[0] + 1 + raw[old[0]]] == _ARRAY_TAG:
        value_at = old[0] + 1 + raw[old[0]]
        for start, end in array_items(raw, value_at + 1):
            if first is None and raw[start] == _TABLE_TAG:
                first = _counted_again(raw, start + 1, queue, reason)
                if first is not None:
                    continue
            others.append(raw[start:end])
    deaths = (first or _encode_death(death)) + b"".join(others)
    headers: dict[str, bytes] = {"x-death": b"A" + _U32.pack(len(deaths)) + deaths}
    if "x-first-death-reason" not in entries:
        headers["x-first-death-reason"] = _longstr(reason)
        headers["x-first-death-queue"] = _longstr(queue)
        headers["x-first-death-exchange"] = _longstr(msg.exchange)
    headers["x-last-death-reason"] = _longstr(reason)
    headers["x-last-death-queue"] = _longstr(queue)
    headers["x-last-death-exchange"] = _longstr(msg.exchange)
    remove: tuple[str, ...] = ()
    if dl_routing_key is not None:
        remove = ("CC",)
        keys = [dl_routing_key]
    copy_props = props.edit_properties(
        raw,
        set_headers=headers,
        remove_headers=remove,
        set_properties={"expiration": None} if expiration is not None else None,
    )
    return Message(dlx, keys[0], copy_props, msg.body, now_ms, msg.native), keys


_ARRAY_TAG = ord("A")
_TABLE_TAG = ord("F")


def _counted_again(raw: bytes, offset: int, queue: str, reason: str) -> bytes | None:
    """The x-death entry (a table at ``offset``) counted once more, if it is for
    ``queue`` and ``reason``: RabbitMQ keeps the first such death's details and
    only counts it, moving it to the front. Its other fields stay as bytes."""
    fields = {key: (start, end) for key, start, end in reversed(table_entries(raw, offset)[0])}
    for key, wanted in (("queue", queue), ("reason", reason)):
        span = fields.get(key)
        if span is None or _text(_entry_value(raw, span)) != wanted:
            return None
    count = _entry_value(raw, fields["count"]) if "count" in fields else 0
    if not isinstance(count, int) or isinstance(count, bool):
        count = 0
    counted = min(count + 1, _INT64_MAX)  # a count a publisher set may be the largest
    return b"F" + edit_table(raw, offset, {"count": b"l" + _I64.pack(counted)})


def _entry_value(raw: bytes, span: tuple[int, int]) -> Any:
    """The decoded value of a table entry given as its (start, end) byte range."""
    return decode_field_value(raw, span[0] + 1 + raw[span[0]])[0]


def _longstr(text: str) -> bytes:
    data = text.encode("utf-8", "surrogateescape")
    return b"S" + _U32.pack(len(data)) + data


def _encode_death(death: dict[str, Any]) -> bytes:
    """One x-death entry, keys sorted and the count a long, as RabbitMQ writes it."""
    parts: list[bytes] = []
    for key, value in sorted(death.items()):
        raw_key = key.encode()
        if key == "count" and isinstance(value, int) and not isinstance(value, bool):
            encoded = b"l" + _I64.pack(value)
        else:
            encoded = encode_field_value(value)
        parts.append(bytes((len(raw_key),)) + raw_key + encoded)
    body = b"".join(parts)
    return b"F" + _U32.pack(len(body)) + body
