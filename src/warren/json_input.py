"""JSON from outside (API request bodies, definitions files): bounded depth, UTF-8 only.

Python's parser recurses once per nesting level, so a body of ``[[[[...`` a
thousand deep raises RecursionError (and anything built from a deep value
recurses again); and it accepts a lone surrogate escape (``"\\ud800"``), a
string no UTF-8 encoder can write back. Both are refused here with a
JSONInputError before the document reaches anything else (the depth is measured
without recursion, after parsing: a walk over the containers costs less than
the parse).
"""

from __future__ import annotations

import json
import re
from typing import Any

from warren.core.table import MAX_DEPTH

__all__ = ["MAX_JSON_DEPTH", "JSONInputError", "loads"]

#: Deepest nesting of arrays and objects accepted: room for a definitions document's
#: own levels (document, category, entry) around arguments nested as deep as an AMQP
#: field table may be, so whatever Warren exports it imports again.
MAX_JSON_DEPTH = MAX_DEPTH + 8

# An escaped surrogate (\uD800-\uDFFF) or one encoded in UTF-8 (CESU's ED A0..BF xx).
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_TOO_DEEP = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"


class JSONInputError(ValueError):
    """A document refused: ``reason`` says why, as an API error's reason would."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value``'s arrays and objects nest deeper than ``limit`` (no recursion)."""
    if not isinstance(value, dict | list):
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                if depth >= limit:
                    return True
                push((child, depth + 1))
    return False


def loads(raw: bytes | bytearray | str) -> Any:
    """The value ``raw`` holds; JSONInputError when it is not JSON ("not_json"), is
    nested deeper than MAX_JSON_DEPTH, or holds a string that is not UTF-8."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        value = json.loads(data)
    except RecursionError:  # the parser's own bound (about a thousand levels)
        raise JSONInputError(_TOO_DEEP) from None
    except (ValueError, UnicodeDecodeError):
        raise JSONInputError("not_json") from None
    brackets = data.count(b"[") + data.count(b"{")
    if brackets > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise JSONInputError(_TOO_DEEP)
    if _MAYBE_SURROGATE.search(data) is not None:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise JSONInputError(
                f"not UTF-8: a string holds a lone surrogate ({ascii(bad)[1:-1]})"
            ) from None
    return value
