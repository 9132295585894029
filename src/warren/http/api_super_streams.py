"""Super streams through the management API (core/super_stream.py).

``PUT /api/stream/super-streams/{vhost}/{name}`` is RabbitMQ's
rabbitmq_stream_management route, with its body (``partitions`` or
``binding-keys``, ``arguments`` with the stream manager's names) and its
checks and 400s; ``node`` is not taken (one node makes it; in a cluster the
definitions replicate). ``DELETE`` on the same path is Warren's own
(``warren ctl super-streams delete``; RabbitMQ deletes one with
``rabbitmq-streams delete_super_stream``, not over HTTP).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from aiohttp import web

from warren.core import super_stream
from warren.core.users import CONFIGURE
from warren.http.common import Ctx, bad_request, new_name
from warren.http.state import Router

EXCHANGE = "exchange"


def register(r: Router) -> None:
    r.route("PUT", "/api/stream/super-streams/{vhost}/{name}")(put_super_stream)
    r.route("DELETE", "/api/stream/super-streams/{vhost}/{name}")(delete_super_stream)


def _partition_count(value: Any) -> int:
    """``partitions``: a number, or a number's text (RabbitMQ's coercion)."""
    if isinstance(value, bool):
        raise bad_request("The partitions must be a number")
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise bad_request("The partitions must be a number") from None
    if count < 1:
        raise bad_request("The partition number must be greater than 0")
    if count > super_stream.MAX_PARTITIONS:
        raise bad_request(f"The partition number must not exceed {super_stream.MAX_PARTITIONS}")
    return count


def _binding_keys(value: Any) -> list[str]:
    """``binding-keys``: comma-separated; refused before it is split when it
    names more keys than a super stream may have."""
    if not isinstance(value, str):
        raise bad_request("binding-keys must be a string")
    if value.count(",") + 1 > super_stream.MAX_PARTITIONS:
        raise bad_request(
            f"The number of binding keys must not exceed {super_stream.MAX_PARTITIONS}"
        )
    keys = super_stream.parse_binding_keys(value)
    if not keys:
        raise bad_request("The number of binding keys must be greater than 0")
    return keys


async def put_super_stream(ctx: Ctx) -> web.StreamResponse:
    vhost_name = ctx.params[0]
    vhost = ctx.vhost(vhost_name)
    name = new_name(EXCHANGE, ctx.params[1])
    ctx.check(vhost_name, CONFIGURE, EXCHANGE, name)
    body = await ctx.body()
    count, keys_text = body.get("partitions"), body.get("binding-keys")
    if count is None and keys_text is None:
        raise bad_request("Must specify partitions or binding keys")
    if count is not None and keys_text is not None:
        raise bad_request("Specify partitions or binding keys, not both")
    if count is not None:
        streams, keys = super_stream.streams_for_partitions(name, _partition_count(count))
    else:
        keys = _binding_keys(keys_text)
        streams = super_stream.streams_for_keys(name, keys)
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be a JSON object")
    super_stream.create(vhost, name, streams, keys, arguments, partial(ctx.check, vhost_name))
    return web.Response(status=204)  # RabbitMQ's: the vhost (its resource) exists


async def delete_super_stream(ctx: Ctx) -> web.StreamResponse:
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    super_stream.delete(vhost, name, partial(ctx.check, vhost_name))
    return web.Response(status=204)
