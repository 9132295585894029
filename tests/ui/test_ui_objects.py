"""The UI's other pages against a management API: exchanges and bindings,
connections and channels, users, virtual hosts, permissions, policies and
definitions. Each test cleans up what it made, through the UI where it can."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pika
import pytest
from playwright.sync_api import Page, expect

from .conftest import Console, UIServer
from .helpers import expect_flash, load

pytestmark = pytest.mark.ui


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def queue(ui_server: UIServer) -> Iterator[str]:
    name = unique("ui-q")
    ui_server.api("PUT", f"/queues/%2F/{name}", {"durable": False, "auto_delete": False})
    yield name
    ui_server.api("DELETE", f"/queues/%2F/{name}")


def test_exchange_bind_publish_unbind_delete(
    logged_in: Page, ui_server: UIServer, queue: str, console: Console
) -> None:
    page = logged_in
    exchange = unique("ui-x")
    page.locator("#nav a[href='#/exchanges']").click()
    form = page.locator("#add-exchange")
    form.locator("input[name=name]").fill(exchange)
    form.locator("select[name=exchange_type]").select_option("topic")
    form.locator("button[type=submit]").click()
    expect_flash(page, f"Exchange {exchange} added.")
    page.get_by_role("link", name=exchange, exact=True).click()
    expect(page.locator("main h1")).to_have_text(f"Exchange {exchange}")
    expect(page.locator("main table.facts")).to_contain_text("topic")

    bind = page.locator("#binding-form")
    bind.locator("input[name=destination]").fill(queue)
    bind.locator("input[name=binding_routing_key]").fill("sensor.#")
    bind.locator("button[type=submit]").click()
    expect_flash(page, "Binding added.")
    expect(page.locator("main table.list").first).to_contain_text("sensor.#")

    publish = page.locator("#publish-form")
    publish.locator("input[name=routing_key]").fill("sensor.kitchen")
    publish.locator("textarea[name=payload]").fill("21.5")
    publish.locator("button[type=submit]").click()
    expect_flash(page, "Message published.")
    publish.locator("input[name=routing_key]").fill("nowhere")
    publish.locator("button[type=submit]").click()
    expect_flash(page, "Message published, but not routed.")
    got = ui_server.api(
        "POST",
        f"/queues/%2F/{queue}/get",
        {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )
    assert [(m["routing_key"], m["payload"]) for m in got] == [("sensor.kitchen", "21.5")]

    page.get_by_role("button", name="Unbind").click()
    expect_flash(page, "Binding removed.")
    expect(page.get_by_role("button", name="Unbind")).to_have_count(0)
    page.locator("#delete-exchange").click()
    expect_flash(page, f"Exchange {exchange} deleted.")
    expect(page).to_have_url(re.compile(r"#/exchanges$"))
    expect(page.get_by_role("link", name=exchange, exact=True)).to_have_count(0)
    assert console.errors == []


def test_connection_channel_and_close(
    logged_in: Page, ui_server: UIServer, queue: str, console: Console
) -> None:
    page = logged_in
    params = pika.ConnectionParameters("127.0.0.1", ui_server.amqp_port, heartbeat=0)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)
        tag = ch.basic_consume(queue, lambda *a: None)
        port = conn._impl._transport._sock.getsockname()[1]  # noqa: SLF001 - find our row

        page.locator("#nav a[href='#/connections']").click()
        link = page.get_by_role("link", name=re.compile(rf":{port} ->"))
        link.click()
        expect(page.locator("main h1")).to_contain_text(f":{port} ->")
        expect(page.locator("main table.facts")).to_contain_text("guest")
        chan = page.get_by_role("link", name=re.compile(r"\(1\)$"))
        chan.click()
        expect(page.locator("main h1")).to_contain_text("Channel")
        consumers = page.locator("main table.list")
        expect(consumers).to_contain_text(tag)
        expect(consumers.get_by_role("link", name=queue)).to_be_visible()
        expect(page.locator("main table.facts")).to_contain_text("7")

        page.go_back()
        expect(page.locator("#close-connection")).to_be_visible()
        page.locator("#close-connection input[name=reason]").fill("ui test says bye")
        page.locator("#close-connection button[type=submit]").click()
        expect_flash(page, "Connection closed.")
        expect(page).to_have_url(re.compile(r"#/connections$"))
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while True:
                conn.process_data_events(time_limit=1)
        assert closed.value.reply_code == 320
        assert "ui test says bye" in closed.value.reply_text
    finally:
        if conn.is_open:
            conn.close()
    assert console.errors == []


def test_users_vhosts_permissions_policies(
    logged_in: Page, ui_server: UIServer, console: Console
) -> None:
    page = logged_in
    user, vhost, policy = unique("ui-user"), unique("ui-vh"), unique("ui-pol")

    page.locator("#nav a[href='#/users']").click()
    form = page.locator("#add-user")
    form.locator("input[name=username]").fill(user)
    form.locator("input[name=new_password]").fill("s3cret")
    form.locator("input[name=tags]").fill("monitoring")
    form.locator("button[type=submit]").click()
    expect_flash(page, "User saved.")
    expect(page.locator(f"tr[data-user='{user}']")).to_contain_text("monitoring")
    # New tags, password left empty: the password stays.
    form.locator("input[name=tags]").fill("management, policymaker")
    form.locator("button[type=submit]").click()
    expect_flash(page, "User saved.")
    expect(page.locator(f"tr[data-user='{user}']")).to_contain_text("management, policymaker")
    assert ui_server.api("GET", "/whoami", auth=(user, "s3cret"))["name"] == user
    form.locator("input[name=username]").fill(unique("ui-nobody"))
    form.locator("button[type=submit]").click()
    expect(page.locator("#flash .error")).to_have_text("A new user needs a password.")

    page.locator("#nav a[href='#/vhosts']").click()
    form = page.locator("#add-vhost")
    form.locator("input[name=vhost_name]").fill(vhost)
    form.locator("input[name=description]").fill("made by the UI test")
    form.locator("button[type=submit]").click()
    expect_flash(page, "Virtual host added.")
    expect(page.locator(f"tr[data-vhost='{vhost}']")).to_contain_text("made by the UI test")

    page.locator("#nav a[href='#/permissions']").click()
    form = page.locator("#set-permission")
    form.locator("select[name=user]").select_option(user)
    form.locator("select[name=vhost]").select_option(vhost)
    form.locator("input[name=write]").fill("^ui-.*")
    form.locator("button[type=submit]").click()
    expect_flash(page, "Permission set.")
    row = page.locator("main table.list tr", has_text=user)
    expect(row).to_contain_text("^ui-.*")
    perms = ui_server.api("GET", f"/permissions/{vhost}/{user}")
    assert (perms["configure"], perms["write"], perms["read"]) == (".*", "^ui-.*", ".*")
    row.get_by_role("button", name="Clear").click()
    expect_flash(page, "Permissions cleared.")
    expect(row).to_have_count(0)

    page.locator("#nav a[href='#/policies']").click()
    form = page.locator("#add-policy")
    form.locator("select[name=vhost]").select_option(vhost)
    form.locator("input[name=policy_name]").fill(policy)
    form.locator("input[name=pattern]").fill("^ui-")
    form.locator("select[name=apply-to]").select_option("quorum_queues")  # RabbitMQ 4.x's
    form.locator("textarea[name=definition]").fill('{"max-length": 10}')
    form.locator("button[type=submit]").click()
    expect_flash(page, "Policy saved.")
    row = page.locator("main table.list tr", has_text=policy)
    expect(row).to_contain_text("max-length: 10")
    expect(row).to_contain_text("quorum_queues")
    form.locator("textarea[name=definition]").fill("{not json")
    form.locator("button[type=submit]").click()
    expect(page.locator("#flash .error")).to_have_text("The definition is not valid JSON.")
    row.get_by_role("button", name="Delete").click()
    expect_flash(page, f"Policy {policy} deleted.")
    expect(row).to_have_count(0)

    page.locator("#nav a[href='#/vhosts']").click()
    page.locator(f"tr[data-vhost='{vhost}']").get_by_role("button", name="Delete").click()
    expect_flash(page, f"Virtual host {vhost} deleted.")
    expect(page.locator(f"tr[data-vhost='{vhost}']")).to_have_count(0)
    page.locator("#nav a[href='#/users']").click()
    page.locator(f"tr[data-user='{user}']").get_by_role("button", name="Delete").click()
    expect_flash(page, f"User {user} deleted.")
    expect(page.locator(f"tr[data-user='{user}']")).to_have_count(0)
    assert console.errors == []


def test_definitions_download_and_upload(
    logged_in: Page, ui_server: UIServer, tmp_path, console: Console
) -> None:
    page = logged_in
    page.locator("#nav a[href='#/definitions']").click()
    with page.expect_download() as download:
        page.locator("#download-definitions").click()
    assert download.value.suggested_filename.startswith("warren-definitions-")
    exported = json.loads(download.value.path().read_text())
    assert {"users", "vhosts", "queues", "exchanges", "bindings"} <= exported.keys()

    queue = unique("ui-imported")
    upload = tmp_path / "defs.json"
    upload.write_text(
        json.dumps(
            {
                "queues": [
                    {
                        "name": queue,
                        "vhost": "/",
                        "durable": True,
                        "auto_delete": False,
                        "arguments": {},
                    }
                ]
            }
        )
    )
    try:
        page.locator("#upload-definitions input[type=file]").set_input_files(str(upload))
        page.locator("#upload-definitions button[type=submit]").click()
        expect_flash(page, "Definitions imported.")
        page.locator("#nav a[href='#/queues']").click()
        expect(page.locator(f"tr[data-queue='{queue}']")).to_be_visible()
    finally:
        ui_server.api("DELETE", f"/queues/%2F/{queue}")
    assert console.errors == []


def test_add_stream_queue(logged_in: Page, ui_server: UIServer, console: Console) -> None:
    page = logged_in
    name = unique("ui-stream")
    page.locator("#nav a[href='#/queues']").click()
    form = page.locator("#add-queue")
    form.locator("select[name=queue_type]").select_option("stream")
    expect(form.locator("select[name=durable]")).to_be_disabled()
    form.locator("input[name=name]").fill(name)
    form.locator("button[type=submit]").click()
    try:
        expect_flash(page, f"Queue {name} added.")
        row = page.locator(f"tr[data-queue='{name}']")
        expect(row).to_contain_text("stream")
        queue = ui_server.api("GET", f"/queues/%2F/{name}")
        assert queue["durable"] is True
        assert queue["arguments"]["x-queue-type"] == "stream"
    finally:
        ui_server.api("DELETE", f"/queues/%2F/{name}")
    assert console.errors == []


def test_add_quorum_queue_and_see_its_members(
    logged_in: Page, ui_server: UIServer, console: Console
) -> None:
    page = logged_in
    name = unique("ui-quorum")
    page.locator("#nav a[href='#/queues']").click()
    form = page.locator("#add-queue")
    form.locator("select[name=queue_type]").select_option("quorum")
    expect(form.locator("select[name=durable]")).to_be_disabled()
    form.locator("input[name=name]").fill(name)
    form.locator("button[type=submit]").click()
    try:
        expect_flash(page, f"Queue {name} added.")
        row = page.locator(f"tr[data-queue='{name}']")
        expect(row).to_contain_text("quorum")
        queue = ui_server.api("GET", f"/queues/%2F/{name}")
        assert queue["arguments"]["x-queue-type"] == "quorum"
        load(page, f"{ui_server.url}/#/queues/%2F/{name}")
        expect(page.locator("main")).to_contain_text("Leader")
        expect(page.locator("main")).to_contain_text(queue["leader"])
    finally:
        ui_server.api("DELETE", f"/queues/%2F/{name}")
    assert console.errors == []


def test_missing_object_page(logged_in: Page, ui_server: UIServer, console: Console) -> None:
    page = logged_in
    load(page, f"{ui_server.url}/#/queues/%2F/{unique('ui-absent')}")
    expect(page.locator("main h1")).to_have_text("Not found")
    load(page, f"{ui_server.url}/#/no/such/page")
    expect(page.locator("main h1")).to_have_text("Not found")
    # Chromium logs the API's 404 itself; nothing else may appear.
    assert [e for e in console.errors if "404" not in e] == []


def test_vhost_and_queue_names_with_slashes(
    logged_in: Page, ui_server: UIServer, console: Console
) -> None:
    """Names travel URL-encoded in the hash routes and the API paths ("/" -> %2F)."""
    page = logged_in
    vhost, queue = unique("ui/vh"), unique("ui/q")
    ui_server.api("PUT", f"/vhosts/{quote(vhost, safe='')}", {})
    ui_server.api(
        "PUT",
        f"/permissions/{quote(vhost, safe='')}/guest",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    try:
        page.locator("#nav a[href='#/queues']").click()
        form = page.locator("#add-queue")
        form.locator("select[name=vhost]").select_option(vhost)
        form.locator("input[name=name]").fill(queue)
        form.locator("button[type=submit]").click()
        expect_flash(page, f"Queue {queue} added.")
        page.get_by_role("link", name=queue, exact=True).click()
        expect(page).to_have_url(
            re.compile(re.escape(f"#/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}") + "$")
        )
        expect(page.locator("main h1")).to_have_text(f"Queue {queue}")
        publish = page.locator("#publish-form")
        publish.locator("textarea[name=payload]").fill("across a slash")
        publish.locator("button[type=submit]").click()
        expect_flash(page, "Message published.")
        page.locator("#get-form select[name=ackmode]").select_option("ack_requeue_false")
        page.locator("#get-form button[type=submit]").click()
        expect(page.locator("#get-results pre.payload")).to_have_text("across a slash")
    finally:
        ui_server.api("DELETE", f"/vhosts/{quote(vhost, safe='')}")
    assert console.errors == []
