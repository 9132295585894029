"""The x-consistent-hash exchange, as RabbitMQ's rabbitmq_consistent_hash_exchange plugin.

Each message goes to exactly one of the bound destinations, chosen by hashing
the routing key (or, with the exchange argument ``hash-header`` - LavinMQ calls
it ``x-hash-on`` - a header's value, or with ``hash-property`` one of
``message_id``, ``correlation_id``, ``timestamp``). The binding key is the
destination's weight: a positive integer, so a queue bound with "2" gets about
twice the messages of one bound with "1". A message without the header or
property is hashed as an empty value, so all such messages go to one
destination, as in RabbitMQ (which hashes ``undefined``).

Destinations sit on a hash ring, ``weight`` x 100 points each (a hundred
points per unit of weight keep each destination's share within a few percent
of its weight's), at positions derived from the destination's kind and name
alone (not from binding order or object ids): the same key goes to the same
destination for as long as the bindings stay, across restarts too, and adding
or removing a binding moves only the keys that land on, or leave, that
binding's points.

RabbitMQ's rules, with its texts: a binding key that is not an integer, or is
below 1, is refused with 406; ``hash-property`` must name a supported property;
``hash-header`` and ``hash-property`` are mutually exclusive. As in RabbitMQ,
a destination bound twice counts with the weight of its first binding; unlike
RabbitMQ, removing one of the two leaves the other one in effect.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from warren.core.erlang_format import binary_p, field_type
from warren.core.errors import PreconditionFailed
from warren.core.exchange import Binding, Exchange
from warren.core.table_encode import encode_field_value

if TYPE_CHECKING:
    from warren.core.message import Message
    from warren.core.queue import Queue

__all__ = ["MAX_WEIGHT", "POINTS_PER_WEIGHT", "ConsistentHashExchange", "hash_value"]

#: Properties ``hash-property`` may name (RabbitMQ's list).
PROPERTIES = ("correlation_id", "message_id", "timestamp")
#: Ring points per unit of weight.
POINTS_PER_WEIGHT = 100
#: The largest weight a binding may give. RabbitMQ has no limit (and runs out of
#: memory on a key like "99999999999999999999"); 1000 is 100,000 ring points.
MAX_WEIGHT = 1000

# Erlang's list_to_integer/1: an optional sign, then decimal digits, nothing else.
_INTEGER = re.compile(r"[+-]?[0-9]+")

Destination = Any  # Queue | Exchange (a runtime alias; the annotations name both)
_Ident = tuple[str, str]  # (destination kind, destination name)


def hash_value(data: bytes) -> int:
    """Position on the ring (64 bits) of a key or of a destination's point."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else None


def _as_bytes(value: Any) -> bytes:
    """The bytes hashed for a header or property value (empty when it is absent)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    return encode_field_value(value)  # tables, arrays, floats...: their typed encoding


def binding_weight(routing_key: str) -> int:
    """The weight a binding key gives, with RabbitMQ's refusals (406)."""
    if _INTEGER.fullmatch(routing_key) is None:
        prefix = "The binding key must be an integer: "
        raw = routing_key.encode("utf-8", "surrogateescape")
        raise PreconditionFailed(prefix + binary_p(raw, column=len(prefix) + 1))
    weight = int(routing_key)
    if weight < 1:
        raise PreconditionFailed("The binding key must be greater than 0")
    if weight > MAX_WEIGHT:
        raise PreconditionFailed(f"The binding key must be at most {MAX_WEIGHT}")
    return weight


class ConsistentHashExchange(Exchange):
    type = "x-consistent-hash"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header, self._property = self._hash_on(self.arguments)
        # Bindings per destination, oldest first, with their weights: the first one
        # places the destination on the ring.
        self._by_dest: dict[_Ident, dict[tuple[Any, ...], int]] = {}
        self._dests: dict[_Ident, Destination] = {}
        self._points: dict[int, _Ident] = {}  # ring position -> destination
        # The ring in order, rebuilt lazily after binding changes.
        self._ring_hashes: list[int] = []
        self._ring_dests: list[Destination] = []
        self._dirty = False

    @staticmethod
    def _hash_on(arguments: dict[str, Any]) -> tuple[str | None, str | None]:
        """(header, property) to hash on, validated as RabbitMQ validates them."""
        header = None
        for arg in ("hash-header", "x-hash-on"):  # RabbitMQ's name first, then LavinMQ's
            if arg in arguments:
                header = _text(arguments[arg])
                if header is None:  # RabbitMQ crashes (541) here; a clear 406 instead
                    raise PreconditionFailed(
                        f"invalid type '{field_type(arguments[arg])}' for arg '{arg}': "
                        "expected longstr"
                    )
                break
        prop = None
        if "hash-property" in arguments:
            prop = _text(arguments["hash-property"])
            if prop is None:
                raise PreconditionFailed(
                    f"invalid type '{field_type(arguments['hash-property'])}' for arg "
                    "'hash-property': expected longstr"
                )
            if header is not None:
                raise PreconditionFailed("hash-header and hash-property are mutually exclusive")
            if prop not in PROPERTIES:
                raise PreconditionFailed(f"Unsupported property: {prop}")
        return header, prop

    # -- bindings ---------------------------------------------------------------------
    def validate_binding(self, routing_key: str, arguments: dict[str, Any] | None) -> None:
        binding_weight(routing_key)

    def _index_add(self, binding: Binding) -> None:
        ident = (binding.destination_kind, binding.destination.name)
        weights = self._by_dest.setdefault(ident, {})
        weights[binding.key] = binding_weight(binding.routing_key)
        if len(weights) == 1:
            self._dests[ident] = binding.destination
            self._place(ident, weights[binding.key])

    def _index_remove(self, binding: Binding) -> None:
        ident = (binding.destination_kind, binding.destination.name)
        weights = self._by_dest.get(ident)
        if weights is None or binding.key not in weights:
            return
        was_first = next(iter(weights)) == binding.key
        weight = weights.pop(binding.key)
        if not was_first:
            return
        self._unplace(ident, weight)
        if weights:
            self._place(ident, next(iter(weights.values())))
        else:
            del self._by_dest[ident]
            del self._dests[ident]

    def _point_hashes(self, ident: _Ident, weight: int) -> list[int]:
        base = f"{ident[0]}\x00{ident[1]}\x00".encode("utf-8", "surrogateescape")
        return [hash_value(base + str(i).encode()) for i in range(weight * POINTS_PER_WEIGHT)]

    def _place(self, ident: _Ident, weight: int) -> None:
        points = self._points
        for h in self._point_hashes(ident, weight):
            points.setdefault(h, ident)  # a 64-bit collision keeps the earlier owner
        self._dirty = True

    def _unplace(self, ident: _Ident, weight: int) -> None:
        points = self._points
        for h in self._point_hashes(ident, weight):
            if points.get(h) == ident:
                del points[h]
        self._dirty = True

    def _rebuild(self) -> None:
        self._ring_hashes = sorted(self._points)
        dests = self._dests
        points = self._points
        self._ring_dests = [dests[points[h]] for h in self._ring_hashes]
        self._dirty = False

    # -- routing ----------------------------------------------------------------------
    def key_of(self, msg: Message) -> bytes:
        """The bytes this exchange hashes for ``msg``."""
        if self._header is not None:
            headers = msg.headers
            return _as_bytes(headers.get(self._header) if headers else None)
        if self._property is not None:
            props = msg.decoded_properties()
            return _as_bytes(getattr(props, self._property))
        return msg.routing_key.encode("utf-8", "surrogateescape")

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        if self._dirty:
            self._rebuild()
        hashes = self._ring_hashes
        if not hashes:
            return ()
        i = bisect.bisect_left(hashes, hash_value(self.key_of(msg)))
        return (self._ring_dests[i if i < len(hashes) else 0],)
