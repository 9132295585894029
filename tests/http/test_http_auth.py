"""Who may do what: RabbitMQ's user tags and vhost permissions, as RabbitMQ 3.10.8
answers (an authenticated user it refuses gets 401 ``not_authorised`` too)."""

from __future__ import annotations

import pytest
from conftest import BrokerThread
from httphelp import Api

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api(broker: BrokerThread) -> Api:
    admin = Api(broker.http_port)
    admin.put("/api/vhosts/other")
    for name, tags in (
        ("mgr", "management"),
        ("mon", "monitoring"),
        ("pol", "policymaker"),
        ("none", ""),
    ):
        assert admin.put(f"/api/users/{name}", {"password": "pw", "tags": tags}).status == 201
    for name in ("mgr", "pol"):
        admin.put(f"/api/permissions/%2F/{name}", {"configure": "^mine.*", "write": ".*", "read": ".*"})
    admin.put("/api/queues/%2F/mine.q")
    admin.put("/api/queues/other/theirs")
    return admin


def refused(reply: object, reason: str) -> bool:
    assert reply.status == 401, reply  # type: ignore[attr-defined]
    assert reply.json() == {"error": "not_authorised", "reason": reason}  # type: ignore[attr-defined]
    assert "WWW-Authenticate" not in reply.headers  # type: ignore[attr-defined]
    return True


def test_a_user_without_management_tags_cannot_use_the_api(api: Api) -> None:
    none = api.as_user("none", "pw")
    for path in ("/api/overview", "/api/whoami", "/api/queues"):
        assert refused(none.request("GET", path), "Not management user")


def test_management_users_see_their_vhosts_only(api: Api) -> None:
    mgr = api.as_user("mgr", "pw")
    assert mgr.get("/api/whoami") == {"name": "mgr", "tags": ["management"]}
    assert [v["name"] for v in mgr.get("/api/vhosts")] == ["/"]
    assert [q["name"] for q in mgr.get("/api/queues")] == ["mine.q"]
    assert refused(mgr.request("GET", "/api/queues/other"), "User not authorised to access virtual host")
    assert refused(mgr.request("GET", "/api/users"), "Not administrator user")
    assert refused(mgr.request("GET", "/api/nodes"), "Not monitor user")
    assert refused(mgr.request("GET", "/api/definitions"), "Not administrator user")
    assert refused(mgr.request("GET", "/api/policies"), "Not policymaker user")
    assert refused(mgr.put("/api/vhosts/new"), "Not administrator user")
    # Changes need the AMQP permission on the object's name.
    assert mgr.put("/api/queues/%2F/mine.2").status == 201
    assert refused(mgr.put("/api/queues/%2F/yours"), "Access refused.")
    assert refused(mgr.delete("/api/queues/other/theirs"), "User not authorised to access virtual host")
    assert api.get("/api/queues/other/theirs")["name"] == "theirs"


def test_monitoring_users_see_everything_and_change_nothing(api: Api) -> None:
    mon = api.as_user("mon", "pw")
    assert [v["name"] for v in mon.get("/api/vhosts")] == ["/", "other"]
    assert {q["name"] for q in mon.get("/api/queues")} == {"mine.q", "theirs"}
    assert mon.get("/api/nodes")[0]["running"] is True
    assert "listeners" in mon.get("/api/overview")
    assert refused(mon.put("/api/queues/other/x"), "User not authorised to access virtual host")
    assert refused(mon.request("GET", "/api/users"), "Not administrator user")
    assert refused(mon.delete("/api/vhosts/other"), "Not administrator user")


def test_policymakers_manage_policies_in_their_vhosts(api: Api) -> None:
    pol = api.as_user("pol", "pw")
    body = {"pattern": ".*", "definition": {"max-length": 1}}
    assert pol.put("/api/policies/%2F/p", body).status == 201
    assert [p["name"] for p in pol.get("/api/policies")] == ["p"]
    assert refused(pol.put("/api/policies/other/p", body), "User not authorised to access virtual host")
    assert refused(pol.put("/api/operator-policies/%2F/op", body), "Not administrator user")
    assert refused(api.as_user("mgr", "pw").delete("/api/policies/%2F/p"), "Not policymaker user")
    assert pol.delete("/api/policies/%2F/p").status == 204

