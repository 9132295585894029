"""Matching functions for topic and headers exchanges, independent of exchanges."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from warren.core.erlang_format import binary_p, field_type, term_p
from warren.core.errors import PreconditionFailed

T = TypeVar("T")

_CACHE_LIMIT = 4096


def topic_matches(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic semantics: '*' is exactly one word, '#' zero or more words."""
    # Iterative two-pointer match with backtracking to the last '#'.
    p = w = 0
    star_p = -1
    star_w = 0
    np_, nw = len(pattern), len(words)
    while w < nw or p < np_:
        if p < np_:
            tok = pattern[p]
            if tok == "#":
                star_p, star_w = p, w
                p += 1
                continue
            if w < nw and (tok == "*" or tok == words[w]):
                p += 1
                w += 1
                continue
        if star_p >= 0 and star_w < nw:
            star_w += 1
            p, w = star_p + 1, star_w
            continue
        return False
    return True


class TopicMatcher(Generic[T]):
    """Topic bindings with a cache of routing key -> destinations.

    Publishers reuse a small set of routing keys, so after the first message for a
    key routing costs one dict lookup. Any binding change clears the cache.
    """

    def __init__(self) -> None:
        self._bindings: dict[Hashable, tuple[list[str], T]] = {}
        self._exact: dict[str, dict[Hashable, T]] = {}
        self._cache: dict[str, tuple[T, ...]] = {}

    def add(self, pattern: str, key: Hashable, dest: T) -> None:
        if "*" in pattern or "#" in pattern:
            self._bindings[key] = (pattern.split("."), dest)
        else:
            self._exact.setdefault(pattern, {})[key] = dest
        self._cache.clear()

    def remove(self, pattern: str, key: Hashable) -> None:
        if key in self._bindings:
            del self._bindings[key]
        else:
            exact = self._exact.get(pattern)
            if exact is not None:
                exact.pop(key, None)
                if not exact:
                    del self._exact[pattern]
        self._cache.clear()

    def match(self, routing_key: str) -> tuple[T, ...]:
        hit = self._cache.get(routing_key)
        if hit is not None:
            return hit
        exact = self._exact.get(routing_key)
        result: list[T] = list(exact.values()) if exact else []
        if self._bindings:
            # As in RabbitMQ, the empty routing key has zero words (not one empty
            # word): '#' matches it, '*' does not.
            words = routing_key.split(".") if routing_key else []
            for pattern, dest in self._bindings.values():
                if topic_matches(pattern, words):
                    result.append(dest)
        out = tuple(result)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[routing_key] = out
        return out


_X_MATCH = {"all", "any", "all-with-x", "any-with-x"}


def _x_match_value(arguments: dict[str, Any]) -> str:
    value = arguments.get("x-match", "all")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else repr(value)


def validate_x_match(arguments: dict[str, Any]) -> None:
    """RabbitMQ's check of a headers binding's x-match, with its texts (Erlang terms)."""
    if "x-match" not in arguments:
        return
    value = arguments["x-match"]
    if isinstance(value, str | bytes):
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        if raw.decode("utf-8", "replace") in _X_MATCH:
            return
        prefix = "Invalid x-match field value "
        raise PreconditionFailed(
            f"{prefix}{binary_p(raw, column=len(prefix) + 1)}; "
            "expected all, any, all-with-x, or any-with-x"
        )
    raise PreconditionFailed(
        f"Invalid x-match field type {field_type(value)} (value {term_p(value)}); expected longstr"
    )


class HeadersMatcher:
    """One headers binding: x-match mode plus the header values it requires."""

    __slots__ = ("all", "pairs")

    def __init__(self, arguments: dict[str, Any]) -> None:
        mode = _x_match_value(arguments)
        with_x = mode.endswith("-with-x")
        self.all = mode.startswith("all")
        self.pairs = [
            (k, v)
            for k, v in arguments.items()
            if k != "x-match" and (with_x or not k.startswith("x-"))
        ]

    def matches(self, headers: dict[str, Any]) -> bool:
        if self.all:
            for k, v in self.pairs:
                if k not in headers:
                    return False
                if v is not None and not _same(headers[k], v):
                    return False
            return True
        return any(k in headers and (v is None or _same(headers[k], v)) for k, v in self.pairs)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bytes) and isinstance(b, str):
        return a == b.encode()
    if isinstance(b, bytes) and isinstance(a, str):
        return b == a.encode()
    return bool(a == b) and (type(a) is bool) == (type(b) is bool)
