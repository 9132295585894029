"""Steps the browser tests share."""

from __future__ import annotations

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Request, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from .conftest import PAGE_ERRORS, PASSWORD, USER, UIServer

#: The management API refreshes its statistics every few seconds (RabbitMQ: 5 s)
#: and the UI polls every 5 s: counters and rates may take two rounds to move.
STATS_TIMEOUT = 30_000
#: How often a wait_for_function checks the page: playwright's default is every
#: animation frame, 60 a second, which keeps headless Chromium drawing frames
#: (some 0.05 CPU-seconds per second of waiting) for states that the API's
#: answers change, not frames.
POLL_MS = 50


#: What Chromium answers a request with when the machine's network changed
#: while it ran: the cluster tests' network namespaces add and remove
#: interfaces (tests/cluster/netns.py), which Chromium takes for a network
#: change and fails the page's requests of that moment, its scripts included.
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def load(page: Page, url: str, attempts: int = 3) -> None:
    """``page.goto(url)`` until the page loaded with no request failed by a
    network change (NETWORK_CHANGED): loaded again then, as a user would."""
    errors = PAGE_ERRORS.get(page)
    for attempt in range(attempts):
        changed: list[str] = []
        mark = len(errors) if errors is not None else 0

        def failed(request: Request, changed: list[str] = changed) -> None:
            if NETWORK_CHANGED in (request.failure or ""):
                changed.append(request.url)

        page.on("requestfailed", failed)
        try:
            page.goto(url)
            page.wait_for_load_state("networkidle")
        except PlaywrightError as exc:
            if NETWORK_CHANGED not in str(exc) or attempt == attempts - 1:
                raise
            changed.append(url)
        finally:
            page.remove_listener("requestfailed", failed)
        if not changed:
            return
        if errors is not None:
            del errors[mark:]
    raise AssertionError(f"{url}: requests failed by network changes {attempts} times: {changed}")


def log_in(page: Page, ui: UIServer, password: str = PASSWORD) -> None:
    load(page, f"{ui.url}/")
    form = page.locator("#login-form")
    expect(form).to_be_visible()
    form.locator("input[name=username]").fill(USER)
    form.locator("input[name=password]").fill(password)
    form.locator("button[type=submit]").click()


def series_value(page: Page, chart: str, series: str, attr: str) -> float:
    item = page.locator(f"[data-chart={chart}] [data-series={series}]")
    return float(item.get_attribute(f"data-{attr}") or 0)


def wait_for_series(page: Page, chart: str, series: str, attr: str, test: str) -> None:
    """Wait until a chart series' data-<attr> (v) passes a JS test."""
    selector = f"[data-chart={chart}] [data-series={series}]"
    try:
        page.wait_for_function(
            f"""() => {{
                const el = document.querySelector('{selector}');
                const v = el ? Number(el.dataset.{attr}) : NaN;
                return {test};
            }}""",
            timeout=STATS_TIMEOUT,
            polling=POLL_MS,
        )
    except PlaywrightTimeoutError:
        legend = page.locator(f"[data-chart={chart}] .legend").evaluate("e => e.outerHTML")
        raise AssertionError(f"{selector}: data-{attr} never passed `{test}`: {legend}") from None


def expect_flash(page: Page, text: str) -> None:
    """The page's message line says text; then it is emptied for the next step."""
    expect(page.locator("#flash")).to_have_text(text)
    page.locator("#flash").evaluate("el => el.replaceChildren()")
