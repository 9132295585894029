"""HTTPListener: RabbitMQ's management API and the web UI's files, on the broker's loop.

An aiohttp application run with AppRunner/TCPSite on the loop the broker
(and every AMQP connection) runs on: handlers read and change core state
directly, with no locks and no thread hops, and give the loop back while
they work through long listings (common.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import mimetypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import HttpVersion11, web

from warren.core import clock
from warren.core.errors import BrokerError
from warren.core.runtime_parameters import ValidationFailed
from warren.core.session import ClientSession, LoginRefused
from warren.core.users import User
from warren.http import (
    api_broker,
    api_connections,
    api_definitions,
    api_federation,
    api_health,
    api_objects,
    api_parameters,
    api_shovels,
    api_stream,
    api_super_streams,
    api_ui,
)
from warren.http.admission import admitting
from warren.http.bodies import BodyBudget, check_announced
from warren.http.bound_sites import BoundSites, Wrap
from warren.http.bridge import Bridge
from warren.http.common import (
    MANAGEMENT,
    REALM,
    ApiError,
    Ctx,
    bad_request,
    basic_credentials,
    not_found,
)
from warren.http.prometheus import MetricsEndpoints
from warren.http.replies import BareError, from_broker_error
from warren.http.state import ApiState, Router
from warren.http.ui_oauth import UiOAuth
from warren.http.websocket import WebSocketConnections, websocket_middleware
from warren.proxy_accept import listener_proxy

if TYPE_CHECKING:
    from warren.node import Node, WebSocketEndpoint

log = logging.getLogger("warren.http")

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: In the data directory: what the API keeps that the core does not (state.py).
STATE_FILE = "mgmt.json"
#: Who a public route's request is (no tags: it may do nothing else).
ANONYMOUS = User("", "")


def build_router() -> Router:
    router = Router()
    for module in (
        api_broker,
        api_definitions,
        api_health,
        api_objects,
        api_connections,
        api_parameters,
        api_shovels,
        api_super_streams,
        api_federation,
        api_stream,
        api_ui,
    ):
        module.register(router)
    return router


@dataclasses.dataclass(frozen=True)
class _Requester:
    """Who a request's session is, for the log."""

    name: str


class ManagementApp:
    """The request handling: route, authenticate, run the handler, map errors."""

    def __init__(
        self,
        node: Node,
        websockets: Sequence[WebSocketEndpoint] = (),
        connections: WebSocketConnections | None = None,
    ) -> None:
        self.node = node
        data = node.layout
        self.state = ApiState.load(
            data.root / STATE_FILE, node.config.damaged_metadata, data.mirror
        )
        #: Bytes of request bodies held at once (bodies.py).
        self.budget = BodyBudget(node.config.http_body_budget)
        self.router = build_router()
        self.websockets = tuple(websockets)
        self.websocket_connections = connections or WebSocketConnections()
        #: The HTTP publish/consume bridge under /bridge/ (bridge.py).
        self.bridge = Bridge(node, self._authenticate, self.budget)

    def application(self) -> web.Application:
        # WebSocket upgrades an endpoint claims are taken before routing (on any path,
        # by subprotocol) and before authentication; with no endpoint, no middleware.
        middlewares = (
            [websocket_middleware(self.websockets, self.websocket_connections)]
            if self.websockets
            else []
        )
        # Bodies are read by bodies.py within their limits; aiohttp's own limit only
        # bounds a form upload (request.post()) of definitions.
        config = self.node.config
        max_size = max(config.http_max_body_size, config.http_max_definitions_size)
        app = web.Application(client_max_size=max_size, middlewares=middlewares)
        app.router.add_route("*", "/api", self.api, expect_handler=self.expect)
        # Read by the UIs before their login form, so answered without credentials.
        UiOAuth(self.node).add_routes(app)
        # Any character, newlines too: a name may hold one (%0A).
        app.router.add_route("*", r"/api/{tail:[\s\S]*}", self.api, expect_handler=self.expect)
        self.bridge.add_routes(app)
        MetricsEndpoints(self.node).add_routes(app)  # as on the [prometheus] listener
        app.router.add_get("/", self.index)
        app.router.add_get("/ui/{path:.*}", self.static)
        return app

    async def index(self, request: web.Request) -> web.StreamResponse:
        return self._file(STATIC_DIR / "index.html")

    async def static(self, request: web.Request) -> web.StreamResponse:
        path = (STATIC_DIR / request.match_info["path"]).resolve()
        if not path.is_relative_to(STATIC_DIR):
            raise web.HTTPNotFound()
        if path.is_dir():
            path = path / "index.html"
        return self._file(path)

    @staticmethod
    def _file(path: Path) -> web.StreamResponse:
        if not path.is_file():
            raise web.HTTPNotFound()
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        # FileResponse sends with the loop's sendfile/executor: no blocking read here.
        return web.FileResponse(path, headers={"Content-Type": ctype})

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: a body that would be refused is refused before
        the client sends it (aiohttp's default handler says 100 Continue to all)."""
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11:
            return None
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
        try:
            check_announced(self.node.config, self.budget, request)
        except ApiError as exc:
            return exc.response()
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response's own bytes come after
        return None

    async def api(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._api(request)
        except ApiError as exc:
            return _refused(request, exc).response()
        except BrokerError as exc:
            return _refused(request, from_broker_error(exc)).response()
        except ValidationFailed as exc:
            return _refused(request, bad_request(str(exc))).response()
        except web.HTTPException:
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("management API: %s %s failed", request.method, request.path)
            return ApiError(500, "internal_error", "internal error").response()
        finally:
            self.budget.release(request)

    async def _api(self, request: web.Request) -> web.StreamResponse:
        resolved = self.router.resolve(request.raw_path)
        if resolved is None:
            raise not_found()
        route, params = resolved
        method = "GET" if request.method == "HEAD" else request.method
        if method == "OPTIONS":
            return web.Response(status=200, headers={"Allow": _allow(route.handlers)})
        handler = route.handlers.get(method)
        if handler is None:
            return web.Response(status=405, headers={"Allow": _allow(route.handlers)})
        if method in route.public:
            return await handler(
                Ctx(request, self.node, self.state, ANONYMOUS, params, self.budget)
            )
        user = await self._authenticate(request)
        ctx = Ctx(request, self.node, self.state, user, params, self.budget)
        ctx.require(MANAGEMENT)
        if method == "GET":
            return await handler(ctx)
        # A change (a declare, a user, a policy, an import): the answer waits
        # until it is on disk and, in a cluster, held by the in-sync followers,
        # as AMQP replies do (the client session's rule).
        session = ClientSession(self.node, _Requester(f"HTTP API user '{user.name}'"))
        mark = session.change_mark()
        response = await handler(ctx)
        await session.changes_durable(mark)
        return response

    async def _authenticate(self, request: web.Request) -> User:
        authorization = _authorization(request)
        if authorization is None:
            raise BareError(401, "not_authorized", "no credentials", {"WWW-Authenticate": REALM})
        creds = basic_credentials(authorization)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.node.oauth2 is not None:
            # An OAuth 2 access token (RabbitMQ's management with oauth2): the login's
            # backend chain takes it, its tags say what the user may do here.
            creds = ("", token.strip())
        if creds is None and "Authorization" in request.headers and _is_basic(authorization):
            raise BareError(400, "bad_request", "malformed Authorization header")
        if creds is None:
            raise ApiError(401, "not_authorized", "Login failed", {"WWW-Authenticate": REALM})
        name, password = creds
        try:
            user = ClientSession(self.node, _Requester("management API")).login(
                "http", name, password, request.remote
            )
        except LoginRefused as exc:
            if exc.reason == LoginRefused.LOOPBACK:
                raise ApiError(
                    401,
                    "not_authorized",
                    f"User '{name}' can only log in via localhost",
                    {"WWW-Authenticate": REALM},
                ) from None
            log.warning(
                "management API: login refused for user '%s' from %s%s",
                name,
                request.remote,
                ": too many failed logins" if exc.reason == LoginRefused.BLOCKED else "",
            )
            if exc.delay_ms > 0:  # repeated guesses slow down (core/auth_guard.py)
                await clock.sleep(self.node.clock, exc.delay_ms)
            raise ApiError(
                401, "not_authorized", "Login failed", {"WWW-Authenticate": REALM}
            ) from None
        return user


def _authorization(request: web.Request) -> str | None:
    """The Authorization header; without one, on /api/definitions[/{vhost}] only
    (as RabbitMQ), the ``auth`` query parameter (base64 ``user:password``) that
    RabbitMQ's UI puts in its definitions download link."""
    header = request.headers.get("Authorization")
    if header is None and "auth" in request.query:
        path = request.raw_path.split("?", 1)[0].strip("/").split("/")
        if path[:2] == ["api", "definitions"] and len(path) <= 3:
            return f"Basic {request.query['auth']}"
    return header


def _is_basic(authorization: str) -> bool:
    return authorization.lower().startswith("basic ")


def _refused(request: web.Request, exc: ApiError) -> ApiError:
    """A refused change (PUT, POST, DELETE) leaves a log line with its reason."""
    if request.method not in ("GET", "HEAD", "OPTIONS") and exc.status != 401:
        log.warning(
            "management API: %s %s from %s refused: %d %s",
            request.method,
            request.path,
            request.remote,
            exc.status,
            exc.reason,
        )
    return exc


def _allow(handlers: Mapping[str, object]) -> str:
    methods = set(handlers) | {"OPTIONS"}
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


class HTTPListener:
    """The ``http`` listener (warren.node.Listener): the management API on bind:port,
    and the byte-stream protocols of ``websockets`` over WebSocket (http/websocket.py)."""

    name = "http"

    def __init__(
        self,
        bind: str,
        port: int,
        websockets: Sequence[WebSocketEndpoint] = (),
        tls_port: int = -1,
    ) -> None:
        self.bind = bind
        self.requested_port = port
        self.requested_tls_port = tls_port
        #: The HTTPS port bound (0: none).
        self.tls_port = 0
        self.websockets = tuple(websockets)
        self.websocket_connections = WebSocketConnections()
        self._runner: web.AppRunner | None = None
        #: Bound and listening, not yet served (start() serves them).
        self._sites = BoundSites()
        self._port = 0
        self.app: ManagementApp | None = None

    @property
    def port(self) -> int:
        return self._port

    def bind_ports(self, node: Node) -> None:
        """Bind and listen on the HTTP (and HTTPS) port, answering nothing yet:
        BindError when a port is taken (broker_lifecycle.py binds before it reads
        the data dir)."""
        if self._sites:
            return
        try:
            self._port = self._sites.bind("HTTP", self.bind, self.requested_port)
            if self.requested_tls_port >= 0:
                tls = node.tls.context("the HTTPS port")
                self.tls_port = self._sites.bind("HTTPS", self.bind, self.requested_tls_port, tls)
        except BaseException:
            self._sites.close()
            raise

    async def start(self, node: Node) -> None:
        """Serve the management API on the ports bind_ports() bound (binding them
        first if not)."""
        self.bind_ports(node)
        self.app = ManagementApp(node, self.websockets, self.websocket_connections)
        runner = web.AppRunner(self.app.application(), access_log=None, shutdown_timeout=2.0)
        try:
            await runner.setup()
            await self._sites.start(
                runner, listener_proxy(node.config, node.clock, "mgmt"), _rate_limited(node)
            )
        except BaseException:
            self._sites.close()
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("listening on HTTP (management API) %s:%s", self.bind, self._port)
        if self.tls_port:
            log.info("listening on HTTPS (management API) %s:%s", self.bind, self.tls_port)
        for endpoint in self.websockets:
            log.info(
                "serving WebSocket at %s (subprotocols %s) on the HTTP port",
                endpoint.path,
                ", ".join(endpoint.subprotocols),
            )

    async def stop(self) -> None:
        """Stop accepting and finish (or cut, after 2 s) the requests under way.
        WebSocket connections are closed first (1001 Going Away): their handlers
        would otherwise hold the shutdown for its whole timeout."""
        self._sites.close()
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        for site in list(runner.sites):
            await site.stop()
        await self.websocket_connections.close_all()
        if self.app is not None:
            self.app.bridge.close_all()
        await runner.cleanup()


def _rate_limited(node: Node) -> Wrap | None:
    """The management ports' connection rate (http/admission.py); None: no limit."""
    limits = node.rate_limits
    if not limits.http_connections_per_second:
        return None
    return lambda factory, what: admitting(
        factory, limits.allow_http_connection, node.clock, f"management {what}"
    )
