"""Dev-only server for the management UI: the static files plus a proxy to an API.

Serves ``/`` (index.html) and ``/ui/{path}`` from src/warren/http/static, as
Warren's HTTP listener does, and forwards ``/api/...`` to another server's
management API (a RabbitMQ, or a Warren whose HTTP listener does not serve the
UI files), so the UI can be worked on and tested against either:

    python tests/ui/devserver.py --api http://127.0.0.1:15672 --port 8080

then open http://127.0.0.1:8080/ (guest/guest). The files are served under
a strict Content-Security-Policy (CSP below), so the tests would catch the UI
reaching for inline code or styles or another host.

With ``--rabbitmq-ui`` it serves RabbitMQ's own management UI instead, read
from the installed rabbitmq-server package (rabbitmq_www.py) at its site root
with RabbitMQ's default CSP, as RabbitMQ's management listener does:

    python tests/ui/devserver.py --rabbitmq-ui --api http://127.0.0.1:15672
"""

from __future__ import annotations

import argparse
import asyncio
import mimetypes
import sys
import threading
from pathlib import Path

from aiohttp import ClientSession, web

if __package__:
    from .rabbitmq_www import RabbitMQWww, find
else:  # python tests/ui/devserver.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rabbitmq_www import RabbitMQWww, find

STATIC_DIR = Path(__file__).resolve().parents[2] / "src" / "warren" / "http" / "static"

# Request headers passed on to the API; everything else is the proxy's business.
FORWARDED = ("Authorization", "Content-Type", "Accept", "X-Reason", "X-Requested-With")
CLIENT = web.AppKey("client", ClientSession)
# The strictest policy the UI is written for: nothing inline, nothing from
# elsewhere (a violation is a console error, which the tests fail on).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
#: What RabbitMQ's management listener sends with every UI file (its default
#: management.csp.policy): its index.html runs inline code and its templates use eval.
RABBITMQ_CSP = "script-src 'self' 'unsafe-eval' 'unsafe-inline'; object-src 'self'"


def make_app(api_base: str, static_dir: Path = STATIC_DIR) -> web.Application:
    """Warren's own UI: / and /ui/{path} from static_dir."""
    app = _proxy_app(api_base)

    async def index(_: web.Request) -> web.StreamResponse:
        return web.FileResponse(static_dir / "index.html", headers=PAGE_HEADERS)

    async def asset(request: web.Request) -> web.StreamResponse:
        path = (static_dir / request.match_info["path"]).resolve()
        if not path.is_file() or static_dir.resolve() not in path.parents:
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers=PAGE_HEADERS)

    app.router.add_get("/", index)
    app.router.add_get("/ui/{path:.+}", asset)
    return app


def make_rabbitmq_app(api_base: str, www: RabbitMQWww) -> web.Application:
    """RabbitMQ's UI: every file of its management plugins' www trees at the root."""
    app = _proxy_app(api_base)

    async def asset(request: web.Request) -> web.StreamResponse:
        rel = request.match_info.get("path") or "index.html"
        data = www.read(rel)
        if data is None:
            raise web.HTTPNotFound()
        kind = mimetypes.guess_type(rel)[0] or "application/octet-stream"
        return web.Response(
            body=data,
            content_type=kind,
            headers={"Cache-Control": "no-cache", "Content-Security-Policy": RABBITMQ_CSP},
        )

    app.router.add_get("/", asset)
    app.router.add_get("/{path:(?!api/).+}", asset)
    return app


def _proxy_app(api_base: str) -> web.Application:
    """An app that forwards /api and /api/... to api_base."""
    api_base = api_base.rstrip("/")
    app = web.Application()

    async def on_startup(app: web.Application) -> None:
        app[CLIENT] = ClientSession(auto_decompress=True)

    async def on_cleanup(app: web.Application) -> None:
        await app[CLIENT].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: request.headers[k] for k in FORWARDED if k in request.headers}
        url = f"{api_base}{request.raw_path}"
        body = await request.read()
        async with request.app[CLIENT].request(
            request.method, url, headers=headers, data=body or None, allow_redirects=False
        ) as upstream:
            payload = await upstream.read()
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=upstream.status, body=payload, headers=out)

    app.router.add_route("*", "/api/{tail:.*}", proxy)
    app.router.add_route("*", "/api", proxy)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


class DevServer:
    """The dev server on its own loop in a thread: ``url`` once started."""

    def __init__(
        self,
        api_base: str,
        host: str = "127.0.0.1",
        port: int = 0,
        rabbitmq_www: RabbitMQWww | None = None,
    ) -> None:
        self.api_base = api_base
        self.rabbitmq_www = rabbitmq_www
        self.host = host
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> DevServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        if self.rabbitmq_www is not None:
            app = make_rabbitmq_app(self.api_base, self.rabbitmq_www)
        else:
            app = make_app(self.api_base)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="http://127.0.0.1:15672", help="management API base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--rabbitmq-ui", action="store_true", help="serve RabbitMQ's own UI (installed package)"
    )
    args = parser.parse_args()
    if args.rabbitmq_ui:
        www = find()
        if www is None:
            parser.error("no rabbitmq-server package with rabbitmq_management is installed")
        app = make_rabbitmq_app(args.api, www)
        print(f"RabbitMQ {www.version}'s UI on http://{args.host}:{args.port}/, API {args.api}")
    else:
        app = make_app(args.api)
        print(f"UI on http://{args.host}:{args.port}/, API {args.api}")
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
