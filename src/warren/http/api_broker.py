"""Node-wide endpoints: overview, whoami, nodes, vhosts, users, permissions,
health checks and the aliveness test (definitions: api_definitions.py)."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import time
from typing import Any

from aiohttp import web

from warren import __version__, node_stats
from warren.core.message import Message
from warren.core.properties import EMPTY_PROPERTIES
from warren.core.stats import (
    HISTORY_SAMPLES,
    VHOST_GROUPS,
    Ages,
    History,
    MessageStats,
    details,
)
from warren.core.users import (
    SHA256,
    Permission,
    User,
    hash_password,
    hashing_algorithm,
    valid_hash,
)
from warren.definitions_export import RABBITMQ_FORMAT_VERSION
from warren.http import formats
from warren.http.common import (
    ADMIN,
    MONITORING,
    Ctx,
    bad_request,
    build,
    flag,
    item_response,
    json_response,
    list_response,
    new_name,
    not_found,
    parse_tags,
    require_keys,
)
from warren.http.state import Router
from warren.node import node_name
from warren.node_stats import NODE_GAUGES

NO_CONTENT = 204
_STARTED = time.time()


def _created(existed: bool) -> web.Response:
    return web.Response(status=204 if existed else 201)


def register(r: Router) -> None:  # noqa: C901 - one table of routes
    r.route("GET", "/api/overview")(overview)
    r.route("GET", "/api/whoami")(whoami)
    r.route("GET", "/api/nodes")(nodes)
    r.route("GET", "/api/nodes/{node}")(node)
    r.route("GET", "/api/nodes/{node}/memory")(node_memory)
    r.route("GET", "/api/nodes/{node}/memory/relative")(node_memory_relative)
    r.route("GET", "/api/extensions")(extensions)
    r.route("GET", "/api/cluster")(cluster)
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
    r.route("GET", "/api/health/checks/alarms")(health_alarms)
    r.route("GET", "/api/health/checks/local-alarms")(health_alarms)
    r.route("GET", "/api/health/checks/virtual-hosts")(health_vhosts)
    r.route("GET", "/api/health/checks/node-is-quorum-critical")(health_ok)
    r.route("GET", "/api/health/checks/node-is-mirror-sync-critical")(health_ok)
    r.route("GET", "/api/health/checks/port-listener/{port}")(health_port)
    r.route("GET", "/api/health/checks/protocol-listener/{protocol}")(health_protocol)
    r.route("GET", "/api/aliveness-test/{vhost}")(aliveness)


# -- overview, whoami, nodes ------------------------------------------------------------------


def _listeners(ctx: Ctx) -> list[dict[str, Any]]:
    return [
        {
            "node": node_name(),
            "protocol": lst.name,
            "ip_address": getattr(lst, "bind", ""),
            "port": lst.port,
            "socket_opts": {},
        }
        for lst in ctx.node.listeners
        if lst.port
    ]


async def overview(ctx: Ctx) -> web.StreamResponse:
    names = ctx.vhost_names()
    ready = unacked = queues = exchanges = consumers = 0
    for i, name in enumerate(names):
        v = ctx.node.vhosts[name]
        queues += len(v.queues)
        exchanges += len(v.exchanges)
        for q in v.queues.values():
            r, u = formats.queue_counts(q)
            ready += r
            unacked += u
            consumers += len(q.consumers)
        if i % 16 == 15:
            await asyncio.sleep(0)
    conns = await build(list(ctx.node.connections), lambda c: c.info() or None)
    conns = [c for c in conns if ctx.sees_all() or c.get("user") == ctx.user.name]
    channels = sum(c.get("channels", 0) for c in conns)
    ages, stats = ctx.ages(), ctx.stats_enabled()
    totals: dict[str, Any] = {}
    for i, (key, value) in enumerate(zip(_LENGTHS, (ready + unacked, ready, unacked), strict=True)):
        totals[key] = value
        if ctx.sees_all():
            totals[f"{key}_details"] = ctx.node.queue_totals.details(i, ages.len_age, ages.len_incr)
        else:  # the vhosts this user sees: their rates summed
            rate = sum(ctx.node.vhosts[n].lengths.details(i)["rate"] for n in names)  # type: ignore[misc]
            totals[f"{key}_details"] = {"rate": round(rate, 1)}
    body: dict[str, Any] = {
        "management_version": RABBITMQ_FORMAT_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": _retention(ctx),
        "exchange_types": [
            {"name": n, "description": d, "enabled": True} for n, d in formats.EXCHANGE_TYPES
        ],
        "product_version": __version__,
        "product_name": "Warren",
        "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
        "cluster_name": ctx.node.cluster_name,
        "erlang_version": f"Python {platform.python_version()}",
        "erlang_full_version": f"Python {platform.python_version()} ({platform.platform()})",
        "release_series_support_status": "supported",
        "disable_stats": not stats,
        "enable_queue_totals": flag(ctx.query.get("enable_queue_totals", "false")),
        "churn_rates": _churn(ctx, ages),
        "queue_totals": totals,
        "object_totals": {
            "channels": channels,
            "connections": len(conns),
            "consumers": consumers,
            "exchanges": exchanges,
            "queues": queues,
        },
        "statistics_db_event_queue": 0,
        "node": node_name(),
        "message_stats": (
            ctx.node.stats
            if ctx.sees_all()
            else MessageStats.combined(ctx.node.vhosts[n].stats for n in names)
        ).as_dict(VHOST_GROUPS, ages),
    }
    if ctx.sees_all():
        body["listeners"] = _listeners(ctx)
        body["contexts"] = [{"node": node_name(), **_context(ctx)}]
    else:  # as RabbitMQ: a management user is not shown the node, nor consumers
        del body["node"]
        del body["object_totals"]["consumers"]
    if not stats:  # as RabbitMQ 3.10: counts of objects only, no rates or listeners
        for key in (
            "message_stats",
            "churn_rates",
            "queue_totals",
            "listeners",
            "contexts",
            "statistics_db_event_queue",
        ):
            body.pop(key, None)
        body["node"] = node_name()  # shown to every user then
        gone = ("channels", "consumers") if ctx.sees_all() else ("channels", "consumers", "connections")
        for key in gone:
            body["object_totals"].pop(key, None)
    return item_response(ctx, body)


_LENGTHS = ("messages", "messages_ready", "messages_unacknowledged")


def _retention(ctx: Ctx) -> dict[str, list[int]]:
    """How far back rate samples go, in seconds (RabbitMQ's policies keep hours;
    Warren keeps HISTORY_SAMPLES samples, docs/http-api.md)."""
    seconds = HISTORY_SAMPLES * max(1, ctx.node.config.collect_statistics_interval // 1000)
    return {"global": [seconds], "basic": [seconds], "detailed": [seconds]}


def _churn(ctx: Ctx, ages: Ages) -> dict[str, Any]:
    """The churn counters with their rates (node_stats.py), as RabbitMQ's overview."""
    figures = ctx.node.node_figures
    values = node_stats.read_values(ctx.node)
    out: dict[str, Any] = {}
    for name in sorted(node_stats.CHURN):
        i = NODE_GAUGES.index(name)
        out[name] = values[i]
        out[f"{name}_details"] = figures.details(i, ages.msg_age, ages.msg_incr)
    return out


def _context(ctx: Ctx) -> dict[str, Any]:
    """The management listener, as RabbitMQ's ``contexts`` entry describes it."""
    http = next((lst for lst in ctx.node.listeners if lst.name == "http"), None)
    return {
        "description": "RabbitMQ Management",
        "path": "/",
        "cowboy_opts": "[]",
        "ip": getattr(http, "bind", ""),
        "port": str(http.port if http is not None else ""),
        "ssl_opts": [],
    }


async def whoami(ctx: Ctx) -> web.StreamResponse:
    return json_response({"name": ctx.user.name, "tags": list(ctx.user.tags)})


def _node_info(ctx: Ctx) -> dict[str, Any]:
    """The node as RabbitMQ's /api/nodes lists it, with the process's analogues of
    the Erlang VM's figures (node_stats.py), sampled with the rates."""
    alarm = ctx.node.disk_alarm
    ages = ctx.ages()
    figures = ctx.node.node_figures
    values = node_stats.read_values(ctx.node)  # now; their rates are the sampled ones
    fds = node_stats.fd_total()
    unmeasured = details(0.0, History(), 0, ages.node_age, ages.node_incr)
    unmeasured_time = dict(unmeasured)  # times are floats, in samples too
    if "samples" in unmeasured_time:
        unmeasured_time["samples"] = [
            {**sample, "sample": 0.0}
            for sample in unmeasured_time["samples"]  # type: ignore[attr-defined]
        ]
    info: dict[str, Any] = {
        "name": node_name(),
        "type": "disc",
        "running": True,
        "being_drained": False,
        "uptime": int((time.time() - _STARTED) * 1000),
        "os_pid": str(os.getpid()),
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "mem_calculation_strategy": "rss",
        "disk_free_alarm": alarm,
        "disk_free_limit": ctx.node.config.free_disk_min,
        "mem_alarm": ctx.node.mem_alarm,
        "mem_limit": ctx.node.mem_limit,
        "fd_total": fds,
        "sockets_total": fds * 9 // 10,
        "proc_total": node_stats.PROC_TOTAL,
        "run_queue": node_stats.run_queue(),
        # Not measured (no per-call timing) or not there (no Mnesia): 0, for the
        # agents that read them (Telegraf).
        "io_read_avg_time": 0.0,
        "io_read_avg_time_details": unmeasured_time,
        "io_write_avg_time": 0.0,
        "io_write_avg_time_details": unmeasured_time,
        "mnesia_disk_tx_count": 0,
        "mnesia_disk_tx_count_details": unmeasured,
        "mnesia_ram_tx_count": 0,
        "mnesia_ram_tx_count_details": unmeasured,
        "partitions": [],
        "cluster_links": [],
        "config_files": [],
        "log_files": ["<stdout>"],
        "db_dir": str(ctx.node.config.data_dir),
        "contexts": [{k: v for k, v in _context(ctx).items() if k != "ssl_opts"}],
        "applications": [
            {"name": "warren", "description": "Warren AMQP 0-9-1 broker", "version": __version__}
        ],
        "exchange_types": [
            {"name": n, "description": d, "enabled": True} for n, d in formats.EXCHANGE_TYPES
        ],
        "auth_mechanisms": [
            {
                "name": "PLAIN",
                "description": "SASL PLAIN authentication mechanism",
                "enabled": True,
            },
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True},
            {
                # Offered on TLS connections with a verified client certificate
                # (docs/security.md), as rabbitmq_auth_mechanism_ssl does.
                "name": "EXTERNAL",
                "description": "RabbitMQ SASL EXTERNAL authentication mechanism",
                "enabled": bool(ctx.node.config.tls_verify_peer and ctx.node.config.tls_ca_cert),
            },
        ],
        "enabled_plugins": ["rabbitmq_management"],
        "listeners": _listeners(ctx),
    }
    for i, name in enumerate(NODE_GAUGES):
        info[name] = values[i]
        info[f"{name}_details"] = figures.details(i, ages.node_age, ages.node_incr)
    return info


async def nodes(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    return await list_response(ctx, [_node_info(ctx)], ())


async def node(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    if ctx.params[0] != node_name():
        raise not_found()
    return item_response(ctx, _node_info(ctx))


#: RabbitMQ's memory breakdown categories (the Erlang VM's); Warren's whole resident
#: memory is reported as other_system, the rest are 0 (docs/http-api.md).
_MEMORY_CATEGORIES = (
    "connection_readers",
    "connection_writers",
    "connection_channels",
    "connection_other",
    "queue_procs",
    "queue_slave_procs",
    "quorum_queue_procs",
    "quorum_queue_dlx_procs",
    "stream_queue_procs",
    "stream_queue_replica_reader_procs",
    "stream_queue_coordinator_procs",
    "plugins",
    "other_proc",
    "metrics",
    "mgmt_db",
    "mnesia",
    "quorum_ets",
    "other_ets",
    "binary",
    "msg_index",
    "code",
    "atom",
    "other_system",
    "allocated_unused",
    "reserved_unallocated",
)


def _memory(ctx: Ctx) -> int:
    ctx.require(MONITORING)
    if ctx.params[0] != node_name():
        raise not_found()
    return int(ctx.node.mem_used)


async def node_memory(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ's memory breakdown: what Telegraf reads with every node (and drops
    the node's metrics when it cannot). The total is the resident memory."""
    used = _memory(ctx)
    breakdown: dict[str, Any] = dict.fromkeys(_MEMORY_CATEGORIES, 0)
    breakdown["other_system"] = used
    breakdown["strategy"] = "rss"
    breakdown["total"] = {"erlang": used, "rss": used, "allocated": used}
    return json_response({"memory": breakdown})


async def node_memory_relative(ctx: Ctx) -> web.StreamResponse:
    """The same in whole percentages of the total."""
    used = _memory(ctx)
    breakdown: dict[str, Any] = {"total": 100, **dict.fromkeys(_MEMORY_CATEGORIES, 0)}
    breakdown["other_system"] = 100 if used else 0
    return json_response({"memory": breakdown})


async def cluster(ctx: Ctx) -> web.StreamResponse:
    """Warren's own: the cluster's leader, in-sync replicas and followers with their
    replication lag (docs/clustering.md); ``{"enabled": false}`` on a single node."""
    ctx.require(MONITORING)
    status = ctx.node.cluster_status
    return json_response(status() if status is not None else {"enabled": False})


async def extensions(ctx: Ctx) -> web.StreamResponse:
    return json_response([])


async def get_cluster_name(ctx: Ctx) -> web.StreamResponse:
    return json_response({"name": ctx.node.cluster_name})


async def put_cluster_name(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = (await ctx.body()).get("name")
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
    ctx.node.add_vhost(name)
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
    names = (await ctx.body()).get("users")
    if not isinstance(names, list):
        raise bad_request("users must be a list of names")
    for name in names:
        ctx.node.users.delete_user(str(name))
    ctx.node.save_users()
    return web.Response(status=NO_CONTENT)


async def get_user(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    return item_response(ctx, formats.user_info(_user(ctx, ctx.params[0])))


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
    return _created(existing is not None)


async def delete_user(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = ctx.params[0]
    _user(ctx, name)
    ctx.node.users.delete_user(name)  # with its permissions, topic permissions, limits
    ctx.node.save_users()
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
    user = _user(ctx, name)
    if vhost not in ctx.node.vhosts:
        raise not_found()
    configure, write, read = _regexes(await ctx.body(), ("configure", "write", "read"))
    existed = vhost in user.permissions
    user.permissions[vhost] = Permission(configure, write, read)
    ctx.node.save_users()
    return _created(existed)


async def delete_permission(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost, name = ctx.params
    user = _user(ctx, name)
    if user.permissions.pop(vhost, None) is None:
        raise not_found()
    ctx.node.save_users()
    return web.Response(status=NO_CONTENT)


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


# -- health checks -------------------------------------------------------------------------


async def health_ok(ctx: Ctx) -> web.StreamResponse:
    return json_response({"status": "ok"})


async def health_alarms(ctx: Ctx) -> web.StreamResponse:
    if ctx.node.alarms:
        raised = [r for r in ("memory", "disk") if r in ctx.node.alarms]
        return json_response(
            {
                "status": "failed",
                "reason": "resource alarm(s) in effect in the cluster",
                "alarms": [{"node": node_name(), "resource": r} for r in raised],
            },
            503,
        )
    return json_response({"status": "ok"})


async def health_vhosts(ctx: Ctx) -> web.StreamResponse:
    return json_response({"status": "ok"})


async def health_port(ctx: Ctx) -> web.StreamResponse:
    try:
        port = int(ctx.params[0])
    except ValueError:
        raise bad_request(f"Invalid port: {ctx.params[0]}") from None
    ports = [lst.port for lst in ctx.node.listeners if lst.port]
    if port in ports:
        return json_response({"status": "ok", "port": port})
    return json_response(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports}, 503
    )


async def health_protocol(ctx: Ctx) -> web.StreamResponse:
    protocol = ctx.params[0].lower()
    protocols = [lst.name for lst in ctx.node.listeners if lst.port]
    if protocol in protocols or (protocol == "amqp091" and "amqp" in protocols):
        return json_response({"status": "ok", "protocol": protocol})
    return json_response(
        {
            "status": "failed",
            "reason": "No active listener",
            "missing": protocol,
            "protocols": protocols,
        },
        503,
    )


async def aliveness(ctx: Ctx) -> web.StreamResponse:
    """Declare ``aliveness-test``, publish to it and get the message back, as RabbitMQ."""
    vhost = ctx.vhost(ctx.params[0])
    q = vhost.declare_queue("aliveness-test", durable=False)
    vhost.publish(
        vhost.default_exchange,
        Message("", "aliveness-test", EMPTY_PROPERTIES, b"test_message"),
    )
    item = q.get(no_ack=True)
    if item is None or item[1].body != b"test_message":
        return json_response({"status": "failed", "reason": "no message"}, 503)
    return json_response({"status": "ok"})
