"""RabbitMQ's own management UI against Warren's management API, in headless
Chromium: every page.

An operator may keep RabbitMQ's UI (or a tool built on it) pointed at Warren:
conftest.py's ``rabbitmq_ui`` serves the UI files of the installed
rabbitmq-server package (rabbitmq_www.py: management, federation and shovel
plugins, read in place) and proxies their /api calls to Warren. A small live
load (rabbitui.Live: a pika publisher and consumer) gives the tables and rate
charts data. Each page is checked by rabbitui.RabbitUI.visit (no exception, no
console error, no refused request, no error shown, no NaN), then for Warren's
objects with the figures the API gives. test_rabbitmq_ui_forms.py uses the
forms. With WARREN_UI_API_URL naming a RabbitMQ (conftest.py), the same tests
pass against RabbitMQ 3.10, which is how their expectations were checked.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from diskhelp import eventually  # tests/diskhelp.py
from playwright.sync_api import expect

from .conftest import USER
from .helpers import STATS_TIMEOUT
from .rabbitui import (
    BACKLOG,
    BACKLOG_COUNT,
    CLASSIC,
    LOAD_NAME,
    NONZERO_RATE,
    POLICY,
    QUORUM,
    SHOVEL,
    STREAM,
    TOPIC,
    UPSTREAM,
    Live,
    P,
    RabbitUI,
    contiguous,
    counts,
    esc,
)

pytestmark = pytest.mark.ui


def test_overview_and_node(rui: RabbitUI, live: Live) -> None:
    main = rui.visit("#/")
    overview = live.ui.api("GET", "/overview")
    totals = main.locator("#global-counts")
    for key in ("connections", "channels", "exchanges", "queues", "consumers"):
        expect(totals).to_contain_text(f"{key.capitalize()}: {overview['object_totals'][key]}")
    expect(main.locator("#chart-lengths-over canvas").first).to_be_attached()
    expect(rui.legend("msg-rates-over", "Publish")).to_have_text(
        NONZERO_RATE, timeout=STATS_TIMEOUT
    )
    expect(main.locator("table.list").first).to_contain_text(overview["node"])
    rui.assert_clean("#/ after its rates")

    main = rui.visit(f"#/nodes/{esc(overview['node'])}")
    expect(main.locator("h1")).to_have_text(f"Node {overview['node']}")
    # Its two breakdowns are read when asked for (GET /api/nodes/{node}?memory=true).
    rui.open_section("Memory details").locator("button[query=memory]").click()
    expect(main.locator("#memory-details")).to_contain_text("Memory calculation strategy")
    rui.open_section("Binary references").locator("button[query=binary]").click()
    expect(main.locator("#binary-details")).not_to_be_empty()
    rui.assert_clean("the node's memory and binary breakdowns")
    main = rui.visit("#/cluster-name")
    name = live.ui.api("GET", "/cluster-name")["name"]
    expect(main.locator("h1")).to_have_text(f"Cluster name: {name}")


def test_connections_and_channels(rui: RabbitUI, live: Live) -> None:
    conn = live.connection(LOAD_NAME)
    main = rui.visit("#/connections")
    expect(main.locator("table.list")).to_contain_text(LOAD_NAME)
    main = rui.visit(f"#/connections/{esc(conn['name'])}")
    expect(main.locator("h2").first).to_contain_text(conn["name"])
    details = main.locator("table.facts").first
    for text in (LOAD_NAME, USER, "AMQP 0-9-1"):
        expect(details).to_contain_text(text)
    expect(main).to_contain_text("Channels (2)")
    expect(rui.legend("data-rates-conn", "From client")).to_have_text(
        re.compile(r"[1-9][\d.]* (B|KiB|MiB)/s"), timeout=STATS_TIMEOUT
    )

    def channels() -> list[dict[str, Any]]:  # (RabbitMQ: after their first statistics)
        return live.ui.api("GET", f"/connections/{esc(conn['name'])}/channels")

    eventually(lambda: sorted(c["consumer_count"] for c in channels()) == [0, 1])
    consumer_channel = next(c for c in channels() if c["consumer_count"] == 1)
    main = rui.visit("#/channels")
    for ch in channels():
        link = main.locator(f"table.list a[href='#/channels/{esc(ch['name'])}']")
        expect(link).to_have_count(1, timeout=STATS_TIMEOUT)
    main = rui.visit(f"#/channels/{esc(consumer_channel['name'])}")
    expect(main.locator("h1")).to_have_text(f"Channel: {consumer_channel['name']}")
    consumers = rui.open_section("Consumers")
    expect(consumers).to_contain_text(CLASSIC)
    expect(rui.facts_cell("Prefetch count")).to_have_text("10")


def test_exchanges(rui: RabbitUI, live: Live) -> None:
    main = rui.visit("#/exchanges")
    cells = rui.row(main.locator("table.list"), TOPIC)
    assert "topic" in cells, cells
    main = rui.visit(f"#/exchanges/%2F/{TOPIC}")
    expect(main.locator("h1")).to_have_text(f"Exchange: {TOPIC}")
    expect(rui.open_section("Bindings")).to_contain_text(CLASSIC)
    expect(rui.legend("msg-rates-x", "Publish (In)")).to_have_text(
        NONZERO_RATE, timeout=STATS_TIMEOUT
    )
    main = rui.visit("#/exchanges/%2F/amq.default")
    expect(main.locator("h1")).to_have_text("Exchange: (AMQP default)")


def test_queues_of_each_type(rui: RabbitUI, live: Live) -> None:
    main = rui.visit("#/queues")
    table = main.locator("table.list")
    for name, kind in ((BACKLOG, "classic"), (QUORUM, "quorum"), (STREAM, "stream")):
        cells = rui.row(table, name)
        q = live.ui.api("GET", f"/queues/%2F/{esc(name)}")
        assert kind in cells, (name, cells)
        assert contiguous(cells, counts(q)), (name, cells, counts(q))
    assert f"{BACKLOG_COUNT}" in rui.row(table, BACKLOG)

    for name in (BACKLOG, QUORUM):
        main = rui.visit(f"#/queues/%2F/{name}")
        q = live.ui.api("GET", f"/queues/%2F/{name}")
        expect(main.locator("h1")).to_have_text(f"Queue {name}")
        keys = ("messages", "messages_ready", "messages_unacknowledged")
        assert rui.facts_row("Messages")[:3] == [f"{q[k]:,}" for k in keys]
    # A quorum queue's page: its "In memory ready" and "Dead-lettered" counts too,
    # and never "idle" (as RabbitMQ 3.10's quorum queues).
    assert rui.facts_row("Messages")[3:] == [f"{q['messages_ram']:,}", "0"]
    expect(main.locator("table.facts").nth(1)).to_contain_text("running")

    main = rui.visit(f"#/queues/%2F/{BACKLOG}")
    expect(main.locator("table.facts").first).to_contain_text(POLICY)

    main = rui.visit(f"#/queues/%2F/{STREAM}")
    q = live.ui.api("GET", f"/queues/%2F/{STREAM}")
    assert rui.facts_row("Messages")[:1] == [f"{q['messages']:,}"]

    # The consumed queue: busy, so "running" (not "idle") and its rates moving.
    main = rui.visit(f"#/queues/%2F/{CLASSIC}")
    expect(rui.legend("msg-rates-q", "Publish")).to_have_text(
        NONZERO_RATE, timeout=STATS_TIMEOUT
    )
    state = rui.facts_cell("State")
    expect(state).to_have_text("running", timeout=STATS_TIMEOUT)
    rui.page.evaluate("() => partial_update()")
    rui.wait_rendered()
    expect(state).to_have_text("running")  # and stays so while it works
    tag = live.ui.api("GET", f"/queues/%2F/{CLASSIC}")["consumer_details"][0]["consumer_tag"]
    expect(rui.open_section("Consumers")).to_contain_text(tag)
    rui.assert_clean(f"#/queues/%2F/{CLASSIC} after its rates")


def test_admin_pages(rui: RabbitUI, live: Live) -> None:
    main = rui.visit("#/users")
    assert "administrator" in rui.row(main.locator("table.list"), USER)
    main = rui.visit(f"#/users/{USER}")
    expect(main.locator("h1")).to_have_text(f"User: {USER}")
    expect(rui.open_section("Permissions")).to_contain_text("/")

    main = rui.visit("#/vhosts")
    rui.row(main.locator("table.list"), "/")
    main = rui.visit("#/vhosts/%2F")
    expect(main.locator("h1")).to_have_text("Virtual Host: /")

    main = rui.visit("#/feature-flags")
    flags = live.ui.api("GET", "/feature-flags")
    assert flags
    for flag in flags:
        expect(main.locator("table.list")).to_contain_text(flag["name"])
    quorum = main.locator("table.list tr", has_text="quorum_queue")
    expect(quorum).to_contain_text("enabled", ignore_case=True)

    main = rui.visit("#/policies")
    cells = rui.row(main.locator("table.list").first, POLICY)
    assert f"^{BACKLOG}$" in cells, cells
    main = rui.visit(f"#/policies/%2F/{POLICY}")
    expect(main.locator("h1")).to_have_text(f"Policy: {POLICY}")
    expect(main).to_contain_text("max-length")

    main = rui.visit("#/limits")
    expect(main.locator("table.list").first).to_contain_text("max-connections")
    expect(main.locator("table.list").first).to_contain_text("1000")
    expect(main.locator("table.list").nth(1)).to_contain_text("max-channels")


def test_federation_and_shovel_pages(rui: RabbitUI, live: Live) -> None:
    main = rui.visit("#/federation")
    expect(main.locator("h1")).to_have_text("Federation Status")
    main = rui.visit("#/federation-upstreams")
    rui.row(main.locator("table.list"), UPSTREAM)
    main = rui.visit(f"#/federation-upstreams/%2F/{UPSTREAM}")
    expect(main.locator("h1")).to_have_text(f"Federation Upstream: {UPSTREAM}")

    main = rui.visit("#/shovels")
    expect(main.locator("h1")).to_have_text("Shovel Status")
    expect(main.locator("table.list")).to_contain_text(SHOVEL)
    main = rui.visit("#/dynamic-shovels")
    rui.row(main.locator("table.list"), SHOVEL)
    main = rui.visit(f"#/dynamic-shovels/%2F/{SHOVEL}")
    expect(main.locator("h1")).to_have_text(f"Dynamic Shovel: {SHOVEL}")
    expect(main).to_contain_text(f"{SHOVEL}-src")


def test_pages_of_one_vhost(rui: RabbitUI, live: Live) -> None:
    """With two vhosts the UI lists a vhost column and offers to show one vhost:
    every list is then asked for with the vhost in its path."""
    other = f"{P}other-{uuid.uuid4().hex[:8]}"
    api = live.ui.api
    api("PUT", f"/vhosts/{esc(other)}", {"description": "second"})
    try:
        rui.page.reload()  # the vhost list is read at login
        rui.wait_rendered()
        rui.page.locator("#show-vhost").select_option("/")
        rui.wait_rendered()
        for route in ("#/connections", "#/channels", "#/exchanges", "#/queues", "#/policies",
                      "#/federation", "#/federation-upstreams", "#/shovels", "#/dynamic-shovels"):
            rui.visit(route)
        main = rui.visit("#/queues")
        rui.row(main.locator("table.list"), BACKLOG)
        rui.page.locator("#show-vhost").select_option(other)
        rui.wait_rendered()
        main = rui.visit("#/queues")
        expect(main.locator("table.list a", has_text=BACKLOG)).to_have_count(0)
        rui.page.locator("#show-vhost").select_option("")
        rui.wait_rendered()
        rui.assert_clean("back to every vhost")
    finally:
        api("DELETE", f"/vhosts/{esc(other)}")
