"""The management API in memory: the HTTP listener's own aiohttp application
and request handler (http/server.py's ManagementApp under aiohttp's web
server), fed a request's bytes over a MemoryTransport; the answer parsed by
the standard library's http.client, independent of aiohttp.

What a test checks through it is what the API answers (status, JSON), as
tests/httphelp.py's Api over a socket; what only a socket shows (TLS,
WebSocket, many requests on one connection, a client that stops reading)
stays in tests/http.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from harness.amqp import MemoryTransport
from warren.http.server import ManagementApp

if TYPE_CHECKING:
    from harness.broker import Harness


class Reply:
    """An HTTP answer: status, headers, body (httphelp.Reply's shape)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.body[:200]!r}>"


class _Bytes:
    """What http.client.HTTPResponse reads from: a socket's makefile."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


class MemoryHTTP:
    """Requests to a harness broker's management API, one connection each
    (``Connection: close``), as ``user``."""

    def __init__(self, harness: Harness, user: str = "guest", password: str = "guest") -> None:
        self.harness = harness
        self.auth: tuple[str, str] | None = (user, password)
        #: The application's runner, made at the first request, shared by as_user's.
        self._runner: list[web.AppRunner] = []

    def as_user(self, user: str, password: str) -> MemoryHTTP:
        other = MemoryHTTP(self.harness, user, password)
        other._runner = self._runner
        return other

    def _server(self) -> web.Server:
        if not self._runner:
            harness = self.harness
            app = ManagementApp(harness.broker)
            runner = web.AppRunner(app.application(), access_log=None)
            harness.run(runner.setup())
            harness.on_stop(lambda: harness.run(runner.cleanup()))
            self._runner.append(runner)
        server = self._runner[0].server
        assert server is not None
        return server

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Reply:
        """One request (``body``: JSON unless bytes), its whole answer."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        head = {"Host": "localhost", "Connection": "close", **(headers or {})}
        if self.auth is not None:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            head.setdefault("Authorization", f"Basic {token}")
        if data is not None:
            head.setdefault("Content-Type", "application/json")
            head["Content-Length"] = str(len(data))
        lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (data or b"")
        return self._exchange(raw)

    def _exchange(self, raw: bytes) -> Reply:
        harness = self.harness
        server = self._server()
        done = harness.loop.create_future()

        def written() -> None:
            if transport.lost and not done.done():
                done.set_result(None)

        protocol = server()
        transport = MemoryTransport(harness.loop, protocol, ("127.0.0.1", 0), written)

        async def exchange() -> None:
            protocol.connection_made(transport)
            protocol.data_received(raw)
            await done  # the handler's answer is out and it closed the connection

        harness.run(exchange())
        response = http.client.HTTPResponse(_Bytes(bytes(transport.written)))  # type: ignore[arg-type]
        response.begin()
        answer = response.read()
        return Reply(response.status, dict(response.getheaders()), answer)

    def get(self, path: str) -> Any:
        """GET ``path`` (under /api/): the JSON of a 200 answer."""
        reply = self.request("GET", f"/api/{path}")
        assert reply.status == 200, reply
        return reply.json()
