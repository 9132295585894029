"""The overview, whoami and the node: what RabbitMQ's /api/overview and /api/nodes
show, with the node's figures (node_stats.py) and their rates (core/stats.py)."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from typing import Any

from aiohttp import web

from warren import __version__, node_stats
from warren.core.stats import (
    VHOST_GROUPS,
    Ages,
    History,
    MessageStats,
    details,
)
from warren.http import formats
from warren.http.common import (
    MONITORING,
    Ctx,
    build,
    flag,
    item_response,
    json_response,
    list_response,
    not_found,
)
from warren.http.state import Router
from warren.node import node_name
from warren.node_stats import NODE_GAUGES

_STARTED = time.time()


def register(r: Router) -> None:
    r.route("GET", "/api/overview")(overview)
    r.route("GET", "/api/whoami")(whoami)
    r.route("GET", "/api/nodes")(nodes)
    r.route("GET", "/api/nodes/{node}")(node)
    r.route("GET", "/api/nodes/{node}/memory")(node_memory)
    r.route("GET", "/api/nodes/{node}/memory/relative")(node_memory_relative)


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
            totals[f"{key}_details"] = ctx.node.queue_totals.details(i, ages.len_age, ages.len_incr, ages.end_s)
        else:  # the vhosts this user sees: their rates summed
            rate = sum(ctx.node.vhosts[n].lengths.details(i)["rate"] for n in names)  # type: ignore[misc]
            totals[f"{key}_details"] = {"rate": round(rate, 1)}
    body: dict[str, Any] = {
        "management_version": ctx.node.config.rabbitmq_version,
        "rates_mode": "basic",
        "sample_retention_policies": _retention(ctx),
        "exchange_types": [
            {"name": n, "description": d, "enabled": True} for n, d in formats.EXCHANGE_TYPES
        ],
        "product_version": __version__,
        "product_name": "Warren",
        "rabbitmq_version": ctx.node.config.rabbitmq_version,
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


#: The ranges the management UI offers, each with the max ages that name it
#: (RabbitMQ's overview: within about 10 %; its defaults are 605 s, 3660 s ...).
_UI_RANGES = (
    (0, 66, 60),
    (540, 660, 600),
    (3240, 3960, 3600),
    (25920, 31681, 28800),
    (77760, 95041, 86400),
)


def _ui_range(max_age: int) -> int:
    """The UI range a max age stands for (0: none), as RabbitMQ's overview names it."""
    return next((ui for low, high, ui in _UI_RANGES if low <= max_age <= high), 0)


def _retention(ctx: Ctx) -> dict[str, list[int]]:
    """How far back the history of each kind of object goes, as the UI ranges
    ([mgmt] sample_retention_policies, RabbitMQ's overview field)."""
    config = ctx.node.config
    policies = (
        ("global", config.sample_retention_global),
        ("basic", config.sample_retention_basic),
        ("detailed", config.sample_retention_detailed),
    )
    return {name: sorted(_ui_range(age) for age, _ in policy) for name, policy in policies}


def _churn(ctx: Ctx, ages: Ages) -> dict[str, Any]:
    """The churn counters with their rates (node_stats.py), as RabbitMQ's overview."""
    figures = ctx.node.node_figures
    values = node_stats.read_values(ctx.node)
    out: dict[str, Any] = {}
    for name in sorted(node_stats.CHURN):
        i = NODE_GAUGES.index(name)
        out[name] = values[i]
        out[f"{name}_details"] = figures.details(i, ages.msg_age, ages.msg_incr, ages.end_s)
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
    unmeasured = details(0.0, History(), 0, ages.node_age, ages.node_incr, ages.end_s)
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
            {
                "name": "rabbit",
                "description": "RabbitMQ",
                "version": ctx.node.config.rabbitmq_version,
            },
            {"name": "warren", "description": "Warren AMQP 0-9-1 broker", "version": __version__},
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
        info[f"{name}_details"] = figures.details(i, ages.node_age, ages.node_incr, ages.end_s)
    return info


async def nodes(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    return await list_response(ctx, [_node_info(ctx)], ())


async def node(ctx: Ctx) -> web.StreamResponse:
    ctx.require(MONITORING)
    if ctx.params[0] != node_name():
        raise not_found()
    info = _node_info(ctx)
    # The node page's "Memory details" and "Binary references" ask for these; Warren
    # has no Erlang binary heap to break down (the UI says: not available).
    if flag(ctx.query.get("memory", "false")):
        info["memory"] = _memory_breakdown(ctx)
    if flag(ctx.query.get("binary", "false")):
        info["binary"] = "not_available"
    return item_response(ctx, info)


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
    return json_response({"memory": _memory_breakdown(ctx)})


def _memory_breakdown(ctx: Ctx) -> dict[str, Any]:
    used = _memory(ctx)
    breakdown: dict[str, Any] = dict.fromkeys(_MEMORY_CATEGORIES, 0)
    breakdown["other_system"] = used
    breakdown["strategy"] = "rss"
    breakdown["total"] = {"erlang": used, "rss": used, "allocated": used}
    return breakdown


async def node_memory_relative(ctx: Ctx) -> web.StreamResponse:
    """The same in whole percentages of the total."""
    used = _memory(ctx)
    breakdown: dict[str, Any] = {"total": 100, **dict.fromkeys(_MEMORY_CATEGORIES, 0)}
    breakdown["other_system"] = 100 if used else 0
    return json_response({"memory": breakdown})
