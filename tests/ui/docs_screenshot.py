"""Regenerate docs/img/ui-overview.png: the overview of a broker under a little load.

    python tests/ui/docs_screenshot.py http://127.0.0.1:15672 5672

Publishes a varying number of messages every few seconds and consumes some
(pika) for about a minute with the overview open, then takes the screenshot
(Debian's chromium through playwright).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pika
from playwright.sync_api import expect, sync_playwright

OUT = Path(__file__).resolve().parents[2] / "docs" / "img" / "ui-overview.png"


def main() -> None:
    base, amqp_port = sys.argv[1].rstrip("/"), int(sys.argv[2])
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    for q in ("orders", "invoices", "audit"):
        ch.queue_declare(q, durable=True)
        ch.queue_purge(q)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 1200, "height": 700})
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
        page.screenshot(path=str(OUT))
        browser.close()
    conn.close()
    print(f"{OUT}: {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
