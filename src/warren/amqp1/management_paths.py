"""The paths of RabbitMQ 4's ``/management`` node: request targets and bindings' locations.

A request's ``to`` is an HTTP-like target: a path whose segments are
percent-encoded (RFC 3986; a ``/`` inside a name is ``%2F``) and, for GET
/bindings, a query. A binding is named by one segment,
``src=X;dstq=Q;key=K;args=H`` (``dste=E`` for an exchange destination): the
names and key percent-encoded, ``H`` a hash of its arguments in base64url
(empty for none). Pure functions; a bad path raises :class:`BadPath`, which
the node answers 400.
"""

from __future__ import annotations

import hashlib
import re
from base64 import urlsafe_b64encode
from typing import Any, Final
from urllib.parse import parse_qsl

from warren.core.destination import EXCHANGE, QUEUE
from warren.core.exchange import Binding
from warren.core.table_tags import encode_arguments

__all__ = [
    "BadPath",
    "args_hash",
    "binding_location",
    "parse_binding_segment",
    "parse_target",
    "quote",
    "route",
    "unquote",
]

_UNRESERVED: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
#: What a request target may hold unencoded: RFC 3986's characters and '%'.
_URI_CHARS: Final = _UNRESERVED | frozenset(":/?#[]@!$&'()*+,;=%")
#: RabbitMQ 4's pattern of a binding's segment: percent-encoded names and key,
#: the arguments' hash in base64url.
_BINDING_SEGMENT: Final = re.compile(
    r"src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);"
    r"key=([0-9A-Za-z\-._~%]*);args=([0-9A-Za-z\-_]*)"
)


class BadPath(ValueError):
    """A target or segment the node cannot read (answered 400, with ``text``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def unquote(text: str) -> str:
    """RFC 3986 percent-decoding, strict: a bad escape or bytes that are not
    UTF-8 are a BadPath."""
    if "%" not in text:
        return text
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        if text[i] == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise BadPath(f"bad percent-encoding in '{text}'")
            out.append(int(pair, 16))
            i += 3
        else:
            out += text[i].encode("utf-8")
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise BadPath(f"'{text}' is not percent-encoded UTF-8") from None


def quote(text: str) -> str:
    """Percent-encode all but RFC 3986's unreserved characters (as RabbitMQ's
    clients and its own locations do)."""
    return "".join(
        c if c in _UNRESERVED else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in text
    )


def parse_target(target: str) -> tuple[list[str], dict[str, str]]:
    """A request's ``to``: its path segments (still encoded) and its query
    (decoded, ``+`` a space as in a form)."""
    if not _URI_CHARS.issuperset(target):
        raise BadPath(f"failed to normalize URI '{target}'")
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    if not path.startswith("/"):
        raise BadPath(f"bad request target '{target}'")
    params: dict[str, str] = {}
    if query:
        try:
            params = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True))
        except ValueError:
            raise BadPath(f"failed to dissect query '{query}'") from None
    return path[1:].split("/"), params


def route(segments: list[str]) -> str | None:
    """Which of the node's resources a path names (None: none)."""
    match segments:
        case ["queues", _]:
            return "queue"
        case ["queues", _, "messages"]:
            return "messages"
        case ["exchanges", _]:
            return "exchange"
        case ["bindings"]:
            return "bindings"
        case ["bindings", _]:
            return "binding"
        case ["auth", "tokens"]:
            return "tokens"
    return None


def args_hash(arguments: dict[str, Any]) -> str:
    """A binding's arguments as a segment's ``args=``: empty for none, else a
    digest of their encoding (RabbitMQ 4 hashes its own terms: the two do not
    match, a client takes the value from a binding's ``location``)."""
    if not arguments:
        return ""
    encoded = encode_arguments(dict(sorted(arguments.items())))
    return urlsafe_b64encode(hashlib.sha256(encoded).digest()[:4]).decode().rstrip("=")


def binding_location(binding: Binding) -> str:
    """A binding's path, as DELETE /bindings/... takes it."""
    kind = "q" if binding.destination_kind == QUEUE else "e"
    return (
        f"/bindings/src={quote(binding.source.name)};dst{kind}="
        f"{quote(binding.destination.name)};key={quote(binding.routing_key)};"
        f"args={args_hash(binding.arguments)}"
    )


def parse_binding_segment(segment: str) -> tuple[str, str, str, str, str]:
    """A binding's segment, still encoded (a ``%3B`` is no ``;``), as (source,
    destination kind, destination, key, arguments hash)."""
    match = _BINDING_SEGMENT.fullmatch(segment)
    if match is None:
        raise BadPath(f"bad binding path segment '{segment}'")
    source, kind, destination, key, digest = match.groups()
    return (
        unquote(source),
        QUEUE if kind == "q" else EXCHANGE,
        unquote(destination),
        unquote(key),
        digest,
    )
