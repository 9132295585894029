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
from httphelp import Reply

from harness.amqp import MemoryTransport
from warren.http.server import ManagementApp

if TYPE_CHECKING:
    from harness.broker import Harness


class _Bytes:
    """What http.client.HTTPResponse reads from: a socket's makefile."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


class MemoryHTTP:
    """Requests to a harness broker's management API, one connection each
    (``Connection: close``), as ``user``: tests/httphelp.py's Api calls
    (``request``, ``get``, ``put``, ``post``, ``delete``, ``as_user``,
    ``anonymous``), so a test moves with its assertions as they were."""

    def __init__(self, harness: Harness, user: str = "guest", password: str = "guest") -> None:
        self.harness = harness
        self.auth: tuple[str, str] | None = (user, password)
        #: The application's runner, made at the first request, shared by as_user's.
        self._runner: list[web.AppRunner] = []

    def as_user(self, user: str, password: str) -> MemoryHTTP:
        other = MemoryHTTP(self.harness, user, password)
        other._runner = self._runner
        return other

    def anonymous(self) -> MemoryHTTP:
        """Requests with no Authorization header."""
        other = self.as_user("", "")
        other.auth = None
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
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        """One request (``body``: JSON unless bytes; ``raw``: the body as it is),
        its whole answer."""
        return self.begin(method, path, body, headers, raw).reply()

    def begin(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Pending:
        """A request sent and the loop run until it has nothing left to do now:
        an answer the broker holds (a refused login's delay, on its clock) is
        still to come (``Pending.done``)."""
        if raw is not None:
            body = raw
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        head = {"Host": "localhost", "Connection": "close", **(headers or {})}
        if self.auth is not None:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            head.setdefault("Authorization", f"Basic {token}")
        if data is not None:
            head.setdefault("Content-Type", "application/json")
            head["Content-Length"] = str(len(data))
        lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + (data or b"")
        return Pending(self.harness, self._server(), request)

    def get(self, path: str) -> Any:
        """GET ``path`` (``/api/...``, or relative to /api/): the JSON of a 200 answer."""
        reply = self.request("GET", path if path.startswith("/") else f"/api/{path}")
        assert reply.status == 200, reply
        return reply.json()

    def put(self, path: str, body: Any = None) -> Reply:
        return self.request("PUT", path, body if body is not None else {})

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        return self.request("DELETE", path, **kw)


class Pending:
    """One request on a connection of its own, sent; its answer once the
    handler has written it and closed the connection."""

    def __init__(self, harness: Harness, server: web.Server, request: bytes) -> None:
        self.harness = harness
        self._done = done = harness.loop.create_future()

        def written() -> None:
            if transport.lost and not done.done():
                done.set_result(None)

        protocol = server()
        transport = self._transport = MemoryTransport(
            harness.loop, protocol, ("127.0.0.1", 0), written
        )

        async def send() -> None:
            protocol.connection_made(transport)
            protocol.data_received(request)

        harness.run(send())
        harness.settle()

    def done(self) -> bool:
        """Whether the answer is out (nothing runs the loop here)."""
        return self._done.done()

    def reply(self) -> Reply:
        """The answer, the loop run until it is out."""

        async def answered() -> None:
            await self._done  # the handler's answer is out and it closed the connection

        self.harness.run(answered())
        response = http.client.HTTPResponse(_Bytes(bytes(self._transport.written)))  # type: ignore[arg-type]
        response.begin()
        answer = response.read()
        return Reply(response.status, dict(response.getheaders()), answer)
