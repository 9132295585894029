"""The federation plugin's management API: the links' state, as RabbitMQ's
rabbitmq_federation_management answers /api/federation-links."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.http.common import MONITORING, POLICYMAKER, Ctx, list_response, not_found
from warren.http.state import Router
from warren.node import node_name


def register(r: Router) -> None:
    r.route("GET", "/api/federation-links")(list_links)
    r.route("GET", "/api/federation-links/{vhost}")(list_links)
    r.route("DELETE", "/api/federation-links/vhost/{vhost}/{upstream}/restart")(restart)
    # RabbitMQ's: one link, by the id and node the listing gives.
    r.route("DELETE", "/api/federation-links/vhost/{vhost}/{id}/{node}/restart")(restart_link)


def _links(ctx: Ctx) -> list[dict[str, Any]]:
    component = ctx.node.parameter_components.get("federation-upstream")
    if component is None:
        return []
    visible = set(ctx.vhost_names())
    node = node_name()
    return [{**link, "node": node} for link in component.status() if link["vhost"] in visible]


async def list_links(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    links = _links(ctx)
    if ctx.params:
        vhost = ctx.vhost(ctx.params[0]).name
        links = [link for link in links if link["vhost"] == vhost]
    return await list_response(ctx, links, ())


async def restart(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    vhost, upstream = ctx.params
    component = ctx.node.parameter_components.get("federation-upstream")
    if component is None or not component.restart(ctx.vhost(vhost).name, upstream):
        raise not_found()
    return web.Response(status=204)


async def restart_link(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    vhost, link_id, node = ctx.params
    component = ctx.node.parameter_components.get("federation-upstream")
    restart_one = getattr(component, "restart_link", None)
    if (
        node != node_name()
        or restart_one is None
        or not restart_one(ctx.vhost(vhost).name, link_id)
    ):
        raise not_found()
    return web.Response(status=204)
