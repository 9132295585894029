"""Exchanges, queues and bindings: listing, declaring, deleting, publishing, getting.

Every change goes through the VHost methods AMQP clients reach, so the same
validation and equivalence rules (and texts) apply; a management user needs
the configure/write/read permission an AMQP client would need.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import quote

from aiohttp import web

from warren.core.codec_errors import DecodeError
from warren.core.commit import NOT_STORED, NotStored
from warren.core.errors import AccessRefused, NotImplemented_
from warren.core.exchange import Binding, Exchange
from warren.core.message import Message
from warren.core.names import strip_cr_lf, to_bytes
from warren.core.properties import BASIC_PROPERTIES, BasicProperties, decode_properties
from warren.core.queue import Queue
from warren.core.session import ClientSession
from warren.core.stats import count_get
from warren.core.users import CONFIGURE, READ, WRITE, UserStore, check_routing_argument
from warren.core.vhost import VHost
from warren.core.vhost_routing import REJECTED_BY_QUEUE
from warren.http import formats
from warren.http.common import (
    ApiError,
    Ctx,
    amqp_table,
    bad_request,
    build,
    flag,
    item_response,
    json_response,
    list_response,
    new_name,
    not_found,
    parse_bool,
    require_keys,
)
from warren.http.state import Router
from warren.json_tables import from_json_table, to_json_table

DEFAULT_EXCHANGE = "amq.default"
_PROPERTY_NAMES = tuple(name for name, _ in BASIC_PROPERTIES)


def register(r: Router) -> None:
    r.route("GET", "/api/exchanges")(list_exchanges)
    r.route("GET", "/api/exchanges/{vhost}")(list_exchanges)
    r.route("GET", "/api/exchanges/{vhost}/{name}")(get_exchange)
    r.route("PUT", "/api/exchanges/{vhost}/{name}")(put_exchange)
    r.route("DELETE", "/api/exchanges/{vhost}/{name}")(delete_exchange)
    r.route("POST", "/api/exchanges/{vhost}/{name}/publish")(publish)
    r.route("GET", "/api/exchanges/{vhost}/{name}/bindings/source")(exchange_bindings_source)
    r.route("GET", "/api/exchanges/{vhost}/{name}/bindings/destination")(
        exchange_bindings_destination
    )
    r.route("GET", "/api/queues")(list_queues)
    r.route("GET", "/api/queues/{vhost}")(list_queues)
    r.route("GET", "/api/queues/{vhost}/{name}")(get_queue)
    r.route("PUT", "/api/queues/{vhost}/{name}")(put_queue)
    r.route("DELETE", "/api/queues/{vhost}/{name}")(delete_queue)
    r.route("DELETE", "/api/queues/{vhost}/{name}/contents")(purge_queue)
    r.route("POST", "/api/queues/{vhost}/{name}/get")(get_messages)
    r.route("GET", "/api/queues/{vhost}/{name}/bindings")(queue_bindings)
    r.route("GET", "/api/bindings")(list_bindings)
    r.route("GET", "/api/bindings/{vhost}")(list_bindings)
    for kind in ("q", "e"):
        r.route("GET", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}")(list_between)
        r.route("POST", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}")(create_binding)
        r.route("GET", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}/{{props}}")(
            get_binding
        )
        r.route("DELETE", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}/{{props}}")(
            delete_binding
        )


def _vhosts(ctx: Ctx) -> list[VHost]:
    """The vhost named in the path (checked), or every vhost the user may see."""
    if ctx.params:
        return [ctx.vhost(ctx.params[0])]
    return [ctx.node.vhosts[n] for n in ctx.vhost_names()]


def _exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE else name


def _exchange(vhost: VHost, name: str) -> Exchange:
    ex = vhost.exchanges.get(_exchange_name(name))
    if ex is None:
        raise not_found()
    return ex


def _queue(vhost: VHost, name: str) -> Queue:
    q = vhost.queues.get(name)
    if q is None:
        raise not_found()
    return q


def _exchange_items(ctx: Ctx) -> Iterator[Exchange]:
    for v in _vhosts(ctx):
        yield from v.exchanges.values()


# -- exchanges --------------------------------------------------------------------------------


async def list_exchanges(ctx: Ctx) -> web.StreamResponse:
    ages, stats = ctx.ages(), ctx.stats_enabled()

    def info(ex: Exchange) -> dict[str, Any]:
        made = formats.exchange_info(ex, ages)
        if not stats:
            made.pop("message_stats", None)
        return made

    items = await build(list(_exchange_items(ctx)), info)
    return await list_response(ctx, items)


async def get_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost(ctx.params[0])
    ex = _exchange(vhost, ctx.params[1])
    info = formats.exchange_info(ex, ctx.ages())
    info["incoming"] = []
    info["outgoing"] = []
    return item_response(ctx, info)


def _vhost_for_put(ctx: Ctx, name: str) -> VHost:
    """RabbitMQ answers a declaration in a missing vhost with 404 vhost_not_found."""
    if name not in ctx.node.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    vhost: VHost = ctx.vhost(name)
    return vhost


async def put_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost_name = ctx.params[0]
    vhost = _vhost_for_put(ctx, vhost_name)
    name = new_name("exchange", strip_cr_lf(ctx.params[1]))  # as AMQP's exchange.declare
    body = await ctx.body()
    type_ = body.get("type", "direct")
    if not isinstance(type_, str):
        raise bad_request("type must be a string")
    ctx.check(vhost_name, CONFIGURE, "exchange", name)
    arguments = amqp_table(body.get("arguments"))
    existed = name in vhost.exchanges
    if not existed:
        check_routing_argument(partial(ctx.check, vhost_name), "exchange", name, arguments)
    # RabbitMQ's defaults are exchange.declare's: not durable.
    vhost.declare_exchange(
        name,
        type_,
        durable=parse_bool(body, "durable", False),
        auto_delete=parse_bool(body, "auto_delete", False),
        internal=parse_bool(body, "internal", False),
        arguments=arguments,
    )
    return web.Response(status=204 if existed else 201)


async def delete_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    _exchange(vhost, name)
    ctx.check(vhost_name, CONFIGURE, "exchange", name)
    vhost.delete_exchange(_exchange_name(name), if_unused=flag(ctx.query.get("if-unused")))
    return web.Response(status=204)


def _properties(props: Any) -> bytes:
    """The basic properties of a published message, as RabbitMQ reads them: keys it
    does not know are ignored, an empty list is no headers, integers must be
    integers (its ``["not_int", key]``)."""
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    fields = {k: v for k, v in props.items() if k in _PROPERTY_NAMES}
    headers = fields.get("headers")
    if headers == []:  # RabbitMQ's empty proplist
        del fields["headers"]
    elif headers is not None:
        if not isinstance(headers, dict):
            raise bad_request("headers must be a JSON object")
        fields["headers"] = from_json_table(headers)
    for key in ("delivery_mode", "priority", "timestamp"):
        if key in fields and (not isinstance(fields[key], int) or isinstance(fields[key], bool)):
            raise bad_request(["not_int", key])
    try:
        return BasicProperties(**fields).encode()
    except (ValueError, TypeError, AttributeError) as exc:
        raise bad_request(f"invalid properties: {exc}") from None


async def publish(ctx: Ctx) -> web.StreamResponse:
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    body = await ctx.body()
    require_keys(body, "routing_key", "properties", "payload", "payload_encoding")
    ex = vhost.exchanges.get(_exchange_name(name))
    if ex is None:  # as RabbitMQ: the AMQP error, as a 400
        raise bad_request(f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost_name}'")
    ctx.check(vhost_name, WRITE, "exchange", ex.name)
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    if encoding == "string":
        raw = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(["not_base64", payload]) from None
    else:
        raise bad_request(["unsupported_encoding", encoding])
    if ex.internal:
        raise ApiError(400, "bad_request", f"cannot publish to internal exchange '{ex.name}'")
    routing_key = new_name("routing_key", str(body["routing_key"]))
    if ex.type == "topic" and ctx.user.topic_permissions:
        # RabbitMQ's publish goes through a channel, which checks the topic
        # permission; its refusal closes that channel: a 400 with the 403.
        variables = {"username": ctx.user.name, "vhost": vhost_name}
        try:
            UserStore.check_topic(ctx.user, vhost_name, ex.name, routing_key, WRITE, variables)
        except AccessRefused as exc:
            raise bad_request(f"{exc.code} {exc.reply_text}") from None
    props = _properties(body["properties"])
    msg = Message(ex.name, routing_key, props, raw, ctx.node.clock.now_ms())
    # What RabbitMQ's management plugin does: publish in confirm mode and answer
    # with the confirm. So "routed" promises what a confirm does: a persistent
    # message in a durable queue is on disk (core/commit.py); one that could
    # not be stored, or that a queue refused, is an error and kept nowhere.
    what = f"management API publish by user '{ctx.user.name}'"
    commit = ClientSession(ctx.node, ctx.user).commit(vhost, what)
    routed = commit.publish(ex, msg)
    stats = vhost.base_stats  # no channel: counted for the vhost, as RabbitMQ does
    stats.publish += 1
    if not routed:
        stats.drop_unroutable += 1
    try:
        await commit.stored()
    except NotStored:
        raise bad_request(f"rejected Unable to publish message: {NOT_STORED}.") from None
    if routed == REJECTED_BY_QUEUE:  # x-overflow reject-publish: RabbitMQ's nack answer
        raise bad_request("rejected Unable to publish message. Check queue limits.")
    return json_response({"routed": routed != 0})


def _bindings_where(vhost: VHost, source: Exchange | None, dest: Any) -> list[dict[str, Any]]:
    out = []
    if source is vhost.default_exchange and isinstance(dest, Queue):
        out.append(formats.default_binding_info(dest))
    exchanges = [source] if source is not None else list(vhost.exchanges.values())
    for ex in exchanges:
        for b in ex.bindings.values():
            if dest is None or b.destination is dest:
                out.append(formats.binding_info(b, vhost.name))
    return out


# The bindings of an exchange or a queue that does not exist are none, not a
# 404: RabbitMQ answers 404 only for a missing vhost (rabbit_mgmt_wm_bindings),
# and a client that lists a super stream's partitions this way (Spark's data
# source) sees the same answer from both.


async def exchange_bindings_source(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost(ctx.params[0])
    ex = vhost.exchanges.get(_exchange_name(ctx.params[1]))
    items = [] if ex is None else [formats.binding_info(b, vhost.name) for b in ex.bindings.values()]
    return await list_response(ctx, items, ())


async def exchange_bindings_destination(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost(ctx.params[0])
    ex = vhost.exchanges.get(_exchange_name(ctx.params[1]))
    items = [] if ex is None else _bindings_where(vhost, None, ex)
    return await list_response(ctx, items, ())


# -- queues ---------------------------------------------------------------------------------


async def list_queues(ctx: Ctx) -> web.StreamResponse:
    queues = [q for v in _vhosts(ctx) for q in v.queues.values()]
    members = formats.replicas(ctx.node.cluster_status)
    items = await build(
        queues,
        partial(
            formats.queue_info, ages=ctx.ages(), stats=ctx.stats_enabled(), replica_info=members
        ),
    )
    return await list_response(ctx, items)


async def get_queue(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost(ctx.params[0])
    q = _queue(vhost, ctx.params[1])
    info = formats.queue_info(
        q, ctx.ages(), replica_info=formats.replicas(ctx.node.cluster_status)
    )
    owner = q.exclusive_owner
    if owner is not None and hasattr(owner, "info"):  # the connection, as RabbitMQ names it
        held = owner.info()
        if held:
            info["owner_pid_details"] = {
                key: held.get(key) for key in ("name", "peer_host", "peer_port")
            }
    info["consumer_details"] = [c for c in _consumers_of(ctx, q)]
    info["incoming"] = []
    info["deliveries"] = []
    return item_response(ctx, info)


def _consumers_of(ctx: Ctx, q: Queue) -> list[dict[str, Any]]:
    if not q.consumers:
        return []
    return [
        consumer
        for conn in ctx.node.connections
        for ch in conn.channels_info()
        for consumer in ch.get("consumer_details", [])
        if consumer["queue"] == {"name": q.name, "vhost": q.vhost.name}
    ]


async def put_queue(ctx: Ctx) -> web.StreamResponse:
    vhost_name = ctx.params[0]
    vhost = _vhost_for_put(ctx, vhost_name)
    name = new_name("queue", strip_cr_lf(ctx.params[1]))  # as AMQP's queue.declare
    body = await ctx.body()
    ctx.check(vhost_name, CONFIGURE, "queue", name)
    arguments = amqp_table(body.get("arguments"))
    qtype = body.get("type")
    if isinstance(qtype, str) and qtype and "x-queue-type" not in arguments:
        arguments["x-queue-type"] = qtype
    # RabbitMQ's defaults are queue.declare's: no body makes a transient queue.
    durable = parse_bool(body, "durable", False)
    auto_delete = parse_bool(body, "auto_delete", False)
    if vhost.default_queue_type is not None:
        # RabbitMQ 3.13 declares through a channel, which applies the vhost's default.
        arguments = vhost.metadata.with_default_type(durable, False, auto_delete, arguments)
    elif arguments.get("x-queue-type") == "classic":
        # RabbitMQ's default type, not an argument a classic queue keeps.
        arguments.pop("x-queue-type")
    existed = name in vhost.queues
    if not existed:
        check_routing_argument(partial(ctx.check, vhost_name), "queue", name, arguments)
    vhost.declare_queue(name, durable=durable, auto_delete=auto_delete, arguments=arguments)
    return web.Response(status=204 if existed else 201)


async def delete_queue(ctx: Ctx) -> web.StreamResponse:
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    _queue(vhost, name)
    ctx.check(vhost_name, CONFIGURE, "queue", name)
    try:
        vhost.delete_queue(
            name,
            if_unused=flag(ctx.query.get("if-unused")),
            if_empty=flag(ctx.query.get("if-empty")),
        )
    except NotImplemented_ as exc:  # a quorum queue's if-unused: RabbitMQ's text alone
        raise bad_request(exc.text) from None
    return web.Response(status=204)


async def purge_queue(ctx: Ctx) -> web.StreamResponse:
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    q = _queue(vhost, name)
    ctx.check(vhost_name, READ, "queue", name)
    q.purge()
    return web.Response(status=204)


_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


def _payload(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    if truncate is not None:
        body = body[:truncate]
    if encoding == "auto":
        try:
            return body.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), "base64"


def _properties_json(raw: bytes) -> dict[str, Any]:
    try:
        props = decode_properties(raw)
    except DecodeError:
        return {}
    out: dict[str, Any] = {}
    for name in _PROPERTY_NAMES:
        value = getattr(props, name)
        if value is not None:
            out[name] = to_json_table(value) if name == "headers" else value
    return out


def _integer(value: Any) -> int:
    """An integer or a string of one, as RabbitMQ takes ``count`` and ``truncate``;
    else its 400 ``["not_integer", value]``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise bad_request(["not_integer", value])


async def get_messages(ctx: Ctx) -> web.StreamResponse:
    """Take up to ``count`` messages; requeued ones go back after all are taken,
    so one request never returns the same message twice (as RabbitMQ)."""
    vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    q = _queue(vhost, name)
    body = await ctx.body()
    require_keys(body, "ackmode", "count", "encoding")
    ctx.check(vhost_name, READ, "queue", name)
    ackmode, encoding = body["ackmode"], body["encoding"]
    if ackmode not in _ACKMODES:
        raise bad_request(f"Invalid ackmode: {ackmode}")
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    count = _integer(body["count"])
    truncate = _integer(body["truncate"]) if body.get("truncate") not in (None, "") else None
    requeue = ackmode.endswith("requeue_true")
    no_ack = ackmode == "ack_requeue_false"
    # A delivery stream of the requester's session (core/deliveries.py): what
    # is taken stays unsettled until all are taken, then goes back or is
    # dropped; should the request fail half way, its close puts it all back.
    deliveries = ClientSession(ctx.node, ctx.user).deliveries(vhost.base_stats)
    taken = 0
    out: list[dict[str, Any]] = []
    try:
        for _ in range(max(0, count)):
            item = deliveries.pull(q, no_ack)
            if item is None:
                if not out:
                    vhost.base_stats.get_empty += 1
                    q.stats.get_empty += 1
                break
            _tag, msg, redelivered = item
            count_get(vhost.base_stats, q.stats, no_ack, redelivered)
            if not no_ack:
                taken += 1
            payload, used = _payload(msg.body, encoding, truncate)
            out.append(
                {
                    "payload_bytes": len(msg.body),
                    "redelivered": redelivered,
                    "exchange": msg.exchange,
                    "routing_key": msg.routing_key,
                    "message_count": 0,
                    "properties": _properties_json(msg.properties),
                    "payload": payload,
                    "payload_encoding": used,
                }
            )
        if requeue:
            deliveries.recover()
        else:  # dropped: dead-lettered where the queue says so
            deliveries.reject(0, True, requeue=False, explicit=False)
    finally:
        deliveries.close()
    # What was left in the queue after each get, as RabbitMQ reports it.
    base = q.message_count - (taken if requeue else 0)
    for i, entry in enumerate(out):
        entry["message_count"] = base + len(out) - i - 1
    return json_response(out)


async def queue_bindings(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost(ctx.params[0])
    q = vhost.queues.get(ctx.params[1])
    if q is None:
        items = [formats.implicit_binding_info(vhost.name, ctx.params[1])]
    else:
        items = [formats.default_binding_info(q)] + _bindings_where(vhost, None, q)
    return await list_response(ctx, items, ())


# -- bindings -------------------------------------------------------------------------------


def _binding_info(vhost: str, binding: Binding) -> dict[str, Any]:
    return formats.binding_info(binding, vhost)


async def list_bindings(ctx: Ctx) -> web.StreamResponse:
    items: list[dict[str, Any]] = []
    for v in _vhosts(ctx):
        items.extend(await build(v.queues.values(), formats.default_binding_info))
        bindings = [b for ex in v.exchanges.values() for b in ex.bindings.values()]
        items.extend(await build(bindings, partial(_binding_info, v.name)))
    # RabbitMQ's order: by vhost, source (the default exchange's first), destination, key.
    return await list_response(ctx, items, ("vhost", "source", "destination", "routing_key"))


def _ends(ctx: Ctx) -> tuple[VHost, Exchange, Queue | Exchange, str]:
    """The vhost, source, destination and destination kind (``q``/``e``) a binding
    path names; a missing end is RabbitMQ's 404 ``no exchange 'x' in vhost 'v'``."""
    vhost = ctx.vhost(ctx.params[0])
    kind = ctx.request.raw_path.split("?", 1)[0].strip("/").split("/")[5]
    source_name, dest_name = _exchange_name(ctx.params[1]), ctx.params[2]
    source = vhost.exchanges.get(source_name)
    if source is None:
        raise ApiError(404, "not_found", f"no exchange '{ctx.params[1]}' in vhost '{vhost.name}'")
    dest: Queue | Exchange | None = (
        vhost.queues.get(dest_name) if kind == "q" else vhost.exchanges.get(dest_name)
    )
    if dest is None:
        what = "queue" if kind == "q" else "exchange"
        raise ApiError(404, "not_found", f"no {what} '{dest_name}' in vhost '{vhost.name}'")
    return vhost, source, dest, kind


async def list_between(ctx: Ctx) -> web.StreamResponse:
    try:
        vhost, source, dest, _ = _ends(ctx)
    except ApiError as exc:
        if exc.error != "not_found":
            raise
        return json_response([])  # as RabbitMQ: no such end, no bindings
    return await list_response(ctx, _bindings_where(vhost, source, dest), ())


async def create_binding(ctx: Ctx) -> web.StreamResponse:
    vhost, source, dest, kind = _ends(ctx)
    body = await ctx.body()
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string and arguments an object")
    new_name("routing_key", routing_key)
    arguments = amqp_table(body.get("arguments"))
    ctx.check(vhost.name, WRITE, "queue" if kind == "q" else "exchange", dest.name)
    ctx.check(vhost.name, READ, "exchange", source.name)
    if kind == "q":  # the core's queue.bind (its exclusivity aside: no connection)
        binding = vhost.bind_queue(source.name, dest.name, routing_key, arguments, None)
    else:
        binding = vhost.bind(source, dest, routing_key, arguments)
    props = formats.properties_key(binding.routing_key, binding.arguments)
    location = f"{quote(to_bytes(dest.name), safe='')}/{quote(props, safe='~')}"
    return web.Response(status=201, headers={"Location": location})


def _find(ctx: Ctx) -> tuple[VHost, dict[str, Any], Any]:
    vhost, source, dest, _ = _ends(ctx)
    props = ctx.params[3]
    for b in source.bindings.values():
        if b.destination is dest and formats.properties_key(b.routing_key, b.arguments) == props:
            return vhost, formats.binding_info(b, vhost.name), b
    if source is vhost.default_exchange and isinstance(dest, Queue) and props == dest.name:
        return vhost, formats.default_binding_info(dest), None
    raise not_found()


async def get_binding(ctx: Ctx) -> web.StreamResponse:
    _, info, _ = _find(ctx)
    return item_response(ctx, info)


async def delete_binding(ctx: Ctx) -> web.StreamResponse:
    vhost, info, binding = _find(ctx)
    if binding is None:
        raise ApiError(401, "not_authorised", "Access refused.")
    kind = "queue" if info["destination_type"] == "queue" else "exchange"
    ctx.check(vhost.name, WRITE, kind, info["destination"])
    ctx.check(vhost.name, READ, "exchange", info["source"])
    vhost.unbind(binding.source, binding.destination, binding.routing_key, binding.arguments)
    return web.Response(status=204)
