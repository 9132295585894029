"""/api/definitions: RabbitMQ's definitions export and import, node-wide or per vhost.

The core's part is definitions_import.py and definitions_export.py (topic
permissions included); this adds what only the API keeps (vhost metadata,
global parameters, in mgmt.json) and applies an import step by step, giving
the loop back every SLICE objects.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.web_request import FileField

from warren.definitions_document import DefinitionsError
from warren.definitions_export import export_definitions
from warren.definitions_import import import_steps
from warren.http.bodies import TOO_LARGE, check_announced, parse_json, read_body
from warren.http.common import ADMIN, SLICE, ApiError, Ctx, bad_request, json_response, parse_tags
from warren.http.state import ApiState, Router

NO_CONTENT = 204


def register(r: Router) -> None:
    r.route("GET", "/api/definitions")(get_definitions)
    r.route("POST", "/api/definitions")(post_definitions)
    r.route("GET", "/api/definitions/{vhost}")(get_vhost_definitions)
    r.route("POST", "/api/definitions/{vhost}")(post_vhost_definitions)


# -- definitions ---------------------------------------------------------------------------


def _attachment(ctx: Ctx, response: web.Response) -> web.Response:
    if ctx.query.get("download"):
        response.headers["Content-Disposition"] = (
            f'attachment; filename="{ctx.query["download"]}"'
        )
    return response


_POLICY_VALUE_KEYS = ("pattern", "definition", "priority", "apply-to")


def management_format(data: dict[str, Any], state: ApiState) -> dict[str, Any]:
    """The core's export (``rabbitmqctl export_definitions``'s format) as the
    management plugin writes it: parameters with RabbitMQ's key order (``value``
    first; an operator policy's value ``pattern``, ``definition``, ``priority``,
    ``apply-to``), queues without ``type``, vhosts with RabbitMQ 3.13's ``name``,
    ``description``, ``tags``, ``default_queue_type`` (when set), ``metadata`` (from
    the API's state and the core's; their limits are the vhost-limits parameters)."""
    vhosts = []
    for v in data["vhosts"]:
        meta = state.vhost_metadata.get(v["name"]) or {"description": "", "tags": []}
        description, tags = meta["description"], list(meta["tags"])
        entry: dict[str, Any] = {"name": v["name"], "description": description, "tags": tags}
        dqt = v["metadata"].get("default_queue_type")
        if dqt is not None:  # RabbitMQ 3.13 leaves it out when not set
            entry["default_queue_type"] = dqt
        entry["metadata"] = {
            **({"default_queue_type": dqt} if dqt is not None else {}),
            "description": description,
            "tags": list(tags),
        }
        vhosts.append(entry)
    parameters = []
    for p in data["parameters"]:
        value = p["value"]
        if p["component"] == "operator_policy" and isinstance(value, dict):
            value = {k: value[k] for k in _POLICY_VALUE_KEYS if k in value}
        parameters.append(
            {"value": value, "vhost": p["vhost"], "component": p["component"], "name": p["name"]}
        )
    queues = [{k: v for k, v in q.items() if k != "type"} for q in data["queues"]]
    return {**data, "vhosts": vhosts, "parameters": parameters, "queues": queues}


async def get_definitions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    # What the core does not keep comes from the API's own state.
    state = ctx.state
    data = management_format(export_definitions(ctx.node), state)
    # RabbitMQ exports its internal_cluster_id too; an import leaves Warren's as it is.
    values = {**state.global_parameters, "internal_cluster_id": ctx.node.cluster_id}
    data["global_parameters"] = [{"name": k, "value": v} for k, v in sorted(values.items())]
    await asyncio.sleep(0)
    return _attachment(ctx, json_response(data))


async def _definitions_body(ctx: Ctx) -> dict[str, Any]:
    """JSON, or the web UI's form upload (field ``file``), within the body limits."""
    request = ctx.request
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        # aiohttp reads the form (within client_max_size); the budget holds what it
        # announces, or all a definitions upload may be when it announces nothing.
        config = ctx.node.config
        check_announced(config, ctx.budget, request)
        length = request.content_length
        ctx.budget.take(request, config.http_max_definitions_size if length is None else length)
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            raise bad_request(TOO_LARGE) from None
        field = form.get("file")
        raw = field.file.read() if isinstance(field, FileField) else field
    else:
        raw = await read_body(ctx.node.config, ctx.budget, request)
    try:
        data = parse_json(raw or b"")
    except ApiError as exc:
        if exc.reason != "not_json":
            raise  # over a limit: the reason says which
        raise bad_request("failed_to_parse_json") from None  # RabbitMQ's reason here
    if not isinstance(data, dict):
        raise bad_request("failed_to_parse_json")
    return data


async def _import(ctx: Ctx, data: dict[str, Any]) -> web.Response:
    """Import with a yield to the loop every SLICE objects (thousands of queues)."""
    try:
        for i, _ in enumerate(import_steps(ctx.node, data), 1):
            if i % SLICE == 0:
                await asyncio.sleep(0)
    except DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    return web.Response(status=NO_CONTENT)


async def post_definitions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    data = await _definitions_body(ctx)
    response = await _import(ctx, data)
    _import_api_state(ctx, data)
    return response


def _import_api_state(ctx: Ctx, data: dict[str, Any]) -> None:
    """The parts of a definitions file the core skips and the API keeps: vhost
    metadata, global parameters (checked loosely: the core import has
    accepted the document)."""
    state = ctx.state
    for v in _records(data, "vhosts"):
        meta: dict[str, Any] = v["metadata"] if isinstance(v.get("metadata"), dict) else v
        if "description" in meta or "tags" in meta:
            tags = meta.get("tags", [])
            state.vhost_metadata[str(v.get("name"))] = {
                "description": str(meta.get("description", "")),
                "tags": parse_tags(tags) if isinstance(tags, str | list) else [],
            }
    for g in _records(data, "global_parameters"):
        name = g.get("name")
        if name == "cluster_name" and isinstance(g.get("value"), str) and g["value"]:
            ctx.node.cluster_name = g["value"]
        elif isinstance(name, str) and name != "internal_cluster_id":
            state.global_parameters[name] = g.get("value")
    state.save()


def _records(data: dict[str, Any], category: str) -> list[dict[str, Any]]:
    items = data.get(category)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


_VHOST_CATEGORIES = ("parameters", "policies", "queues", "exchanges", "bindings")


async def get_vhost_definitions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost = ctx.params[0]
    ctx.vhost(vhost)
    full = management_format(export_definitions(ctx.node), ctx.state)
    data: dict[str, Any] = {"rabbit_version": full["rabbit_version"]}
    for category in _VHOST_CATEGORIES:
        items = [dict(i) for i in full[category] if i.get("vhost") == vhost]
        if category in ("queues", "exchanges", "bindings"):
            for item in items:
                item.pop("vhost", None)
        data[category] = items
    return _attachment(ctx, json_response(data))


async def post_vhost_definitions(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    vhost = ctx.params[0]
    ctx.vhost(vhost)
    data = await _definitions_body(ctx)
    scoped: dict[str, Any] = {}
    for category in _VHOST_CATEGORIES:
        items = data.get(category)
        if isinstance(items, list):
            scoped[category] = [
                {**item, "vhost": vhost} if isinstance(item, dict) else item for item in items
            ]
    return await _import(ctx, scoped)
