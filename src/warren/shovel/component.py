"""The ``shovel`` runtime-parameter component: shovels start, restart and stop
as their parameters are set and cleared (core/runtime_parameters.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from warren.shovel.runner import Shovel
from warren.shovel.spec import validate

log = logging.getLogger("warren.shovel")


class ShovelComponent:
    name = "shovel"

    def __init__(
        self,
        local_uri: Callable[[str], str],
        node: str,
        clear: Callable[[str, str], None],
    ) -> None:
        """``local_uri(vhost)``: how a shovel reaches this broker when its URI is
        ``amqp://`` (no host); ``clear(vhost, name)``: delete a shovel's parameter
        (a shovel with src-delete-after deletes itself when done)."""
        self._local_uri = local_uri
        self._node = node
        self._clear = clear
        self.shovels: dict[tuple[str, str], Shovel] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def validate(self, vhost: str, name: str, value: Any) -> Any:
        validate(value)  # ValidationFailed when it is not a shovel
        return value

    def apply(self, vhost: str, name: str, value: Any | None) -> None:
        old = self.shovels.pop((vhost, name), None)
        if old is not None:
            self._stop_later(old)
        if value is None:
            log.info("shovel '%s' in vhost '%s' deleted", name, vhost)
            return
        shovel = Shovel(vhost, name, validate(value), self._resolve, self._node, self._finished)
        self.shovels[(vhost, name)] = shovel
        shovel.start()

    def _resolve(self, uri: str, vhost: str) -> str:
        """``amqp://`` and ``amqp:///vhost`` are this broker (the shovel's own vhost
        when none is named)."""
        if uri.startswith("amqp:///") or uri == "amqp://":
            named = uri[len("amqp:///") :].split("?", 1)[0]
            return self._local_uri(named or vhost)
        return uri

    def _finished(self, shovel: Shovel) -> None:
        if self.shovels.get((shovel.vhost, shovel.name)) is shovel:
            self._clear(shovel.vhost, shovel.name)

    def _stop_later(self, shovel: Shovel) -> None:
        task = asyncio.ensure_future(shovel.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def restart(self, vhost: str, name: str) -> bool:
        shovel = self.shovels.get((vhost, name))
        if shovel is None:
            return False
        self._stop_later(shovel)
        fresh = Shovel(vhost, name, shovel.spec, self._resolve, self._node, self._finished)
        self.shovels[(vhost, name)] = fresh
        fresh.start()
        return True

    def status(self) -> list[dict[str, Any]]:
        return [s.info() for _key, s in sorted(self.shovels.items())]

    async def close(self) -> None:
        shovels = list(self.shovels.values())
        self.shovels.clear()
        await asyncio.gather(*(s.stop() for s in shovels), *self._stopping)
