"""Steps the browser tests share."""

from __future__ import annotations

from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from .conftest import PASSWORD, USER, UIServer

#: The management API refreshes its statistics every few seconds (RabbitMQ: 5 s)
#: and the UI polls every 5 s: counters and rates may take two rounds to move.
STATS_TIMEOUT = 30_000


def log_in(page: Page, ui: UIServer, password: str = PASSWORD) -> None:
    page.goto(f"{ui.url}/")
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
        )
    except PlaywrightTimeoutError:
        legend = page.locator(f"[data-chart={chart}] .legend").evaluate("e => e.outerHTML")
        raise AssertionError(f"{selector}: data-{attr} never passed `{test}`: {legend}") from None


def expect_flash(page: Page, text: str) -> None:
    """The page's message line says text; then it is emptied for the next step."""
    expect(page.locator("#flash")).to_have_text(text)
    page.locator("#flash").evaluate("el => el.replaceChildren()")
