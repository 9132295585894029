"""The commands of ``warren ctl``: one handler per action, registered with argparse.

Every handler takes a :class:`Context` and returns the exit status. With
``--json`` a handler prints the API's JSON answer (nothing when the API
answered with an empty body, as for most changes); otherwise a table, a
key/value block or one confirmation line.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from warren.ctl.client import EXIT_NOT_FOUND, EXIT_OK, EXIT_SERVER, Client, CtlError, path
from warren.ctl.output import Column, field, render_pairs, render_table

__all__ = ["Context", "LocalUsageError", "register"]

Handler = Callable[["Context"], int]
DEFAULT_EXCHANGE = "(AMQP default)"


class LocalUsageError(Exception):
    """Bad input found before any request (invalid JSON, unreadable file): exit 1."""


class Context:
    def __init__(
        self,
        client: Client,
        args: argparse.Namespace,
        out: TextIO,
        err: TextIO,
        inp: TextIO,
    ) -> None:
        self.client = client
        self.args = args
        self.out = out
        self.err = err
        self.inp = inp

    @property
    def vhost(self) -> str:
        vhost: str = self.args.vhost
        return vhost

    def opt(self, name: str, default: Any) -> Any:
        """An option that only some parsers of a command define (listing options)."""
        return getattr(self.args, name, default)

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def print_json(self, doc: Any) -> None:
        if doc is not None:
            self.out.write(json.dumps(doc, indent=2) + "\n")

    def say(self, message: str) -> None:
        """A confirmation line (table mode only)."""
        if not self.json:
            self.out.write(message + "\n")

    def done(self, answer: Any, message: str) -> int:
        if self.json:
            self.print_json(answer)
        else:
            self.say(message)
        return EXIT_OK


# -- argument helpers ------------------------------------------------------------------------


def json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise LocalUsageError(f"{what} is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise LocalUsageError(f"{what} must be a JSON object, got: {text!r}")
    return value


def _q(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def _in_vhost(ctx: Context) -> str:
    return f"in vhost {_q(ctx.vhost)}"


def _tags(value: Any) -> list[str]:
    """User tags come as a list (RabbitMQ 3.9+) or a comma-separated string."""
    if isinstance(value, list):
        return [str(t) for t in value if str(t)]
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    return []


def _exchange_name(obj: dict[str, Any], key: str = "name") -> str:
    name = obj.get(key)
    return DEFAULT_EXCHANGE if name == "" else str(name or "")


def _read_secret(ctx: Context, prompt: str) -> str:
    """A password not given on the command line: prompted on a terminal, else
    the first line of stdin (so it stays out of the process list)."""
    if ctx.inp.isatty():
        return getpass.getpass(prompt)
    line = ctx.inp.readline()
    if not line:
        raise LocalUsageError("no password given (argument or first line of stdin)")
    return line.rstrip("\r\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


# -- listing ---------------------------------------------------------------------------------


def listing(
    ctx: Context,
    rows: Any,
    columns: Sequence[Column],
    all_vhosts: bool = False,
) -> int:
    """Print a list answer: JSON as is, or a table (``--columns`` picks fields);
    ``--sort``/``--reverse`` order both."""
    sort_key, reverse = ctx.opt("sort", None), ctx.opt("reverse", False)
    if isinstance(rows, list) and sort_key is not None:
        present = [r for r in rows if field(r, sort_key) is not None]
        missing = [r for r in rows if field(r, sort_key) is None]  # last either way
        present.sort(key=lambda r: _sort_value(field(r, sort_key)), reverse=reverse)
        rows = present + missing
    elif isinstance(rows, list) and reverse:
        rows = rows[::-1]
    if ctx.json:
        ctx.print_json(rows)
        return EXIT_OK
    if not isinstance(rows, list):
        raise CtlError("the API answered a listing with something other than a list", EXIT_SERVER)
    picked = ctx.opt("columns", None)
    if picked:
        cols = [Column(name, name) for name in (c.strip() for c in picked.split(",")) if name]
    else:
        cols = list(columns)
        if all_vhosts:
            cols.insert(0, Column("vhost", "vhost"))
    render_table(rows, cols, ctx.out, headers=not ctx.opt("no_headers", False))
    return EXIT_OK


def _sort_value(value: Any) -> tuple[int, Any]:
    """Numbers (in order) before anything else (by its text)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value)
    return (1, value if isinstance(value, str) else json.dumps(value, sort_keys=True))


def _scoped(ctx: Context, resource: str) -> str:
    """``/api/<resource>/<vhost>``, or ``/api/<resource>`` with --all-vhosts."""
    if ctx.opt("all_vhosts", False):
        return path(resource)
    return path(resource, ctx.vhost)


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
    return ctx.done(answer, f"Added vhost {_q(ctx.args.name)}.")


def cmd_vhosts_delete(ctx: Context) -> int:
    answer = ctx.client.delete(path("vhosts", ctx.args.name))
    return ctx.done(answer, f"Deleted vhost {_q(ctx.args.name)}.")


# -- users -----------------------------------------------------------------------------------


def cmd_users_list(ctx: Context) -> int:
    users = ctx.client.get(path("users"))
    return listing(
        ctx, users, [Column("name", "name"), Column("tags", lambda u: _tags(u.get("tags")))]
    )


def cmd_users_add(ctx: Context) -> int:
    password = ctx.args.new_password
    if password is None:
        password = _read_secret(ctx, f"Password for {ctx.args.name}: ")
    body = {"password": password, "tags": ctx.args.tags or ""}
    answer = ctx.client.put(path("users", ctx.args.name), body)
    return ctx.done(answer, f"Added user {_q(ctx.args.name)}.")


def cmd_users_delete(ctx: Context) -> int:
    answer = ctx.client.delete(path("users", ctx.args.name))
    return ctx.done(answer, f"Deleted user {_q(ctx.args.name)}.")


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
            f"the API does not show user {_q(name)}'s password_hash, so the tags cannot "
            "be changed without also changing the password (use users change-password --tags)",
            EXIT_SERVER,
        )
    tags = [t for arg in ctx.args.tags for t in arg.split(",") if t.strip()]
    body: dict[str, Any] = {"password_hash": user["password_hash"], "tags": ",".join(tags)}
    if user.get("hashing_algorithm"):
        body["hashing_algorithm"] = user["hashing_algorithm"]
    answer = ctx.client.put(path("users", name), body)
    shown = ", ".join(tags) if tags else "(none)"
    return ctx.done(answer, f"Set tags of user {_q(name)} to {shown}.")


def cmd_users_change_password(ctx: Context) -> int:
    name = ctx.args.name
    user = _get_user(ctx, name)  # 404 (exit 5) before asking for a password
    password = ctx.args.new_password
    if password is None:
        password = _read_secret(ctx, f"New password for {name}: ")
    tags = ctx.args.tags if ctx.args.tags is not None else ",".join(_tags(user.get("tags")))
    answer = ctx.client.put(path("users", name), {"password": password, "tags": tags})
    return ctx.done(answer, f"Changed the password of user {_q(name)}.")


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
    return ctx.done(answer, f"Set permissions of user {_q(a.target_user)} {_in_vhost(ctx)}.")


def cmd_permissions_clear(ctx: Context) -> int:
    answer = ctx.client.delete(path("permissions", ctx.vhost, ctx.args.target_user))
    return ctx.done(
        answer, f"Cleared permissions of user {_q(ctx.args.target_user)} {_in_vhost(ctx)}."
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
    rows = ctx.client.get(_scoped(ctx, "queues"))
    return listing(ctx, rows, QUEUE_COLUMNS, ctx.opt("all_vhosts", False))


def cmd_queues_declare(ctx: Context) -> int:
    a = ctx.args
    arguments = json_object(a.arguments, "--arguments") if a.arguments else {}
    if a.type:
        arguments["x-queue-type"] = a.type
    body = {"durable": a.durable, "auto_delete": a.auto_delete, "arguments": arguments}
    answer = ctx.client.put(path("queues", ctx.vhost, a.name), body)
    return ctx.done(answer, f"Declared queue {_q(a.name)} {_in_vhost(ctx)}.")


def cmd_queues_delete(ctx: Context) -> int:
    a = ctx.args
    query = {}
    if a.if_unused:
        query["if-unused"] = "true"
    if a.if_empty:
        query["if-empty"] = "true"
    answer = ctx.client.delete(path("queues", ctx.vhost, a.name), query=query or None)
    return ctx.done(answer, f"Deleted queue {_q(a.name)} {_in_vhost(ctx)}.")


def cmd_queues_purge(ctx: Context) -> int:
    answer = ctx.client.delete(path("queues", ctx.vhost, ctx.args.name, "contents"))
    return ctx.done(answer, f"Purged queue {_q(ctx.args.name)} {_in_vhost(ctx)}.")


# -- exchanges -------------------------------------------------------------------------------

EXCHANGE_COLUMNS = [
    Column("name", _exchange_name),
    Column("type", "type"),
    Column("durable", "durable"),
    Column("auto_delete", "auto_delete"),
    Column("internal", "internal"),
    Column("arguments", "arguments"),
]


def cmd_exchanges_list(ctx: Context) -> int:
    rows = ctx.client.get(_scoped(ctx, "exchanges"))
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
    return ctx.done(answer, f"Declared {a.type} exchange {_q(a.name)} {_in_vhost(ctx)}.")


def cmd_exchanges_delete(ctx: Context) -> int:
    a = ctx.args
    query = {"if-unused": "true"} if a.if_unused else None
    answer = ctx.client.delete(path("exchanges", ctx.vhost, a.name), query=query)
    return ctx.done(answer, f"Deleted exchange {_q(a.name)} {_in_vhost(ctx)}.")


# -- bindings --------------------------------------------------------------------------------

BINDING_COLUMNS = [
    Column("source", lambda b: _exchange_name(b, "source")),
    Column("destination", "destination"),
    Column("destination_type", "destination_type"),
    Column("routing_key", "routing_key"),
    Column("arguments", "arguments"),
]


def cmd_bindings_list(ctx: Context) -> int:
    rows = ctx.client.get(_scoped(ctx, "bindings"))
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
        f"from exchange {_q(a.source)} to {a.destination_type} {_q(a.destination)} "
        f"with routing key {_q(a.routing_key)} {_in_vhost(ctx)}"
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
    return ctx.done(answer, f"Closed connection {_q(a.name)}.")


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
    rows = ctx.client.get(_scoped(ctx, "consumers"))
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
    rows = ctx.client.get(_scoped(ctx, "policies"))
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
    return ctx.done(answer, f"Set policy {_q(a.name)} {_in_vhost(ctx)}.")


def cmd_policies_clear(ctx: Context) -> int:
    answer = ctx.client.delete(path("policies", ctx.vhost, ctx.args.name))
    return ctx.done(answer, f"Cleared policy {_q(ctx.args.name)} {_in_vhost(ctx)}.")


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
    scope = f"of vhost {_q(ctx.vhost)}" if ctx.args.vhost_only else "of the broker"
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
    scope = f"into vhost {_q(ctx.vhost)}" if ctx.args.vhost_only else ""
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
    Column("exchange", lambda m: _exchange_name(m, "exchange")),
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


# -- registration ----------------------------------------------------------------------------


GLOBALS_NOTE = (
    "The global options (--url, --user, --password, --vhost, --json, --timeout, --cacert, "
    "--insecure; listed by `warren ctl --help`) may be given here too."
)


def register(resources: Any, common: argparse.ArgumentParser) -> None:
    """Add every resource and action to the ``COMMAND`` sub-parsers."""

    # The listing options may be given to the resource alone (`queues -a`) or to
    # its `list` action; they default to 'not given' (see Context.opt).
    def listing_options(p: argparse.ArgumentParser, scoped: bool) -> None:
        lo = p.add_argument_group("listing options")
        lo.add_argument(
            "--columns",
            metavar="FIELDS",
            default=argparse.SUPPRESS,
            help="comma-separated API fields to show instead of the default columns "
            "(dotted for nested ones, e.g. name,messages,message_stats.publish)",
        )
        lo.add_argument(
            "--no-headers",
            action="store_true",
            default=argparse.SUPPRESS,
            help="leave out the header line",
        )
        lo.add_argument(
            "--sort",
            metavar="FIELD",
            default=argparse.SUPPRESS,
            help="order by this API field (dotted for nested ones), e.g. messages",
        )
        lo.add_argument(
            "--reverse",
            action="store_true",
            default=argparse.SUPPRESS,
            help="reverse the order (largest first with --sort)",
        )
        if scoped:
            lo.add_argument(
                "-a",
                "--all-vhosts",
                action="store_true",
                default=argparse.SUPPRESS,
                help="list every vhost's (adds a vhost column) instead of --vhost's",
            )

    def resource(
        name: str,
        help_text: str,
        list_handler: Handler | None = None,
        list_help: str = "",
        scoped: bool = False,
        list_extra: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> Any:
        """A resource's parser and its actions' group; with a list handler, the
        resource alone lists (taking the list action's options too)."""
        p = resources.add_parser(
            name, help=help_text, description=help_text, parents=[common], epilog=GLOBALS_NOTE
        )
        p.set_defaults(resource_parser=p)
        if list_handler is not None:
            p.set_defaults(handler=list_handler)
            listing_options(p, scoped)
            if list_extra is not None:
                list_extra(p)
        group = p.add_subparsers(dest="action", metavar="ACTION")
        if list_handler is not None:
            lp = action(group, "list", list_handler, list_help)
            listing_options(lp, scoped)
            if list_extra is not None:
                list_extra(lp)
        return group

    def action(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(
            name, help=help_text, description=help_text, parents=[common], epilog=GLOBALS_NOTE
        )
        p.set_defaults(handler=handler)
        return p

    # status
    p = resources.add_parser(
        "status",
        help="broker overview: version, node, object counts, listeners",
        description="Broker overview (GET /api/overview).",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=cmd_status)

    # vhosts
    g = resource("vhosts", "virtual hosts: list, add, delete", cmd_vhosts_list, "list vhosts")
    p = action(g, "add", cmd_vhosts_add, "create a virtual host")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--description")
    p.add_argument("--tags", help="comma-separated")
    p.add_argument("--default-queue-type", metavar="TYPE")
    p = action(g, "delete", cmd_vhosts_delete, "delete a virtual host and everything in it")
    p.add_argument("name", metavar="NAME")

    # users
    g = resource(
        "users",
        "users: list, add, delete, set-tags, change-password",
        cmd_users_list,
        "list users and their tags",
    )
    p = action(g, "add", cmd_users_add, "create (or replace) a user")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "new_password",
        nargs="?",
        metavar="PASSWORD",
        help="omit to be prompted, or to read it from the first line of stdin",
    )
    p.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    p = action(g, "delete", cmd_users_delete, "delete a user")
    p.add_argument("name", metavar="NAME")
    p = action(g, "set-tags", cmd_users_set_tags, "replace a user's tags (none clears them)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("tags", nargs="*", metavar="TAG")
    p = action(g, "change-password", cmd_users_change_password, "set a user's password")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "new_password",
        nargs="?",
        metavar="PASSWORD",
        help="omit to be prompted, or to read it from the first line of stdin",
    )
    p.add_argument("--tags", default=None, help="also replace the tags (default: keep them)")

    # permissions
    def user_filter(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--of-user",
            dest="for_user",
            metavar="USER",
            default=argparse.SUPPRESS,
            help="list this user's permissions in every vhost instead",
        )

    g = resource(
        "permissions",
        "permissions: list, set, clear",
        cmd_permissions_list,
        "list permissions in --vhost",
        scoped=True,
        list_extra=user_filter,
    )
    p = action(g, "set", cmd_permissions_set, "set a user's permissions in --vhost")
    p.add_argument("target_user", metavar="USER")
    p.add_argument("configure", metavar="CONFIGURE", help="regular expression, e.g. '.*'")
    p.add_argument("write", metavar="WRITE", help="regular expression")
    p.add_argument("read", metavar="READ", help="regular expression")
    p = action(g, "clear", cmd_permissions_clear, "remove a user's permissions in --vhost")
    p.add_argument("target_user", metavar="USER")

    # queues
    g = resource(
        "queues",
        "queues: list, declare, delete, purge",
        cmd_queues_list,
        "list queues in --vhost",
        scoped=True,
    )
    p = action(g, "declare", cmd_queues_declare, "declare a queue in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--durable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="survive a broker restart (default: durable)",
    )
    p.add_argument("--auto-delete", action="store_true", help="delete after its last consumer")
    p.add_argument("--type", metavar="TYPE", help="classic, stream, quorum ... (sets x-queue-type)")
    p.add_argument("--arguments", metavar="JSON", help="e.g. '{\"x-max-length\": 1000}'")
    p = action(g, "delete", cmd_queues_delete, "delete a queue")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-unused", action="store_true", help="only if it has no consumers")
    p.add_argument("--if-empty", action="store_true", help="only if it has no messages")
    p = action(g, "purge", cmd_queues_purge, "remove every ready message of a queue")
    p.add_argument("name", metavar="NAME")

    # exchanges
    g = resource(
        "exchanges",
        "exchanges: list, declare, delete",
        cmd_exchanges_list,
        "list exchanges in --vhost",
        scoped=True,
    )
    p = action(g, "declare", cmd_exchanges_declare, "declare an exchange in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "-t", "--type", default="direct", help="direct, fanout, topic, headers ... (default direct)"
    )
    p.add_argument(
        "--durable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="survive a broker restart (default: durable)",
    )
    p.add_argument("--auto-delete", action="store_true", help="delete after its last binding")
    p.add_argument("--internal", action="store_true", help="no direct publishing")
    p.add_argument("--arguments", metavar="JSON", help='e.g. \'{"alternate-exchange": "ae"}\'')
    p = action(g, "delete", cmd_exchanges_delete, "delete an exchange")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-unused", action="store_true", help="only if it has no bindings")

    # bindings
    def binding_filters(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--source",
            metavar="EXCHANGE",
            default=argparse.SUPPRESS,
            help="only this source exchange's",
        )
        p.add_argument(
            "--destination",
            metavar="NAME",
            default=argparse.SUPPRESS,
            help="only those to this destination",
        )

    g = resource(
        "bindings",
        "bindings: list, add, delete",
        cmd_bindings_list,
        "list bindings in --vhost",
        scoped=True,
        list_extra=binding_filters,
    )
    for name, handler, text in (
        ("add", cmd_bindings_add, "bind a queue (or exchange) to an exchange"),
        ("delete", cmd_bindings_delete, "remove a binding"),
    ):
        p = action(g, name, handler, text)
        p.add_argument("source", metavar="SOURCE", help="source exchange")
        p.add_argument("destination", metavar="DESTINATION", help="destination queue (or exchange)")
        p.add_argument("-k", "--routing-key", default="", help="binding key (default empty)")
        p.add_argument(
            "--destination-type",
            choices=("queue", "exchange"),
            default="queue",
            help="default queue",
        )
        p.add_argument("--arguments", metavar="JSON", help="binding arguments (headers exchanges)")

    # connections, channels, consumers
    g = resource(
        "connections",
        "client connections: list, close",
        cmd_connections_list,
        "list client connections (of every vhost)",
    )
    p = action(g, "close", cmd_connections_close, "close a client connection")
    p.add_argument("name", metavar="NAME", help="the connection's name, as listed")
    p.add_argument("--reason", help="told to the client (X-Reason)")
    resource("channels", "channels: list", cmd_channels_list, "list channels (of every vhost)")
    resource(
        "consumers", "consumers: list", cmd_consumers_list, "list consumers in --vhost", scoped=True
    )

    # policies
    g = resource(
        "policies",
        "policies: list, set, clear",
        cmd_policies_list,
        "list policies in --vhost",
        scoped=True,
    )
    p = action(g, "set", cmd_policies_set, "create or replace a policy in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "pattern", metavar="PATTERN", help="regular expression matched against queue/exchange names"
    )
    p.add_argument("definition", metavar="JSON", help="e.g. '{\"max-length\": 1000}'")
    p.add_argument("--priority", type=int, default=0, help="default 0")
    p.add_argument(
        "--apply-to",
        default="all",
        choices=("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams"),
        help="default all",
    )
    p = action(g, "clear", cmd_policies_clear, "remove a policy")
    p.add_argument("name", metavar="NAME")

    # definitions
    g = resource("definitions", "definitions (JSON): export, import")
    p = action(g, "export", cmd_definitions_export, "write the definitions as JSON")
    p.add_argument("file", nargs="?", metavar="FILE", help="default (or -): stdout")
    p.add_argument("--vhost-only", action="store_true", help="only --vhost's definitions")
    p = action(g, "import", cmd_definitions_import, "load definitions from a JSON file")
    p.add_argument("file", metavar="FILE", help="- reads stdin")
    p.add_argument(
        "--vhost-only", action="store_true", help="a single vhost's file, loaded into --vhost"
    )

    # publish, get
    p = resources.add_parser(
        "publish",
        help="publish one message (body from --body or stdin)",
        description="Publish one message through the API (POST /api/exchanges/V/X/publish).",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=cmd_publish)
    p.add_argument("-e", "--exchange", default="", help="default: the default exchange")
    p.add_argument("-k", "--routing-key", default="", help="for the default exchange: the queue")
    p.add_argument("-b", "--body", help="the payload (default: read stdin)")
    p.add_argument("--properties", metavar="JSON", help="e.g. '{\"priority\": 5}'")
    p.add_argument("--persistent", action="store_true", help="delivery_mode 2")
    p.add_argument("--content-type", metavar="TYPE")
    p.add_argument(
        "-H", "--header", action="append", metavar="KEY=VALUE", help="a header (repeatable)"
    )
    p = resources.add_parser(
        "get",
        help="fetch messages from a queue (requeued by default)",
        description="Fetch messages (POST /api/queues/V/Q/get). By default they are "
        "requeued (and so marked redelivered); --ack removes them.",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=cmd_get)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument(
        "-n", "--count", type=_positive_int, default=1, help="at most this many (default 1)"
    )
    p.add_argument("--ack", action="store_true", help="remove them (ackmode ack_requeue_false)")
    p.add_argument(
        "--ackmode",
        default="ack_requeue_true",
        choices=(
            "ack_requeue_true",
            "ack_requeue_false",
            "reject_requeue_true",
            "reject_requeue_false",
        ),
        help="default ack_requeue_true",
    )
    p.add_argument("--encoding", default="auto", choices=("auto", "base64"), help="default auto")
    p.add_argument("--truncate", type=int, metavar="BYTES", help="cut payloads to this size")
    p.add_argument(
        "--body-only",
        action="store_true",
        help="print only the payloads, one per line (base64 ones decoded)",
    )
