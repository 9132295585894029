"""Warren's own: webhook targets managed through the API (docs/webhooks.md).

``GET /api/webhooks`` (api_broker.py) lists every target; here one target is
read, made or replaced (``PUT``, a target's keys without its name, which is
the path's) and deleted. The webhooks file's targets are the operator's: the
API lists them and refuses to change them. The API's targets are saved in
the data directory (webhooks/saved.py) and in the definitions' ``webhooks``.
"""

from __future__ import annotations

from aiohttp import web

from warren.config import ConfigError
from warren.http.common import ADMIN, MONITORING, Ctx, bad_request, json_response, not_found
from warren.http.replies import ApiError
from warren.http.state import Router
from warren.webhooks import Webhooks
from warren.webhooks.targets import parse_target

__all__ = ["register"]


def register(r: Router) -> None:
    r.route("GET", "/api/webhooks/{name}")(get_webhook)
    r.route("PUT", "/api/webhooks/{name}")(put_webhook)
    r.route("DELETE", "/api/webhooks/{name}")(delete_webhook)


def _webhooks(ctx: Ctx) -> Webhooks:
    hooks = ctx.node.webhooks
    if hooks is None:  # an embedded core broker without warren.app's webhooks
        raise ApiError(405, "method_not_allowed", "webhooks are not enabled on this broker")
    return hooks


async def get_webhook(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    name = ctx.params[0]
    status = ctx.node.webhook_status
    for item in status() if status is not None else []:
        if item["name"] == name:
            return json_response(item)
    raise not_found()


async def put_webhook(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    hooks = _webhooks(ctx)
    body = await ctx.body()
    try:
        target = parse_target(body, ctx.params[0])
        created = hooks.put(target)
    except (ConfigError, ValueError) as exc:
        raise bad_request(str(exc)) from None
    return web.Response(status=201 if created else 204)


async def delete_webhook(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    try:
        deleted = _webhooks(ctx).delete(ctx.params[0])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if not deleted:
        raise not_found()
    return web.Response(status=204)
