"""What RabbitMQ's own management UI needs from the API, checked at the API level
(tests/ui/test_rabbitmq_ui.py drives the UI itself). Each answer is RabbitMQ
3.10.8's, asked with the same requests (tests/rabbitmq_proc.py, plugins
rabbitmq_management, rabbitmq_federation_management, rabbitmq_shovel_management).
"""

from __future__ import annotations

import pytest
from conftest import BrokerThread
from httphelp import Api

pytestmark = pytest.mark.timeout(60)


def test_auth_settings_are_read_without_credentials(broker: BrokerThread) -> None:
    """The UI's index page reads /api/auth before its login form: a 404 there left
    3.10's UI on luck and breaks later ones."""
    reply = Api(broker.http_port).anonymous().request("GET", "/api/auth")
    assert reply.status == 200, reply
    settings = reply.json()
    assert settings["enable_uaa"] is False and settings["oauth_enabled"] is False
    assert settings["uaa_client_id"] == "" and settings["uaa_location"] == ""


def test_extensions_name_the_ui_scripts(broker: BrokerThread) -> None:
    """The UI's pages are registered by the scripts /api/extensions names
    (dispatcher.js is rabbitmq_management's own): with none, no page opens."""
    names = [e["javascript"] for e in Api(broker.http_port).get("/api/extensions")]
    assert names == ["dispatcher.js", "federation.js", "shovel.js"]


def test_feature_flags(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    flags = api.get("/api/feature-flags")
    assert [f["name"] for f in flags] == [
        "classic_mirrored_queue_version",
        "drop_unroutable_metric",
        "empty_basic_get_metric",
        "implicit_default_bindings",
        "maintenance_mode_status",
        "quorum_queue",
        "stream_queue",
        "user_limits",
        "virtual_host_metadata",
    ]
    quorum = next(f for f in flags if f["name"] == "quorum_queue")
    assert quorum == {
        "name": "quorum_queue",
        "desc": "Support queues of type `quorum`",
        "doc_url": "https://www.rabbitmq.com/quorum-queues.html",
        "state": "enabled",
        "stability": "stable",
        "provided_by": "rabbit",
    }
    assert [f["name"] for f in api.get("/api/feature-flags?sort=name&sort_reverse=true")][0] == (
        "virtual_host_metadata"
    )
    assert api.put("/api/feature-flags/quorum_queue/enable").status == 204
    refused = api.put("/api/feature-flags/no_such_flag/enable")
    assert (refused.status, refused.json()) == (400, {"error": "bad_request", "reason": "unsupported"})
    assert api.request("GET", "/api/feature-flags/quorum_queue/enable").status == 405

    assert api.put("/api/users/ff-monitor", {"password": "p", "tags": "monitoring"}).status == 201
    monitor = api.as_user("ff-monitor", "p")
    for method, path in (("GET", "/api/feature-flags"), ("PUT", "/api/feature-flags/quorum_queue/enable")):
        reply = monitor.request(method, path, {} if method == "PUT" else None)
        assert (reply.status, reply.json()) == (
            401, {"error": "not_authorised", "reason": "Not administrator user"}
        )
