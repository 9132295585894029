"""Node-wide endpoints: vhosts, users, permissions (overview, whoami and nodes:
api_overview.py; health checks and the aliveness test: api_health.py;
definitions: api_definitions.py)."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from aiohttp import web

from warren.core.runtime_parameters import validate_default_queue_type
from warren.core.users import (
    SHA256,
    Permission,
    User,
    hash_password,
    hashing_algorithm,
    valid_hash,
)
from warren.http import api_overview, api_webhooks, formats
from warren.http.common import (
    ADMIN,
    MONITORING,
    Ctx,
    bad_request,
    build,
    item_response,
    json_response,
    list_response,
    new_name,
    not_found,
    parse_tags,
    require_keys,
)
from warren.http.state import Router

NO_CONTENT = 204


def _created(existed: bool) -> web.Response:
    return web.Response(status=204 if existed else 201)


def register(r: Router) -> None:  # noqa: C901 - one table of routes
    api_overview.register(r)
    api_webhooks.register(r)
    r.route("GET", "/api/cluster")(cluster)
    r.route("GET", "/api/webhooks")(webhooks)
    r.route("GET", "/api/cluster-name")(get_cluster_name)
    r.route("PUT", "/api/cluster-name")(put_cluster_name)
    r.route("GET", "/api/vhosts")(list_vhosts)
    r.route("GET", "/api/vhosts/{vhost}")(get_vhost)
    r.route("PUT", "/api/vhosts/{vhost}")(put_vhost)
    r.route("DELETE", "/api/vhosts/{vhost}")(delete_vhost)
    r.route("GET", "/api/vhosts/{vhost}/permissions")(vhost_permissions)
    r.route("GET", "/api/vhosts/{vhost}/topic-permissions")(vhost_topic_permissions)
    r.route("GET", "/api/users")(list_users)
    r.route("GET", "/api/users/without-permissions")(users_without_permissions)
    r.route("POST", "/api/users/bulk-delete")(bulk_delete_users)
    r.route("GET", "/api/users/{user}")(get_user)
    r.route("PUT", "/api/users/{user}")(put_user)
    r.route("DELETE", "/api/users/{user}")(delete_user)
    r.route("GET", "/api/users/{user}/permissions")(user_permissions)
    r.route("GET", "/api/users/{user}/topic-permissions")(user_topic_permissions)
    r.route("GET", "/api/permissions")(list_permissions)
    r.route("GET", "/api/permissions/{vhost}/{user}")(get_permission)
    r.route("PUT", "/api/permissions/{vhost}/{user}")(put_permission)
    r.route("DELETE", "/api/permissions/{vhost}/{user}")(delete_permission)
    r.route("GET", "/api/topic-permissions")(list_topic_permissions)
    r.route("GET", "/api/topic-permissions/{vhost}/{user}")(get_topic_permission)
    r.route("PUT", "/api/topic-permissions/{vhost}/{user}")(put_topic_permission)
    r.route("DELETE", "/api/topic-permissions/{vhost}/{user}")(delete_topic_permission)


async def cluster(ctx: Ctx) -> web.StreamResponse:
    """Warren's own: the cluster's leader, in-sync replicas and followers with their
    replication lag (docs/clustering.md); ``{"enabled": false}`` on a single node."""
    ctx.require(MONITORING)
    status = ctx.node.cluster_status
    return json_response(status() if status is not None else {"enabled": False})


async def webhooks(ctx: Ctx) -> web.StreamResponse:
    """Warren's own: the webhook targets with their counters (docs/webhooks.md);
    an empty list without webhooks."""
    ctx.require(MONITORING)
    status = ctx.node.webhook_status
    return json_response(status() if status is not None else [])


async def get_cluster_name(ctx: Ctx) -> web.StreamResponse:
    return json_response({"name": ctx.node.cluster_name})


async def put_cluster_name(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    body = await ctx.body()
    require_keys(body, "name")
    name = body["name"]
    if not isinstance(name, str) or not name:
        raise bad_request("name must be a non-empty string")
    ctx.node.cluster_name = name
    return web.Response(status=NO_CONTENT)


# -- vhosts --------------------------------------------------------------------------------


def _vhost_item(ctx: Ctx, name: str) -> dict[str, Any]:
    return formats.vhost_info(ctx.node.vhosts[name], ctx.state.vhost_metadata.get(name), ctx.ages())


async def list_vhosts(ctx: Ctx) -> web.StreamResponse:
    items = await build(ctx.vhost_names(), lambda n: _vhost_item(ctx, n))
    return await list_response(ctx, items, ("name",))


async def get_vhost(ctx: Ctx) -> web.StreamResponse:
    name = ctx.params[0]
    ctx.vhost(name)
    return item_response(ctx, _vhost_item(ctx, name))


#: The body keys of a vhost's default queue type: RabbitMQ 3.11.0's name first, then
#: the one 3.11.x settled on, which wins (rabbit_mgmt_wm_vhost).
_DQT_KEYS = ("defaultqueuetype", "default_queue_type")


async def put_vhost(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = new_name("vhost", ctx.params[0])
    body = await ctx.body()
    existed = name in ctx.node.vhosts
    meta = ctx.state.vhost_metadata.get(name, {"description": "", "tags": []})
    if "description" in body:
        meta["description"] = str(body["description"])
    if "tags" in body:
        meta["tags"] = parse_tags(body["tags"])
    dqt_key = next((k for k in reversed(_DQT_KEYS) if k in body), None)
    if dqt_key is not None:
        try:  # refused before anything is made, as RabbitMQ 4.x checks it
            dqt = validate_default_queue_type(body[dqt_key])
        except ValueError as exc:
            raise bad_request(str(exc)) from None
    vhost = ctx.node.add_vhost(name)
    if dqt_key is not None:
        vhost.metadata.set_default_queue_type(dqt)
    ctx.state.vhost_metadata[name] = meta
    ctx.state.save()
    if not existed:
        # As RabbitMQ: the user who creates a vhost gets full permissions on it.
        ctx.node.users.set_permissions(ctx.user.name, name)
        ctx.node.save_users()
    return _created(existed)


async def delete_vhost(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = ctx.params[0]
    if name not in ctx.node.vhosts:
        raise not_found()
    ctx.node.delete_vhost(name)
    # The node drops the vhost's permissions; topic permissions on it go too.
    ctx.node.users.forget_vhost(name)
    ctx.node.save_users()
    ctx.state.vhost_metadata.pop(name, None)
    ctx.state.save()
    return web.Response(status=NO_CONTENT)


# -- users and permissions -----------------------------------------------------------------


def _user(ctx: Ctx, name: str) -> User:
    user = ctx.node.users.users.get(name)
    if user is None:
        raise not_found()
    return user


async def list_users(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    items = await build(ctx.node.users.users.values(), formats.user_info)
    return await list_response(ctx, items, ("name",))


async def users_without_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    users = [u for u in ctx.node.users.users.values() if not u.permissions]
    return await list_response(ctx, [formats.user_info(u) for u in users], ("name",))


async def bulk_delete_users(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    body = await ctx.body()
    require_keys(body, "users")
    names = body["users"]
    if not isinstance(names, list):
        raise bad_request("users must be a list of names")
    for name in names:
        if ctx.node.users.delete_user(str(name)):
            _user_event(ctx, "user.deleted", name=str(name))
    ctx.node.save_users()
    return web.Response(status=NO_CONTENT)


async def get_user(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    return item_response(ctx, formats.user_info(_user(ctx, ctx.params[0])))


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


async def put_user(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = new_name("user", ctx.params[0])
    body = await ctx.body()
    if "tags" not in body:
        raise bad_request("tags_not_present")
    tags = parse_tags(body["tags"])
    if "password" in body and "password_hash" in body:
        raise bad_request("both password and password_hash are provided")
    users = ctx.node.users.users
    existing = users.get(name)
    algorithm = SHA256
    if "password" in body:
        if not isinstance(body["password"], str):
            raise bad_request("password must be a string")
        password_hash = hash_password(body["password"])
    elif "password_hash" in body:
        raw_algorithm = body.get("hashing_algorithm", SHA256)
        canonical = hashing_algorithm(raw_algorithm) if isinstance(raw_algorithm, str) else None
        if canonical is None:
            raise bad_request(f"hashing algorithm '{raw_algorithm}' is not supported by Warren")
        algorithm = canonical
        password_hash = body["password_hash"]
        if not isinstance(password_hash, str):
            raise bad_request("password_hash must be a string")
        if not _is_base64(password_hash):
            raise bad_request(["not_base64", password_hash])
        if not valid_hash(password_hash, algorithm):
            raise bad_request(f"password_hash is not a {algorithm} hash")
    elif existing is not None:
        password_hash = existing.password_hash
        algorithm = existing.hashing_algorithm
    else:
        raise bad_request("[{key_missing,password_hash}]")
    if existing is None:
        existing_or_new = users[name] = User(name, password_hash, tags)
    else:
        existing_or_new = existing
        existing.password_hash = password_hash
        existing.tags = tags
    existing_or_new.hashing_algorithm = algorithm
    ctx.node.save_users()
    if existing is None:
        _user_event(ctx, "user.created", name=name, tags=tags)
    return _created(existing is not None)


async def delete_user(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = ctx.params[0]
    _user(ctx, name)
    ctx.node.users.delete_user(name)  # with its permissions, topic permissions, limits
    ctx.node.save_users()
    _user_event(ctx, "user.deleted", name=name)
    return web.Response(status=NO_CONTENT)


def _permissions(ctx: Ctx, user: str | None = None, vhost: str | None = None) -> list[Any]:
    return [
        formats.permission_info(u.name, v, p.configure, p.write, p.read)
        for u in ctx.node.users.users.values()
        if user is None or u.name == user
        for v, p in u.permissions.items()
        if vhost is None or v == vhost
    ]


async def list_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    return await list_response(ctx, _permissions(ctx), ("vhost", "user"))


async def user_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    _user(ctx, ctx.params[0])
    return await list_response(ctx, _permissions(ctx, user=ctx.params[0]), ("vhost", "user"))


async def vhost_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    ctx.vhost(ctx.params[0])
    return await list_response(ctx, _permissions(ctx, vhost=ctx.params[0]), ("vhost", "user"))


async def get_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    p = _user(ctx, name).permissions.get(vhost)
    if p is None:
        raise not_found()
    return item_response(ctx, formats.permission_info(name, vhost, p.configure, p.write, p.read))


def _regexes(body: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    require_keys(body, *keys)
    values = []
    for key in keys:
        value = body[key]
        if not isinstance(value, str):
            raise bad_request(f"{key} must be a string")
        try:
            re.compile(value)
        except re.error as exc:
            raise bad_request(f"{key}: invalid regular expression: {exc}") from None
        values.append(value)
    return values


async def put_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    configure, write, read = _regexes(await ctx.body(), ("configure", "write", "read"))
    user = ctx.node.users.users.get(name)
    if user is None or vhost not in ctx.node.vhosts:
        raise bad_request("vhost_or_user_not_found")  # RabbitMQ's 400, not a 404
    existed = vhost in user.permissions
    user.permissions[vhost] = Permission(configure, write, read)
    ctx.node.save_users()
    perm = {"configure": configure, "write": write, "read": read}
    _user_event(ctx, "permission.created", user=name, vhost=vhost, **perm)
    return _created(existed)


async def delete_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    user = _user(ctx, name)
    if user.permissions.pop(vhost, None) is None:
        raise not_found()
    ctx.node.save_users()
    _user_event(ctx, "permission.deleted", user=name, vhost=vhost)
    return web.Response(status=NO_CONTENT)


def _user_event(ctx: Ctx, event: str, **props: Any) -> None:
    """user.* and permission.* events (core/events.py), with who did it, as
    RabbitMQ's ``user_who_performed_action``."""
    events = ctx.node.events
    if events:
        events.emit(event, {**props, "user_who_performed_action": ctx.user.name})


def topic_permissions(
    ctx: Ctx, user: str | None = None, vhost: str | None = None
) -> list[dict[str, Any]]:
    """The core's topic permissions as RabbitMQ lists them, optionally of one user
    and/or vhost."""
    return [
        {"user": u.name, "vhost": v, "exchange": exchange, "write": p.write, "read": p.read}
        for u in ctx.node.users.users.values()
        if user is None or u.name == user
        for v, per_exchange in u.topic_permissions.items()
        if vhost is None or v == vhost
        for exchange, p in per_exchange.items()
    ]


async def list_topic_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    return await list_response(ctx, topic_permissions(ctx), ("vhost", "user"))


async def user_topic_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    _user(ctx, ctx.params[0])
    return await list_response(ctx, topic_permissions(ctx, user=ctx.params[0]), ())


async def vhost_topic_permissions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    ctx.vhost(ctx.params[0])
    return await list_response(ctx, topic_permissions(ctx, vhost=ctx.params[0]), ())


async def get_topic_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    _user(ctx, name)
    items = topic_permissions(ctx, user=name, vhost=vhost)
    if not items:
        raise not_found()
    return json_response(items)


async def put_topic_permission(ctx: Ctx) -> web.StreamResponse:
    """Set one exchange's topic permission, enforced from the next publish or bind."""
    ctx.require(ADMIN)
    vhost, name = ctx.params
    _user(ctx, name)
    if vhost not in ctx.node.vhosts:
        raise not_found()
    body = await ctx.body()
    exchange = body.get("exchange")
    if not isinstance(exchange, str):
        raise bad_request("[{key_missing,exchange}]")
    write, read = _regexes(body, ("write", "read"))
    existed = ctx.node.users.set_topic_permission(name, vhost, exchange, write, read)
    ctx.node.save_users()
    return _created(existed)


async def delete_topic_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    _user(ctx, name)
    if not ctx.node.users.clear_topic_permissions(name, vhost):
        raise not_found()
    ctx.node.save_users()
    return web.Response(status=NO_CONTENT)
