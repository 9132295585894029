"""The management UI in a real headless Chromium (Debian's), driven by playwright.

The UI talks to an embedded Warren's HTTP listener (http_port=0) unless
WARREN_UI_API_URL names another management API, e.g. a RabbitMQ:

    WARREN_UI_API_URL=http://127.0.0.1:15672 pytest tests/ui

In that case (and when Warren's listener serves the API but not the UI files)
devserver.py serves the files from src/warren/http/static and proxies /api.
Screenshots go to tests/ui/artifacts/.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import rabbitmq_www
from .devserver import DevServer

pytest.importorskip("playwright", reason="playwright is not installed (the test extra)")

from playwright.sync_api import (  # noqa: E402
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Playwright,
    expect,
    sync_playwright,
)

# expect()'s assertions wait for a page's state too, with a timeout of their own
# (5 s) that the page's default does not change: the login form of the pure
# pass's first UI test, at the start of make test (every pass, the build and a
# Spark JVM starting on two cores), once took longer.
expect.set_options(timeout=60_000)

if TYPE_CHECKING:
    from .rabbitui import Live, RabbitUI

API_URL_ENV = "WARREN_UI_API_URL"
CHROMIUM = os.environ.get("WARREN_UI_CHROMIUM", "/usr/bin/chromium")
UI_TESTS = Path(__file__).resolve().parent
ARTIFACTS = UI_TESTS / "artifacts"
USER, PASSWORD = "guest", "guest"
#: Headless Chromium still builds each window's omnibox popup, a WebUI page in a
#: renderer of its own (chrome://omnibox-popup.top-chrome/): some 0.6 s of CPU per
#: browser context, i.e. per test, for a browser bar no test sees (issue 29).
OMNIBOX_POPUP_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup")


def chromium_args() -> list[str]:
    """--disable-gpu, and --disable-features with the omnibox popup's added to
    Playwright's own list. Chromium honours the last --disable-features only, so
    the list Playwright passes first (its driver's chromiumSwitches) is repeated,
    as read from the driver; where it cannot be read, the popup stays."""
    import playwright

    driver = Path(playwright.__file__).parent / "driver" / "package" / "lib"
    for source in (
        driver / "coreBundle.js",
        driver / "server" / "chromium" / "chromiumSwitches.js",
    ):
        with contextlib.suppress(OSError):
            block = re.search(r"disabledFeatures = \[(.*?)\]", source.read_text(), re.DOTALL)
            if block:
                listed = re.findall(r'"(\w+)"', re.sub(r"//[^\n]*", "", block.group(1)))
                features = ",".join(dict.fromkeys([*listed, *OMNIBOX_POPUP_FEATURES]))
                return ["--disable-gpu", f"--disable-features={features}"]
    return ["--disable-gpu"]


@dataclass
class UIServer:
    """Where the browser opens the UI, and what answers its /api calls."""

    url: str
    api_description: str
    #: The broker's AMQP port on 127.0.0.1, for tests that need a client connection.
    amqp_port: int

    def api(
        self, method: str, path: str, body: Any = None, auth: tuple[str, str] = (USER, PASSWORD)
    ) -> Any:
        """A management API call (guest/guest) from the test itself, not the browser."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/api{path}", data=data, method=method)
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read()
        return json.loads(text) if text else None


def _status(url: str, auth: bool = False) -> int:
    req = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UIServer]:
    external = os.environ.get(API_URL_ENV)
    if external:
        if _status(f"{external.rstrip('/')}/api/overview", auth=True) != 200:
            pytest.fail(f"{API_URL_ENV}={external}: GET /api/overview as guest did not answer 200")
        dev = DevServer(external).start()
        try:
            ui = UIServer(dev.url, f"{external} through tests/ui/devserver.py", 0)
            listeners = ui.api("GET", "/overview").get("listeners", [])
            ui.amqp_port = next((x["port"] for x in listeners if x["protocol"] == "amqp"), 5672)
            yield ui
        finally:
            dev.stop()
        return

    from conftest import start_broker  # tests/conftest.py

    data_dir = tmp_path_factory.mktemp("warren-ui") / "data"
    try:
        broker = start_broker(data_dir, http_port=0)
    except TypeError as e:
        pytest.skip(f"Warren's Config has no http_port yet ({e}); set {API_URL_ENV} to test the UI")
    try:
        listener = broker.broker.listener("http")
        if listener is None:
            pytest.skip(f"Warren has no HTTP listener yet; set {API_URL_ENV} to test the UI")
        base = f"http://127.0.0.1:{listener.port}"
        if _status(f"{base}/api/overview", auth=True) != 200:
            pytest.skip(f"Warren's HTTP listener does not serve GET /api/overview yet ({base})")
        if _status(f"{base}/ui/app.js") == 200 and _status(f"{base}/") == 200:
            yield UIServer(base, f"embedded Warren ({base})", broker.port)
        else:
            dev = DevServer(base).start()
            try:
                yield UIServer(
                    dev.url, f"embedded Warren ({base}) through tests/ui/devserver.py", broker.port
                )
            finally:
                dev.stop()
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def rabbitmq_ui(ui_server: UIServer) -> Iterator[UIServer]:
    """RabbitMQ's own management UI, read from the installed rabbitmq-server
    package, its /api calls answered by the same management API as ui_server's."""
    www = rabbitmq_www.find()
    if www is None:
        pytest.skip(
            "RabbitMQ's management UI is not installed (no rabbitmq_management plugin under "
            f"{rabbitmq_www.PLUGINS_GLOB}; `make rabbitmq` installs Debian's rabbitmq-server)"
        )
    dev = DevServer(ui_server.url, rabbitmq_www=www).start()
    try:
        yield UIServer(
            dev.url,
            f"RabbitMQ {www.version}'s UI over {ui_server.api_description}",
            ui_server.amqp_port,
        )
    finally:
        dev.stop()


class SharedBrowser:
    """One Chromium, and one Playwright driver, per test process for a run of
    tests that need a browser (each test gets a context of its own: the page
    fixture): a browser per module started 16 of each in tests/ui, some 1.5
    CPU-seconds apiece. Playwright's sync API keeps its asyncio loop marked
    running on this thread while it is open; any test that runs a loop of its
    own (xdist hands tests out in any order) would fail with "Cannot run the
    event loop while another loop is running". So the mark is set only while a
    test uses the browser (:meth:`use`, :meth:`pause`), and the browser is
    closed when the next test on this process is not one of tests/ui
    (pytest_runtest_teardown below)."""

    def __init__(self) -> None:
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: (the fixture, its key, the context, what the fixture made in it)
        self._kept: tuple[str, str, BrowserContext, Any] | None = None

    def use(self) -> Browser:
        if self._browser is not None:
            asyncio._set_running_loop(self._loop)
            return self._browser
        playwright = sync_playwright().start()
        self._loop = asyncio._get_running_loop()  # the mark start() left
        try:
            self._browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=chromium_args()
            )
        except BaseException:
            playwright.stop()
            raise
        self._playwright = playwright
        return self._browser

    def pause(self) -> None:
        if self._browser is not None:
            asyncio._set_running_loop(None)

    def kept(self, fixture: str, key: str, make: Callable[[BrowserContext], Any]) -> Any:
        """What ``make`` built in a context of its own for ``fixture`` and ``key``
        (a logged-in page), while the browser lasts and they stay the
        same: another's is dropped first."""
        if self._kept is not None and self._kept[:2] == (fixture, key):
            return self._kept[3]
        self.drop()
        context = new_context(self.use())
        try:
            self._kept = (fixture, key, context, make(context))
        except BaseException:
            context.close()
            raise
        return self._kept[3]

    def kept_by(self) -> str | None:
        return self._kept[0] if self._kept is not None else None

    def drop(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None and self._browser is not None:
            marked = asyncio._get_running_loop()
            asyncio._set_running_loop(self._loop)
            try:
                kept[2].close()
            finally:
                asyncio._set_running_loop(marked)

    def close(self) -> None:
        browser, playwright = self._browser, self._playwright
        if browser is None or playwright is None:
            return
        asyncio._set_running_loop(self._loop)
        try:
            self.drop()
            browser.close()
        finally:
            self._browser = self._playwright = None
            playwright.stop()  # its loop ends: the mark is cleared


SHARED_BROWSER = SharedBrowser()


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (make browser: apt-get install chromium)")
    try:
        yield SHARED_BROWSER.use()
    finally:
        SHARED_BROWSER.pause()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's fixtures (its browser context closed): the shared browser
    closed unless the next test on this process is one of tests/ui (make test
    runs them one after the other on a worker; one that needs no browser
    between them would cost a Chromium start), the kept page (rui,
    logged_in) unless the next test uses that fixture."""
    yield
    if nextitem is None or not Path(nextitem.path).is_relative_to(UI_TESTS):
        SHARED_BROWSER.close()
    elif SHARED_BROWSER.kept_by() not in getattr(nextitem, "fixturenames", ()):
        SHARED_BROWSER.drop()  # a kept page would go on polling the API


@dataclass
class Console:
    """What the page printed: errors and uncaught exceptions."""

    errors: list[str] = field(default_factory=list)

    def on_message(self, msg: ConsoleMessage) -> None:
        # A request a network change failed (helpers.NETWORK_CHANGED: another
        # test's network namespaces) says nothing of the page; load() retries it.
        if msg.type == "error" and "net::ERR_NETWORK_CHANGED" not in msg.text:
            self.errors.append(f"console.error: {msg.text} ({msg.location.get('url', '')})")

    def on_page_error(self, exc: Exception) -> None:
        self.errors.append(f"uncaught: {exc}")


@pytest.fixture
def console() -> Console:
    return Console()


#: Each page's list of console errors (the page fixture): what a
#: load that a network change failed made the page throw (a script of it
#: missing, e.g. RabbitMQ's main.js: "sync_get is not defined") is forgotten
#: when it is loaded again.
PAGE_ERRORS: weakref.WeakKeyDictionary[Page, list[str]] = weakref.WeakKeyDictionary()


def new_context(browser: Browser) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    # How long a wait for a page's state may take: the RabbitMQ UI's first render
    # after logging in once took more than 15 s in make test (four compiled-pass
    # workers, the pure pass and Chromium on two cores).
    context.set_default_timeout(60_000)
    return context


def open_page(context: BrowserContext, console: Console) -> Page:
    pg = context.new_page()
    pg.on("console", console.on_message)
    pg.on("pageerror", console.on_page_error)
    PAGE_ERRORS[pg] = console.errors  # load() forgets a failed load's errors
    # Deletions ask window.confirm(): yes.
    pg.on("dialog", lambda dialog: dialog.accept())
    return pg


@dataclass
class RelayConsole(Console):
    """A kept page's console: what the page reports goes to the console of the
    test that uses it."""

    target: Console = field(default_factory=Console)

    def on_message(self, msg: ConsoleMessage) -> None:
        self.target.on_message(msg)

    def on_page_error(self, exc: Exception) -> None:
        self.target.on_page_error(exc)


@contextlib.contextmanager
def kept_for_test(
    request: pytest.FixtureRequest,
    key: str,
    make: Callable[[BrowserContext], Any],
    reset: Callable[[Any], None],
) -> Iterator[Any]:
    """The requesting fixture's kept page (SharedBrowser.kept) for its tests
    that follow each other on this process (in any module), ``reset`` for
    each; a test that fails (or its reset) leaves none to the next, which
    starts afresh."""
    value = SHARED_BROWSER.kept(request.fixturename, key, make)
    try:
        reset(value)
    except BaseException:
        SHARED_BROWSER.drop()
        raise
    failed = request.session.testsfailed
    yield value
    if request.session.testsfailed != failed:
        SHARED_BROWSER.drop()


@pytest.fixture
def logged_in(
    request: pytest.FixtureRequest, browser: Browser, ui_server: UIServer, console: Console
) -> Iterator[Page]:
    """The management UI logged in as guest, on the overview: one page for the
    tests using it one after another on this process (kept_for_test), logged
    in by the first (a context, the UI's load and a log-in were some 0.5
    CPU-seconds per test). Each test starts as after a log-in: on the
    overview (a re-render), no message in #flash, the page's errors going to
    its own console."""
    from .helpers import log_in

    def make(context: BrowserContext) -> tuple[Page, RelayConsole]:
        relay = RelayConsole(target=console)
        pg = open_page(context, relay)
        log_in(pg, ui_server)
        return pg, relay

    def reset(kept: tuple[Page, RelayConsole]) -> None:
        pg, relay = kept
        relay.target = console
        PAGE_ERRORS[pg] = console.errors
        pg.evaluate(
            "() => { document.getElementById('flash').replaceChildren();"
            " if (location.hash !== '#/') { location.hash = '#/'; } }"
        )
        expect(pg.locator("main h1")).to_have_text("Overview")

    with kept_for_test(request, ui_server.url, make, reset) as (pg, _):
        yield pg


@pytest.fixture
def page(browser: Browser, console: Console) -> Iterator[Page]:
    context = new_context(browser)
    try:
        yield open_page(context, console)
    finally:
        context.close()


@pytest.fixture
def shot(request: pytest.FixtureRequest, page: Page):
    """shot("name") saves a screenshot as tests/ui/artifacts/<test>-<name>.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str, full_page: bool = False) -> Path:
        path = ARTIFACTS / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path

    return take


# -- RabbitMQ's own UI (test_rabbitmq_ui*.py; rabbitui.py imports this module) ---------------


@pytest.fixture(scope="module")
def live(rabbitmq_ui: UIServer) -> Iterator[Live]:
    """Objects of every kind and a small load on them, for a module's tests."""
    from .rabbitui import running_load

    with running_load(rabbitmq_ui) as live:
        yield live


@pytest.fixture
def rui(
    request: pytest.FixtureRequest, browser: Browser, rabbitmq_ui: UIServer, live: Live
) -> Iterator[RabbitUI]:
    """RabbitMQ's UI, logged in as guest: one page for the tests using it one
    after another on this process (kept_for_test), logged in (and checked,
    RabbitUI.log_in) by the first. Its loads, logins and renders were some
    0.7 CPU-seconds per test in a context of its own. Each test starts from
    the page as a log-in leaves it (RabbitUI.reset); a test that fails leaves
    no page to the next."""
    from .rabbitui import RabbitUI

    def make(context: BrowserContext) -> RabbitUI:
        console = Console()
        ui = RabbitUI(open_page(context, console), rabbitmq_ui, console)
        ui.log_in()
        return ui

    with kept_for_test(request, rabbitmq_ui.url, make, lambda ui: ui.reset()) as ui:
        yield ui
