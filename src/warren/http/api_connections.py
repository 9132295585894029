"""Connections, channels and consumers: what clients of any protocol have open.

All of it comes from ``warren.node.ClientConnection`` (info, channels_info,
force_close), so this module knows no protocol. Management users see their
own connections; monitoring users and administrators see everyone's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from warren.http.common import SLICE, Ctx, item_response, list_response, not_authorised, not_found
from warren.http.state import Router
from warren.node import ClientConnection

log = logging.getLogger("warren.http")

DEFAULT_REASON = "Closed via management plugin"


def register(r: Router) -> None:
    r.route("GET", "/api/connections")(list_connections)
    r.route("GET", "/api/connections/{name}")(get_connection)
    r.route("DELETE", "/api/connections/{name}")(close_connection)
    r.route("GET", "/api/connections/username/{user}")(user_connections)
    r.route("DELETE", "/api/connections/username/{user}")(close_user_connections)
    r.route("GET", "/api/connections/{name}/channels")(connection_channels)
    r.route("GET", "/api/vhosts/{vhost}/connections")(vhost_connections)
    r.route("GET", "/api/vhosts/{vhost}/channels")(vhost_channels)
    r.route("GET", "/api/channels")(list_channels)
    r.route("GET", "/api/channels/{name}")(get_channel)
    r.route("GET", "/api/consumers")(list_consumers)
    r.route("GET", "/api/consumers/{vhost}")(list_consumers)


async def visible_connections(
    ctx: Ctx, vhost: str | None = None
) -> list[tuple[ClientConnection, dict[str, Any]]]:
    """(connection, info) of the open connections this user may see (in slices)."""
    out = []
    for i, conn in enumerate(list(ctx.node.connections), 1):
        if i % SLICE == 0:
            await asyncio.sleep(0)
        info = conn.info()
        if not info:
            continue
        if vhost is not None and info.get("vhost") != vhost:
            continue
        if not ctx.sees_all() and info.get("user") != ctx.user.name:
            continue
        out.append((conn, info))
    return out


async def _find(ctx: Ctx, name: str) -> tuple[ClientConnection, dict[str, Any]]:
    for conn, info in await visible_connections(ctx):
        if info.get("name") == name:
            return conn, info
    raise not_found()


async def _channels(ctx: Ctx, conns: list[tuple[ClientConnection, dict[str, Any]]]) -> list[Any]:
    out: list[dict[str, Any]] = []
    ages = ctx.ages()
    for i, (conn, _) in enumerate(conns, 1):
        for ch in conn.channels_info(ages):
            ch = dict(ch)
            ch.pop("consumer_details", None)
            out.append(ch)
        if i % SLICE == 0:
            await asyncio.sleep(0)
    return out


def _with_history(ctx: Ctx, conn: ClientConnection, info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with its byte rates' history when ``data_rates_age`` asks for it."""
    ages = ctx.ages()
    if not ages.data_age or "recv_oct_details" not in info:
        return info
    octets = conn.octets
    return {
        **info,
        "recv_oct_details": octets.details(0, ages.data_age, ages.data_incr, ages.end_s),
        "send_oct_details": octets.details(1, ages.data_age, ages.data_incr, ages.end_s),
    }


async def list_connections(ctx: Ctx) -> web.StreamResponse:
    items = [_with_history(ctx, c, info) for c, info in await visible_connections(ctx)]
    return await list_response(ctx, items, ("name",))


async def vhost_connections(ctx: Ctx) -> web.StreamResponse:
    ctx.vhost(ctx.params[0])
    items = [_with_history(ctx, c, info) for c, info in await visible_connections(ctx, ctx.params[0])]
    return await list_response(ctx, items, ("name",))


#: What RabbitMQ lists as null but shows as "" for one connection without TLS.
_TLS_KEYS = (
    "peer_cert_issuer",
    "peer_cert_subject",
    "peer_cert_validity",
    "ssl_cipher",
    "ssl_hash",
    "ssl_key_exchange",
    "ssl_protocol",
)


async def get_connection(ctx: Ctx) -> web.StreamResponse:
    conn, found = await _find(ctx, ctx.params[0])
    info = _with_history(ctx, conn, dict(found))
    for key in _TLS_KEYS:
        if key in info and info[key] is None:
            info[key] = ""
    return item_response(ctx, info)


def force_close(ctx: Ctx, conn: ClientConnection, info: dict[str, Any]) -> None:
    """Close it as RabbitMQ does (AMQP: 320 CONNECTION_FORCED with the ``X-Reason``
    header's text; MQTT 5: DISCONNECT 0x98) and answer at once: the connection
    goes when its client answers, or at the protocol's close timeout."""
    reason = ctx.request.headers.get("X-Reason", DEFAULT_REASON)
    log.info(
        "management API: user '%s' closes connection %s: %s", ctx.user.name, info["name"], reason
    )
    conn.force_close(reason)


async def close_connection(ctx: Ctx) -> web.StreamResponse:
    """A user may close their own connections; closing others' needs administrator."""
    conn, info = await _find(ctx, ctx.params[0])
    own_or_admin(ctx, info.get("user"))
    force_close(ctx, conn, info)
    return web.Response(status=204)


def own_or_admin(ctx: Ctx, user: str | None) -> None:
    """RabbitMQ's is_authorized_user: the user themselves, or an administrator."""
    if user != ctx.user.name and not ctx.is_admin():
        raise not_authorised("Not administrator user")


async def user_connections(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ's tracked connections of one user (any vhost): name, vhost, user, node."""
    user = ctx.params[0]
    own_or_admin(ctx, user)
    items = [
        {"name": info["name"], "vhost": info.get("vhost"), "user": user, "node": info.get("node")}
        for _, info in await visible_connections(ctx)
        if info.get("user") == user
    ]
    return await list_response(ctx, items, ("name",))


async def close_user_connections(ctx: Ctx) -> web.StreamResponse:
    """Close every connection of one user (204 when there are none, as RabbitMQ)."""
    user = ctx.params[0]
    own_or_admin(ctx, user)
    for conn, info in await visible_connections(ctx):
        if info.get("user") == user:
            force_close(ctx, conn, info)
    return web.Response(status=204)


async def connection_channels(ctx: Ctx) -> web.StreamResponse:
    conn, info = await _find(ctx, ctx.params[0])
    return await list_response(ctx, await _channels(ctx, [(conn, info)]), ("name",))


async def list_channels(ctx: Ctx) -> web.StreamResponse:
    return await list_response(ctx, await _channels(ctx, await visible_connections(ctx)), ("name",))


async def vhost_channels(ctx: Ctx) -> web.StreamResponse:
    ctx.vhost(ctx.params[0])
    return await list_response(ctx, await _channels(ctx, await visible_connections(ctx, ctx.params[0])), ("name",))


async def get_channel(ctx: Ctx) -> web.StreamResponse:
    name = ctx.params[0]
    ages = ctx.ages()  # the page's rate charts ask for msg_rates_age
    for conn, _ in await visible_connections(ctx):
        for ch in conn.channels_info(ages):
            if ch.get("name") == name:
                # Per-exchange and per-queue counts (RabbitMQ's detailed rates mode):
                # Warren keeps none, as RabbitMQ in its default basic mode.
                return item_response(ctx, {**ch, "deliveries": [], "publishes": []})
    raise not_found()


async def list_consumers(ctx: Ctx) -> web.StreamResponse:
    vhosts = [ctx.params[0]] if ctx.params else ctx.vhost_names()
    if ctx.params:
        ctx.vhost(ctx.params[0])
    wanted = set(vhosts)
    # Consumers are listed for every vhost the user may see, whoever's channel holds them.
    items = []
    for i, conn in enumerate(list(ctx.node.connections), 1):
        if i % SLICE == 0:
            await asyncio.sleep(0)
        for ch in conn.channels_info():
            for consumer in ch.get("consumer_details", []):
                if consumer["queue"]["vhost"] in wanted:
                    items.append(consumer)
    return await list_response(ctx, items, ())
