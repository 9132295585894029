"""The management API's routing table and what it keeps that the core does not.

RabbitMQ paths put a vhost ("/" as ``%2F``) and names holding any character
in single segments, so routes are matched on the raw path split at ``/``,
each segment unquoted afterwards, never on a decoded path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

if TYPE_CHECKING:
    from warren.http.common import Ctx

Handler = Callable[["Ctx"], Awaitable[web.StreamResponse]]


@dataclass
class Route:
    """One path pattern: literal segments, and ``None`` where a parameter goes."""

    pattern: tuple[str | None, ...]
    handlers: dict[str, Handler] = field(default_factory=dict)

    def match(self, segments: list[str]) -> list[str] | None:
        if len(segments) != len(self.pattern):
            return None
        params = []
        for want, got in zip(self.pattern, segments, strict=True):
            if want is None:
                params.append(got)
            elif want != got:
                return None
        return params


class Router:
    """Routes registered with ``@router.route("GET", "/api/queues/{vhost}/{name}")``."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str | None, ...], Route] = {}

    def route(self, method: str, path: str) -> Callable[[Handler], Handler]:
        pattern = tuple(
            None if part.startswith("{") else part for part in path.strip("/").split("/")
        )

        def register(handler: Handler) -> Handler:
            self.routes.setdefault(pattern, Route(pattern)).handlers[method] = handler
            return handler

        return register

    def resolve(self, raw_path: str) -> tuple[Route, list[str]] | None:
        segments = [unquote(s) for s in raw_path.split("?", 1)[0].strip("/").split("/")]
        # Literal segments win over parameters (/api/queues/{vhost} vs /api/queues/detailed).
        best: tuple[int, Route, list[str]] | None = None
        for route in self.routes.values():
            params = route.match(segments)
            if params is not None and (best is None or len(params) < best[0]):
                best = (len(params), route, params)
        return None if best is None else (best[1], best[2])


@dataclass
class ApiState:
    """Settings the management API accepts that the core has no place for (kept in
    memory: lost at a restart, which the docs say)."""

    #: vhost -> {"description": ..., "tags": [...]}.
    vhost_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: user -> {"max-connections": n, "max-channels": n}: stored and listed, not enforced.
    user_limits: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (user, vhost) -> {exchange: {"write": re, "read": re}}: stored, not enforced.
    topic_permissions: dict[tuple[str, str], dict[str, dict[str, str]]] = field(
        default_factory=dict
    )
    #: name -> value (cluster_name lives on the node).
    global_parameters: dict[str, Any] = field(default_factory=dict)
