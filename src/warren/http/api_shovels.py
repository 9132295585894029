"""The shovel plugin's management API: shovels' state, restart and deletion.

A shovel's definition is a runtime parameter (``/api/parameters/shovel/...``,
api_parameters.py); these routes report what the ``shovel`` component runs,
as RabbitMQ's rabbitmq_shovel_management answers them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.http.common import MONITORING, POLICYMAKER, Ctx, list_response, not_found
from warren.http.state import Router


def register(r: Router) -> None:
    r.route("GET", "/api/shovels")(list_shovels)
    r.route("GET", "/api/shovels/{vhost}")(list_shovels)
    r.route("GET", "/api/shovels/vhost/{vhost}/{name}")(get_shovel)
    r.route("DELETE", "/api/shovels/vhost/{vhost}/{name}")(delete_shovel)
    r.route("DELETE", "/api/shovels/vhost/{vhost}/{name}/restart")(restart_shovel)


def _status(ctx: Ctx) -> list[dict[str, Any]]:
    component = ctx.node.parameter_components.get("shovel")
    if component is None:
        return []
    visible = set(ctx.vhost_names())
    return [s for s in component.status() if s["vhost"] in visible]


async def list_shovels(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    shovels = _status(ctx)
    if ctx.params:
        vhost = ctx.vhost(ctx.params[0]).name
        shovels = [s for s in shovels if s["vhost"] == vhost]
    return await list_response(ctx, shovels, ())


async def get_shovel(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    vhost, name = ctx.params
    for shovel in _status(ctx):
        if shovel["vhost"] == vhost and shovel["name"] == name:
            return web.json_response(shovel)
    raise not_found()


async def delete_shovel(ctx: Ctx) -> web.StreamResponse:
    """A dynamic shovel's parameter goes, and the shovel with it (the "Delete this
    shovel" button of RabbitMQ's UI)."""
    ctx.require(POLICYMAKER)
    vhost, name = ctx.params
    if not ctx.node.clear_parameter(ctx.vhost(vhost).name, "shovel", name):
        raise not_found()
    return web.Response(status=204)


async def restart_shovel(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    vhost, name = ctx.params
    component = ctx.node.parameter_components.get("shovel")
    if component is None or not component.restart(ctx.vhost(vhost).name, name):
        raise not_found()
    return web.Response(status=204)
