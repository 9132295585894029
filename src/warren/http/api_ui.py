"""What RabbitMQ's own management UI reads besides the objects: its login
settings (/api/auth, answered by ui_oauth.py), its extensions (/api/extensions) and the feature flags
page (/api/feature-flags). With these, RabbitMQ's UI pointed at Warren's API
works page for page (tests/ui/test_rabbitmq_ui.py, docs/http-api.md)."""

from __future__ import annotations

from aiohttp import web

from warren.http.common import ADMIN, Ctx, bad_request, list_response
from warren.http.replies import json_response
from warren.http.state import Router

NO_CONTENT = 204

#: RabbitMQ's /api/auth with no OAuth 2 login set up (http/ui_oauth.py answers it):
#: 3.10's UI reads ``enable_uaa``, 3.11 and later UIs ``oauth_enabled``; either
#: way, the login form.
AUTH_SETTINGS = {"enable_uaa": False, "uaa_client_id": "", "uaa_location": "", "oauth_enabled": False}

#: The UI's scripts for what Warren serves, as RabbitMQ lists them with
#: rabbitmq_management, rabbitmq_federation_management and
#: rabbitmq_shovel_management enabled. The UI starts once each has loaded, so
#: whatever serves its files must serve the federation and shovel plugins' too.
EXTENSIONS = ("dispatcher.js", "federation.js", "shovel.js")

#: RabbitMQ 3.10's feature flags: (name, description, doc_url, provided_by).
#: Warren behaves as a node with every one of them enabled (quorum and stream
#: queues, user limits, vhost metadata, implicit default bindings, the drop and
#: empty-get counters, ...): nothing to switch on.
FEATURE_FLAGS = (
    (
        "classic_mirrored_queue_version",
        "Support setting version for classic mirrored queues",
        "",
        "rabbit",
    ),
    (
        "drop_unroutable_metric",
        "Count unroutable publishes to be dropped in stats",
        "",
        "rabbitmq_management_agent",
    ),
    (
        "empty_basic_get_metric",
        "Count AMQP `basic.get` on empty queues in stats",
        "",
        "rabbitmq_management_agent",
    ),
    (
        "implicit_default_bindings",
        "Default bindings are now implicit, instead of being stored in the database",
        "",
        "rabbit",
    ),
    ("maintenance_mode_status", "Maintenance mode status", "", "rabbit"),
    (
        "quorum_queue",
        "Support queues of type `quorum`",
        "https://www.rabbitmq.com/quorum-queues.html",
        "rabbit",
    ),
    (
        "stream_queue",
        "Support queues of type `stream`",
        "https://www.rabbitmq.com/stream.html",
        "rabbit",
    ),
    ("user_limits", "Configure connection and channel limits for a user", "", "rabbit"),
    ("virtual_host_metadata", "Virtual host metadata (description, tags, etc)", "", "rabbit"),
)


def register(r: Router) -> None:
    r.route("GET", "/api/extensions")(extensions)
    r.route("GET", "/api/feature-flags")(feature_flags)
    r.route("PUT", "/api/feature-flags/{name}/enable")(enable_feature_flag)


async def extensions(ctx: Ctx) -> web.StreamResponse:
    return json_response([{"javascript": name} for name in EXTENSIONS])


async def feature_flags(ctx: Ctx) -> web.StreamResponse:
    ctx.require(ADMIN)
    items = [
        {
            "name": name,
            "desc": desc,
            "doc_url": doc_url,
            "state": "enabled",
            "stability": "stable",
            "provided_by": provided_by,
        }
        for name, desc, doc_url, provided_by in FEATURE_FLAGS
    ]
    return await list_response(ctx, items, ("name",))


async def enable_feature_flag(ctx: Ctx) -> web.StreamResponse:
    """Every flag Warren lists is enabled already; another name is RabbitMQ's 400."""
    ctx.require(ADMIN)
    if ctx.params[0] not in {flag[0] for flag in FEATURE_FLAGS}:
        raise bad_request("unsupported")
    return web.Response(status=NO_CONTENT)
