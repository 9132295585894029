"""End-to-end: the management UI in headless Chromium against a management API.

Which API answers is up to conftest.py (embedded Warren by default). Every wait
is a playwright wait on the page's state; nothing sleeps.
"""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import Page, expect

from .conftest import PASSWORD, USER, Console, UIServer
from .helpers import STATS_TIMEOUT, load, log_in, series_value, wait_for_series

pytestmark = pytest.mark.ui


def test_queue_publish_get_and_overview(
    page: Page, ui_server: UIServer, console: Console, shot
) -> None:
    queue = f"ui-test-{uuid.uuid4().hex[:8]}"
    log_in(page, ui_server)

    # The overview: counters and both charts.
    expect(page.locator("#nav")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text(USER)
    expect(page.locator("[data-total=queues] b")).to_have_text(re.compile(r"^\d[\d,]*$"))
    expect(page.locator("[data-chart=rates] svg")).to_be_visible()
    expect(page.locator("[data-chart=queued] svg")).to_be_visible()
    queued_before = series_value(page, "queued", "messages", "current")

    # Add a queue (classic, durable, one typed argument).
    page.locator("#nav a[href='#/queues']").click()
    form = page.locator("#add-queue")
    form.locator("select[name=queue_type]").select_option("classic")
    form.locator("input[name=name]").fill(queue)
    form.locator("select[name=durable]").select_option("true")
    form.get_by_label("queue arguments key").fill("x-max-length")
    form.get_by_label("queue arguments value").fill("100")
    form.locator(".arg-row select").select_option("number")
    form.locator("button[type=submit]").click()
    expect(page.locator("#flash")).to_have_text(f"Queue {queue} added.")
    row = page.locator(f"tr[data-queue='{queue}']")
    expect(row).to_be_visible()
    # The name filter keeps it and hides the rest.
    page.locator("input.filter").fill(queue[-8:])
    expect(page.locator("tr[data-queue]")).to_have_count(1)
    page.locator("input.filter").fill(queue + "-not")
    expect(row).to_have_count(0)
    page.locator("input.filter").fill("")

    # Its page: arguments, then publish two messages through the default exchange.
    row.get_by_role("link", name=queue).click()
    expect(page.locator("main h1")).to_have_text(f"Queue {queue}")
    expect(page.locator("main table.facts")).to_contain_text("x-max-length: 100")
    publish = page.locator("#publish-form")
    expect(publish.locator("input[name=routing_key]")).to_have_value(queue)
    publish.get_by_label("headers key").fill("x-origin")
    publish.get_by_label("headers value").fill("ui-test")
    for n in (1, 2):
        publish.locator("textarea[name=payload]").fill(f"hello from the UI test #{n}")
        publish.locator("button[type=submit]").click()
        expect(page.locator("#flash")).to_have_text("Message published.")
        # The next publish must not race the flash of this one.
        page.locator("#flash").evaluate("el => el.replaceChildren()")
    expect(page.locator("[data-count=messages_ready] b")).to_have_text("2", timeout=STATS_TIMEOUT)

    # Get the first one back, acknowledged (it leaves the queue).
    get = page.locator("#get-form")
    get.locator("select[name=ackmode]").select_option("ack_requeue_false")
    get.locator("select[name=encoding]").select_option("auto")
    get.locator("input[name=count]").fill("1")
    get.locator("button[type=submit]").click()
    message = page.locator("#get-results [data-message='1']")
    expect(message.locator("pre.payload")).to_have_text("hello from the UI test #1")
    expect(message).to_contain_text("x-origin")
    expect(message).to_contain_text("1 messages remaining")
    expect(page.locator("[data-count=messages_ready] b")).to_have_text("1", timeout=STATS_TIMEOUT)
    shot("queue", full_page=True)

    # Back on the overview: the queued-messages total moved (rates: next test).
    page.locator("#nav a[href='#/']").click()
    expect(page.locator("main h1")).to_have_text("Overview")
    wait_for_series(page, "queued", "messages", "current", f"v !== {queued_before}")
    shot("overview")

    # Purge, then delete the queue from its page (each confirm() is accepted).
    load(page, f"{ui_server.url}/#/queues/%2F/{queue}")
    expect(page.locator("main h1")).to_have_text(f"Queue {queue}")
    page.locator("#purge-queue").click()
    expect(page.locator("#flash")).to_have_text(f"Queue {queue} purged.")
    expect(page.locator("[data-count=messages_ready] b")).to_have_text("0", timeout=STATS_TIMEOUT)
    page.locator("#delete-queue").click()
    expect(page.locator("#flash")).to_have_text(f"Queue {queue} deleted.")
    expect(page).to_have_url(re.compile(r"#/queues$"))
    expect(page.locator(f"tr[data-queue='{queue}']")).to_have_count(0)

    # Log out: back to the login form, and the credentials are gone.
    page.locator("#logout").click()
    expect(page.locator("#login-form")).to_be_visible()
    assert page.evaluate("() => sessionStorage.getItem('warren.auth')") is None

    assert console.errors == []


def test_overview_rates_move(page: Page, ui_server: UIServer, console: Console, shot) -> None:
    overview = ui_server.api("GET", "/overview")
    if "message_stats" not in overview:
        pytest.skip(
            f"{ui_server.api_description}: /api/overview reports no message_stats rates "
            "(publish_details, deliver_get_details, ack_details)"
        )
    queue = f"ui-rates-{uuid.uuid4().hex[:8]}"
    log_in(page, ui_server)
    expect(page.locator("[data-chart=rates] svg")).to_be_visible()
    ui_server.api("PUT", f"/queues/%2F/{queue}", {"durable": False, "auto_delete": False})
    try:
        for n in range(3):
            body = {
                "properties": {},
                "routing_key": queue,
                "payload": f"m{n}",
                "payload_encoding": "string",
            }
            assert ui_server.api("POST", "/exchanges/%2F/amq.default/publish", body)["routed"]
        got = ui_server.api(
            "POST",
            f"/queues/%2F/{queue}/get",
            {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"},
        )
        assert [m["payload"] for m in got] == ["m0", "m1"]
        # The sampler polls every 5 s: the short burst shows as a peak above zero.
        wait_for_series(page, "rates", "publish", "peak", "v > 0")
        wait_for_series(page, "rates", "deliver_get", "peak", "v > 0")
        shot("overview")
    finally:
        ui_server.api("DELETE", f"/queues/%2F/{queue}")
    assert console.errors == []


def test_every_page_renders(page: Page, ui_server: UIServer, console: Console) -> None:
    log_in(page, ui_server)
    expect(page.locator("main h1")).to_have_text("Overview")
    pages = {
        "connections": "Connections",
        "channels": "Channels",
        "exchanges": "Exchanges",
        "queues": "Queues",
        "users": "Users",
        "vhosts": "Virtual hosts",
        "permissions": "Permissions",
        "policies": "Policies",
        "definitions": "Definitions",
        "exchanges/%2F/amq.direct": "Exchange amq.direct",
        "exchanges/%2F/": "Exchange (AMQP default)",
    }
    for route, title in pages.items():
        load(page, f"{ui_server.url}/#/{route}")
        expect(page.locator("main h1")).to_have_text(title)
        expect(page.locator("#flash .error")).to_have_count(0)
    expect(page.locator("tr[data-user=guest]")).to_have_count(0)  # on the definitions page now
    load(page, f"{ui_server.url}/#/users")
    expect(page.locator("tr[data-user=guest]")).to_be_visible()
    load(page, f"{ui_server.url}/#/vhosts")
    expect(page.locator("tr[data-vhost='/']")).to_be_visible()
    assert console.errors == []


def test_server_text_is_not_markup(page: Page, ui_server: UIServer, console: Console) -> None:
    name = f'<img src=x onerror="window.pwned=1">ui-{uuid.uuid4().hex[:6]}'
    from urllib.parse import quote

    ui_server.api(
        "PUT", f"/queues/%2F/{quote(name, safe='')}", {"durable": False, "auto_delete": False}
    )
    try:
        log_in(page, ui_server)
        expect(page.locator("main h1")).to_have_text("Overview")
        page.locator("#nav a[href='#/queues']").click()
        row = page.locator("tr", has_text=name)
        expect(row).to_be_visible()
        row.get_by_role("link", name=name).click()
        expect(page.locator("main h1")).to_have_text(f"Queue {name}")
        assert page.locator("main img").count() == 0
        assert page.evaluate("() => window.pwned") is None
    finally:
        ui_server.api("DELETE", f"/queues/%2F/{quote(name, safe='')}")
    assert console.errors == []


def test_bad_password_stays_on_login(page: Page, ui_server: UIServer, console: Console) -> None:
    log_in(page, ui_server, password="not-the-password")
    expect(page.locator("#login-form [role=alert]")).to_contain_text("Login failed")
    expect(page.locator("#nav")).to_be_hidden()
    # The 401 itself is logged by Chromium as a failed resource load: the only error allowed.
    assert [e for e in console.errors if "401" not in e] == []


def test_unauthorized_returns_to_login(page: Page, ui_server: UIServer, console: Console) -> None:
    log_in(page, ui_server)
    expect(page.locator("main h1")).to_have_text("Overview")
    # Credentials that stop working (password changed, user deleted): the next call is a 401.
    page.evaluate("() => sessionStorage.setItem('warren.auth', 'Basic ' + btoa('guest:wrong'))")
    page.locator("#nav a[href='#/queues']").click()
    expect(page.locator("#login-form")).to_be_visible()
    expect(page.locator("#login-form [role=alert]")).to_contain_text("Your session has ended")
    assert page.evaluate("() => sessionStorage.getItem('warren.auth')") is None
    # Logging in again goes on where the session ended.
    page.locator("#login-form input[name=username]").fill(USER)
    page.locator("#login-form input[name=password]").fill(PASSWORD)
    page.locator("#login-form button[type=submit]").click()
    expect(page.locator("main h1")).to_have_text("Queues")
    assert [e for e in console.errors if "401" not in e] == []


def test_user_without_admin_rights(page: Page, ui_server: UIServer, console: Console) -> None:
    """A management user sees the overview, and is told, not logged out, on admin pages."""
    user = f"ui-mgmt-{uuid.uuid4().hex[:8]}"
    nobody = f"ui-notags-{uuid.uuid4().hex[:8]}"
    ui_server.api("PUT", f"/users/{user}", {"password": "pw", "tags": "management"})
    ui_server.api("PUT", f"/users/{nobody}", {"password": "pw", "tags": ""})
    ui_server.api(
        "PUT", f"/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    try:
        load(page, f"{ui_server.url}/")
        form = page.locator("#login-form")
        form.locator("input[name=username]").fill(nobody)
        form.locator("input[name=password]").fill("pw")
        form.locator("button[type=submit]").click()
        expect(form.locator("[role=alert]")).to_have_text("Login failed: Not management user")

        form.locator("input[name=username]").fill(user)
        form.locator("button[type=submit]").click()
        expect(page.locator("main h1")).to_have_text("Overview")
        expect(page.locator("#whoami")).to_have_text(user)
        for admin_page in (
            "users",
            "permissions",
            "policies",
            "definitions",
            "shovels",
            "federation",
            "cluster",
        ):
            expect(page.locator(f"#nav a[href='#/{admin_page}']")).to_be_hidden()
        load(page, f"{ui_server.url}/#/users")
        expect(page.locator("main .error")).to_have_text("Not administrator user")
        expect(page.locator("#nav")).to_be_visible()
        page.locator("#nav a[href='#/queues']").click()
        expect(page.locator("main h1")).to_have_text("Queues")
    finally:
        ui_server.api("DELETE", f"/users/{user}")
        ui_server.api("DELETE", f"/users/{nobody}")
    assert [e for e in console.errors if "401" not in e] == []
