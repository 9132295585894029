"""The ``shovel`` runtime-parameter component: shovels start, restart and stop
as their parameters are set and cleared (core/runtime_parameters.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from warren.core.clock import Clock
from warren.links import StateWaiters
from warren.shovel.runner import Shovel
from warren.shovel.spec import ShovelSpec, validate

log = logging.getLogger("warren.shovel")
T = TypeVar("T")


class ShovelComponent:
    name = "shovel"

    def __init__(
        self,
        local_uri: Callable[[str], str],
        node: str,
        clear: Callable[[str, str], None],
        clock: Callable[[], Clock] | None = None,
    ) -> None:
        """``local_uri(vhost)``: how a shovel reaches this broker when its URI is
        ``amqp://`` (no host); ``clear(vhost, name)``: delete a shovel's parameter
        (a shovel with src-delete-after deletes itself when done); ``clock()``: the
        broker's clock, which shovels wait on (core/clock.py)."""
        self._local_uri = local_uri
        self._clock = clock
        self._node = node
        self._clear = clear
        self.shovels: dict[tuple[str, str], Shovel] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        # Woken when a shovel comes, goes or changes state (wait_for).
        self._shovel_waiters = StateWaiters()

    def validate(self, vhost: str, name: str, value: Any) -> Any:
        validate(value)  # ValidationFailed when it is not a shovel
        return value

    def apply(self, vhost: str, name: str, value: Any | None) -> None:
        old = self.shovels.pop((vhost, name), None)
        if old is not None:
            self._stop_later(old)
        if value is None:
            log.info("shovel '%s' in vhost '%s' deleted", name, vhost)
            self._shovel_waiters.notify()
            return
        self._start(vhost, name, validate(value))

    def _start(self, vhost: str, name: str, spec: ShovelSpec) -> None:
        shovel = Shovel(
            vhost, name, spec, self._resolve, self._node, self._finished,
            self._shovel_waiters.notify, self._clock() if self._clock else None,
        )  # fmt: skip
        self.shovels[(vhost, name)] = shovel
        shovel.start()
        self._shovel_waiters.notify()

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
        self._start(vhost, name, shovel.spec)
        return True

    def status(self) -> list[dict[str, Any]]:
        return [s.info() for _key, s in sorted(self.shovels.items())]

    async def wait_for(
        self, check: Callable[[list[dict[str, Any]]], T | None], timeout: float
    ) -> T:
        """What ``check(status())`` (the shovels as the API lists them) returns once
        it is not None, checked again whenever a shovel comes, goes or changes
        state: tests wait with it instead of polling the API."""
        return await self._shovel_waiters.wait(
            lambda: check(self.status()), timeout, lambda: f"the shovels are {self.status()}"
        )

    async def close(self) -> None:
        shovels = list(self.shovels.values())
        self.shovels.clear()
        await asyncio.gather(*(s.stop() for s in shovels), *self._stopping)
