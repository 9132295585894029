"""The federation components: upstreams and upstream sets as runtime parameters,
and the links they make for the exchanges a federation policy matches.

``federation-upstream`` and ``federation-upstream-set`` are two parameter
components sharing one Federation. It watches the exchanges of every vhost
that has upstreams (VHost.exchange_watchers): when an exchange appears, goes,
changes policy or bindings, its links are brought in line, one per upstream
the policy names (``federation-upstream``: one; ``federation-upstream-set``:
a set's, or ``all`` of the vhost's).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

from warren.core.clock import Clock
from warren.core.queue import Queue
from warren.core.vhost import VHost
from warren.federation.link import BindingKey, ExchangeLink, binding_key
from warren.federation.queue_link import QueueLink
from warren.federation.upstream import Upstream, validate_set, validate_upstream
from warren.links import StateWaiters

log = logging.getLogger("warren.federation")

LinkKey = tuple[str, str, str]  # vhost, exchange, upstream
T = TypeVar("T")


class Federation:
    def __init__(
        self,
        get_vhost: Callable[[str], VHost | None],
        local_uri: Callable[[str], str],
        cluster_name: Callable[[], str],
        clock: Callable[[], Clock] | None = None,
    ) -> None:
        """``clock()``: the broker's clock, which links wait on (core/clock.py)."""
        self._get_vhost = get_vhost
        self._clock = clock
        self._local_uri = local_uri
        self._cluster_name = cluster_name
        self.upstreams: dict[tuple[str, str], Upstream] = {}
        self.sets: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.links: dict[LinkKey, ExchangeLink] = {}
        self.queue_links: dict[LinkKey, QueueLink] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._watched: set[str] = set()
        self._pending: set[tuple[str, str]] = set()
        self._stopping: set[asyncio.Task[None]] = set()
        # Woken when a link comes, goes or changes state (wait_for).
        self._link_waiters = StateWaiters()
        self.upstream_component = _Component("federation-upstream", self)
        self.set_component = _Component("federation-upstream-set", self)

    # -- parameters -------------------------------------------------------------------
    def validate(self, component: str, vhost: str, name: str, value: Any) -> Any:
        if component == "federation-upstream":
            validate_upstream(name, value)
        else:
            validate_set(value)
        return value

    def apply(self, component: str, vhost: str, name: str, value: Any | None) -> None:
        table: dict[tuple[str, str], Any] = (
            self.upstreams if component == "federation-upstream" else self.sets
        )
        if value is None:
            table.pop((vhost, name), None)
        elif component == "federation-upstream":
            table[(vhost, name)] = validate_upstream(name, value)
        else:
            table[(vhost, name)] = validate_set(value)
        self._watch(vhost)
        self.reconcile_vhost(vhost)
        self.reconcile_queues(vhost)
        if self._sweep is None and (self.upstreams or self.queue_links):
            self._sweep = asyncio.get_running_loop().call_later(1.0, self._sweep_queues)

    # -- federated queues -------------------------------------------------------------
    def _sweep_queues(self) -> None:
        """Queues come and go, and take policies, without telling anyone: look once
        a second while there are upstreams."""
        self._sweep = None
        for vhost in sorted({v for v, _n in self.upstreams} | {k[0] for k in self.queue_links}):
            self.reconcile_queues(vhost)
        if self.upstreams or self.queue_links:
            self._sweep = asyncio.get_running_loop().call_later(1.0, self._sweep_queues)

    def reconcile_queues(self, vhost_name: str) -> None:
        vhost = self._get_vhost(vhost_name)
        wanted: dict[LinkKey, Upstream] = {}
        if vhost is not None:
            for queue in vhost.queues.values():
                if queue.policy is None or queue.exclusive:
                    continue
                for upstream in self._upstreams_for(vhost_name, queue.policy.definition):
                    wanted[(vhost_name, queue.name, upstream.name)] = upstream
        for key, link in list(self.queue_links.items()):
            if key[0] == vhost_name and wanted.get(key) != link.upstream:
                self._stop(self.queue_links.pop(key))
        for key, upstream in wanted.items():
            if key in self.queue_links:
                continue
            name = key[1]
            link = QueueLink(
                vhost_name,
                name,
                upstream,
                self._local_uri(vhost_name),
                self._cluster_name(),
                _queue_getter(vhost, name),
                self._link_waiters.notify,
                self._clock() if self._clock else None,
            )
            self.queue_links[key] = link
            link.start()
            self._link_waiters.notify()

    def _watch(self, vhost_name: str) -> None:
        if vhost_name in self._watched:
            return
        vhost = self._get_vhost(vhost_name)
        if vhost is None:
            return
        self._watched.add(vhost_name)
        vhost.exchange_watchers.append(self._exchange_changed)

    # -- links ------------------------------------------------------------------------
    def _exchange_changed(self, vhost: VHost, name: str) -> None:
        key = (vhost.name, name)
        if key not in self._pending:  # coalesce a burst of binding changes
            self._pending.add(key)
            asyncio.get_running_loop().call_soon(self._reconcile_pending, key)

    def _reconcile_pending(self, key: tuple[str, str]) -> None:
        self._pending.discard(key)
        self.reconcile(*key)

    def reconcile_vhost(self, vhost_name: str) -> None:
        vhost = self._get_vhost(vhost_name)
        names = set(vhost.exchanges) if vhost is not None else set()
        names |= {ex for (v, ex, _u) in self.links if v == vhost_name}
        for name in sorted(names):
            self.reconcile(vhost_name, name)

    def _upstreams_for(self, vhost: str, definition: dict[str, Any]) -> list[Upstream]:
        if "federation-upstream" in definition:
            upstream = self.upstreams.get((vhost, str(definition["federation-upstream"])))
            return [upstream] if upstream is not None else []
        if "federation-upstream-pattern" in definition:
            try:
                pattern = re.compile(str(definition["federation-upstream-pattern"]))
            except re.error:
                log.warning(
                    "federation-upstream-pattern %r is not a regular expression",
                    definition["federation-upstream-pattern"],
                )
                return []
            return [
                u for (v, name), u in sorted(self.upstreams.items())
                if v == vhost and pattern.search(name)
            ]  # fmt: skip
        set_name = definition.get("federation-upstream-set")
        if set_name is None:
            return []
        if set_name == "all":
            return [u for (v, _n), u in sorted(self.upstreams.items()) if v == vhost]
        out = []
        for entry in self.sets.get((vhost, str(set_name)), []):
            found = self.upstreams.get((vhost, entry["upstream"]))
            if found is None:
                continue
            base = found
            overrides = {k: v for k, v in entry.items() if k != "upstream"}
            if overrides:
                merged = {**_as_value(base), **overrides}
                try:
                    base = validate_upstream(base.name, merged)
                except ValueError:
                    log.warning("upstream set %s: bad overrides for %s", set_name, base.name)
            out.append(base)
        return out

    def reconcile(self, vhost_name: str, exchange: str) -> None:
        vhost = self._get_vhost(vhost_name)
        ex = vhost.exchanges.get(exchange) if vhost is not None else None
        wanted: dict[str, Upstream] = {}
        bindings: set[BindingKey] = set()
        if ex is not None and ex.name and ex.policy is not None:
            for upstream in self._upstreams_for(vhost_name, ex.policy.definition):
                wanted[upstream.name] = upstream
            bindings = {binding_key(b.routing_key, b.arguments) for b in ex.bindings.values()}
        for key, link in list(self.links.items()):
            if key[0] == vhost_name and key[1] == exchange:
                current = wanted.get(key[2])
                if current is None or current != link.upstream:
                    self._stop(self.links.pop(key))
                else:
                    link.set_bindings(bindings)
        if ex is None:
            return
        for name, upstream in wanted.items():
            key = (vhost_name, exchange, name)
            if key in self.links:
                continue
            link = ExchangeLink(
                vhost_name,
                exchange,
                ex.type,
                ex.durable,
                upstream,
                self._local_uri(vhost_name),
                self._cluster_name(),
                bindings,
                self._link_waiters.notify,
                self._clock() if self._clock else None,
            )
            self.links[key] = link
            link.start()
            self._link_waiters.notify()

    def _stop(self, link: ExchangeLink | QueueLink) -> None:
        """Stop a link taken out of the tables (in the background: apply is not async)."""
        task = asyncio.ensure_future(link.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        self._link_waiters.notify()

    def status(self) -> list[dict[str, Any]]:
        return [link.info() for _key, link in sorted(self.links.items())] + [
            link.info() for _key, link in sorted(self.queue_links.items())
        ]

    async def wait_for(
        self, check: Callable[[list[dict[str, Any]]], T | None], timeout: float
    ) -> T:
        """What ``check(status())`` (the links as the API lists them) returns once
        it is not None, checked again whenever a link comes, goes or changes
        state: tests wait for a link with it instead of polling the API."""
        return await self._link_waiters.wait(
            lambda: check(self.status()), timeout, lambda: f"the links are {self.status()}"
        )

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        links: list[ExchangeLink | QueueLink] = [*self.links.values(), *self.queue_links.values()]
        self.links.clear()
        self.queue_links.clear()
        await asyncio.gather(*(link.stop() for link in links), *self._stopping)


def _queue_getter(vhost: VHost | None, name: str) -> Callable[[], Queue | None]:
    def get() -> Queue | None:
        return vhost.queues.get(name) if vhost is not None else None

    return get


def _as_value(upstream: Upstream) -> dict[str, Any]:
    value: dict[str, Any] = {
        "uri": list(upstream.uris),
        "prefetch-count": upstream.prefetch_count,
        "reconnect-delay": upstream.reconnect_delay,
        "ack-mode": upstream.ack_mode,
        "trust-user-id": upstream.trust_user_id,
        "max-hops": upstream.max_hops,
    }
    for key, v in (
        ("exchange", upstream.exchange),
        ("queue", upstream.queue),
        ("expires", upstream.expires),
        ("message-ttl", upstream.message_ttl),
    ):
        if v is not None:
            value[key] = v
    return value


class _Component:
    """One of the two parameter components (core/runtime_parameters.py)."""

    def __init__(self, name: str, federation: Federation) -> None:
        self.name = name
        self._federation = federation

    def validate(self, vhost: str, name: str, value: Any) -> Any:
        return self._federation.validate(self.name, vhost, name, value)

    def apply(self, vhost: str, name: str, value: Any | None) -> None:
        self._federation.apply(self.name, vhost, name, value)

    def status(self) -> list[dict[str, Any]]:
        return self._federation.status() if self.name == "federation-upstream" else []

    async def wait_for(
        self, check: Callable[[list[dict[str, Any]]], T | None], timeout: float
    ) -> T:
        """Federation.wait_for, for a caller that holds the parameter component."""
        return await self._federation.wait_for(check, timeout)

    def restart_link(self, vhost: str, link_id: str) -> bool:
        """Restart the one link whose API ``id`` this is (RabbitMQ's per-link route)."""
        for table in (self._federation.links, self._federation.queue_links):
            for key, link in list(table.items()):
                if key[0] == vhost and link.info()["id"] == link_id:
                    self._federation._stop(table.pop(key))
                    self._federation.reconcile_vhost(vhost)
                    self._federation.reconcile_queues(vhost)
                    return True
        return False

    def restart(self, vhost: str, name: str) -> bool:
        restarted = False
        for table in (self._federation.links, self._federation.queue_links):
            for key in list(table):
                if key[0] == vhost and key[2] == name:
                    self._federation._stop(table.pop(key))
                    restarted = True
        if restarted:
            self._federation.reconcile_vhost(vhost)
            self._federation.reconcile_queues(vhost)
        return restarted

    async def close(self) -> None:
        if self.name == "federation-upstream":
            await self._federation.close()
