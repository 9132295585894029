"""AMQP 1.0 source and target addresses, as RabbitMQ 4 reads them.

Pure functions: an address string (or None) in, an :class:`Address` or an
:class:`AddressError` carrying the AMQP error condition out. Whether the
exchange or queue exists is for the caller (amqp:not-found).

RabbitMQ 4's "v2" addresses, which clients should use:

- target ``/exchanges/:exchange/:routing-key`` and ``/exchanges/:exchange``
  (routing key ""); the default exchange ("" or ``amq.default``) is refused:
  ``/queues/:queue`` is its form;
- target and source ``/queues/:queue``;
- a null target: the anonymous terminus (each message's ``to`` field holds one
  of the three forms above: :func:`parse_to`).

Each segment is percent-encoded (RFC 3986): ``%XX`` is a byte, other
characters must be RFC 3986's unreserved or reserved ones (a space, a
non-ASCII character or a stray ``%`` makes the address bad), and the bytes
must be UTF-8. An exchange segment and a routing key cannot hold a raw ``/``
(``%2F``); a queue name, everything after ``/queues/``, can.

RabbitMQ 3.x's rabbitmq_amqp1_0 plugin's "v1" forms, still taken by RabbitMQ 4
(deprecated) for any address that does not start with ``/exchanges/`` or
``/queues/``: ``/exchange/X/RK``, ``/exchange/X``, ``/topic/RK`` (amq.topic),
``/amq/queue/Q`` (must exist), ``/queue/Q`` and a bare ``Q`` (declared when
absent), and the target ``/queue`` (the default exchange). Only ``%2F`` is
decoded in them (to ``/``). A v1 target without a routing key routes by each
message's ``subject`` (routing_key None); a v1 source on an exchange means a
temporary queue bound to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEFAULT_EXCHANGE",
    "INVALID_FIELD",
    "PRECONDITION_FAILED",
    "Address",
    "AddressError",
    "parse_source",
    "parse_target",
    "parse_to",
    "queue_address",
    "exchange_address",
]

#: The AMQP error conditions RabbitMQ 4 answers a bad address with: a link's
#: (attach refused) and a message's ``to`` on the anonymous terminus.
INVALID_FIELD: Final = "amqp:invalid-field"
PRECONDITION_FAILED: Final = "amqp:precondition-failed"

#: The default exchange's name ("") and the name v2 also refuses for it.
DEFAULT_EXCHANGE: Final = ""
_DEFAULT_ALIAS: Final = "amq.default"

_EXCHANGES: Final = "/exchanges/"
_QUEUES: Final = "/queues/"

#: RFC 3986's unreserved and reserved characters: what may stand unencoded.
_URI_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;="
)
_HEX: Final = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class Address:
    """Where a link sends to or consumes from.

    ``routing_key``: for an exchange, the key to publish with (v2: "" when the
    address has none) or, for a source, to bind a temporary queue with; None on a
    v1 target means each message's ``subject`` (v1's target ``/queue`` is the
    default exchange itself, name "", keyed so). For a queue, None: a target
    publishes to the default exchange with the queue's name as key.
    ``declare``: v1's ``/queue/Q`` and bare ``Q`` declare the queue when it does not
    exist (RabbitMQ 3.x did); every other queue must exist.
    """

    kind: Literal["exchange", "queue"]
    name: str
    routing_key: str | None = None
    v1: bool = False
    declare: bool = False


class AddressError(ValueError):
    """A bad address: ``condition`` is the AMQP error condition to answer with."""

    def __init__(self, description: str, condition: str = INVALID_FIELD) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def parse_target(address: str | None) -> Address | None:
    """A link's target address; None for the null address (the anonymous terminus:
    each message's ``to`` is parsed with :func:`parse_to`)."""
    if address is None:
        return None
    if address.startswith((_EXCHANGES, _QUEUES)):
        return _parse_v2_target(address, INVALID_FIELD)
    return _parse_v1(address, target=True)


def parse_to(to: str | None) -> Address:
    """A message's ``to`` on the anonymous terminus: a v2 target address only;
    RabbitMQ 4 answers a missing or bad one with amqp:precondition-failed."""
    if to is None:
        raise AddressError(
            "anonymous terminus requires 'to' address to be set", PRECONDITION_FAILED
        )
    return _parse_v2_target(to, PRECONDITION_FAILED)


def parse_source(address: str | None) -> Address:
    """A link's source address: ``/queues/:queue`` (v2), else a v1 form."""
    if address is None:
        raise AddressError("source address required")
    if address.startswith(_QUEUES):
        # As RabbitMQ 4: the rest is the name, "" included (not found, later).
        return Address("queue", _unquote(address[len(_QUEUES) :], address, INVALID_FIELD))
    return _parse_v1(address, target=False)


def exchange_address(exchange: str, routing_key: str | None = None) -> str:
    """The v2 address of ``exchange`` (and ``routing_key``), percent-encoded."""
    if routing_key is None:
        return _EXCHANGES + _quote(exchange)
    return f"{_EXCHANGES}{_quote(exchange)}/{_quote(routing_key)}"


def queue_address(queue: str) -> str:
    """The v2 address of ``queue``, percent-encoded (a generated queue's address)."""
    return _QUEUES + _quote(queue)


# -- v2 ---------------------------------------------------------------------------------
def _parse_v2_target(address: str, condition: str) -> Address:
    if address.startswith(_EXCHANGES):
        segments = address[len(_EXCHANGES) :].split("/")
        if segments[0] in (DEFAULT_EXCHANGE, _DEFAULT_ALIAS) or len(segments) > 2:
            raise _bad(address, condition)
        exchange = _unquote(segments[0], address, condition)
        if exchange == _DEFAULT_ALIAS:  # encoded, still the default exchange's alias
            raise _bad(address, condition)
        key = _unquote(segments[1], address, condition) if len(segments) == 2 else ""
        return Address("exchange", exchange, key)
    if address.startswith(_QUEUES) and len(address) > len(_QUEUES):
        return Address("queue", _unquote(address[len(_QUEUES) :], address, condition))
    raise _bad(address, condition)


def _bad(address: str, condition: str) -> AddressError:
    if condition == PRECONDITION_FAILED:
        return AddressError(f"bad 'to' address string: {address}", condition)
    return AddressError(f"bad address: {address!r}", condition)


def _unquote(segment: str, address: str, condition: str) -> str:
    """RFC 3986 percent-decoding, strict: a bad escape or an unencoded character
    outside RFC 3986's set makes ``address`` bad, as do bytes that are not UTF-8."""
    if "%" not in segment and _URI_CHARS.issuperset(segment):
        return segment
    out = bytearray()
    i, n = 0, len(segment)
    while i < n:
        char = segment[i]
        if char == "%":
            pair = segment[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise _bad(address, condition)
            out.append(int(pair, 16))
            i += 3
        elif char in _URI_CHARS:
            out.append(ord(char))
            i += 1
        else:
            raise _bad(address, condition)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(address, condition) from None


def _quote(name: str) -> str:
    """Percent-encode all but RFC 3986's unreserved characters (as RabbitMQ's
    clients do: uri_string:quote)."""
    safe = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
    return "".join(
        char if char in safe else "".join(f"%{byte:02X}" for byte in char.encode("utf-8"))
        for char in name
    )


# -- v1 ---------------------------------------------------------------------------------
def _parse_v1(address: str, target: bool) -> Address:
    """RabbitMQ 3.x's forms; only ``%2F`` is decoded, to ``/``."""
    parts = address.split("/")
    if len(parts) == 1:
        if not address:
            raise _bad(address, INVALID_FIELD)
        return Address("queue", _v1_unescape(address), v1=True, declare=True)
    head, kind, rest = parts[0], parts[1], parts[2:]
    if head != "":
        raise _bad(address, INVALID_FIELD)
    if kind == "exchange":
        if not rest or rest[0] == "" or len(rest) > 2:
            raise _bad(address, INVALID_FIELD)
        key = _v1_unescape(rest[1]) if len(rest) == 2 else ""
        if target and key == "":
            return Address("exchange", _v1_unescape(rest[0]), None, v1=True)
        return Address("exchange", _v1_unescape(rest[0]), key, v1=True)
    if kind == "topic" and len(rest) == 1 and rest[0]:
        return Address("exchange", "amq.topic", _v1_unescape(rest[0]), v1=True)
    if kind == "queue":
        if not rest and target:
            # The default exchange, keyed by each message's subject.
            return Address("exchange", DEFAULT_EXCHANGE, None, v1=True)
        if len(rest) == 1 and rest[0]:
            return Address("queue", _v1_unescape(rest[0]), v1=True, declare=True)
    if kind == "amq" and len(rest) == 2 and rest[0] == "queue" and rest[1]:
        return Address("queue", _v1_unescape(rest[1]), v1=True)
    raise _bad(address, INVALID_FIELD)


def _v1_unescape(segment: str) -> str:
    return segment.replace("%2F", "/")
