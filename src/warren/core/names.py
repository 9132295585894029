"""What a name may be: valid UTF-8, at most 255 bytes, and how an invalid one is shown.

Names (of queues, exchanges, vhosts, users, policies, parameters) and routing
keys are AMQP short strings: at most 255 bytes, and UTF-8 as RabbitMQ checks
it. Warren's decoders keep any byte they cannot decode as a lone surrogate
(``surrogateescape``: ``b"\\xff"`` becomes ``"\\udcff"``), and JSON can spell a
lone surrogate too (``"\\ud800"``), so "valid UTF-8" here means "holds no
surrogate". Every door that makes a named object refuses the others; a name
made before Warren refused them (an old data directory) is still shown
(U+FFFD for what cannot be decoded, as RabbitMQ's API shows it) and can be
addressed through its bytes (``%FF`` in an API path).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING
from urllib.parse import quote

from warren.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from warren.core.vhost import VHost

__all__ = [
    "MALFORMED_SHORTSTR",
    "MAX_NAME_BYTES",
    "check_name",
    "is_valid_utf8",
    "name_problem",
    "shown",
    "strip_cr_lf",
    "to_bytes",
    "too_long",
    "warn_undecodable",
]

log = logging.getLogger("warren.vhost")

#: Longest name or routing key, in bytes of UTF-8 (an AMQP short string).
MAX_NAME_BYTES = 255

#: RabbitMQ's reason (501 FRAME_ERROR) for a method's short string that is not UTF-8.
MALFORMED_SHORTSTR = "Malformed UTF-8 in shortstr"

_SURROGATES = re.compile("[\ud800-\udfff]")


def is_valid_utf8(text: str) -> bool:
    """Whether ``text`` came from valid UTF-8 (holds no surrogate code point)."""
    if text.isascii():  # O(1) in CPython: most names stop here
        return True
    return _SURROGATES.search(text) is None


def to_bytes(text: str) -> bytes:
    """The bytes a name stands for: undecodable bytes kept by ``surrogateescape`` are
    given back as they came; any other lone surrogate as its three-byte encoding."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def shown(text: str) -> str:
    """``text`` fit to show (JSON, logs): each surrogate replaced by U+FFFD."""
    if is_valid_utf8(text):
        return text
    return _SURROGATES.sub("\ufffd", text)


def too_long(kind: str, size: int) -> str:
    """RabbitMQ's words (its management API's, for a queue) for a name over the limit."""
    return f"{kind} should be less than {MAX_NAME_BYTES} bytes, actually was {size}"


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` cannot name a new ``kind`` ("queue", "routing_key" ...), or None."""
    if not is_valid_utf8(name):
        return f"{kind} '{shown(name)}' is not valid UTF-8 ({to_bytes(name)!r})"
    if len(name) > MAX_NAME_BYTES // 4:  # shorter ones fit whatever their characters
        size = len(name.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            return too_long(kind, size)
    return None


def check_name(kind: str, name: str) -> None:
    """Refuse (406 PRECONDITION_FAILED) a name no AMQP client could send or be sent."""
    problem = name_problem(kind, name)
    if problem is not None:
        raise PreconditionFailed(problem)


def strip_cr_lf(name: str) -> str:
    """``name`` without CR and LF, as RabbitMQ takes the queue and exchange names of
    exchange.* and queue.* methods (``"a\\nb"`` declares ``"ab"``)."""
    if "\n" in name or "\r" in name:
        return name.replace("\r", "").replace("\n", "")
    return name


def warn_undecodable(vhost: VHost) -> int:
    """Log every object of ``vhost`` named (a binding: keyed) with bytes that are not
    UTF-8, made before Warren refused them; they are kept, with their messages, and
    shown with U+FFFD. How many there are."""
    found: list[tuple[str, str]] = []
    for q in vhost.queues.values():
        if not is_valid_utf8(q.name):
            found.append(("queue", q.name))
    for ex in vhost.exchanges.values():
        if not is_valid_utf8(ex.name):
            found.append(("exchange", ex.name))
        for b in ex.bindings.values():
            if not is_valid_utf8(b.routing_key):
                found.append(
                    (f"binding of exchange '{shown(ex.name)}' with routing key", b.routing_key)
                )
    for kind, name in found:
        log.warning(
            "vhost '%s': %s '%s' is not valid UTF-8 (%s): kept from before Warren refused "
            "such names; the management API shows it with U+FFFD and finds it as '%s' in "
            "a path. No AMQP client can name it: move its messages (API get, a shovel) "
            "and delete it",
            shown(vhost.name),
            kind,
            shown(name),
            ascii(to_bytes(name)),
            quote(to_bytes(name), safe=""),
        )
    return len(found)
