"""The actions of ``warren ctl``: one handler per action (registered by parsers.py).

Every handler takes a :class:`Context` and returns the exit status. With
``--json`` a handler prints the API's JSON answer (nothing when the API
answered with an empty body, as for most changes); otherwise a table, a
key/value block or one confirmation line.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from warren.ctl.client import EXIT_NOT_FOUND, EXIT_OK, EXIT_SERVER, CtlError, path
from warren.ctl.context import (
    Context,
    LocalUsageError,
    exchange_name,
    in_vhost,
    json_object,
    listing,
    quoted,
    read_secret,
    scoped,
    tag_list,
)
from warren.ctl.output import Column, render_pairs, render_table

# -- status ----------------------------------------------------------------------------------


def cmd_status(ctx: Context) -> int:
    ov = ctx.client.get(path("overview"))
    if ctx.json:
        ctx.print_json(ov)
        return EXIT_OK
    if not isinstance(ov, dict):
        raise CtlError(
            "the API answered /api/overview with something other than an object", EXIT_SERVER
        )
    product = " ".join(
        str(x)
        for x in (
            ov.get("product_name") or "RabbitMQ",
            ov.get("product_version") or ov.get("rabbitmq_version") or "",
        )
        if x
    )
    totals = ov.get("object_totals") or {}
    queued = ov.get("queue_totals") or {}
    pairs: list[tuple[str, Any]] = [("product", product)]
    for key in ("management_version", "node", "cluster_name", "erlang_version", "python_version"):
        if ov.get(key) not in (None, ""):
            pairs.append((key, ov[key]))
    for key in ("connections", "channels", "exchanges", "queues", "consumers"):
        pairs.append((key, totals.get(key, 0)))
    pairs.append(("messages", queued.get("messages", 0)))
    pairs.append(("messages_ready", queued.get("messages_ready", 0)))
    pairs.append(("messages_unacknowledged", queued.get("messages_unacknowledged", 0)))
    render_pairs(pairs, ctx.out)
    listeners = ov.get("listeners") or []
    if listeners:
        ctx.out.write("\nlisteners\n")
        render_table(
            listeners,
            [
                Column("protocol", "protocol"),
                Column("interface", "ip_address"),
                Column("port", "port"),
                Column("node", "node"),
            ],
            ctx.out,
        )
    return EXIT_OK


# -- cluster ---------------------------------------------------------------------------------


def cmd_cluster_status(ctx: Context) -> int:
    status = ctx.client.get(path("cluster"))
    if ctx.json:
        ctx.print_json(status)
        return EXIT_OK
    if not isinstance(status, dict):
        raise CtlError(
            "the API answered /api/cluster with something other than an object", EXIT_SERVER
        )
    if not status.get("enabled"):
        ctx.out.write("clustering is not enabled on this broker\n")
        return EXIT_OK
    leader = status.get("leader") or {}
    pairs: list[tuple[str, Any]] = [
        ("node", status.get("node")),
        ("role", status.get("role")),
        ("leader", leader.get("id")),
        ("leader amqp", leader.get("amqp")),
        ("replication position", status.get("position")),
        ("in-sync replicas", ", ".join(status.get("in_sync_replicas") or [])),
        ("etcd", ", ".join(status.get("etcd_endpoints") or [])),
    ]
    render_pairs(pairs, ctx.out)
    followers = status.get("followers") or []
    if followers:
        ctx.out.write("\nfollowers\n")
        render_table(
            followers,
            [
                Column("node", "node"),
                Column("address", "address"),
                Column("state", "state"),
                Column("position", "acked_position"),
                Column("lag", "lag_actions"),
                Column("in sync", "in_sync"),
            ],
            ctx.out,
        )
    return EXIT_OK


# -- vhosts ----------------------------------------------------------------------------------

VHOST_COLUMNS = [
    Column("name", "name"),
    Column("description", "description"),
    Column("tags", "tags"),
    Column("messages", "messages"),
    Column("ready", "messages_ready"),
    Column("unacked", "messages_unacknowledged"),
]


def cmd_vhosts_list(ctx: Context) -> int:
    return listing(ctx, ctx.client.get(path("vhosts")), VHOST_COLUMNS)


def cmd_vhosts_add(ctx: Context) -> int:
    body: dict[str, Any] = {}
    if ctx.args.description is not None:
        body["description"] = ctx.args.description
    if ctx.args.tags is not None:
        body["tags"] = ctx.args.tags
    if ctx.args.default_queue_type is not None:
        body["default_queue_type"] = ctx.args.default_queue_type
    answer = ctx.client.put(path("vhosts", ctx.args.name), body)
    return ctx.done(answer, f"Added vhost {quoted(ctx.args.name)}.")


def cmd_vhosts_delete(ctx: Context) -> int:
    answer = ctx.client.delete(path("vhosts", ctx.args.name))
    return ctx.done(answer, f"Deleted vhost {quoted(ctx.args.name)}.")


# -- users -----------------------------------------------------------------------------------


def cmd_users_list(ctx: Context) -> int:
    users = ctx.client.get(path("users"))
    return listing(
        ctx, users, [Column("name", "name"), Column("tags", lambda u: tag_list(u.get("tags")))]
    )


def cmd_users_add(ctx: Context) -> int:
    password = ctx.args.new_password
    if password is None:
        password = read_secret(ctx, f"Password for {ctx.args.name}: ")
    body = {"password": password, "tags": ctx.args.tags or ""}
    answer = ctx.client.put(path("users", ctx.args.name), body)
    return ctx.done(answer, f"Added user {quoted(ctx.args.name)}.")


def cmd_users_delete(ctx: Context) -> int:
    answer = ctx.client.delete(path("users", ctx.args.name))
    return ctx.done(answer, f"Deleted user {quoted(ctx.args.name)}.")


def _get_user(ctx: Context, name: str) -> dict[str, Any]:
    user = ctx.client.get(path("users", name))
    if not isinstance(user, dict):
        raise CtlError(
            f"the API answered GET /api/users/{name} with something other than an object",
            EXIT_SERVER,
        )
    return user


def cmd_users_set_tags(ctx: Context) -> int:
    name = ctx.args.name
    user = _get_user(ctx, name)
    if "password_hash" not in user:
        raise CtlError(
            f"the API does not show user {quoted(name)}'s password_hash, so the tags cannot "
            "be changed without also changing the password (use users change-password --tags)",
            EXIT_SERVER,
        )
    tags = [t for arg in ctx.args.tags for t in arg.split(",") if t.strip()]
    body: dict[str, Any] = {"password_hash": user["password_hash"], "tags": ",".join(tags)}
    if user.get("hashing_algorithm"):
        body["hashing_algorithm"] = user["hashing_algorithm"]
    answer = ctx.client.put(path("users", name), body)
    shown = ", ".join(tags) if tags else "(none)"
    return ctx.done(answer, f"Set tags of user {quoted(name)} to {shown}.")


def cmd_users_change_password(ctx: Context) -> int:
    name = ctx.args.name
    user = _get_user(ctx, name)  # 404 (exit 5) before asking for a password
    password = ctx.args.new_password
    if password is None:
        password = read_secret(ctx, f"New password for {name}: ")
    tags = ctx.args.tags if ctx.args.tags is not None else ",".join(tag_list(user.get("tags")))
    answer = ctx.client.put(path("users", name), {"password": password, "tags": tags})
    return ctx.done(answer, f"Changed the password of user {quoted(name)}.")


# -- permissions -----------------------------------------------------------------------------

PERMISSION_COLUMNS = [
    Column("user", "user"),
    Column("vhost", "vhost"),
    Column("configure", "configure"),
    Column("write", "write"),
    Column("read", "read"),
]


def cmd_permissions_list(ctx: Context) -> int:
    if ctx.opt("for_user", None) is not None:
        api = path("users", ctx.opt("for_user", None), "permissions")
    elif ctx.opt("all_vhosts", False):
        api = path("permissions")
    else:
        api = path("vhosts", ctx.vhost, "permissions")
    return listing(ctx, ctx.client.get(api), PERMISSION_COLUMNS)


def cmd_permissions_set(ctx: Context) -> int:
    a = ctx.args
    body = {"configure": a.configure, "write": a.write, "read": a.read}
    answer = ctx.client.put(path("permissions", ctx.vhost, a.target_user), body)
    return ctx.done(answer, f"Set permissions of user {quoted(a.target_user)} {in_vhost(ctx)}.")


def cmd_permissions_clear(ctx: Context) -> int:
    answer = ctx.client.delete(path("permissions", ctx.vhost, ctx.args.target_user))
    return ctx.done(
        answer, f"Cleared permissions of user {quoted(ctx.args.target_user)} {in_vhost(ctx)}."
    )


# -- queues ----------------------------------------------------------------------------------

QUEUE_COLUMNS = [
    Column("name", "name"),
    Column("type", "type"),
    Column("durable", "durable"),
    Column("auto_delete", "auto_delete"),
    Column("state", "state"),
    Column("messages", "messages"),
    Column("ready", "messages_ready"),
    Column("unacked", "messages_unacknowledged"),
    Column("consumers", "consumers"),
    Column("policy", "policy"),
]


def cmd_queues_list(ctx: Context) -> int:
    rows = ctx.client.get(scoped(ctx, "queues"))
    return listing(ctx, rows, QUEUE_COLUMNS, ctx.opt("all_vhosts", False))


def cmd_queues_declare(ctx: Context) -> int:
    a = ctx.args
    arguments = json_object(a.arguments, "--arguments") if a.arguments else {}
    if a.type:
        arguments["x-queue-type"] = a.type
    body = {"durable": a.durable, "auto_delete": a.auto_delete, "arguments": arguments}
    answer = ctx.client.put(path("queues", ctx.vhost, a.name), body)
    return ctx.done(answer, f"Declared queue {quoted(a.name)} {in_vhost(ctx)}.")


def cmd_queues_delete(ctx: Context) -> int:
    a = ctx.args
    query = {}
    if a.if_unused:
        query["if-unused"] = "true"
    if a.if_empty:
        query["if-empty"] = "true"
    answer = ctx.client.delete(path("queues", ctx.vhost, a.name), query=query or None)
    return ctx.done(answer, f"Deleted queue {quoted(a.name)} {in_vhost(ctx)}.")


def cmd_queues_purge(ctx: Context) -> int:
    answer = ctx.client.delete(path("queues", ctx.vhost, ctx.args.name, "contents"))
    return ctx.done(answer, f"Purged queue {quoted(ctx.args.name)} {in_vhost(ctx)}.")


# -- exchanges -------------------------------------------------------------------------------

EXCHANGE_COLUMNS = [
    Column("name", exchange_name),
    Column("type", "type"),
    Column("durable", "durable"),
    Column("auto_delete", "auto_delete"),
    Column("internal", "internal"),
    Column("arguments", "arguments"),
]


def cmd_exchanges_list(ctx: Context) -> int:
    rows = ctx.client.get(scoped(ctx, "exchanges"))
    return listing(ctx, rows, EXCHANGE_COLUMNS, ctx.opt("all_vhosts", False))


def cmd_exchanges_declare(ctx: Context) -> int:
    a = ctx.args
    body = {
        "type": a.type,
        "durable": a.durable,
        "auto_delete": a.auto_delete,
        "internal": a.internal,
        "arguments": json_object(a.arguments, "--arguments") if a.arguments else {},
    }
    answer = ctx.client.put(path("exchanges", ctx.vhost, a.name), body)
    return ctx.done(answer, f"Declared {a.type} exchange {quoted(a.name)} {in_vhost(ctx)}.")


def cmd_exchanges_delete(ctx: Context) -> int:
    a = ctx.args
    query = {"if-unused": "true"} if a.if_unused else None
    answer = ctx.client.delete(path("exchanges", ctx.vhost, a.name), query=query)
    return ctx.done(answer, f"Deleted exchange {quoted(a.name)} {in_vhost(ctx)}.")


# -- bindings --------------------------------------------------------------------------------

BINDING_COLUMNS = [
    Column("source", lambda b: exchange_name(b, "source")),
    Column("destination", "destination"),
    Column("destination_type", "destination_type"),
    Column("routing_key", "routing_key"),
    Column("arguments", "arguments"),
]


def cmd_bindings_list(ctx: Context) -> int:
    rows = ctx.client.get(scoped(ctx, "bindings"))
    if isinstance(rows, list):
        source, destination = ctx.opt("source", None), ctx.opt("destination", None)
        if source is not None:
            rows = [b for b in rows if b.get("source") == source]
        if destination is not None:
            rows = [b for b in rows if b.get("destination") == destination]
    return listing(ctx, rows, BINDING_COLUMNS, ctx.opt("all_vhosts", False))


def _binding_path(ctx: Context, *extra: str) -> str:
    a = ctx.args
    kind = "q" if a.destination_type == "queue" else "e"
    return path("bindings", ctx.vhost, "e", a.source, kind, a.destination, *extra)


def _describe_binding(ctx: Context) -> str:
    a = ctx.args
    return (
        f"from exchange {quoted(a.source)} to {a.destination_type} {quoted(a.destination)} "
        f"with routing key {quoted(a.routing_key)} {in_vhost(ctx)}"
    )


def cmd_bindings_add(ctx: Context) -> int:
    a = ctx.args
    body = {
        "routing_key": a.routing_key,
        "arguments": json_object(a.arguments, "--arguments") if a.arguments else {},
    }
    answer = ctx.client.post(_binding_path(ctx), body)
    return ctx.done(answer, f"Added binding {_describe_binding(ctx)}.")


def cmd_bindings_delete(ctx: Context) -> int:
    a = ctx.args
    arguments = json_object(a.arguments, "--arguments") if a.arguments else {}
    found = ctx.client.get(_binding_path(ctx))
    match = [
        b
        for b in (found if isinstance(found, list) else [])
        if b.get("routing_key") == a.routing_key and (b.get("arguments") or {}) == arguments
    ]
    if not match:
        raise CtlError(f"no binding {_describe_binding(ctx)}", EXIT_NOT_FOUND, http_status=404)
    key = match[0].get("properties_key")
    if not isinstance(key, str):
        raise CtlError("the API's binding has no properties_key", EXIT_SERVER)
    answer = ctx.client.delete(_binding_path(ctx, key))
    return ctx.done(answer, f"Deleted binding {_describe_binding(ctx)}.")


# -- connections, channels, consumers --------------------------------------------------------


def _peer(c: dict[str, Any]) -> str:
    host, port = c.get("peer_host"), c.get("peer_port")
    if host is None:
        return ""
    host = f"[{host}]" if ":" in str(host) else str(host)
    return f"{host}:{port}" if port is not None else host


CONNECTION_COLUMNS = [
    Column("name", "name"),
    Column("user", "user"),
    Column("vhost", "vhost"),
    Column("peer", _peer),
    Column("protocol", "protocol"),
    Column("channels", "channels"),
    Column("state", "state"),
    Column("client", "client_properties.product"),
]


def cmd_connections_list(ctx: Context) -> int:
    return listing(ctx, ctx.client.get(path("connections")), CONNECTION_COLUMNS)


def cmd_connections_close(ctx: Context) -> int:
    a = ctx.args
    headers = {"X-Reason": a.reason} if a.reason else None
    answer = ctx.client.delete(path("connections", a.name), headers=headers)
    return ctx.done(answer, f"Closed connection {quoted(a.name)}.")


CHANNEL_COLUMNS = [
    Column("name", "name"),
    Column("user", "user"),
    Column("vhost", "vhost"),
    Column("number", "number"),
    Column("consumers", "consumer_count"),
    Column("prefetch", "prefetch_count"),
    Column("unacked", "messages_unacknowledged"),
    Column("confirm", "confirm"),
    Column("transactional", "transactional"),
]


def cmd_channels_list(ctx: Context) -> int:
    return listing(ctx, ctx.client.get(path("channels")), CHANNEL_COLUMNS)


CONSUMER_COLUMNS = [
    Column("queue", "queue.name"),
    Column("consumer_tag", "consumer_tag"),
    Column("channel", "channel_details.name"),
    Column("ack_required", "ack_required"),
    Column("exclusive", "exclusive"),
    Column("prefetch", "prefetch_count"),
    Column("active", "active"),
    Column("arguments", "arguments"),
]


def cmd_consumers_list(ctx: Context) -> int:
    rows = ctx.client.get(scoped(ctx, "consumers"))
    cols = list(CONSUMER_COLUMNS)
    if ctx.opt("all_vhosts", False):  # a consumer's vhost is in its queue's details
        cols.insert(0, Column("vhost", "queue.vhost"))
    return listing(ctx, rows, cols)


# -- policies --------------------------------------------------------------------------------

POLICY_COLUMNS = [
    Column("name", "name"),
    Column("pattern", "pattern"),
    Column("apply_to", "apply-to"),
    Column("priority", "priority"),
    Column("definition", "definition"),
]


def cmd_policies_list(ctx: Context) -> int:
    rows = ctx.client.get(scoped(ctx, "policies"))
    return listing(ctx, rows, POLICY_COLUMNS, ctx.opt("all_vhosts", False))


def cmd_policies_set(ctx: Context) -> int:
    a = ctx.args
    body = {
        "pattern": a.pattern,
        "definition": json_object(a.definition, "the policy definition"),
        "priority": a.priority,
        "apply-to": a.apply_to,
    }
    answer = ctx.client.put(path("policies", ctx.vhost, a.name), body)
    return ctx.done(answer, f"Set policy {quoted(a.name)} {in_vhost(ctx)}.")


def cmd_policies_clear(ctx: Context) -> int:
    answer = ctx.client.delete(path("policies", ctx.vhost, ctx.args.name))
    return ctx.done(answer, f"Cleared policy {quoted(ctx.args.name)} {in_vhost(ctx)}.")


# -- definitions -----------------------------------------------------------------------------


def _definitions_path(ctx: Context) -> str:
    return path("definitions", ctx.vhost) if ctx.args.vhost_only else path("definitions")


def cmd_definitions_export(ctx: Context) -> int:
    doc = ctx.client.get(_definitions_path(ctx))
    text = json.dumps(doc, indent=2) + "\n"
    target = ctx.args.file
    if target in (None, "-"):
        ctx.out.write(text)
        return EXIT_OK
    try:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise LocalUsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    scope = f"of vhost {quoted(ctx.vhost)}" if ctx.args.vhost_only else "of the broker"
    ctx.say(f"Exported the definitions {scope} to {target}.")
    return EXIT_OK


def cmd_definitions_import(ctx: Context) -> int:
    source = ctx.args.file
    try:
        if source == "-":
            text = ctx.inp.read()
        else:
            with open(source, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise LocalUsageError(f"cannot read {source}: {exc.strerror or exc}") from None
    doc = json_object(text, source if source != "-" else "stdin")
    answer = ctx.client.post(_definitions_path(ctx), doc)
    scope = f"into vhost {quoted(ctx.vhost)}" if ctx.args.vhost_only else ""
    return ctx.done(answer, f"Imported the definitions of {source} {scope}".rstrip() + ".")


# -- publish and get -------------------------------------------------------------------------


def _read_body(ctx: Context) -> tuple[str, str]:
    """The payload and its payload_encoding (string, or base64 for binary stdin)."""
    if ctx.args.body is not None:
        return ctx.args.body, "string"
    if ctx.inp.isatty():
        raise LocalUsageError("give the message body with --body or on stdin")
    buffer = getattr(ctx.inp, "buffer", None)
    data: bytes = buffer.read() if buffer is not None else ctx.inp.read().encode()
    try:
        return data.decode("utf-8"), "string"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def cmd_publish(ctx: Context) -> int:
    a = ctx.args
    properties = json_object(a.properties, "--properties") if a.properties else {}
    if a.persistent:
        properties["delivery_mode"] = 2
    if a.content_type:
        properties["content_type"] = a.content_type
    for header in a.header or []:
        key, sep, value = header.partition("=")
        if not sep or not key:
            raise LocalUsageError(f"--header expects KEY=VALUE, got {header!r}")
        properties.setdefault("headers", {})[key] = value
    payload, encoding = _read_body(ctx)
    body = {
        "properties": properties,
        "routing_key": a.routing_key,
        "payload": payload,
        "payload_encoding": encoding,
    }
    exchange = a.exchange or "amq.default"
    answer = ctx.client.post(path("exchanges", ctx.vhost, exchange, "publish"), body)
    if ctx.json:
        ctx.print_json(answer)
        return EXIT_OK
    routed = isinstance(answer, dict) and answer.get("routed")
    if routed:
        ctx.say("Message published and routed.")
    else:
        ctx.say("Message published but NOT routed (no queue matched).")
    return EXIT_OK


GET_COLUMNS = [
    Column("routing_key", "routing_key"),
    Column("exchange", lambda m: exchange_name(m, "exchange")),
    Column("redelivered", "redelivered"),
    Column("remaining", "message_count"),
    Column("bytes", "payload_bytes"),
    Column("encoding", "payload_encoding"),
    Column("payload", "payload"),
]


def cmd_get(ctx: Context) -> int:
    a = ctx.args
    ackmode = "ack_requeue_false" if a.ack else a.ackmode
    body: dict[str, Any] = {"count": a.count, "ackmode": ackmode, "encoding": a.encoding}
    if a.truncate is not None:
        body["truncate"] = a.truncate
    answer = ctx.client.post(path("queues", ctx.vhost, a.queue, "get"), body)
    if a.body_only and not ctx.json:
        for message in answer if isinstance(answer, list) else []:
            payload = message.get("payload", "")
            if message.get("payload_encoding") == "base64":
                data = base64.b64decode(payload)
                buffer = getattr(ctx.out, "buffer", None)
                ctx.out.flush()
                if buffer is not None:
                    buffer.write(data + b"\n")
                    buffer.flush()
                else:
                    ctx.out.write(data.decode("utf-8", "replace") + "\n")
            else:
                ctx.out.write(f"{payload}\n")
        return EXIT_OK
    return listing(ctx, answer, GET_COLUMNS)
