"""The web UI's login through an OpenID Connect provider ([mgmt] oauth_*), in
Chromium: the authorization code flow with PKCE against the small provider of
tests/oidcprovider.py (discovery, authorize, token with the verifier checked,
JWKS, logout), Warren relaying discovery and the code exchange, the access
token as the API's Bearer. The broker's clock is a ManualClock: the token's
expiry on the broker is a clock step; in the browser, playwright's clock."""

from __future__ import annotations

import html
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api
from oauth2help import FULL
from oidcprovider import OidcProvider
from playwright.sync_api import Page, Route, expect

from warren.core.clock import ManualClock

from .conftest import API_URL_ENV, Console
from .devserver import CSP
from .helpers import load

pytestmark = pytest.mark.skipif(
    bool(os.environ.get(API_URL_ENV)), reason="needs a Warren of its own, set up for OAuth 2"
)

CLIENT = "warren-ui"
SECRET = "s3cret"
LIFETIME = 600


@contextmanager
def warren_with_provider(
    data: Path, secret: str | None, **settings: Any
) -> Iterator[tuple[OidcProvider, BrokerThread]]:
    """A provider, and a Warren (ManualClock) whose UI logs in through it."""
    holder: list[BrokerThread] = []
    provider = OidcProvider(
        CLIENT,
        [],
        now_s=lambda: holder[0].clock.now_ms() // 1000,
        secret=secret,
        scopes={"alice": ["tag:administrator", *FULL]},
        lifetime=LIFETIME,
    ).start()
    try:
        broker = start_broker(
            data,
            clock=ManualClock(),
            oauth2_resource_server_id="rabbitmq",
            oauth2_jwks_url=f"{provider.url}/jwks",
            oauth2_issuer=provider.url,
            oauth2_preferred_username_claims=("preferred_username",),
            mgmt_oauth_enabled=True,
            mgmt_oauth_client_id=CLIENT,
            mgmt_oauth_client_secret=secret,
            mgmt_oauth_provider_url=provider.url,
            mgmt_oauth_scopes="openid profile rabbitmq.tag:administrator",
            **settings,
        )
        holder.append(broker)
        provider.redirect_uris.append(f"http://127.0.0.1:{broker.http_port}/")
        try:
            yield provider, broker
        finally:
            broker.stop()
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OidcProvider, BrokerThread]]:
    """A confidential client (Warren adds the secret); the provider's login only."""
    with warren_with_provider(tmp_path_factory.mktemp("ui-oauth") / "data", SECRET) as pair:
        yield pair


def strict_policy(page: Page, base: str, provider_url: str) -> None:
    """Warren's page with devserver.py's Content-Security-Policy (connect-src
    'self'): the login fetches from the page's origin only (a violation is a
    console error)."""

    def add_policy(route: Route) -> None:
        response = route.fetch()
        route.fulfill(
            response=response, headers={**response.headers, "content-security-policy": CSP}
        )

    def hand_back(route: Route) -> None:
        # The provider's redirects back (after its login and its logout) as a
        # page that navigates there: playwright routes no request a redirect
        # makes, and the page landed on must go through add_policy too.
        response = route.fetch(max_redirects=0)
        target = response.headers.get("location")
        if response.status != 302 or not target:
            route.fulfill(response=response)
            return
        refresh = (
            f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(target)}">'
        )
        route.fulfill(status=200, content_type="text/html", body=refresh)

    page.route(lambda url: url.startswith(f"{base}/") and urlsplit(url).path == "/", add_policy)
    page.route(f"{provider_url}/authorize", hand_back)
    page.route(f"{provider_url}/logout?*", hand_back)


def sign_in(page: Page, provider: OidcProvider, user: str = "alice") -> None:
    """From Warren's login page through the provider's and back."""
    page.locator("#oauth-login-button").click()
    page.wait_for_url(f"{provider.url}/authorize?*")
    page.locator("#idp-login input[name=username]").fill(user)
    page.locator("#idp-login button[type=submit]").click()


def test_login_through_the_provider_overview_expiry_and_logout(
    page: Page, oidc: tuple[OidcProvider, BrokerThread], console: Console, shot
) -> None:
    provider, broker = oidc
    base = f"http://127.0.0.1:{broker.http_port}"
    for name in ("oauth-a", "oauth-b", "oauth-c"):
        assert Api(broker.http_port).put(f"/api/queues/%2F/{name}").status in (201, 204)
    page.clock.install()
    strict_policy(page, base, provider.url)

    # The login page offers the provider only (oauth_disable_basic_auth's default).
    load(page, f"{base}/#/queues")
    expect(page.locator("#oauth-login-button")).to_be_visible()
    expect(page.locator("#login-form")).to_have_count(0)
    shot("login")
    sign_in(page, provider)

    # Back on the page the login started from, logged in as the token's user.
    expect(page.locator("tr[data-queue='oauth-b']")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("alice")
    assert "code=" not in page.url and page.url.endswith("/#/queues")
    # The code went through Warren, which added the client's secret; the
    # provider checked the PKCE verifier against the challenge.
    (exchange,) = provider.token_requests
    assert exchange["client_id"] == CLIENT and exchange["client_secret"] == SECRET
    assert exchange["code_verifier"] and exchange["redirect_uri"] == f"{base}/"
    page.locator("#nav a[href='#/']").click()
    expect(page.locator("[data-total=queues] b")).to_have_text("3")
    shot("overview")

    # Logging out goes through the provider's logout and back to the login page.
    page.locator("#logout").click()
    expect(page.locator("#oauth-login-button")).to_be_visible()
    (logout,) = provider.logouts
    assert logout["client_id"] == CLIENT and logout["post_logout_redirect_uri"] == f"{base}/"
    assert logout["id_token_hint"]

    # The token expires on the broker: the next API call's 401 ends the session.
    sign_in(page, provider)
    expect(page.locator("[data-total=queues] b")).to_have_text("3")
    page.locator("#nav a[href='#/exchanges']").click()
    expect(page.locator("a[href='#/exchanges/%2F/amq.topic']")).to_be_visible()
    broker.advance((LIFETIME + 1) * 1000)
    page.clock.fast_forward(5_000)  # the page's next poll
    expect(page.locator("#oauth-login .error")).to_have_text(
        "Your session has ended: please log in again."
    )

    # Logged in again, back on the exchanges; by the browser's clock the token
    # then expires too, and the login page comes back without an API call.
    sign_in(page, provider)
    expect(page.locator("a[href='#/exchanges/%2F/amq.topic']")).to_be_visible()
    page.clock.fast_forward(3 * LIFETIME * 1000)
    expect(page.locator("#oauth-login .error")).to_have_text(
        "Your session has expired: please log in again."
    )
    # The 401 of the expired token is logged by Chromium: the only error allowed.
    assert [e for e in console.errors if "401" not in e] == []
    # The policy was in force all along: the page may not fetch from the provider.
    probe = f"fetch('{provider.url}/jwks', {{mode: 'no-cors'}}).then(() => 'sent', () => 'blocked')"
    assert page.evaluate(probe) == "blocked"


def test_provider_errors_are_shown(
    page: Page, oidc: tuple[OidcProvider, BrokerThread], console: Console
) -> None:
    """A refused authorization and a return that no login here started."""
    provider, broker = oidc
    base = f"http://127.0.0.1:{broker.http_port}"
    load(page, f"{base}/?error=access_denied&error_description=User+said+no&state=x")
    expect(page.locator("#oauth-login .error")).to_have_text("Login failed: User said no")
    assert urlsplit(page.url).query == ""
    load(page, f"{base}/?code=forged&state=forged")
    expect(page.locator("#oauth-login .error")).to_have_text(
        "Login failed: the provider's answer is not for a login started here."
    )
    assert not any(r["code"] == "forged" for r in provider.token_requests)
    assert parse_qs(urlsplit(page.url).query) == {}
    assert not console.errors, console.errors


def test_api_auth_tells_the_ui(oidc: tuple[OidcProvider, BrokerThread]) -> None:
    provider, broker = oidc
    settings = Api(broker.http_port).anonymous().get("/api/auth")
    assert settings["oauth_enabled"] is True
    assert settings["oauth_client_id"] == CLIENT
    assert settings["oauth_provider_url"] == provider.url
    assert settings["oauth_disable_basic_auth"] is True
    assert SECRET not in str(settings)


def test_public_client_and_the_password_form_side_by_side(
    page: Page, tmp_path: Path, console: Console
) -> None:
    """No client secret (a public client: PKCE alone), oauth_disable_basic_auth =
    false: the login page offers both, and each logs in. A provider without an
    end_session_endpoint: logging out only forgets the token."""
    settings = {"mgmt_oauth_disable_basic_auth": False}
    with warren_with_provider(tmp_path / "data", None, **settings) as (provider, broker):
        provider.logout_endpoint = False
        base = f"http://127.0.0.1:{broker.http_port}"
        load(page, f"{base}/")
        form = page.locator("#login-form")
        form.locator("input[name=username]").fill("guest")
        form.locator("input[name=password]").fill("guest")
        form.locator("button[type=submit]").click()
        expect(page.locator("#whoami")).to_have_text("guest")
        page.locator("#logout").click()  # the password's logout: no provider
        expect(page.locator("#login-form")).to_be_visible()
        expect(page.locator("#login-form #oauth-login-button")).to_be_visible()
        assert provider.logouts == []

        sign_in(page, provider)
        expect(page.locator("#whoami")).to_have_text("alice")
        (exchange,) = provider.token_requests
        assert "client_secret" not in exchange and exchange["client_id"] == CLIENT
        page.locator("#logout").click()
        expect(page.locator("#login-form #oauth-login-button")).to_be_visible()
        assert provider.logouts == []
        assert console.errors == []
