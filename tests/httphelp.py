"""A small blocking client for the management API, used by tests/http (urllib only)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.body[:200]!r}>"


class Api:
    """Requests to one broker's management API as one user."""

    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth: tuple[str, str] | None = (user, password)

    def as_user(self, user: str, password: str) -> Api:
        other = Api(0)
        other.base, other.auth = self.base, (user, password)
        return other

    def anonymous(self) -> Api:
        other = Api(0)
        other.base, other.auth = self.base, None
        return other

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return Reply(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, dict(exc.headers), exc.read())

    def get(self, path: str) -> Any:
        reply = self.request("GET", path)
        assert reply.status == 200, reply
        return reply.json()

    def put(self, path: str, body: Any = None) -> Reply:
        return self.request("PUT", path, body if body is not None else {})

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        return self.request("DELETE", path, **kw)


def wait_for(check: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
