"""README's screenshot of the UI shows the UI's current pages.

tests/ui/docs_screenshot.py takes docs/img/ui-overview.png and records beside it,
in ui-overview.json, the navigation it shows and the PNG's SHA-256. Here the same
capture runs against the UI in Chromium, written to
tests/ui/artifacts/ui-overview.png (each run's picture, to look at or to copy
over the committed one), and is compared with that record: a page added to (or
removed from) the navigation fails until the picture is taken again, and so
does a PNG replaced without its record. The committed PNG is not rewritten
here: its live charts and fonts never give the same bytes twice.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
from playwright.sync_api import Page, expect

from .conftest import ARTIFACTS, Console, UIServer
from .docs_screenshot import MANIFEST, OUT, VIEWPORT, capture
from .helpers import log_in

pytestmark = pytest.mark.ui

RETAKE = "take it again: python tests/ui/docs_screenshot.py http://127.0.0.1:15672 5672"


def test_screenshot_shows_the_uis_navigation(
    page: Page, ui_server: UIServer, console: Console
) -> None:
    log_in(page, ui_server)  # as guest, an administrator: every page
    expect(page.locator("main h1")).to_have_text("Overview")
    recorded = json.loads(MANIFEST.read_text())
    png, nav = capture(page)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / OUT.name).write_bytes(png)
    assert nav == recorded["nav"], f"{OUT.name} shows other pages than the UI; {RETAKE}"
    assert _size(png) == recorded["viewport"]  # the README's picture's size
    assert console.errors == []


def test_screenshot_is_the_one_recorded() -> None:
    png = OUT.read_bytes()
    recorded = json.loads(MANIFEST.read_text())
    assert hashlib.sha256(png).hexdigest() == recorded["sha256"], (
        f"{MANIFEST.name} is stale; {RETAKE}"
    )
    assert _size(png) == recorded["viewport"] == [VIEWPORT["width"], VIEWPORT["height"]]


def _size(png: bytes) -> list[int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return list(struct.unpack(">II", png[16:24]))
