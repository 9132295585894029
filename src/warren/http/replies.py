"""What every answer of the management API is made of: errors and JSON bodies.

A JSON body is always valid UTF-8, whatever the names in it: a name made
before Warren refused names that are not UTF-8 (an old data directory) holds
lone surrogates (core/names.py), written as U+FFFD as RabbitMQ's API shows the
bytes it cannot decode. Without that, one such queue made every listing that
includes it answer 500 for every user.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
from typing import Any

from aiohttp import web

from warren.core.errors import BrokerError

__all__ = [
    "ApiError",
    "BareError",
    "bad_request",
    "dumps",
    "encode",
    "from_broker_error",
    "json_response",
    "not_authorised",
    "not_found",
]

_SURROGATES = re.compile("[\ud800-\udfff]")


class ApiError(Exception):
    """An error answer: status and RabbitMQ's ``{"error": ..., "reason": ...}`` body."""

    def __init__(
        self, status: int, error: str, reason: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=encode(
                json.dumps(
                    {"error": self.error, "reason": self.reason},
                    default=_default,
                    ensure_ascii=False,
                )
            ),
            content_type="application/json",
            headers=self.headers,
        )


class BareError(ApiError):
    """An error answered with no body, as RabbitMQ's web server answers a request
    it refuses before the API sees it: no credentials at all (401), or an
    Authorization header it cannot parse (400)."""

    def response(self) -> web.Response:
        return web.Response(status=self.status, headers=self.headers)


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def bad_request(reason: Any) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_authorised(reason: str) -> ApiError:
    """RabbitMQ 3.10 answers an authenticated user it refuses with 401 too (no realm)."""
    return ApiError(401, "not_authorised", reason)


def from_broker_error(exc: BrokerError) -> ApiError:
    """A core refusal as RabbitMQ's management API reports it."""
    if exc.code == 404:
        return ApiError(404, "not_found", exc.text)
    if exc.code == 403:
        return not_authorised("Access refused.")
    if exc.code == 540:  # NOT_IMPLEMENTED: RabbitMQ keeps the code in the text
        return bad_request(f"540 {exc.text}")
    if exc.code == 506:  # RESOURCE_ERROR: the disk could not take the change
        return ApiError(500, "internal_error", exc.text)
    return bad_request(exc.text)


# -- JSON -----------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def dumps(value: Any) -> str:
    return json.dumps(value, default=_default, ensure_ascii=False, separators=(",", ":"))


def encode(text: str) -> bytes:
    """``text`` in UTF-8, any lone surrogate in it written as U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=encode(dumps(value)), content_type="application/json", charset="utf-8"
    )
