"""What every management endpoint shares: errors, auth, request bodies, list options.

Handlers run on the broker's own event loop, so anything proportional to the
number of objects (building, sorting, encoding a listing of 10,000 queues)
goes through the helpers here, which give the loop back every ``SLICE`` items.
"""

from __future__ import annotations

import asyncio
import base64
import re
import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.core.names import MAX_NAME_BYTES, is_valid_utf8, name_problem, too_long
from warren.core.stats import Ages
from warren.core.table_encode import encode_table
from warren.core.users import User
from warren.http.bodies import BodyBudget, parse_json, read_body
from warren.http.replies import (
    ApiError,
    bad_request,
    dumps,
    encode,
    json_response,
    not_authorised,
    not_found,
)
from warren.json_tables import from_json_table

if TYPE_CHECKING:
    from warren.http.state import ApiState
    from warren.node import Node

#: Items handled between two yields to the event loop.
SLICE = 256

MANAGEMENT, MONITORING, POLICYMAKER, ADMIN = "management", "monitoring", "policymaker", "admin"
_LEVEL_TAGS = {
    MANAGEMENT: {"management", "policymaker", "monitoring", "administrator"},
    POLICYMAKER: {"policymaker", "administrator"},
    MONITORING: {"monitoring", "administrator"},
    ADMIN: {"administrator"},
}
_LEVEL_REFUSAL = {
    MANAGEMENT: "Not management user",
    POLICYMAKER: "Not policymaker user",
    MONITORING: "Not monitor user",
    ADMIN: "Not administrator user",
}
REALM = 'Basic realm="RabbitMQ Management"'


async def dumps_list(items: list[Any]) -> str:
    """A long list encoded in slices, yielding in between."""
    if len(items) <= SLICE:
        return dumps(items)
    parts = []
    for start in range(0, len(items), SLICE):
        parts.append(",".join(dumps(item) for item in items[start : start + SLICE]))
        await asyncio.sleep(0)
    return "[" + ",".join(parts) + "]"


# -- the request context ----------------------------------------------------------------------


class Ctx:
    """One authenticated request: the user, the node, the path's parameters."""

    def __init__(
        self,
        request: web.Request,
        node: Node,
        state: ApiState,
        user: User,
        params: list[str],
        budget: BodyBudget,
    ) -> None:
        self.request = request
        self.node = node
        self.state = state
        self.budget = budget
        self.user = user
        self.params = params
        self.tags = set(user.tags)

    @property
    def query(self) -> Any:
        return self.request.query

    def ages(self) -> Ages:
        """The history the request asks for: each of RabbitMQ's four ranges
        (``lengths``, ``msg_rates``, ``data_rates``, ``node_stats``) needs both its
        ``_age`` and ``_incr`` as integers (seconds), or it is not asked for; a
        range that is not positive or has over 500 samples is RabbitMQ's 400
        ``Invalid range parameters: age 0, incr 5``."""
        ranges: dict[str, tuple[int, int]] = {}
        for prefix in ("lengths", "msg_rates", "data_rates", "node_stats"):  # RabbitMQ's order
            age = _integer(self.query.get(f"{prefix}_age"))
            incr = _integer(self.query.get(f"{prefix}_incr"))
            if age is None or incr is None:
                ranges[prefix] = (0, 0)
                continue
            if age <= 0 or incr <= 0 or age // incr > MAX_RANGE:
                raise bad_request(f"Invalid range parameters: age {age}, incr {incr}")
            ranges[prefix] = (age, incr)
        return Ages(
            *ranges["msg_rates"],
            *ranges["lengths"],
            *ranges["data_rates"],
            *ranges["node_stats"],
            self.node.stats.history.last_s,  # sampled every round
        )

    def stats_enabled(self) -> bool:
        """False for ``disable_stats=true``: objects without their statistics."""
        return not flag(self.query.get("disable_stats", "false"))

    def is_admin(self) -> bool:
        return "administrator" in self.tags

    def sees_all(self) -> bool:
        """Monitoring users and administrators see every vhost's objects."""
        return bool(self.tags & {"monitoring", "administrator"})

    def require(self, level: str) -> None:
        if not self.tags & _LEVEL_TAGS[level]:
            raise not_authorised(_LEVEL_REFUSAL[level])

    def vhost_names(self) -> list[str]:
        """The vhosts whose objects this user may list, sorted."""
        if self.sees_all():
            return sorted(self.node.vhosts)
        return sorted(v for v in self.node.vhosts if v in self.user.permissions)

    def vhost(self, name: str) -> Any:
        """The vhost (404 when missing), if this user may use it (401 otherwise)."""
        vhost = self.node.vhosts.get(name)
        if vhost is None:
            raise not_found()
        if not self.is_admin() and name not in self.user.permissions:
            raise not_authorised("User not authorised to access virtual host")
        return vhost

    def check(self, vhost: str, kind: str, resource_type: str, name: str) -> None:
        """A configure/write/read permission, as an AMQP client would need it."""
        perm = self.user.permissions.get(vhost)
        if perm is None or not perm.allows(kind, name):
            raise not_authorised("Access refused.")

    async def body(self) -> dict[str, Any]:
        """The JSON object sent (an empty body is ``{}``), read within the body limits
        (bodies.py)."""
        raw = await read_body(self.node.config, self.budget, self.request)
        data = parse_json(raw)
        if not isinstance(data, dict):
            raise bad_request("not_json")
        return data


def new_name(kind: str, name: str) -> str:
    """``name`` for a new ``kind`` (queue, exchange, vhost, user, policy, parameter,
    routing_key); 400 when it is not UTF-8 or is over 255 bytes (core/names.py)."""
    if not is_valid_utf8(name):
        raise bad_request(name_problem(kind, name))
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        # RabbitMQ's words for a long queue name end with a newline, so these do.
        raise bad_request(too_long(kind, size) + "\n")
    return name


def amqp_table(value: Any, what: str = "arguments") -> dict[str, Any]:
    """JSON ``arguments`` (or headers) as the AMQP table a client would have sent;
    400 when they are not an object, or could not be stored or sent (nested deeper
    than AMQP allows, a number no field type holds, a key over 255 bytes)."""
    if not value:  # null, [], "" as no arguments (RabbitMQ's empty proplist is [])
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{what} must be a JSON object")
    table = from_json_table(value)
    try:
        encode_table(table)
    except (ValueError, TypeError, struct.error) as exc:
        raise bad_request(f"invalid {what}: {exc}") from None
    return table


def require_keys(body: dict[str, Any], *keys: str) -> None:
    """RabbitMQ's 400 for missing keys: ``[{key_missing,write},{key_missing,read}]``."""
    missing = [f"{{key_missing,{k}}}" for k in keys if k not in body]
    if missing:
        # Erlang's ~p: one line when it fits in 80 columns, else one term a line.
        line = "[" + ",".join(missing) + "]"
        raise bad_request(line if len(line) <= 80 else "[" + ",\n ".join(missing) + "]")


def parse_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    """A body's boolean as RabbitMQ takes it: ``true``/``false`` or the strings
    ``"true"``/``"false"``; anything else is its 400 ``["not_boolean", value]``."""
    value = body.get(key, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise bad_request(["not_boolean", value])


def parse_tags(value: Any) -> list[str]:
    """Tags as a list or RabbitMQ's comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a string or a list of strings")


def flag(value: Any) -> bool:
    """A JSON or form boolean (``true``, ``"true"``)."""
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        text = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep else None


# -- list options: filtering, sorting, columns, pagination ---------------------------------

MAX_PAGE_SIZE = 500
#: The most samples one history answer may ask for (RabbitMQ's ?MAX_RANGE).
MAX_RANGE = 500
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _integer(value: str | None) -> int | None:
    """A query integer as Erlang's list_to_integer reads it (None otherwise)."""
    if value is None or not _INTEGER.fullmatch(value):
        return None
    return int(value)


def _get_path(item: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(item, dict):
            return None
        item = item.get(key)
    return item


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, dumps(value))


def _pagination(query: Any) -> tuple[int, int]:
    """``page`` and ``page_size`` (100 unless given), or RabbitMQ's 400s: a number
    it cannot read, or one out of range (``page size undefined`` when none was
    given)."""
    size_arg = query.get("page_size")
    try:
        page = int(query["page"])
        page_size = int(size_arg) if size_arg is not None else 100
    except ValueError:
        raise bad_request("Pagination parameters are invalid") from None
    if page < 1 or page_size < 1 or page_size > MAX_PAGE_SIZE:
        shown = page_size if size_arg is not None else "undefined"
        raise ApiError(
            400,
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, page size {shown}",
        )
    return page, page_size


def _columns(item: dict[str, Any], paths: list[list[str]]) -> dict[str, Any]:
    """The dotted ``paths`` of ``item``; as RabbitMQ, an object on the way is kept
    (``arguments: {}``) even when the key asked for is not in it, and a column
    inside ``arguments`` (an AMQP table, which RabbitMQ does not look into) gives
    the whole table."""
    out: dict[str, Any] = {}
    for path in paths:
        if len(path) > 1 and path[0] == "arguments" and "arguments" in item:
            out["arguments"] = item["arguments"]
            continue
        source: Any = item
        target = out
        for depth, key in enumerate(path):
            if not isinstance(source, dict) or key not in source:
                break
            source = source[key]
            if depth == len(path) - 1:
                target[key] = source
            else:
                if not isinstance(source, dict):
                    break
                target = target.setdefault(key, {})
    return out


async def build(items: Iterable[Any], make: Callable[[Any], dict[str, Any] | None]) -> list[Any]:
    """``make`` applied to every item (None results dropped), yielding every SLICE."""
    out = []
    for i, item in enumerate(items, 1):
        made = make(item)
        if made is not None:
            out.append(made)
        if i % SLICE == 0:
            await asyncio.sleep(0)
    return out


async def list_response(
    ctx: Ctx, items: list[dict[str, Any]], default_sort: tuple[str, ...] = ("vhost", "name")
) -> web.Response:
    """A listing with RabbitMQ's query options: ``sort``/``sort_reverse`` (dotted),
    ``columns`` (dotted, comma-separated), and pagination (``page``, ``page_size``,
    ``name``, ``use_regex``) answered in the ``{"items": ..., "page": ...}`` shape."""
    query = ctx.query
    total = len(items)
    page_arg = query.get("page")
    if page_arg is not None:
        page, page_size = _pagination(query)
        name = query.get("name", "")
        if name:
            if flag(query.get("use_regex", "false")):
                try:
                    pattern = re.compile(name)
                except re.error:  # RabbitMQ's words for any unusable parameter
                    raise bad_request("Pagination parameters are invalid") from None
                items = [i for i in items if pattern.search(str(i.get("name", "")))]
            else:
                lowered = name.lower()
                items = [i for i in items if lowered in str(i.get("name", "")).lower()]
    sort = query.get("sort")
    paths = [s.split(".") for s in sort.split(",") if s] if sort else None
    if paths is None and default_sort and items and all(k in items[0] for k in default_sort):
        paths = [[k] for k in default_sort]
    if paths:
        items = sorted(items, key=lambda i: tuple(_sort_key(_get_path(i, p)) for p in paths))
        await asyncio.sleep(0)
    if flag(query.get("sort_reverse", "false")):
        items = list(reversed(items))
    if page_arg is not None:
        filtered = len(items)
        page_count = max(1, -(-filtered // page_size))
        if page > page_count:
            raise ApiError(
                400,
                "page_out_of_range",
                f"Page out of range, page: {page} page size: {page_size}, len: {filtered}",
            )
        items = items[(page - 1) * page_size : page * page_size]
    columns = query.get("columns")
    if columns:
        col_paths = [c.split(".") for c in columns.split(",") if c]
        items = await build(items, lambda i: _columns(i, col_paths))
    if page_arg is not None:
        return json_response(
            {
                "filtered_count": filtered,
                "item_count": len(items),
                "items": items,
                "page": page,
                "page_count": page_count,
                "page_size": page_size,
                "total_count": total,
            }
        )
    return web.Response(body=encode(await dumps_list(items)), content_type="application/json")


def item_response(ctx: Ctx, item: dict[str, Any]) -> web.Response:
    columns = ctx.query.get("columns")
    if columns:
        item = _columns(item, [c.split(".") for c in columns.split(",") if c])
    return json_response(item)
