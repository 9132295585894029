"""The UI's pages for links between brokers and nodes: shovels, federation
(upstreams, upstream sets, link status) and the cluster. Shovels and
federation links here run between objects of the one embedded broker (a
shovel's amqp:// is the local broker; an upstream's URI names its AMQP port).
Each test cleans up what it made, through the UI where it can."""

from __future__ import annotations

import re
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pika
import pytest
from free_ports import free_port
from playwright.sync_api import Page, expect

from .conftest import Console, UIServer
from .helpers import expect_flash, load

pytestmark = pytest.mark.ui

#: The lists refresh every 5 s: what changes on the broker shows within a few rounds.
POLLED = 20_000


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def quietly(call: Callable[[], object]) -> None:
    """Cleanup: what the test already deleted answers 404."""
    try:
        call()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise


def needs(ui: UIServer, path: str, what: str) -> None:
    """Skip when the management API does not serve path (a RabbitMQ without the plugin)."""
    try:
        ui.api("GET", path)
    except urllib.error.HTTPError as e:
        pytest.skip(f"{ui.api_description}: GET /api{path} answers {e.code}: no {what}")


def is_warren(ui: UIServer) -> bool:
    return ui.api("GET", "/overview").get("product_name") == "Warren"


def publish(ui: UIServer, exchange: str, routing_key: str, body: bytes) -> None:
    params = pika.ConnectionParameters("127.0.0.1", ui.amqp_port, heartbeat=0)
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(delivery_mode=2))


def receive(ui: UIServer, queue: str, timeout: float = 15) -> bytes | None:
    """The next message of queue (acked), or None after timeout seconds without one."""
    params = pika.ConnectionParameters("127.0.0.1", ui.amqp_port, heartbeat=0)
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        for method, _props, body in ch.consume(queue, inactivity_timeout=timeout):
            if method is None:
                return None
            ch.basic_ack(method.delivery_tag)
            ch.cancel()
            return body
    return None


def refused_put_only(console: Console) -> list[str]:
    """The console's errors but the 400s of the definitions the API refused on purpose
    (Chromium logs them as failed resource loads)."""
    return [e for e in console.errors if not re.search(r"status of 400 .*/api/parameters/", e)]


@pytest.fixture
def queues(ui_server: UIServer) -> Iterator[tuple[str, str]]:
    """A source and a destination queue for a shovel."""
    names = (unique("ui-shovel-src"), unique("ui-shovel-dest"))
    for name in names:
        ui_server.api("PUT", f"/queues/%2F/{name}", {"durable": True, "auto_delete": False})
    yield names
    for name in names:
        quietly(lambda name=name: ui_server.api("DELETE", f"/queues/%2F/{name}"))


def test_shovel_moves_messages_restarts_and_is_deleted(
    logged_in: Page, ui_server: UIServer, queues: tuple[str, str], console: Console
) -> None:
    needs(ui_server, "/shovels", "shovel plugin")
    page = logged_in
    src, dest = queues
    name = unique("ui-shovel")
    counts = is_warren(ui_server)  # RabbitMQ 3.10 reports no messages_transferred
    try:
        page.locator("#nav a[href='#/shovels']").click()
        expect(page.locator("main h1")).to_have_text("Shovels")
        form = page.locator("#add-shovel")
        # A definition the API refuses: its reasons are flashed, nothing is added.
        form.locator("input[name=shovel_name]").fill(name)
        form.locator("input[name=src-uri]").fill("http://nowhere")
        form.locator("button[type=submit]").click()
        error = page.locator("#flash .error")
        expect(error).to_contain_text("Validation failed")
        expect(error).to_contain_text("http://nowhere")  # Warren: "src-uri: ... is not a ... URI"
        expect(error).to_contain_text(re.compile(r"Must specify .*src-queue|src-exchange"))
        expect(page.locator(f"tr[data-shovel='{name}']")).to_have_count(0)

        form.locator("input[name=src-uri]").fill("amqp://")
        form.locator("input[name=src-queue]").fill(src)
        form.locator("input[name=dest-queue]").fill(dest)
        form.locator("select[name=ack-mode]").select_option("on-publish")
        form.locator("input[name=src-prefetch-count]").fill("50")
        form.locator("input[name=reconnect-delay]").fill("1")
        form.locator("button[type=submit]").click()
        expect_flash(page, f"Shovel {name} saved.")
        assert ui_server.api("GET", f"/parameters/shovel/%2F/{name}")["value"] == {
            "src-uri": "amqp://",
            "src-queue": src,
            "dest-uri": "amqp://",
            "dest-queue": dest,
            "ack-mode": "on-publish",
            "src-prefetch-count": 50,
            "reconnect-delay": 1,
        }
        row = page.locator(f"tr[data-shovel='{name}']")
        expect(row.locator("[data-field=state]")).to_have_text("running", timeout=POLLED)
        expect(row).to_contain_text(f"queue {src}")
        expect(row).to_contain_text(f"queue {dest}")
        expect(row.locator("[data-field=reason]")).to_have_count(0)

        publish(ui_server, "", src, b"shovelled by the UI test")
        assert receive(ui_server, dest) == b"shovelled by the UI test"
        if counts:
            expect(row.locator("[data-field=moved]")).to_have_text("1", timeout=POLLED)

        # A restart starts a fresh shovel (its count from 0), which moves messages again.
        row.get_by_role("button", name="Restart").click()
        expect_flash(page, f"Shovel {name} restarted.")
        if counts:
            expect(row.locator("[data-field=moved]")).to_have_text("0", timeout=POLLED)
        expect(row.locator("[data-field=state]")).to_have_text("running", timeout=POLLED)
        publish(ui_server, "", src, b"after the restart")
        assert receive(ui_server, dest) == b"after the restart"
        if counts:
            expect(row.locator("[data-field=moved]")).to_have_text("1", timeout=POLLED)

        row.get_by_role("button", name="Delete").click()
        expect_flash(page, f"Shovel {name} deleted.")
        expect(row).to_have_count(0)
        assert all(s["name"] != name for s in ui_server.api("GET", "/shovels"))
        publish(ui_server, "", src, b"stays put")
        assert receive(ui_server, dest, timeout=1) is None
    finally:
        quietly(lambda: ui_server.api("DELETE", f"/parameters/shovel/%2F/{name}"))
    assert refused_put_only(console) == []


def test_shovel_with_an_unreachable_source_shows_its_error(
    logged_in: Page, ui_server: UIServer, queues: tuple[str, str], console: Console
) -> None:
    needs(ui_server, "/shovels", "shovel plugin")
    if not is_warren(ui_server):
        pytest.skip("RabbitMQ 3.10 reports such a shovel as starting, without its error")
    page = logged_in
    src, dest = queues
    name = unique("ui-shovel-down")
    port = free_port()
    try:
        page.locator("#nav a[href='#/shovels']").click()
        form = page.locator("#add-shovel")
        form.locator("input[name=shovel_name]").fill(name)
        form.locator("input[name=src-uri]").fill(f"amqp://guest:pw-not-shown@127.0.0.1:{port}/%2F")
        form.locator("input[name=src-queue]").fill(src)
        form.locator("select[name=dest-type]").select_option("exchange")
        expect(form.locator("input[name=dest-queue]")).to_be_hidden()
        form.locator("input[name=dest-exchange]").fill("amq.direct")
        form.locator("input[name=dest-exchange-key]").fill(dest)
        form.locator("button[type=submit]").click()
        expect_flash(page, f"Shovel {name} saved.")
        row = page.locator(f"tr[data-shovel='{name}']")
        expect(row.locator("[data-field=state]")).to_have_text("terminated", timeout=POLLED)
        expect(row.locator("[data-field=reason]")).to_contain_text(
            "Connection refused", timeout=POLLED
        )
        expect(row).to_contain_text(f"amqp://guest@127.0.0.1:{port}/%2F")
        # (Warren's status names the destination exchange, not its key.)
        expect(row).to_contain_text("exchange amq.direct")
        # The password is in the definition, never on the page.
        assert "pw-not-shown" not in page.locator("main").inner_text()
        row.get_by_role("button", name="Delete").click()
        expect_flash(page, f"Shovel {name} deleted.")
        expect(row).to_have_count(0)
    finally:
        quietly(lambda: ui_server.api("DELETE", f"/parameters/shovel/%2F/{name}"))
    assert console.errors == []


def test_federation_upstream_set_link_restart_and_delete(
    logged_in: Page, ui_server: UIServer, console: Console
) -> None:
    needs(ui_server, "/federation-links", "federation plugin")
    page = logged_in
    upstream, upstream_set = unique("ui-up"), unique("ui-upset")
    up_x, down_x, policy = unique("ui-fed-up"), unique("ui-fed-down"), unique("ui-fed-pol")
    local_q = unique("ui-fed-q")
    counts = is_warren(ui_server)  # RabbitMQ 3.10 reports no messages_received
    uri = f"amqp://guest:guest@127.0.0.1:{ui_server.amqp_port}/%2F"
    ui_server.api("PUT", f"/exchanges/%2F/{down_x}", {"type": "topic", "durable": True})
    ui_server.api("PUT", f"/queues/%2F/{local_q}", {"durable": False, "auto_delete": False})
    ui_server.api("POST", f"/bindings/%2F/e/{down_x}/q/{local_q}", {"routing_key": "#"})
    try:
        page.locator("#nav a[href='#/federation']").click()
        expect(page.locator("main h1")).to_have_text("Federation status")
        page.locator(".subnav").get_by_role("link", name="Upstreams and sets").click()
        expect(page.locator("main h1")).to_have_text("Federation upstreams")

        form = page.locator("#add-upstream")
        form.locator("input[name=upstream_name]").fill(upstream)
        form.locator("input[name=uri]").fill("http://nowhere")
        form.locator("button[type=submit]").click()
        expect(page.locator("#flash .error")).to_contain_text(re.compile(r"Validation failed"))
        expect(page.locator("#flash .error")).to_contain_text("http://nowhere")
        form.locator("input[name=uri]").fill(uri)
        form.locator("input[name=exchange]").fill(up_x)
        form.locator("input[name=max-hops]").fill("2")
        form.locator("input[name=reconnect-delay]").fill("1")
        form.locator("button[type=submit]").click()
        expect_flash(page, f"Upstream {upstream} saved.")
        value = ui_server.api("GET", f"/parameters/federation-upstream/%2F/{upstream}")["value"]
        assert value == {
            "uri": uri,
            "exchange": up_x,
            "max-hops": 2,
            "reconnect-delay": 1,
            "ack-mode": "on-confirm",
            "trust-user-id": False,
        }
        row = page.locator(f"tr[data-upstream='{upstream}']")
        expect(row).to_contain_text(f"amqp://guest@127.0.0.1:{ui_server.amqp_port}/%2F")
        expect(row).to_contain_text("max-hops: 2")
        assert "guest:guest@" not in page.locator("main").inner_text()

        # An upstream set: names with an override; a refused one's reason unescaped.
        sets = page.locator("#add-upstream-set")
        sets.locator("input[name=set_name]").fill(upstream_set)
        sets.locator("textarea[name=upstreams]").fill('[{"x": 1}]')
        sets.locator("button[type=submit]").click()
        # The API sends &lt;&lt;"x"&gt;&gt; (HTML-escaped): the page shows <<"x">>.
        expect(page.locator("#flash .error")).to_contain_text('<<"x">>')
        sets.locator("textarea[name=upstreams]").fill(
            f'[{{"upstream": "{upstream}", "max-hops": 3}}]'
        )
        sets.locator("button[type=submit]").click()
        expect_flash(page, f"Upstream set {upstream_set} saved.")
        set_row = page.locator(f"tr[data-set='{upstream_set}']")
        expect(set_row).to_contain_text(f"{upstream} (max-hops: 3)")
        set_row.get_by_role("button", name="Delete").click()
        expect_flash(page, f"Upstream set {upstream_set} deleted.")
        expect(set_row).to_have_count(0)

        # A policy makes down_x federated: its link to up_x shows on the status page.
        ui_server.api(
            "PUT",
            f"/policies/%2F/{policy}",
            {
                "pattern": f"^{down_x}$",
                "apply-to": "exchanges",
                "definition": {"federation-upstream": upstream},
            },
        )
        page.locator(".subnav").get_by_role("link", name="Status").click()
        expect(page.locator("main h1")).to_have_text("Federation status")
        link = page.locator(f"tr[data-upstream='{upstream}']")
        expect(link.locator("[data-field=state]")).to_have_text("running", timeout=POLLED)
        expect(link).to_contain_text(f"exchange {up_x}")
        expect(link.get_by_role("link", name=down_x)).to_be_visible()
        publish(ui_server, up_x, "ui.test", b"federated")
        assert receive(ui_server, local_q) == b"federated"
        if counts:
            expect(link.locator("[data-field=received]")).to_have_text("1", timeout=POLLED)

        link.get_by_role("button", name="Restart").click()
        # Warren restarts the upstream's links, RabbitMQ the one link.
        restarted = re.compile(rf"^Links? from upstream {upstream} restarted\.$")
        expect(page.locator("#flash")).to_have_text(restarted)
        if counts:
            expect(link.locator("[data-field=received]")).to_have_text("0", timeout=POLLED)
        expect(link.locator("[data-field=state]")).to_have_text("running", timeout=POLLED)

        page.locator(".subnav").get_by_role("link", name="Upstreams and sets").click()
        row.get_by_role("button", name="Delete").click()
        expect_flash(page, f"Upstream {upstream} deleted.")
        expect(row).to_have_count(0)
        page.locator(".subnav").get_by_role("link", name="Status").click()
        expect(page.locator("main h1")).to_have_text("Federation status")
        expect(page.locator(f"tr[data-upstream='{upstream}']")).to_have_count(0)
    finally:
        api = ui_server.api
        quietly(lambda: api("DELETE", f"/parameters/federation-upstream/%2F/{upstream}"))
        quietly(lambda: api("DELETE", f"/parameters/federation-upstream-set/%2F/{upstream_set}"))
        quietly(lambda: api("DELETE", f"/policies/%2F/{policy}"))
        for x in (down_x, up_x):
            quietly(lambda x=x: api("DELETE", f"/exchanges/%2F/{x}"))
        for q in api("GET", "/queues/%2F"):
            if q["name"] == local_q or q["name"].startswith(f"federation: {up_x} "):
                quietly(lambda q=q: api("DELETE", f"/queues/%2F/{quote(q['name'], safe='')}"))
    assert refused_put_only(console) == []


def test_cluster_page_on_a_single_node(
    logged_in: Page, ui_server: UIServer, console: Console
) -> None:
    needs(ui_server, "/cluster", "GET /api/cluster (Warren's own)")
    page = logged_in
    page.locator("#nav a[href='#/cluster']").click()
    expect(page.locator("main h1")).to_have_text("Cluster")
    expect(page.locator("#cluster-disabled")).to_contain_text(
        "Clustering is disabled: this broker runs as a single node."
    )
    page.locator("#nav a[href='#/']").click()
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("[data-total=queues] b")).to_have_text(re.compile(r"^\d[\d,]*$"))
    summary = page.locator("#cluster-summary")
    expect(summary).to_have_text("disabled (single node)")
    summary.click()
    expect(page.locator("main h1")).to_have_text("Cluster")
    assert console.errors == []


def test_monitoring_user_sees_status_but_no_forms(
    page: Page, ui_server: UIServer, console: Console
) -> None:
    """Status lists are for monitoring users; definitions need policymaker."""
    needs(ui_server, "/shovels", "shovel plugin")
    user = unique("ui-monitor")
    ui_server.api("PUT", f"/users/{user}", {"password": "pw", "tags": "monitoring"})
    ui_server.api(
        "PUT", f"/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    try:
        load(page, f"{ui_server.url}/")
        form = page.locator("#login-form")
        form.locator("input[name=username]").fill(user)
        form.locator("input[name=password]").fill("pw")
        form.locator("button[type=submit]").click()
        expect(page.locator("main h1")).to_have_text("Overview")
        for link in ("shovels", "federation", "cluster"):
            expect(page.locator(f"#nav a[href='#/{link}']")).to_be_visible()
        page.locator("#nav a[href='#/shovels']").click()
        expect(page.locator("main h1")).to_have_text("Shovels")
        expect(page.locator("#add-shovel")).to_have_count(0)
        page.locator("#nav a[href='#/federation']").click()
        expect(page.locator("main h1")).to_have_text("Federation status")
        page.locator(".subnav").get_by_role("link", name="Upstreams and sets").click()
        # Warren: "Not policymaker user"; RabbitMQ: "User not authorised to access object".
        expect(page.locator("main .panel .error").first).to_have_text(
            re.compile(r"^(Not policymaker user|User not authorised to access object)$")
        )
        expect(page.locator("#add-upstream")).to_have_count(0)
        expect(page.locator("#flash .error")).to_have_count(0)
    finally:
        ui_server.api("DELETE", f"/users/{user}")
    # The refusals are 401 answers, which Chromium logs as failed loads.
    assert [e for e in console.errors if "401" not in e] == []
