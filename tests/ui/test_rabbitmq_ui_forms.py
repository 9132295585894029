"""RabbitMQ's own management UI against Warren's management API: its forms, each
used through the UI and its effect read back from the API (declare, publish,
get, move, purge and delete a queue; exchanges, bindings and publishing;
users, permissions and topic permissions; policies; vhosts; limits; the
cluster name; closing a connection; definitions export and import; federation
upstreams and shovels). The pages: test_rabbitmq_ui.py; the helpers:
rabbitui.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pika
import pytest
from diskhelp import eventually  # tests/diskhelp.py
from playwright.sync_api import expect

from .conftest import USER
from .helpers import STATS_TIMEOUT
from .rabbitui import BACKLOG, POLICY, Live, P, RabbitUI, api_status, esc

pytestmark = pytest.mark.ui


def test_queue_forms(rui: RabbitUI, live: Live) -> None:
    queue = f"{P}form-{uuid.uuid4().hex[:8]}"
    target = f"{queue}-moved"
    quorum = f"{queue}-quorum"
    page = rui.page
    api = live.ui.api

    def ready(name: str) -> int:
        return int(api("GET", f"/queues/%2F/{esc(name)}").get("messages_ready", -1))
    try:
        api("PUT", f"/queues/%2F/{esc(target)}", {"durable": True})  # where they are moved to
        eventually(lambda: ready(target) == 0)
        # Declare a quorum queue and a classic one (the type's choice redraws the form).
        rui.visit("#/queues")
        for name, kind in ((quorum, "quorum"), (queue, "classic")):
            rui.open_section("Add a new queue").locator("select[name=queuetype]").select_option(kind)
            rui.wait_rendered()
            form = rui.open_section("Add a new queue").locator("form")
            form.locator("input[name=name]").fill(name)
            if kind == "classic":
                form.locator("select[name=durable]").select_option("true")
            form.locator("input[type=submit]").click()
            rui.wait_rendered()
            rui.assert_clean(f"add {kind} queue", text_checked=False)
            q = api("GET", f"/queues/%2F/{esc(name)}")
            assert (q["durable"], q["auto_delete"], q["type"]) == (True, False, kind)
            eventually(lambda n=name: "messages" in api("GET", f"/queues/%2F/{esc(n)}"))
            rui.row(rui.visit("#/queues").locator("table.list"), name)

        # Publish two messages on its page.
        rui.visit(f"#/queues/%2F/{esc(queue)}")
        form = rui.open_section("Publish message").locator("form")
        for body in ("first from the UI", "second from the UI"):
            form.locator("textarea[name=payload]").fill(body)
            form.locator("input[type=submit]").click()
            expect(page.locator(".form-popup-info")).to_contain_text("Message published.")
            page.locator(".form-popup-info span").click()
            expect(page.locator(".form-popup-info")).to_have_count(0)
        rui.assert_clean("publish")
        eventually(lambda: ready(queue) == 2, what="2 published messages ready")

        # Get one, requeued (the form's default).
        form = rui.open_section("Get messages").locator("form")
        form.locator("input[type=submit]").click()
        expect(page.locator("#msg-wrapper")).to_contain_text("first from the UI")
        expect(page.locator("#msg-wrapper")).to_contain_text("Redelivered")
        rui.assert_clean("get")
        eventually(lambda: ready(queue) == 2, what="the message got back (requeued)")

        # Move them to another queue (a shovel that deletes itself when done).
        form = rui.open_section("Move messages").locator("form")
        form.locator("input[name=dest-queue]").fill(target)
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("move messages")
        # The moved queue's page (refreshed every 5 s) shows them.
        rui.visit(f"#/queues/%2F/{esc(target)}")
        expect(rui.facts_cell("Messages")).to_have_text("2", timeout=STATS_TIMEOUT)
        assert ready(target) == 2
        assert ready(queue) == 0

        # Purge it, and delete both.
        rui.open_section("Purge").locator("input[type=submit]").click()
        expect(page.locator(".form-popup-info")).to_contain_text("Queue purged")
        rui.assert_clean("purge")
        eventually(lambda: ready(target) == 0, what="the queue purged")
        for name in (target, queue, quorum):
            rui.visit(f"#/queues/%2F/{esc(name)}")
            rui.open_section("Delete").locator("input[type=submit]").click()
            page.wait_for_function("() => location.hash === '#/queues'")
            rui.wait_rendered()
            rui.assert_clean(f"delete {name}")
            assert api_status(live.ui, f"/queues/%2F/{esc(name)}") == 404
    finally:
        for name in (queue, target, quorum):
            if api_status(live.ui, f"/queues/%2F/{esc(name)}") == 200:
                api("DELETE", f"/queues/%2F/{esc(name)}")


def test_user_permission_and_policy_forms(rui: RabbitUI, live: Live) -> None:
    user = f"{P}user-{uuid.uuid4().hex[:8]}"
    policy = f"{P}form-policy-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    try:
        rui.visit("#/users")
        form = rui.open_section("Add a user").locator("form")
        form.locator("input[name=username]").fill(user)
        form.locator("input[name=password]").fill("s3cret")
        form.locator("input[name=password_confirm]").fill("s3cret")
        form.locator("input[name=tags]").fill("monitoring")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add user")
        assert api("GET", f"/users/{esc(user)}")["tags"] == ["monitoring"]

        rui.visit(f"#/users/{esc(user)}")
        form = rui.open_section("Permissions").locator("form[method=put]")
        form.locator("select[name=vhost]").select_option("/")
        form.locator("input[name=configure]").fill("^rmqui-.*")
        form.locator("input[name=write]").fill(".*")
        form.locator("input[name=read]").fill("^amq\\.")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("set permission")
        perm = api("GET", f"/permissions/%2F/{esc(user)}")
        assert (perm["configure"], perm["write"], perm["read"]) == ("^rmqui-.*", ".*", "^amq\\.")

        rui.visit("#/policies")
        form = rui.open_section("Add / update a policy").locator("form")
        form.locator("input[name=name]").fill(policy)
        form.locator("input[name=pattern]").fill("^rmqui-never$")
        form.locator("select[name=apply-to]").select_option("queues")
        form.locator("input[name=priority]").fill("3")
        form.locator("input[name=definition_1_mfkey]").fill("max-length")
        form.locator("input[name=definition_1_mfvalue]").fill("42")
        form.locator("select[name=definition_1_mftype]").select_option("number")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add policy")
        got = api("GET", f"/policies/%2F/{esc(policy)}")
        assert (got["pattern"], got["apply-to"], got["priority"], got["definition"]) == (
            "^rmqui-never$", "queues", 3, {"max-length": 42}
        )
    finally:
        for path in (f"/users/{esc(user)}", f"/policies/%2F/{esc(policy)}"):
            if api_status(live.ui, path) == 200:
                api("DELETE", path)


def test_exchange_forms(rui: RabbitUI, live: Live) -> None:
    exchange = f"{P}form-x-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    page = rui.page
    try:
        rui.visit("#/exchanges")
        form = rui.open_section("Add a new exchange").locator("form")
        form.locator("input[name=name]").fill(exchange)
        form.locator("select[name=type]").select_option("direct")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add exchange")
        x = api("GET", f"/exchanges/%2F/{esc(exchange)}")
        assert (x["type"], x["durable"], x["internal"]) == ("direct", True, False)

        rui.visit(f"#/exchanges/%2F/{esc(exchange)}")
        form = rui.open_section("Bindings").locator("form[action='#/bindings'][method=post]")
        form.locator("select[name=destination_type]").select_option("q")
        form.locator("input[name=destination]").fill(BACKLOG)
        form.locator("input[name=routing_key]").fill("to-backlog")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("bind")
        bindings = api("GET", f"/exchanges/%2F/{esc(exchange)}/bindings/source")
        assert [(b["destination"], b["routing_key"]) for b in bindings] == [(BACKLOG, "to-backlog")]

        before = api("GET", f"/queues/%2F/{BACKLOG}")["messages_ready"]
        form = rui.open_section("Publish message").locator("form")
        form.locator("input[name=routing_key]").fill("to-backlog")
        form.locator("textarea[name=payload]").fill("through the exchange page")
        form.locator("input[type=submit]").click()
        expect(page.locator(".form-popup-info")).to_contain_text("Message published.")
        rui.assert_clean("publish to the exchange")
        eventually(lambda: api("GET", f"/queues/%2F/{BACKLOG}")["messages_ready"] == before + 1)
        got = api("POST", f"/queues/%2F/{BACKLOG}/get", {
            "count": before + 1, "ackmode": "ack_requeue_true", "encoding": "auto"
        })
        assert got[-1]["payload"] == "through the exchange page"

        rui.open_section("Delete this exchange").locator("input[type=submit]").click()
        page.wait_for_function("() => location.hash === '#/exchanges'")
        rui.wait_rendered()
        rui.assert_clean("delete exchange")
        assert api_status(live.ui, f"/exchanges/%2F/{esc(exchange)}") == 404
    finally:
        if api_status(live.ui, f"/exchanges/%2F/{esc(exchange)}") == 200:
            api("DELETE", f"/exchanges/%2F/{esc(exchange)}")


def test_vhost_limit_cluster_and_topic_permission_forms(rui: RabbitUI, live: Live) -> None:
    vhost = f"{P}vhost-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    page = rui.page
    cluster_name = api("GET", "/cluster-name")["name"]
    try:
        rui.visit("#/vhosts")
        form = rui.open_section("Add a new virtual host").locator("form")
        form.locator("input[name=name]").fill(vhost)
        form.locator("input[name=description]").fill("made in RabbitMQ's UI")
        form.locator("input[name=tags]").fill("ui,test")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add vhost", text_checked=False)  # RabbitMQ: NaN until its statistics
        got = api("GET", f"/vhosts/{esc(vhost)}")
        assert (got["description"], sorted(got["tags"])) == ("made in RabbitMQ's UI", ["test", "ui"])

        rui.visit("#/limits")
        form = rui.open_section("Set / update a virtual host limit").locator("form")
        form.locator("select[name=vhost]").select_option(vhost)
        form.locator("select[name=name]").select_option("max-queues")
        form.locator("input[name=value]").fill("77")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("set vhost limit")
        assert api("GET", f"/vhost-limits/{esc(vhost)}")[0]["value"] == {"max-queues": 77}
        form = rui.open_section("Set / update a user limit").locator("form")
        form.locator("select[name=user]").select_option(USER)
        form.locator("select[name=name]").select_option("max-connections")
        form.locator("input[name=value]").fill("900")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("set user limit")
        assert api("GET", f"/user-limits/{USER}")[0]["value"]["max-connections"] == 900

        rui.visit(f"#/users/{USER}")
        form = rui.open_section("Topic permissions").locator("form[method=put]")
        form.locator("select[name=vhost]").select_option("/")
        form.locator("select[name=exchange]").select_option("amq.topic")
        form.locator("input[name=write]").fill("^ui\\.")
        form.locator("input[name=read]").fill(".*")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("set topic permission")
        topic = api("GET", f"/topic-permissions/%2F/{USER}")
        assert [(t["exchange"], t["write"], t["read"]) for t in topic] == [("amq.topic", "^ui\\.", ".*")]

        rui.visit("#/cluster-name")
        form = rui.open_section("Change name").locator("form")
        form.locator("input[name=name]").fill(f"{P}cluster")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("change the cluster name")
        assert api("GET", "/cluster-name")["name"] == f"{P}cluster"
        expect(page.locator("#main h1")).to_have_text(f"Cluster name: {P}cluster")

        rui.visit(f"#/vhosts/{esc(vhost)}")
        rui.open_section("Delete this vhost").locator("input[type=submit]").click()
        page.wait_for_function("() => location.hash === '#/vhosts'")
        rui.wait_rendered()
        rui.assert_clean("delete vhost")
        assert api_status(live.ui, f"/vhosts/{esc(vhost)}") == 404
    finally:
        api("PUT", "/cluster-name", {"name": cluster_name})
        api("DELETE", f"/user-limits/{USER}/max-connections")
        if api_status(live.ui, f"/topic-permissions/%2F/{USER}") == 200:
            api("DELETE", f"/topic-permissions/%2F/{USER}")
        if api_status(live.ui, f"/vhosts/{esc(vhost)}") == 200:
            api("DELETE", f"/vhosts/{esc(vhost)}")


def test_close_a_connection(rui: RabbitUI, live: Live) -> None:
    name = f"{P}closed-{uuid.uuid4().hex[:8]}"
    params = live.params()
    params.client_properties = {"connection_name": name}
    conn = pika.BlockingConnection(params)
    try:
        listed = live.connection(name)
        rui.visit(f"#/connections/{esc(listed['name'])}")
        form = rui.open_section("Close this connection").locator("form")
        form.locator("input[name=reason]").fill("closed from RabbitMQ's UI")
        form.locator("input[type=submit]").click()
        rui.page.wait_for_function("() => location.hash === '#/connections'")
        rui.wait_rendered()
        rui.assert_clean("close the connection")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
        assert closed.value.reply_code == 320
        assert "closed from RabbitMQ's UI" in closed.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_definitions_export_and_import(rui: RabbitUI, live: Live, tmp_path: Any) -> None:
    imported = f"{P}imported-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    page = rui.page
    try:
        rui.visit("#/")
        rui.open_section("Export definitions")
        with page.expect_download() as download:
            page.locator("#download-definitions").click()
        exported = json.loads(download.value.path().read_text())
        assert BACKLOG in [q["name"] for q in exported["queues"]]
        assert POLICY in [p["name"] for p in exported["policies"]]

        upload = tmp_path / "definitions.json"
        upload.write_text(json.dumps({
            "queues": [{"name": imported, "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {"x-max-length": 5}}],
        }))
        rui.visit("#/")
        form = rui.open_section("Import definitions").locator("form")
        form.locator("input[name=file]").set_input_files(str(upload))
        form.locator("input[type=submit]").click()
        expect(page.locator(".form-popup-info")).to_contain_text("imported successfully")
        rui.assert_clean("import definitions")
        assert api("GET", f"/queues/%2F/{esc(imported)}")["arguments"] == {"x-max-length": 5}
    finally:
        if api_status(live.ui, f"/queues/%2F/{esc(imported)}") == 200:
            api("DELETE", f"/queues/%2F/{esc(imported)}")


def test_federation_upstream_and_shovel_forms(rui: RabbitUI, live: Live) -> None:
    upstream = f"{P}form-upstream-{uuid.uuid4().hex[:8]}"
    shovel = f"{P}form-shovel-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    page = rui.page
    uri = f"amqp://127.0.0.1:{live.ui.amqp_port}"
    try:
        rui.visit("#/federation-upstreams")
        form = rui.open_section("Add a new upstream").locator("form")
        form.locator("input[name=name]").fill(upstream)
        form.locator("input[name=uri]").fill(uri)
        form.locator("input[name=max-hops]").fill("2")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add upstream")
        value = api("GET", f"/parameters/federation-upstream/%2F/{esc(upstream)}")["value"]
        assert (value["uri"], value["max-hops"]) == (uri, 2)
        rui.visit(f"#/federation-upstreams/%2F/{esc(upstream)}")
        rui.open_section("Delete this upstream").locator("input[type=submit]").click()
        page.wait_for_function("() => location.hash === '#/federation-upstreams'")
        rui.wait_rendered()
        rui.assert_clean("delete upstream")
        assert api_status(live.ui, f"/parameters/federation-upstream/%2F/{esc(upstream)}") == 404

        rui.visit("#/dynamic-shovels")
        form = rui.open_section("Add a new shovel").locator("form")
        form.locator("input[name=name]").fill(shovel)
        # AMQP 0-9-1 both ends, queue to queue, on this broker (the form's "amqp://").
        form.locator("input[name=amqp091-src-queue]").fill(f"{shovel}-src")
        form.locator("input[name=amqp091-dest-queue]").fill(f"{shovel}-dest")
        form.locator("input[type=submit]").click()
        rui.wait_rendered()
        rui.assert_clean("add shovel")
        value = api("GET", f"/parameters/shovel/%2F/{esc(shovel)}")["value"]
        assert (value["src-queue"], value["dest-queue"]) == (f"{shovel}-src", f"{shovel}-dest")
        rui.visit(f"#/dynamic-shovels/%2F/{esc(shovel)}")
        rui.open_section("Delete this shovel").locator("input[type=submit]").click()
        page.wait_for_function("() => location.hash === '#/dynamic-shovels'")
        rui.wait_rendered()
        rui.assert_clean("delete shovel")
        assert api_status(live.ui, f"/parameters/shovel/%2F/{esc(shovel)}") == 404
    finally:
        for path in (
            f"/parameters/federation-upstream/%2F/{esc(upstream)}",
            f"/parameters/shovel/%2F/{esc(shovel)}",
            f"/queues/%2F/{esc(shovel)}-src",
            f"/queues/%2F/{esc(shovel)}-dest",
        ):
            if api_status(live.ui, path) == 200:
                api("DELETE", path)
