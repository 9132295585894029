"""Health checks (``/api/health/checks/*``) and the aliveness test, as RabbitMQ serves them.

RabbitMQ 3.10 and 3.13 serve the same family (alarms, local-alarms,
certificate-expiration, port-listener, protocol-listener, virtual-hosts,
node-is-quorum-critical, node-is-mirror-sync-critical); 4.x adds is-in-service,
below-node-connection-limit, ready-to-serve-clients, metadata-store/initialized
(and /with-data), quorum-queues-without-elected-leaders (all vhosts or one, a
pattern of names) and reached-target-cluster-size (which asks for no
credentials: it is a startup probe), served here too, as is the older
``/api/healthchecks/node``. A check
that passes is 200 ``{"status": "ok", ...}``; one that fails is 503
``{"status": "failed", "reason": ..., ...}`` with RabbitMQ's words, so load
balancers and Kubernetes probes written for RabbitMQ read Warren the same way.
"""

from __future__ import annotations

import datetime
import logging
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from warren.core.message import Message
from warren.core.properties import EMPTY_PROPERTIES
from warren.core.session import ClientSession
from warren.http.common import Ctx, bad_request, json_response, not_found
from warren.http.formats import queue_type
from warren.http.state import Router
from warren.node import node_name

log = logging.getLogger("warren.http")

HEALTH = "/api/health/checks"
_DAY = 86400
#: Seconds per unit, as RabbitMQ counts them (a month is a twelfth of 365 days).
UNITS = {"days": _DAY, "weeks": 7 * _DAY, "months": _DAY * 365 / 12, "years": 365 * _DAY}
#: RabbitMQ's names for its alarms' resources.
_ALARM_RESOURCES = {"memory": "memory", "disk": "disk space"}
#: Other names RabbitMQ takes for a protocol (its normalize_protocol), Warren's included.
_PROTOCOL_ALIASES = {
    **dict.fromkeys(("amqp091", "amqp0.9.1", "amqp0-9-1", "amqp0_9_1"), "amqp"),
    **dict.fromkeys(("amqps",), "amqp/ssl"),
    **dict.fromkeys(("mqtt3.1", "mqtt3.1.1", "mqtt31", "mqtt311", "mqtt3_1", "mqtt3_1_1"), "mqtt"),
    **dict.fromkeys(("mqtts", "mqtt+tls", "mqtt+ssl"), "mqtt/ssl"),
    **dict.fromkeys(("http1", "http1.1", "http_api", "management", "management_ui", "ui"), "http"),
}
_TLS_NAMES = {"amqp": "amqp/ssl", "mqtt": "mqtt/ssl", "http": "https"}


def register(r: Router) -> None:
    r.route("GET", f"{HEALTH}/alarms")(alarms)
    r.route("GET", f"{HEALTH}/local-alarms")(local_alarms)
    r.route("GET", f"{HEALTH}/certificate-expiration/{{within}}/{{unit}}")(certificate_expiration)
    r.route("GET", f"{HEALTH}/port-listener/{{port}}")(port_listener)
    r.route("GET", f"{HEALTH}/protocol-listener/{{protocol}}")(protocol_listener)
    r.route("GET", f"{HEALTH}/virtual-hosts")(virtual_hosts)
    r.route("GET", f"{HEALTH}/node-is-quorum-critical")(node_is_quorum_critical)
    r.route("GET", f"{HEALTH}/node-is-mirror-sync-critical")(node_is_quorum_critical)
    r.route("GET", f"{HEALTH}/is-in-service")(is_in_service)
    r.route("GET", f"{HEALTH}/below-node-connection-limit")(below_node_connection_limit)
    r.route("GET", f"{HEALTH}/ready-to-serve-clients")(ready_to_serve_clients)
    r.route("GET", f"{HEALTH}/metadata-store/initialized")(metadata_store_initialized)
    r.route("GET", f"{HEALTH}/metadata-store/initialized/with-data")(metadata_store_with_data)
    leaders = f"{HEALTH}/quorum-queues-without-elected-leaders"
    r.route("GET", f"{leaders}/all-vhosts")(leaderless_in_all_vhosts)
    r.route("GET", f"{leaders}/all-vhosts/pattern/{{pattern}}")(leaderless_in_all_vhosts)
    r.route("GET", f"{leaders}/vhost/{{vhost}}")(leaderless_in_vhost)
    r.route("GET", f"{leaders}/vhost/{{vhost}}/pattern/{{pattern}}")(leaderless_in_vhost)
    r.route("GET", f"{HEALTH}/reached-target-cluster-size", public=True)(
        reached_target_cluster_size
    )
    r.route("GET", "/api/aliveness-test/{vhost}")(aliveness)
    r.route("GET", "/api/healthchecks/node")(node_health)
    r.route("GET", "/api/healthchecks/node/{node}")(node_health)


def _ok(**extra: Any) -> web.Response:
    return json_response({"status": "ok", **extra})


def failed(ctx: Ctx, reason: str, **extra: Any) -> web.Response:
    """RabbitMQ's 503 for a failed check, logged (a probe's failures explain themselves)."""
    log.warning("health check %s failed: %s", ctx.request.path, reason)
    return json_response({"status": "failed", "reason": reason, **extra}, 503)


# -- alarms --------------------------------------------------------------------------------


def _alarm_maps(ctx: Ctx) -> list[dict[str, str]]:
    return [
        {"node": node_name(), "resource": _ALARM_RESOURCES[r]}
        for r in ("memory", "disk")
        if r in ctx.node.alarms
    ]


async def alarms(ctx: Ctx) -> web.StreamResponse:
    raised = _alarm_maps(ctx)
    if raised:
        return failed(ctx, "There are alarms in effect in the cluster", alarms=raised)
    return _ok()


async def local_alarms(ctx: Ctx) -> web.StreamResponse:
    raised = _alarm_maps(ctx)
    if raised:
        return failed(ctx, "There are alarms in effect on the node", alarms=raised)
    return _ok()


# -- certificates --------------------------------------------------------------------------


def _tls_listeners(ctx: Ctx) -> list[tuple[str, str, int]]:
    """(protocol, interface, port) of every TLS port bound."""
    out = []
    for lst in ctx.node.listeners:
        port = getattr(lst, "tls_port", 0)
        if port:
            out.append((_TLS_NAMES.get(lst.name, lst.name + "/ssl"), getattr(lst, "bind", ""), port))
    return out


def _stamp(seconds: float) -> str:
    """RabbitMQ's way of writing a date: ``2027-01-05 9:03:07`` (hour not padded)."""
    t = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return f"{t.year}-{t.month:02d}-{t.day:02d} {t.hour}:{t.minute:02d}:{t.second:02d}"


def _expiring(path: str | None, now_s: float, deadline: float) -> list[str] | dict[str, str]:
    """The expiry dates of ``path``'s certificates that fall before ``deadline``
    (``[]``: none, or no file); a file that cannot be read or holds no certificate
    is RabbitMQ's ``{"error": ...}``."""
    if not path:
        return []
    from cryptography import x509  # noqa: PLC0415 - only when a TLS port is checked

    try:
        pem = Path(path).read_bytes()
        certs = x509.load_pem_x509_certificates(pem)
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc.strerror}"}
    except ValueError:
        return {"error": "The certificate file provided does not contain any PEM entry."}
    out = []
    for cert in certs:
        if cert.not_valid_before_utc.timestamp() > now_s:
            return {"error": "Certificate is not yet valid"}
        expires = cert.not_valid_after_utc.timestamp()
        if expires < deadline:
            out.append(_stamp(expires))
    return out


async def certificate_expiration(ctx: Ctx) -> web.StreamResponse:
    """503 when a TLS listener's certificate (tls_cert) or CA bundle (tls_ca_cert)
    expires within the given time, naming the listeners and the dates."""
    within, unit = ctx.params
    try:
        amount = int(within)
    except ValueError:
        raise bad_request("Invalid expiration value.") from None
    seconds = UNITS.get(unit.lower())
    if seconds is None:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    now_s = ctx.node.clock.now_ms() / 1000
    deadline = now_s + amount * seconds
    config = ctx.node.config
    expiring = []
    for protocol, interface, port in _tls_listeners(ctx):
        cert = _expiring(config.tls_cert, now_s, deadline)
        ca = _expiring(config.tls_ca_cert, now_s, deadline)
        if cert or ca:
            expiring.append(
                {
                    "node": node_name(),
                    "protocol": protocol,
                    "interface": interface,
                    "port": port,
                    "certfile": config.tls_cert,
                    "cacertfile": config.tls_ca_cert,
                    "certfile_expires_on": cert,
                    "cacertfile_expires_on": ca,
                }
            )
    if expiring:
        return failed(ctx, "Certificates expiring", expired=expiring)
    return _ok()


# -- listeners -----------------------------------------------------------------------------


def _bound(ctx: Ctx) -> list[tuple[str, int]]:
    """(protocol, port) of every port this node listens on, TLS ports included."""
    out = []
    for lst in ctx.node.listeners:
        if lst.port:
            out.append((lst.name, lst.port))
        tls_port = getattr(lst, "tls_port", 0)
        if tls_port:
            out.append((_TLS_NAMES.get(lst.name, lst.name + "/ssl"), tls_port))
    return out


async def port_listener(ctx: Ctx) -> web.StreamResponse:
    try:
        port = int(ctx.params[0])
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = [p for _, p in _bound(ctx)]
    if port in ports:
        return _ok(port=port)
    return failed(ctx, "No active listener", missing=port, ports=ports)


def _protocol(name: str) -> str:
    name = name.lower()
    return _PROTOCOL_ALIASES.get(name, name)


async def protocol_listener(ctx: Ctx) -> web.StreamResponse:
    """One protocol (3.10 to 3.13's answer), or several, comma-separated (4.x's
    answer: ``protocols`` listed, ``missing`` a list)."""
    protocols = [name for name, _ in _bound(ctx)]
    if "," in ctx.params[0]:
        wanted = [_protocol(p) for p in ctx.params[0].split(",")]
        missing = [p for p in dict.fromkeys(wanted) if p not in protocols]
        if missing:
            return failed(ctx, "No active listener", missing=missing, protocols=protocols)
        return _ok(protocols=protocols)
    protocol = _protocol(ctx.params[0])
    if protocol in protocols:
        return _ok(protocol=protocol)
    return failed(ctx, "No active listener", missing=protocol, protocols=protocols)


# -- the node ------------------------------------------------------------------------------


async def virtual_hosts(ctx: Ctx) -> web.StreamResponse:
    """Every vhost of a running Warren serves (none is ever stopped alone)."""
    return _ok()


async def node_is_quorum_critical(ctx: Ctx) -> web.StreamResponse:
    """Also node-is-mirror-sync-critical. In a Warren cluster every queue is
    replicated to the in-sync followers and one of them takes over: the node the
    API answers for (the leader; followers pass requests to it) is critical when
    no other node is in sync, for then stopping it leaves no node holding every
    confirmed message, and its durable queues are unavailable until it is back."""
    status = ctx.node.cluster_status
    if status is None:
        return _ok(reason="single node cluster")
    info = status()
    if info.get("role") != "leader" or len(info.get("in_sync_replicas", [])) > 1:
        return _ok()
    queues = [
        {"name": q.name, "virtual_host": v.name, "type": queue_type(q)}
        for v in ctx.node.vhosts.values()
        for q in v.queues.values()
        if q.durable
    ]
    return failed(
        ctx,
        "There are quorum queues that would lose their quorum if the target node is shut down",
        queues=sorted(queues, key=lambda q: (q["virtual_host"], q["name"])),
    )


async def is_in_service(ctx: Ctx) -> web.StreamResponse:
    """The broker is in service while its API answers: the HTTP listener is
    started after the broker has recovered and stopped before it shuts down."""
    return _ok()


def _amqp_ports(ctx: Ctx) -> list[int]:
    return [p for name, p in _bound(ctx) if name in ("amqp", "amqp/ssl")]


async def below_node_connection_limit(ctx: Ctx) -> web.StreamResponse:
    if ctx.node.at_connection_max():
        return failed(ctx, "node connection limit is reached")
    return _ok()


async def ready_to_serve_clients(ctx: Ctx) -> web.StreamResponse:
    if not _amqp_ports(ctx):
        return failed(ctx, "no active listeners for AMQP/AMQPS")
    if ctx.node.at_connection_max():
        return failed(
            ctx, "node connection limit is reached", connections=len(ctx.node.connections)
        )
    return _ok()


async def metadata_store_initialized(ctx: Ctx) -> web.StreamResponse:
    """The definitions are read (RabbitMQ: its metadata store reported ready): the
    HTTP listener starts only once the broker has read its data directory."""
    return _ok()


async def metadata_store_with_data(ctx: Ctx) -> web.StreamResponse:
    """Read, and holding at least one vhost (as RabbitMQ: a cluster without users
    is possible, one without vhosts is not yet set up)."""
    if not ctx.node.vhosts:
        return failed(
            ctx, "Metadata store has not yet been initialized: it reports to have no virtual hosts"
        )
    return _ok()


async def leaderless_in_all_vhosts(ctx: Ctx) -> web.StreamResponse:
    return _leaderless(ctx, None, ctx.params[0] if ctx.params else ".*")


async def leaderless_in_vhost(ctx: Ctx) -> web.StreamResponse:
    """One vhost's (a vhost that does not exist has none: ok, as RabbitMQ)."""
    return _leaderless(ctx, ctx.params[0], ctx.params[1] if len(ctx.params) > 1 else ".*")


def _leaderless(ctx: Ctx, vhost: str | None, pattern: str) -> web.Response:
    """Quorum queues (of every vhost, or of one; their names matching ``pattern``, a
    regular expression, unanchored as RabbitMQ's) without an elected leader. A
    quorum queue's leader is the cluster's (docs/clustering.md): every one has it
    while this node leads, or runs alone; none has while it is no longer the
    leader but its broker still answers (stepping down)."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise bad_request(f"invalid pattern '{pattern}': {exc}") from None
    status = ctx.node.cluster_status
    if status is None or status().get("role") == "leader":
        return _ok()
    queues = [
        {
            "readable_name": f"queue '{q.name}' in vhost '{v.name}'",
            "name": q.name,
            "virtual_host": v.name,
            "type": "rabbit_quorum_queue",
        }
        for v in ctx.node.vhosts.values()
        if vhost is None or v.name == vhost
        for q in v.queues.values()
        if q.queue_type == "quorum" and regex.search(q.name)
    ]
    if not queues:
        return _ok()
    return failed(ctx, "Detected quorum queues without an elected leader", queues=queues)


#: RabbitMQ's answer may not be cached (a probe must see the present).
_NO_CACHE = {
    "Cache-Control": "no-cache, no-store, max-age=0, must-revalidate",
    "Pragma": "no-cache",
    "Expires": "0",
}


async def reached_target_cluster_size(ctx: Ctx) -> web.StreamResponse:
    """As many cluster members as ``[clustering] target_cluster_size_hint`` (RabbitMQ's
    cluster_formation key, 1 unless set): the leader and the followers it knows
    (connected, or in the in-sync replica set). No credentials, as RabbitMQ 4.x."""
    target = ctx.node.config.clustering_target_cluster_size_hint
    status = ctx.node.cluster_status
    online = members = 1
    if status is not None:
        info = status()
        connected = {f.get("node") for f in info.get("followers", ())} - {None, info.get("node")}
        online = 1 + len(connected)
        members = len({info.get("node"), *connected, *info.get("in_sync_replicas", ())})
    if members >= target:
        response = _ok()
    else:
        response = failed(
            ctx,
            f"target cluster size not reached: {online} of {target} nodes are online",
            online=online,
            target=target,
        )
    response.headers.update(_NO_CACHE)
    return response


async def node_health(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ's older, deprecated check (3.10 to 3.13): ok while the node runs;
    another node's name is a 404, as RabbitMQ answers a node it does not know."""
    if ctx.params and ctx.params[0] != node_name():
        raise not_found()
    return _ok()


async def aliveness(ctx: Ctx) -> web.StreamResponse:
    """Declare ``aliveness-test``, publish to it and get the message back, as RabbitMQ."""
    vhost = ctx.vhost(ctx.params[0])
    q = vhost.declare_queue("aliveness-test", durable=False)
    vhost.router.publish(
        vhost.default_exchange,
        Message("", "aliveness-test", EMPTY_PROPERTIES, b"test_message", vhost.clock.now_ms()),
    )
    item = ClientSession(ctx.node, ctx.user).deliveries(vhost.base_stats).pull(q, no_ack=True)
    if item is None or item[1].body != b"test_message":
        return failed(ctx, "no message")
    return _ok()
