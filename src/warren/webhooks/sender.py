"""POSTing broker events to the webhook targets, in order, with retries.

Each target has its own bounded buffer and one delivery task: an event is
encoded once, queued to every target whose filters want it, and the task POSTs
them one at a time, in the order they happened. A failed POST (no connection,
no answer within the target's timeout, a status outside 2xx) is tried again
after a backoff on the broker's clock (core/clock.py: tests move a
ManualClock), doubling up to a cap, then given up. Nothing here ever waits on
the broker's side: emitting an event only appends to the buffers, and a
buffer that is full drops its oldest event, counted (``dropped``, the
``warren_webhook_events_dropped_total`` metric), so a receiver that is down
never holds up publishers or connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

from warren import __version__
from warren.core.clock import Clock, sleep
from warren.core.events import Events
from warren.links import redact
from warren.webhooks.saved import SavedTargets
from warren.webhooks.targets import WebhookTarget

__all__ = ["SIGNATURE_HEADER", "Webhooks", "sign"]

log = logging.getLogger("warren.webhooks")

#: The header with the body's HMAC (GitHub's X-Hub-Signature-256 shape).
SIGNATURE_HEADER = "X-Warren-Signature"


def sign(secret: str, body: bytes) -> str:
    """The X-Warren-Signature value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _Pending:
    """One event waiting for one target."""

    __slots__ = ("event", "body", "delivery")

    def __init__(self, event: str, body: bytes, delivery: str) -> None:
        self.event = event
        self.body = body
        self.delivery = delivery


class _TargetState:
    """A target's buffer, delivery task and counters."""

    def __init__(self, target: WebhookTarget) -> None:
        self.target = target
        self.pending: deque[_Pending] = deque()
        self.task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self.retries = 0
        self.retrying = False
        self.last_error: str | None = None
        self.dropping = False  # logged once until the buffer has room again

    def push(self, item: _Pending) -> None:
        if len(self.pending) >= self.target.buffer:
            self.pending.popleft()
            self.dropped += 1
            if not self.dropping:
                self.dropping = True
                log.warning(
                    "webhook '%s': buffer full (%d events), dropping the oldest",
                    self.target.name,
                    self.target.buffer,
                )
        self.pending.append(item)

    def info(self, source: str) -> dict[str, Any]:
        target = self.target
        state = "retrying" if self.retrying else "delivering" if self.task else "idle"
        return {
            "name": target.name,
            "source": source,
            "url": redact(target.url),
            "events": list(target.events),
            "vhosts": list(target.vhosts),
            "signed": target.secret is not None,
            "state": state,
            "queued": len(self.pending),
            "delivered": self.delivered,
            "failed": self.failed,
            "dropped": self.dropped,
            "retries": self.retries,
            "last_error": self.last_error,
        }


class Webhooks:
    """The broker's webhook targets: ``attach`` it to the broker's events,
    ``close`` it when the broker stops (what is still buffered is lost).

    The webhooks file's targets are fixed; the management API's (``put``,
    ``delete``: PUT and DELETE /api/webhooks/<name>, the definitions'
    ``webhooks``) are saved in ``saved`` and come back at the next start.
    While there is no target it does not listen, so no event is built."""

    def __init__(
        self,
        targets: list[WebhookTarget],
        clock: Clock | Callable[[], Clock],
        node: str,
        saved: SavedTargets | None = None,
    ) -> None:
        """``clock``: the broker's, or a function giving it (tests set the
        broker's clock after the broker is made)."""
        self._clock = clock
        self.node = node
        self.states = [_TargetState(t) for t in targets]
        #: The webhooks file's targets' names: listed, never changed by the API.
        self.fixed = frozenset(t.name for t in targets)
        self._saved = saved
        self._events: Events | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    @property
    def clock(self) -> Clock:
        return self._clock if isinstance(self._clock, Clock) else self._clock()

    def attach(self, events: Events) -> None:
        """Hear the broker's events from now on (while there is a target)."""
        self._events = events
        self._listen()

    def _listen(self) -> None:
        events = self._events
        if events is None:
            return
        listening = self.observe in events.observers
        if self.states and not listening:
            events.observers.append(self.observe)
        elif not self.states and listening:
            events.observers.remove(self.observe)

    def status(self) -> list[dict[str, Any]]:
        """Each target as GET /api/webhooks lists it (and the metrics count it)."""
        return [
            state.info("file" if state.target.name in self.fixed else "api")
            for state in self.states
        ]

    # -- the management API's targets ----------------------------------------------------
    def load_saved(self) -> None:
        """Add the API's targets saved by the last run (the broker starts)."""
        for target in self._saved.load() if self._saved is not None else ():
            if target.name in self.fixed:
                log.warning("webhook '%s': the webhooks file's target wins", target.name)
            elif all(s.target.name != target.name for s in self.states):
                self.states.append(_TargetState(target))
        self._listen()

    def managed(self) -> list[WebhookTarget]:
        """The targets the API made (what the definitions export), in order."""
        return [s.target for s in self.states if s.target.name not in self.fixed]

    def put(self, target: WebhookTarget) -> bool:
        """Add ``target``, or replace the API's target of its name (its buffer and
        counters kept): True when it is new. Saved first: a target that cannot
        be saved is not changed (ResourceError). ValueError for a file's target."""
        if target.name in self.fixed:
            raise ValueError(f"webhook '{target.name}' is defined in the webhooks file")
        managed = self.managed()
        names = [t.name for t in managed]
        if target.name in names:
            managed[names.index(target.name)] = target
        else:
            managed.append(target)
        if self._saved is not None:
            self._saved.save(managed)
        for state in self.states:
            if state.target.name == target.name:
                state.target = target
                return False
        self.states.append(_TargetState(target))
        self._listen()
        return True

    def delete(self, name: str) -> bool:
        """Remove the API's target ``name`` (what it still buffers is dropped):
        False when there is none. ValueError for a file's target."""
        if name in self.fixed:
            raise ValueError(f"webhook '{name}' is defined in the webhooks file")
        state = next((s for s in self.states if s.target.name == name), None)
        if state is None:
            return False
        if self._saved is not None:
            self._saved.save([t for t in self.managed() if t.name != name])
        self.states.remove(state)
        state.pending.clear()
        if state.task is not None:
            state.task.cancel()
        self._listen()
        return True

    # -- events in ---------------------------------------------------------------------
    def observe(self, event: str, props: dict[str, Any]) -> None:
        """An event (core/events.py's observer): queued for the targets that want it."""
        if self._closing:
            return
        vhost = props.get("vhost")
        item: _Pending | None = None
        for state in self.states:
            if not state.target.wants(event, vhost if isinstance(vhost, str) else None):
                continue
            if item is None:
                item = self._encode(event, props)
            state.push(item)
            if state.task is None:
                self._start(state)

    def _encode(self, event: str, props: dict[str, Any]) -> _Pending:
        delivery = uuid.uuid4().hex
        document = {
            "event": event,
            "id": delivery,
            "timestamp": self.clock.now_ms(),
            "node": self.node,
            "properties": props,
        }
        body = json.dumps(document, default=str, separators=(",", ":")).encode()
        return _Pending(event, body, delivery)

    def _start(self, state: _TargetState) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # off the loop (a test's direct call): the next event starts it
            return
        state.task = loop.create_task(self._deliver_all(state))

    # -- delivery ----------------------------------------------------------------------
    async def _deliver_all(self, state: _TargetState) -> None:
        try:
            while state.pending and not self._closing:
                await self._deliver(state, state.pending.popleft())
        finally:
            state.task = None
            state.retrying = False

    async def _deliver(self, state: _TargetState, item: _Pending) -> None:
        target = state.target
        attempt = 0
        while True:
            error = await self._post(target, item)
            if error is None:
                state.delivered += 1
                state.retrying = False
                state.dropping = False
                return
            state.last_error = error
            if attempt >= target.max_retries:
                state.failed += 1
                state.retrying = False
                log.warning(
                    "webhook '%s': %s given up after %d attempts: %s",
                    target.name,
                    item.event,
                    attempt + 1,
                    error,
                )
                return
            attempt += 1
            state.retries += 1
            state.retrying = True
            await sleep(self.clock, target.backoff(attempt))

    async def _post(self, target: WebhookTarget, item: _Pending) -> str | None:
        """POST one event once: None when the receiver took it (2xx), else why not."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"Warren/{__version__}",
            "X-Warren-Event": item.event,
            "X-Warren-Delivery": item.delivery,
        }
        if target.secret is not None:
            headers[SIGNATURE_HEADER] = sign(target.secret, item.body)
        request = asyncio.ensure_future(self._send(target.url, item.body, headers))
        timed_out = False

        def expire() -> None:
            nonlocal timed_out
            timed_out = True
            request.cancel()

        # The timeout is on the broker's clock, as every other timeout.
        handle = self.clock.call_later(target.timeout_ms, expire)
        try:
            status = await request
        except asyncio.CancelledError:
            if not timed_out:
                raise
            return f"no answer within {target.timeout_ms} ms"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            handle.cancel()
        return None if 200 <= status < 300 else f"HTTP {status}"

    async def _send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        if self._session is None:
            # No aiohttp timeout: the target's timeout_ms on the clock bounds a POST.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        async with self._session.post(url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status

    async def close(self) -> None:
        """Stop delivering (the broker stops): what is buffered is dropped, and
        the next event (a restarted broker's) starts over."""
        self._closing = True
        tasks = [s.task for s in self.states if s.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for state in self.states:
            state.pending.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._closing = False
