"""Regenerate docs/img/ui-overview.png (README's and docs/ui.md's picture of the UI).

    python tests/ui/docs_screenshot.py http://127.0.0.1:15672 5672

Publishes a varying number of messages every few seconds and consumes some
(pika) for about a minute with the overview open, then takes the screenshot
(Debian's chromium through playwright) and writes docs/img/ui-overview.json
beside it: the navigation the picture shows and the PNG's SHA-256.
tests/ui/test_docs_screenshot.py compares that navigation with the UI's, so a
page added to the UI fails the test until the picture is taken again.

The PNG itself is not rewritten by every test run: live rate charts sampled on
the wall clock, and fonts as each Chromium build renders them, never give the
same bytes twice, so a committed picture written by `make test` would change
at every run.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pika
from playwright.sync_api import Page, expect, sync_playwright

OUT = Path(__file__).resolve().parents[2] / "docs" / "img" / "ui-overview.png"
MANIFEST = OUT.with_suffix(".json")
VIEWPORT = {"width": 1200, "height": 700}


def nav_labels(page: Page) -> list[str]:
    """The navigation links a logged-in administrator sees, in order."""
    return [t.strip() for t in page.locator("#nav a:visible").all_inner_texts()]


def capture(page: Page) -> tuple[bytes, list[str]]:
    """The overview as the README shows it (a PNG of the viewport) and the
    navigation it shows: what main() commits and the UI test takes each run."""
    page.set_viewport_size(VIEWPORT)  # type: ignore[arg-type]
    return page.screenshot(), nav_labels(page)


def manifest_for(png: bytes, nav: list[str]) -> dict[str, object]:
    return {
        "image": OUT.name,
        "sha256": hashlib.sha256(png).hexdigest(),
        "viewport": [VIEWPORT["width"], VIEWPORT["height"]],
        "nav": nav,
    }


def main() -> None:
    base, amqp_port = sys.argv[1].rstrip("/"), int(sys.argv[2])
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    for q in ("orders", "invoices", "audit"):
        ch.queue_declare(q, durable=True)
        ch.queue_purge(q)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
        page.goto(f"{base}/")
        page.fill("#login-form input[name=username]", "guest")
        page.fill("#login-form input[name=password]", "guest")
        page.click("#login-form button[type=submit]")
        expect(page.locator("main h1")).to_have_text("Overview")
        for step in range(14):
            for _ in range(40 + 25 * (step % 4)):
                ch.basic_publish("", "orders", b"order", pika.BasicProperties(delivery_mode=2))
                ch.basic_publish("", "audit", b"audit")
            for _ in range(30 + 10 * (step % 3)):
                method, _, _ = ch.basic_get("orders")
                if method:
                    ch.basic_ack(method.delivery_tag)
            conn.process_data_events(time_limit=4.5)
        png, nav = capture(page)
        browser.close()
    conn.close()
    OUT.write_bytes(png)
    MANIFEST.write_text(json.dumps(manifest_for(png, nav), indent=1) + "\n")
    print(f"{OUT}: {len(png)} bytes; {MANIFEST.name}: {', '.join(nav)}")


if __name__ == "__main__":
    main()
