"""Request bodies: a limit per request, a budget for all of them at once, JSON bounded.

A body is read chunk by chunk as it arrives, never past its limit
([mgmt] max_body_size; max_definitions_size for a definitions upload), and
held against one budget the whole API shares ([mgmt] body_budget) from the
moment it is announced (Content-Length) or received until its request ends:
a client that sends bodies faster than the broker handles them gets 503s,
other clients keep their service and the broker its memory. An announced body
over the limit is refused before a byte of it is read, and a client that asks
first (``Expect: 100-continue``) is refused before it sends one.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from warren.config import Config
from warren.http.replies import ApiError, bad_request
from warren.json_input import JSONInputError, loads

__all__ = ["TOO_LARGE", "BodyBudget", "body_limit", "check_announced", "parse_json", "read_body"]

log = logging.getLogger("warren.http")

#: RabbitMQ's reason (400 bad_request) for a body over the limit.
TOO_LARGE = "Exceeded HTTP request body size limit"
#: How much more of the budget an unannounced (chunked) body takes at a time.
_STEP = 256 * 1024
#: The request's key for the bytes of the budget it holds.
_HELD = web.RequestKey("warren.body_bytes_held", int)


class BodyBudget:
    """Bytes of request bodies held at once, by every request together."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, request: web.Request, size: int) -> None:
        """Hold ``size`` more bytes for ``request`` (given back by ``release``), or
        refuse the request (503) when the budget has not that much left."""
        if self.used + size > self.total:
            log.warning(
                "management API: %s %s from %s refused: request bodies being received "
                "hold %d of the %d bytes allowed ([mgmt] body_budget)",
                request.method,
                request.path,
                request.remote,
                self.used,
                self.total,
            )
            raise ApiError(
                503,
                "service_unavailable",
                "too many request bodies being received at once; try again later",
                {"Retry-After": "1"},
            )
        self.used += size
        request[_HELD] = request.get(_HELD, 0) + size

    def fits(self, size: int) -> bool:
        return self.used + size <= self.total

    def release(self, request: web.Request) -> None:
        """Give back what ``request`` holds (when it has been answered)."""
        self.used -= request.pop(_HELD, 0)


def body_limit(config: Config, request: web.Request) -> int:
    """The largest body ``request`` may have: more for a definitions upload."""
    if request.method == "POST" and request.path.startswith("/api/definitions"):
        return config.http_max_definitions_size
    if request.path.startswith("/bridge/"):  # the HTTP bridge's (bridge.py)
        return config.http_bridge_max_body_size
    return config.http_max_body_size


def _too_large(request: web.Request, limit: int, size: int) -> ApiError:
    log.warning(
        "management API: %s %s from %s refused: a request body of %s bytes, over the %d allowed",
        request.method,
        request.path,
        request.remote,
        size if size >= 0 else "more than the",
        limit,
    )
    return bad_request(TOO_LARGE)


def check_announced(config: Config, budget: BodyBudget, request: web.Request) -> None:
    """What can be told from the headers alone: a Content-Length over the limit,
    or one the budget cannot take now."""
    length = request.content_length
    if length is None:
        return
    limit = body_limit(config, request)
    if length > limit:
        raise _too_large(request, limit, length)
    if not budget.fits(length):
        budget.take(request, length)  # raises the 503


async def read_body(config: Config, budget: BodyBudget, request: web.Request) -> bytearray:
    """The whole body, read as it comes, within its limit and the budget (held
    until ``budget.release(request)``)."""
    limit = body_limit(config, request)
    length = request.content_length
    check_announced(config, budget, request)
    held = 0
    if length is not None:
        budget.take(request, length)
        held = length
    body = bytearray()
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return body
        size = len(body) + len(chunk)
        if size > limit:
            raise _too_large(request, limit, -1)
        if size > held:  # chunked: the budget is taken a step at a time
            step = min(max(_STEP, size - held), limit - held)
            budget.take(request, step)
            held += step
        body += chunk


def parse_json(raw: bytes | bytearray | str) -> Any:
    """The JSON body as an API handler takes it (``{}`` when empty); a refusal is
    RabbitMQ's 400 ``not_json``, or names the limit the body is over."""
    if not raw.strip():
        return {}
    try:
        return loads(raw)
    except JSONInputError as exc:
        raise bad_request(exc.reason) from None
