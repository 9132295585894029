"""Policies, operator policies, vhost and user limits, runtime and global parameters.

Policies and limits are the core's (VHost.set_policy, set_limits: RabbitMQ's
validation and texts; user limits: User.limits, enforced). Other components'
parameters (shovel, ...) go to the broker's registered components
(Broker.set_parameter); an unknown component is refused as RabbitMQ refuses it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.core.runtime_parameters import (
    ValidationFailed,
    is_int,
    json_p,
    unrecognised,
    validate_limits,
)
from warren.core.users import USER_LIMIT_KEYS
from warren.core.vhost import VHost
from warren.http import formats
from warren.http.common import (
    ADMIN,
    POLICYMAKER,
    ApiError,
    Ctx,
    bad_request,
    item_response,
    json_response,
    list_response,
    new_name,
    not_found,
    require_keys,
)
from warren.http.state import Router

#: The components whose parameters Warren keeps (they are its policies and limits).
KNOWN_COMPONENTS = ("operator_policy", "vhost-limits")


def register(r: Router) -> None:
    for kind in ("policies", "operator-policies"):
        r.route("GET", f"/api/{kind}")(list_policies)
        r.route("GET", f"/api/{kind}/{{vhost}}")(list_policies)
        r.route("GET", f"/api/{kind}/{{vhost}}/{{name}}")(get_policy)
        r.route("PUT", f"/api/{kind}/{{vhost}}/{{name}}")(put_policy)
        r.route("DELETE", f"/api/{kind}/{{vhost}}/{{name}}")(delete_policy)
    r.route("GET", "/api/vhost-limits")(list_vhost_limits)
    r.route("GET", "/api/vhost-limits/{vhost}")(list_vhost_limits)
    r.route("PUT", "/api/vhost-limits/{vhost}/{name}")(put_vhost_limit)
    r.route("DELETE", "/api/vhost-limits/{vhost}/{name}")(delete_vhost_limit)
    r.route("GET", "/api/user-limits")(list_user_limits)
    r.route("GET", "/api/user-limits/{user}")(list_user_limits)
    r.route("PUT", "/api/user-limits/{user}/{name}")(put_user_limit)
    r.route("DELETE", "/api/user-limits/{user}/{name}")(delete_user_limit)
    r.route("GET", "/api/parameters")(list_parameters)
    r.route("GET", "/api/parameters/{component}")(list_parameters)
    r.route("GET", "/api/parameters/{component}/{vhost}")(list_parameters)
    r.route("GET", "/api/parameters/{component}/{vhost}/{name}")(get_parameter)
    r.route("PUT", "/api/parameters/{component}/{vhost}/{name}")(put_parameter)
    r.route("DELETE", "/api/parameters/{component}/{vhost}/{name}")(delete_parameter)
    r.route("GET", "/api/global-parameters")(list_global)
    r.route("GET", "/api/global-parameters/{name}")(get_global)
    r.route("PUT", "/api/global-parameters/{name}")(put_global)
    r.route("DELETE", "/api/global-parameters/{name}")(delete_global)


def validation_failed(exc: ValidationFailed) -> ApiError:
    """RabbitMQ's 400 for a refused parameter (its text HTML-escaped, as it sends it)."""
    text = str(exc) + "\n"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return bad_request(text)


def _operator(ctx: Ctx) -> bool:
    return "/operator-policies" in ctx.request.raw_path


def _policy_vhosts(ctx: Ctx) -> list[VHost]:
    if ctx.params:
        return [ctx.vhost(ctx.params[0])]
    return [ctx.node.vhosts[n] for n in ctx.vhost_names()]


def _policy_access(ctx: Ctx) -> None:
    ctx.require(ADMIN if _operator(ctx) else POLICYMAKER)


def _policies(vhost: VHost, operator: bool) -> list[Any]:
    return vhost.operator_policies if operator else vhost.policies


async def list_policies(ctx: Ctx) -> web.StreamResponse:
    _policy_access(ctx)
    operator = _operator(ctx)
    items = [
        formats.policy_info(v.name, p) for v in _policy_vhosts(ctx) for p in _policies(v, operator)
    ]
    return await list_response(ctx, items, ())


async def get_policy(ctx: Ctx) -> web.StreamResponse:
    _policy_access(ctx)
    vhost = ctx.vhost(ctx.params[0])
    for p in _policies(vhost, _operator(ctx)):
        if p.name == ctx.params[1]:
            return item_response(ctx, formats.policy_info(vhost.name, p))
    raise not_found()


async def put_policy(ctx: Ctx) -> web.StreamResponse:
    _policy_access(ctx)
    vhost = ctx.vhost(ctx.params[0])
    name = new_name("policy", ctx.params[1])
    body = await ctx.body()
    require_keys(body, "pattern", "definition")
    operator = _operator(ctx)
    existed = any(p.name == name for p in _policies(vhost, operator))
    setter = vhost.set_operator_policy if operator else vhost.set_policy
    try:
        setter(
            name,
            body.get("pattern"),
            body.get("definition"),
            body.get("priority", 0),
            body.get("apply-to", "all"),
        )
    except ValidationFailed as exc:
        # RabbitMQ HTML-escapes a policy's refusal but not an operator policy's.
        raise (bad_request(str(exc) + "\n") if operator else validation_failed(exc)) from None
    return web.Response(status=204 if existed else 201)


async def delete_policy(ctx: Ctx) -> web.StreamResponse:
    _policy_access(ctx)
    vhost = ctx.vhost(ctx.params[0])
    name = ctx.params[1]
    operator = _operator(ctx)
    if not any(p.name == name for p in _policies(vhost, operator)):
        raise not_found()
    if operator:
        vhost.clear_operator_policy(name)
    else:
        vhost.clear_policy(name)
    return web.Response(status=204)


# -- limits -----------------------------------------------------------------------------------


async def list_vhost_limits(ctx: Ctx) -> web.StreamResponse:
    vhosts = _policy_vhosts(ctx)
    # An emptied limits parameter stays, listed as RabbitMQ writes an empty proplist: [].
    items: list[dict[str, Any]] = [
        {"vhost": v.name, "value": dict(v.limits) or []} for v in vhosts if v.has_limits
    ]
    return await list_response(ctx, items, ())


async def put_vhost_limit(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ answers 204 even for a new limit, and its refusal texts here are
    not HTML-escaped (a policy's are)."""
    ctx.require(ADMIN)
    if ctx.params[0] not in ctx.node.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    vhost = ctx.vhost(ctx.params[0])
    body = await ctx.body()
    require_keys(body, "value")
    limits = dict(vhost.limits)
    limits[ctx.params[1]] = body["value"]
    try:
        vhost.set_limits(validate_limits(limits))
    except ValidationFailed as exc:
        raise bad_request(str(exc) + "\n") from None
    return web.Response(status=204)


async def delete_vhost_limit(ctx: Ctx) -> web.StreamResponse:
    """As RabbitMQ: 204 whether or not the limit was set."""
    ctx.require(ADMIN)
    vhost = ctx.vhost(ctx.params[0])
    if ctx.params[1] in vhost.limits:
        vhost.clear_limits(ctx.params[1])
    return web.Response(status=204)


async def list_user_limits(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    users = ctx.node.users.users
    if ctx.params:
        if ctx.params[0] not in users:
            raise not_found()
        users = {ctx.params[0]: users[ctx.params[0]]}
    items = [{"user": u.name, "value": dict(u.limits)} for u in users.values() if u.limits]
    return await list_response(ctx, items, ("user",))


async def put_user_limit(ctx: Ctx) -> web.StreamResponse:
    """Set one limit (the user's others stay), kept in users.json and enforced from
the next connection or channel on."""
    ctx.require(ADMIN)
    user, name = ctx.params
    body = await ctx.body()
    require_keys(body, "value")
    if user not in ctx.node.users.users:
        raise bad_request(["no_such_user", user])
    value: Any = body["value"]
    # RabbitMQ's texts, without the "Validation failed" its vhost limits have.
    if name not in USER_LIMIT_KEYS:
        raise bad_request(unrecognised([(name, value)], "user-limits"))
    if not is_int(value):
        raise bad_request(f"{name} should be a number, actually was {json_p(value)}")
    ctx.node.users.set_limit(user, name, value)
    ctx.node.save_users()
    return web.Response(status=204)


async def delete_user_limit(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    user, name = ctx.params
    if user not in ctx.node.users.users:
        raise not_found()
    if ctx.node.users.clear_limit(user, name):  # as RabbitMQ: 204 when it was not set
        ctx.node.save_users()
    return web.Response(status=204)


# -- runtime parameters -------------------------------------------------------------------------


def _parameters(ctx: Ctx, component: str | None, vhosts: list[VHost]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in vhosts:
        if component in (None, "operator_policy"):
            for p in v.operator_policies:
                value = p.as_json()
                del value["name"]
                out.append(
                    {"value": value, "vhost": v.name, "component": "operator_policy", "name": p.name}
                )
        if component in (None, "vhost-limits") and v.has_limits:
            out.append(
                {"value": dict(v.limits), "vhost": v.name, "component": "vhost-limits", "name": "limits"}
            )
        for comp, name, value in v.parameters.items(component):
            out.append({"value": value, "vhost": v.name, "component": comp, "name": name})
    return out


async def list_parameters(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    component = ctx.params[0] if ctx.params else None
    vhosts = (
        [ctx.vhost(ctx.params[1])]
        if len(ctx.params) > 1
        else [ctx.node.vhosts[n] for n in ctx.vhost_names()]
    )
    return await list_response(ctx, _parameters(ctx, component, vhosts), ())


async def get_parameter(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    component, vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    for item in _parameters(ctx, component, [vhost]):
        if item["name"] == name:
            return item_response(ctx, item)
    raise not_found()


async def put_parameter(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    component, vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    new_name("parameter", name)
    value = (await ctx.body()).get("value")
    created = not any(n == name for _c, n, _v in vhost.parameters.items(component))
    try:
        if component == "vhost-limits" and name == "limits":
            vhost.set_limits(validate_limits(value))
            return web.Response(status=204)
        if component == "operator_policy" and isinstance(value, dict):
            ctx.require(ADMIN)
            vhost.set_operator_policy(
                name,
                value.get("pattern"),
                value.get("definition"),
                value.get("priority", 0),
                value.get("apply-to", "all"),
            )
            return web.Response(status=204)
        ctx.node.set_parameter(vhost.name, component, name, value)
        return web.Response(status=201 if created else 204)
    except ValidationFailed as exc:
        raise validation_failed(exc) from None


async def delete_parameter(ctx: Ctx) -> web.StreamResponse:
    ctx.require(POLICYMAKER)
    component, vhost_name, name = ctx.params
    vhost = ctx.vhost(vhost_name)
    if component == "vhost-limits" and name == "limits" and vhost.has_limits:
        vhost.clear_limits()
        return web.Response(status=204)
    if component == "operator_policy" and any(p.name == name for p in vhost.operator_policies):
        ctx.require(ADMIN)
        vhost.clear_operator_policy(name)
        return web.Response(status=204)
    if ctx.node.clear_parameter(vhost.name, component, name):
        return web.Response(status=204)
    raise not_found()


# -- global parameters ----------------------------------------------------------------------


#: RabbitMQ's global parameter holding the cluster's permanent id (store/cluster_id.py).
CLUSTER_ID = "internal_cluster_id"


def _globals(ctx: Ctx) -> dict[str, Any]:
    return {
        "cluster_name": ctx.node.cluster_name,
        CLUSTER_ID: ctx.node.cluster_id,
        **ctx.state.global_parameters,
    }


def _fixed(name: str) -> None:
    """The cluster's id is made once and never changes (RabbitMQ would take a new
    one here; monitoring that joins on it would lose the cluster's history)."""
    if name == CLUSTER_ID:
        raise bad_request(f"{CLUSTER_ID} is the cluster's permanent id: it cannot be changed")


async def list_global(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    items = [{"name": k, "value": v} for k, v in _globals(ctx).items()]
    return await list_response(ctx, items, ("name",))


async def get_global(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    values = _globals(ctx)
    if ctx.params[0] not in values:
        raise not_found()
    return json_response({"name": ctx.params[0], "value": values[ctx.params[0]]})


async def put_global(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    name = new_name("parameter", ctx.params[0])
    body = await ctx.body()
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    _fixed(name)
    existed = name in _globals(ctx)
    if name == "cluster_name":
        if not isinstance(body["value"], str) or not body["value"]:
            raise bad_request("cluster_name must be a non-empty string")
        ctx.node.cluster_name = body["value"]
    else:
        ctx.state.global_parameters[name] = body["value"]
        ctx.state.save()
    return web.Response(status=204 if existed else 201)


async def delete_global(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    _fixed(ctx.params[0])
    if ctx.state.global_parameters.pop(ctx.params[0], None) is None:
        raise not_found()
    ctx.state.save()
    return web.Response(status=204)
