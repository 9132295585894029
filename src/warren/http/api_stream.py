"""rabbitmq_stream_management's API: stream protocol connections, their
publishers and their consumers (subscriptions).

The connections are the ones /api/connections lists with protocol
``stream``; their publishers and consumers come from the connection's own
accessors (``publishers_info``, ``consumers_info``), found by duck typing so
that this package imports no protocol package. Each publisher and consumer
gets the ``connection_details`` RabbitMQ adds (name, user, node, peer host
and port). Who sees what follows RabbitMQ: a management user sees their own
connections (and their publishers and consumers), monitoring users and
administrators everyone's; closing another user's connection needs
administrator.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from warren.http.api_connections import force_close, own_or_admin, visible_connections
from warren.http.common import Ctx, item_response, list_response, not_authorised, not_found
from warren.http.replies import bad_request
from warren.http.state import Router
from warren.node import ClientConnection

STREAM = "stream"


@runtime_checkable
class StreamEntities(Protocol):
    """What a stream protocol connection lists of its publishers and consumers."""

    def publishers_info(self) -> list[dict[str, Any]]: ...

    def consumers_info(self) -> list[dict[str, Any]]: ...


def register(r: Router) -> None:
    r.route("GET", "/api/stream/connections")(list_connections)
    r.route("GET", "/api/stream/connections/{vhost}")(vhost_connections)
    r.route("GET", "/api/stream/connections/{vhost}/{name}")(get_connection)
    r.route("DELETE", "/api/stream/connections/{vhost}/{name}")(close_connection)
    r.route("GET", "/api/stream/connections/{vhost}/{name}/publishers")(connection_publishers)
    r.route("GET", "/api/stream/connections/{vhost}/{name}/consumers")(connection_consumers)
    r.route("GET", "/api/stream/publishers")(list_publishers)
    r.route("GET", "/api/stream/publishers/{vhost}")(list_publishers)
    r.route("GET", "/api/stream/publishers/{vhost}/{stream}")(list_publishers)
    r.route("GET", "/api/stream/consumers")(list_consumers)
    r.route("GET", "/api/stream/consumers/{vhost}")(list_consumers)


async def _streams(
    ctx: Ctx, vhost: str | None = None
) -> list[tuple[ClientConnection, dict[str, Any]]]:
    """The stream connections this user may see (of ``vhost`` only, if given)."""
    return [(c, i) for c, i in await visible_connections(ctx, vhost) if i.get("protocol") == STREAM]


def _monitored_vhost(ctx: Ctx, name: str) -> None:
    """404 for a vhost that does not exist; 401 for one the user may not see
    (monitoring users see every vhost)."""
    if name not in ctx.node.vhosts:
        raise not_found()
    if not ctx.sees_all() and name not in ctx.user.permissions:
        raise not_authorised("User not authorised to access virtual host")


async def _find(ctx: Ctx) -> tuple[ClientConnection, dict[str, Any]]:
    """The stream connection named by the path in the path's vhost (404 otherwise)."""
    vhost, name = ctx.params[0], ctx.params[1]
    for conn, info in await _streams(ctx, vhost):
        if info.get("name") == name:
            return conn, info
    raise not_found()


async def list_connections(ctx: Ctx) -> web.StreamResponse:
    return await list_response(ctx, [info for _, info in await _streams(ctx)])


async def vhost_connections(ctx: Ctx) -> web.StreamResponse:
    _monitored_vhost(ctx, ctx.params[0])
    return await list_response(ctx, [info for _, info in await _streams(ctx, ctx.params[0])])


async def get_connection(ctx: Ctx) -> web.StreamResponse:
    _conn, info = await _find(ctx)
    if not ctx.stats_enabled():
        return item_response(ctx, {"name": info["name"]})
    return item_response(ctx, info)


async def close_connection(ctx: Ctx) -> web.StreamResponse:
    """As DELETE /api/connections/{name}: the client gets a Close."""
    conn, info = await _find(ctx)
    own_or_admin(ctx, info.get("user"))
    force_close(ctx, conn, info)
    return web.Response(status=204)


def _details(info: dict[str, Any]) -> dict[str, Any]:
    """RabbitMQ's ``connection_details`` of a publisher or consumer."""
    return {key: info.get(key) for key in ("name", "node", "peer_host", "peer_port", "user")}


def _entities(
    conns: list[tuple[ClientConnection, dict[str, Any]]], kind: str
) -> list[dict[str, Any]]:
    """The publishers (``kind`` "publishers") or consumers of ``conns``, each
    with its connection_details, in connection name and id order."""
    out: list[dict[str, Any]] = []
    for conn, info in sorted(conns, key=lambda ci: str(ci[1].get("name", ""))):
        if not isinstance(conn, StreamEntities):
            continue
        rows = conn.publishers_info() if kind == "publishers" else conn.consumers_info()
        details = _details(info)
        out += [{**row, "connection_details": dict(details)} for row in rows]
    return out


async def connection_publishers(ctx: Ctx) -> web.StreamResponse:
    conn, info = await _find(ctx)
    return await list_response(ctx, _entities([(conn, info)], "publishers"), ())


async def connection_consumers(ctx: Ctx) -> web.StreamResponse:
    conn, info = await _find(ctx)
    return await list_response(ctx, _entities([(conn, info)], "consumers"), ())


async def list_publishers(ctx: Ctx) -> web.StreamResponse:
    """Every visible publisher, of a vhost, or of one stream of it (404 for a
    vhost or stream that does not exist). With ``disable_stats``: none, as
    RabbitMQ (its queue page still loads)."""
    vhost = ctx.params[0] if ctx.params else None
    if vhost is not None and vhost not in ctx.node.vhosts:
        raise not_found()
    stream = ctx.params[1] if len(ctx.params) > 1 else None
    if vhost is not None and stream is not None and stream not in ctx.node.vhosts[vhost].queues:
        raise not_found()
    if not ctx.stats_enabled():
        return await list_response(ctx, [], ())
    rows = _entities(await _streams(ctx, vhost), "publishers")
    if stream is not None:
        rows = [r for r in rows if r["queue"]["name"] == stream]
    return await list_response(ctx, rows, ())


async def list_consumers(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.params[0] if ctx.params else None
    if vhost is not None and vhost not in ctx.node.vhosts:
        raise not_found()
    if not ctx.stats_enabled():
        raise bad_request("Stats in management UI are disabled on this node")
    return await list_response(ctx, _entities(await _streams(ctx, vhost), "consumers"), ())
