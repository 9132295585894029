"""The management API's routing table and what it keeps that the core does not.

RabbitMQ paths put a vhost ("/" as ``%2F``) and names holding any character
in single segments, so routes are matched on the raw path split at ``/``,
each segment unquoted afterwards, never on a decoded path.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from warren.core.errors import ResourceError
from warren.store import damage
from warren.store.layout import read_json_checked, write_json_atomically
from warren.store.mirror import FileMirror

if TYPE_CHECKING:
    from warren.http.common import Ctx

log = logging.getLogger("warren.http")

#: What mgmt.json holds (topic permissions and user limits only until the users
#: file takes them in: store/users_file.py).
_KEYS = ("vhost_metadata", "global_parameters", "topic_permissions", "user_limits")

Handler = Callable[["Ctx"], Awaitable[web.StreamResponse]]


@dataclass
class Route:
    """One path pattern: literal segments, and ``None`` where a parameter goes."""

    pattern: tuple[str | None, ...]
    handlers: dict[str, Handler] = field(default_factory=dict)
    #: Methods answered without credentials (RabbitMQ 4.x's reached-target-cluster-size,
    #: a startup probe's).
    public: set[str] = field(default_factory=set)

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

    def route(self, method: str, path: str, public: bool = False) -> Callable[[Handler], Handler]:
        pattern = tuple(
            None if part.startswith("{") else part for part in path.strip("/").split("/")
        )

        def register(handler: Handler) -> Handler:
            route = self.routes.setdefault(pattern, Route(pattern))
            route.handlers[method] = handler
            if public:
                route.public.add(method)
            return handler

        return register

    def resolve(self, raw_path: str) -> tuple[Route, list[str]] | None:
        # %FF stays the byte it names (as AMQP's decoding keeps it), so a name made
        # before such names were refused can still be addressed (core/names.py).
        segments = [
            unquote(s, errors="surrogateescape")
            for s in raw_path.split("?", 1)[0].strip("/").split("/")
        ]
        # Literal segments win over parameters (/api/queues/{vhost} vs /api/queues/detailed).
        best: tuple[int, Route, list[str]] | None = None
        for route in self.routes.values():
            params = route.match(segments)
            if params is not None and (best is None or len(params) < best[0]):
                best = (len(params), route, params)
        return None if best is None else (best[1], best[2])


@dataclass
class ApiState:
    """Settings the management API accepts that the core has no place for, kept in
    ``<data_dir>/mgmt.json`` (a few entries: written whole at every change). Topic
    permissions and user limits were kept here too; the core has them now, in
    users.json, and moves old entries there when it loads its users
    (store/users_file.py)."""

    #: vhost -> {"description": ..., "tags": [...]}.
    vhost_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: name -> value (cluster_name lives on the node).
    global_parameters: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: The data directory's mirror (store/mirror.py), told of every save.
    mirror: FileMirror | None = None

    @classmethod
    def load(
        cls, path: Path, on_damage: str = damage.REFUSE, mirror: FileMirror | None = None
    ) -> ApiState:
        """The state saved in ``path``; empty when there is none. An unreadable file
        refuses the start, or is set aside and the state starts empty
        (store/damage.py)."""
        state = cls(path=path, mirror=mirror)
        try:
            data = read_json_checked(path, _KEYS)
            state.vhost_metadata = dict(data.get("vhost_metadata", {}))
            state.global_parameters = dict(data.get("global_parameters", {}))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            damage.handle(path, f"unreadable ({exc}); management settings start empty", on_damage)
            state = cls(path=path, mirror=mirror)
        return state

    def save(self) -> None:
        if self.path is None:
            return
        data = {
            "vhost_metadata": self.vhost_metadata,
            "global_parameters": self.global_parameters,
        }
        try:
            write_json_atomically(self.path, data, self.mirror)
        except OSError as exc:
            # Not stored, so not changed: back to what the file holds.
            log.error("cannot save %s: %s", self.path, exc)
            try:
                saved = ApiState.load(self.path)
            except damage.DamagedFile:
                log.error("cannot read %s back: the change stays in memory", self.path)
            else:
                self.vhost_metadata = saved.vhost_metadata
                self.global_parameters = saved.global_parameters
            raise ResourceError(
                f"cannot store the management settings: {exc.strerror or exc}"
            ) from None
