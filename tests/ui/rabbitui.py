"""RabbitMQ's own management UI in a browser page, and the objects and load it is
looked at with (tests/ui/test_rabbitmq_ui.py, test_rabbitmq_ui_forms.py).

Every page is checked the same way (:meth:`RabbitUI.visit`): no uncaught
exception, no console error, no /api request refused, nothing in the UI's own
error line (``#debug``: template errors, unexpected statuses) or warning popup,
no ``NaN``/``undefined`` in the page. Nothing sleeps to synchronise: the waits
are on the page's state (the UI's ``outstanding_reqs``) or on the API; the
load's pacing is what makes it a small load.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pika
from diskhelp import eventually  # tests/diskhelp.py
from playwright.sync_api import Locator, Page, Response, expect

from .conftest import PASSWORD, USER, Console, UIServer
from .helpers import POLL_MS, load

P = "rmqui-"
CLASSIC, BACKLOG, QUORUM, STREAM = f"{P}classic", f"{P}backlog", f"{P}quorum", f"{P}stream"
TOPIC, POLICY, UPSTREAM, SHOVEL = f"{P}topic", f"{P}policy", f"{P}upstream", f"{P}shovel"
LOAD_NAME = f"{P}load"
BACKLOG_COUNT = 7
#: Seconds between the load's publishes: ten a second, enough for every rate (the
#: UI rounds them to 0.01/s) and for a busy queue (not idle: its counts change in
#: every 5 s statistics interval); more only cost the broker and pika CPU.
LOAD_PACE = 0.1


def esc(name: str) -> str:
    """As the UI's esc(): JavaScript's encodeURIComponent."""
    return quote(name, safe="!*'()")


def api_status(ui: UIServer, path: str) -> int:
    try:
        ui.api("GET", path)
    except urllib.error.HTTPError as e:
        return e.code
    return 200


@dataclass
class Live:
    """The objects and load every page is looked at with."""

    ui: UIServer
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def params(self) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            "127.0.0.1",
            self.ui.amqp_port,
            credentials=pika.PlainCredentials(USER, PASSWORD),
            client_properties={"connection_name": LOAD_NAME},
        )

    def connection(self, name: str) -> dict[str, Any]:
        """The connection a client named ``name`` (RabbitMQ lists one after its
        first statistics)."""

        def named() -> list[dict[str, Any]]:
            return [
                c for c in self.ui.api("GET", "/connections")
                if c.get("client_properties", {}).get("connection_name") == name
            ]

        eventually(lambda: bool(named()), what=f"connection {name} listed")
        return named()[0]

    def declare(self) -> None:
        conn = pika.BlockingConnection(self.params())
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(CLASSIC, durable=True)
        ch.queue_declare(BACKLOG, durable=True)
        ch.queue_declare(QUORUM, durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
        ch.exchange_declare(TOPIC, "topic", durable=True)
        ch.queue_bind(CLASSIC, TOPIC, "load.#")
        for i in range(BACKLOG_COUNT):
            ch.basic_publish("", BACKLOG, b"backlog %d" % i, pika.BasicProperties(delivery_mode=2))
        for i in range(3):
            ch.basic_publish("", QUORUM, b"quorum %d" % i)
            ch.basic_publish("", STREAM, b"stream %d" % i)
        conn.close()
        api = self.ui.api
        api("PUT", f"/policies/%2F/{POLICY}", {
            "pattern": f"^{BACKLOG}$", "definition": {"max-length": 1000}, "apply-to": "queues"
        })
        api("PUT", "/vhost-limits/%2F/max-connections", {"value": 1000})
        api("PUT", f"/user-limits/{USER}/max-channels", {"value": 2000})
        local = "amqp://"
        api("PUT", f"/parameters/federation-upstream/%2F/{UPSTREAM}", {
            "value": {"uri": f"amqp://127.0.0.1:{self.ui.amqp_port}", "max-hops": 1}
        })
        api("PUT", f"/parameters/shovel/%2F/{SHOVEL}", {"value": {
            "src-uri": local, "src-queue": f"{SHOVEL}-src",
            "dest-uri": local, "dest-queue": f"{SHOVEL}-dest",
        }})

    def run(self) -> None:
        """Publish to the topic exchange (confirmed) and consume from its queue."""
        try:
            conn = pika.BlockingConnection(self.params())
            pub = conn.channel()
            pub.confirm_delivery()
            sub = conn.channel()
            sub.basic_qos(prefetch_count=10)
            sub.basic_consume(CLASSIC, lambda c, m, _p, _b: c.basic_ack(m.delivery_tag))
            self.started.set()
            while not self.stop.is_set():
                pub.basic_publish(TOPIC, "load.ui", b"x" * 100)
                conn.process_data_events(time_limit=0)
                self.stop.wait(LOAD_PACE)
            conn.close()
        except BaseException as e:  # reported by the fixture's teardown
            self.errors.append(e)
            self.started.set()

    def clean(self) -> None:
        api = self.ui.api
        for path in (
            f"/parameters/shovel/%2F/{SHOVEL}",
            f"/parameters/federation-upstream/%2F/{UPSTREAM}",
            f"/policies/%2F/{POLICY}",
            "/vhost-limits/%2F/max-connections",
            f"/user-limits/{USER}/max-channels",
            f"/exchanges/%2F/{TOPIC}",
            *(f"/queues/%2F/{q}" for q in (CLASSIC, BACKLOG, QUORUM, STREAM)),
            *(f"/queues/%2F/{SHOVEL}-{end}" for end in ("src", "dest")),
        ):
            try:
                api("DELETE", path)
            except urllib.error.HTTPError as e:
                assert e.code == 404, (path, e.code)


@contextmanager
def running_load(ui: UIServer) -> Iterator[Live]:
    """Live's objects declared, its load running until the block ends; then
    everything removed, and the load's errors raised."""
    live = Live(ui)
    live.declare()
    for q in (CLASSIC, BACKLOG, QUORUM, STREAM):  # RabbitMQ counts after its first statistics
        eventually(lambda q=q: "messages" in live.ui.api("GET", f"/queues/%2F/{q}"))
    thread = threading.Thread(target=live.run, name="rmqui-load", daemon=True)
    thread.start()
    assert live.started.wait(30)
    try:
        yield live
    finally:
        live.stop.set()
        thread.join(30)
        live.clean()
    assert not live.errors, live.errors


@dataclass
class RabbitUI:
    """RabbitMQ's UI in one browser page, and what went wrong in it."""

    page: Page
    ui: UIServer
    console: Console
    refused: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("response", self._on_response)

    def _on_response(self, response: Response) -> None:
        if "/api/" in response.url and response.status >= 400:
            self.refused.append(f"{response.status} {response.request.method} {response.url}")

    def log_in(self) -> None:
        load(self.page, f"{self.ui.url}/")
        self.page.locator("input[name=username]").fill(USER)
        self.page.locator("input[name=password]").fill(PASSWORD)
        self.page.locator("#login input[type=submit]").click()
        self.wait_rendered()
        expect(self.page.locator("#header")).to_contain_text(f"User {USER}")
        self.assert_clean("log in")

    def reset(self) -> None:
        """The page as a log-in leaves it, for the next test on a kept page
        (conftest.py's rui): on the overview, no message popup, nothing in #debug,
        what went wrong since the last check forgotten (a fresh page's test
        never saw it either)."""
        self.page.evaluate(
            """() => {
                $('.form-popup-info, .form-popup-warn').remove();
                $('#debug').empty();
                if (location.hash !== '#/') { $('#main').empty(); location.hash = '#/'; }
            }"""
        )
        self.wait_rendered()
        self.console.errors.clear()
        self.refused.clear()

    def wait_rendered(self) -> None:
        """The page drawn and every request it made answered."""
        self.page.wait_for_function(
            "() => typeof outstanding_reqs !== 'undefined' && outstanding_reqs.length === 0"
            " && $('#main').children().length > 0",
            polling=POLL_MS,
        )

    def visit(self, route: str) -> Locator:
        """Open a page (a hash route), refresh it once as the timer does, check it."""
        self.page.evaluate("() => { $('#main').empty(); $('#debug').empty(); }")
        self.page.evaluate(
            "h => { if (location.hash === h) { update(); } else { location.hash = h; } }", route
        )
        self.wait_rendered()
        self.page.evaluate("() => partial_update()")  # the 5 s refresh, now
        self.wait_rendered()
        self.assert_clean(route)
        return self.page.locator("#main")

    def assert_clean(self, where: str, text_checked: bool = True) -> None:
        """Nothing went wrong; ``text_checked``: nor shows the page NaN or undefined
        (RabbitMQ shows NaN for a queue until its first statistics)."""
        debug = self.page.locator("#debug").inner_text()
        popup = self.page.locator(".form-popup-warn")
        warning = popup.first.inner_text() if popup.count() else ""
        main = self.page.locator("#main")
        text = main.inner_text() if text_checked and main.count() else ""
        shown = [
            text[max(0, m.start() - 80) : m.end() + 20]
            for m in re.finditer(r"\b(NaN|undefined)\b", text)
        ]
        problems = {
            "console": list(self.console.errors),
            "refused /api requests": list(self.refused),
            "#debug": debug.strip(),
            "warning popup": warning.strip(),
            "shown in the page": shown,
        }
        problems = {k: v for k, v in problems.items() if v}
        self.console.errors.clear()
        self.refused.clear()
        assert not problems, f"{where}: {json.dumps(problems, indent=1)}"

    def open_section(self, title: str) -> Locator:
        """Unfold a folded section (``div.section-hidden``) by its heading."""
        section = self.page.locator("#main div.section-hidden, #main div.section").filter(
            has=self.page.locator("h2", has_text=re.compile(rf"^\s*{re.escape(title)}"))
        )
        heading = section.locator("h2").first
        if section.locator(".hider").first.is_hidden():
            heading.click()
        expect(section.locator(".hider").first).to_be_visible()
        return section

    def row(self, table: Locator, name: str) -> list[str]:
        """The cells of the table row that links to ``name``."""
        row = table.locator("tr").filter(
            has=self.page.get_by_role("link", name=name, exact=True)
        )
        expect(row).to_have_count(1)
        return [c.strip() for c in row.locator("td").all_inner_texts()]

    def facts_row(self, heading: str) -> list[str]:
        """The cells after a facts table's row heading (the queue page's Messages)."""
        return [c.strip() for c in self._facts(heading).locator("td").all_inner_texts()]

    def facts_cell(self, heading: str) -> Locator:
        return self._facts(heading).locator("td").first

    def _facts(self, heading: str) -> Locator:
        return (
            self.page.locator("#main table.facts tr")
            .filter(has=self.page.locator("th", has_text=re.compile(rf"^\s*{re.escape(heading)}")))
            .first
        )

    def legend(self, chart: str, name: str) -> Locator:
        """A rate chart's legend value (``#chart-<chart>``'s box)."""
        box = self.page.locator(f"#main div.box:has(#chart-{chart})")
        label = self.page.locator("th", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$"))
        return box.locator("table.legend tr").filter(has=label).locator("td")


def contiguous(cells: list[str], wanted: list[str]) -> bool:
    n = len(wanted)
    return any(cells[i : i + n] == wanted for i in range(len(cells) - n + 1))


def counts(q: dict[str, Any]) -> list[str]:
    return [f"{q[k]:,}" for k in ("messages_ready", "messages_unacknowledged", "messages")]


NONZERO_RATE = re.compile(r"^\s*(?!0\.00/s)[\d,.]+/s\s*$")
