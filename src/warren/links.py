"""LinkRunner: the run loop a shovel and a federation link share.

A shovel (shovel/runner.py) and a federation link (federation/link.py,
federation/queue_link.py) are each an AMQP client of another broker that has
to keep going while that broker comes and goes: it runs as an asyncio task,
reports where it is (the state the management API shows), and when a session
fails it says why, once, waits ``reconnect-delay`` (doubling, up to a minute,
while it keeps failing) and connects again. That loop is here once; a
subclass only connects and runs until something fails (``_session``) and
cleans up after itself.

Why a module of its own beside batched_protocol.py and tls.py, rather than in
core/ or one of the two packages: shovel/ and federation/ are protocol
packages, and a protocol package never imports another, so neither can hold
it for the other (federation/ used to import shovel.runner for ``redact``);
core/ is the broker's protocol-agnostic model (vhosts, queues, exchanges) and
has no business with outgoing connections. This module imports only the
standard library and core/clock.py, so any package may use it. The reconnect
back-off waits on the broker's clock (a ManualClock in tests).

Tests wait for a state through ``LinkRunner.wait_for_state`` (or a
component's wait over its runners, ``StateWaiters``): woken by each change,
not by polling the API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from warren.core import clock as clocks
from warren.core.clock import Clock, LoopClock

T = TypeVar("T")

#: The longest wait between two attempts, however long the runner keeps failing.
MAX_BACKOFF = 60.0

#: The state of a runner that is connecting (as the API reports it).
STARTING = "starting"
#: The state of a runner whose session is up.
RUNNING = "running"


#: How long the TCP connect and AMQP handshake to a peer may take (ms) when its
#: URI has no ``connection_timeout`` (RabbitMQ's Erlang client's URI parameter,
#: whose default this is).
CONNECTION_TIMEOUT_MS = 60_000
#: How long one RPC to a peer (a declare, bind, qos, consume, channel open) may
#: wait for its reply (ms) when the URI has no ``rpc_timeout``.
RPC_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class Timeouts:
    """A peer's bounds, from its URI's query (``?connection_timeout=10000``, ms)."""

    connect_ms: int = CONNECTION_TIMEOUT_MS
    rpc_ms: int = RPC_TIMEOUT_MS

    @classmethod
    def of(cls, uri: str) -> Timeouts:
        """The bounds ``uri`` asks for; ValueError names a value that is not a
        positive number of milliseconds."""
        query = parse_qs(urlsplit(uri).query)

        def get(name: str, default: int) -> int:
            if name not in query:
                return default
            raw = query[name][-1]
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value <= 0:
                raise ValueError(f"{name} must be a positive number of milliseconds, not {raw!r}")
            return value

        return cls(
            get("connection_timeout", CONNECTION_TIMEOUT_MS), get("rpc_timeout", RPC_TIMEOUT_MS)
        )


def redact(uri: str) -> str:
    """``uri`` without its password (for status, logs and headers)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class Finished(Exception):
    """Raised by a session that did all it had to (a shovel's src-delete-after):
    the runner reports its failed state with this reason and does not start
    again."""


class StateWaiters:
    """Waiters for a condition over some state, checked again on each change.

    Whoever changes the state calls ``notify()``; each waiter's check runs
    there and then, so what it returns is the state at that moment, not at
    whatever later moment the waiter gets to run.
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []

    def notify(self) -> None:
        for check, fut in list(self._waiting):
            if fut.done():
                continue
            try:
                found = check()
            except Exception as exc:  # the waiter's mistake: it is the one to hear of it
                fut.set_exception(exc)
                continue
            if found is not None:
                fut.set_result(found)

    async def wait(
        self, check: Callable[[], T | None], timeout: float, describe: Callable[[], str]
    ) -> T:
        """What ``check()`` returns once it is not None; TimeoutError after
        ``timeout`` seconds, with ``describe()`` (how things stand then)."""
        found = check()
        if found is not None:
            return found
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = (check, fut)
        self._waiting.append(entry)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise TimeoutError(f"not within {timeout} s: {describe()}") from None
        finally:
            self._waiting.remove(entry)


class LinkRunner(ABC):
    """One shovel or link: the task, the state the API reports, the reconnect loop.

    ``state`` is ``starting``, ``running`` or the subclass's ``FAILED`` word
    (a shovel's ``terminated``, a link's ``error``); ``reason`` says why it
    failed (kept, as the API shows it, while it starts again), ``since`` when
    it last got to running.
    """

    #: The state while waiting to start again after a failure (the API's word for it).
    FAILED: ClassVar[str]
    #: The shortest wait after the first retry (a reconnect-delay of 0 retries at once,
    #: then waits this long, doubling).
    MIN_BACKOFF: ClassVar[float] = 0.0
    #: A reconnect-delay of 0 means "do not start again" (RabbitMQ's shovels) rather
    #: than "at once" (its federation links).
    ZERO_DELAY_STOPS: ClassVar[bool] = False
    log: ClassVar[logging.Logger] = logging.getLogger("warren.links")

    def __init__(
        self,
        reconnect_delay: float,
        on_change: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``on_change``: called on each change of state (a component's own waiters);
        ``clock``: the broker's (core/clock.py), for the back-off and ``since``."""
        self.reconnect_delay = reconnect_delay
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.state = STARTING
        self.reason: str | None = None
        self.since = self.clock.now_ms() / 1000
        self._on_change = on_change
        self._waiters = StateWaiters()
        self._ran = False  # the current session got to running
        self._task: asyncio.Task[None] | None = None

    # -- what a subclass gives ----------------------------------------------------------
    @property
    @abstractmethod
    def label(self) -> str:
        """Who this is, in a log line: "shovel 'x' in vhost '/'"."""

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What the management API shows of it."""

    @abstractmethod
    async def _session(self) -> None:
        """Connect, call ``_set_running()`` once up, and run until something fails:
        raise why (``Finished`` when there is nothing left to do), after closing
        what it opened. It ends only by raising; a return counts as a failure."""

    def _finished(self) -> None:  # noqa: B027 (an optional hook: empty unless overridden)
        """After ``Finished``: the runner is done for good."""

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop as a task (nothing happens if it already runs)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Cancel the loop and wait until its session has closed what it opened;
        a second call does nothing. The loop ends even when the session's client
        swallows the cancellation (``_end_if_stopped``); the caller's own
        cancellation is not swallowed here either."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            self.log.error("%s ended with an error", self.label, exc_info=task.exception())

    @property
    def timestamp(self) -> str:
        """``since`` as the API shows it (local time, to the second)."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))

    async def wait_for_state(
        self, predicate: Callable[[str], bool], timeout: float
    ) -> dict[str, Any]:
        """Wait until ``predicate(state)`` holds and return ``info()`` as it was at
        that change (TimeoutError after ``timeout`` s, saying the state then):
        tests see a state the moment it is reached, without polling."""

        def check() -> dict[str, Any] | None:
            return self.info() if predicate(self.state) else None

        def describe() -> str:
            return f"{self.label} is {self.state}" + (f" ({self.reason})" if self.reason else "")

        return await self._waiters.wait(check, timeout, describe)

    # -- bounds on a peer -----------------------------------------------------------------
    async def _within(self, awaitable: Awaitable[T], timeout_ms: int, what: str) -> T:
        """``awaitable``'s result, or TimeoutError once ``timeout_ms`` of the
        broker's clock pass without it (it is cancelled then: aiormq closes a
        connection whose handshake is cancelled). A peer that accepts TCP and
        then stops answering costs this long, not aiormq's heartbeat grace
        (about 3 min, and none at all before the handshake ends)."""
        inner = asyncio.ensure_future(awaitable)
        expired = False

        def expire() -> None:
            nonlocal expired
            if not inner.done():
                expired = True
                inner.cancel()

        timer = self.clock.call_later(timeout_ms, expire)
        try:
            return await inner
        except (asyncio.CancelledError, Exception):
            # Whatever the cancelled awaitable raised (aiormq may turn the
            # cancellation into a connection error), the expiry is the reason;
            # this task's own cancellation (a stop) stays one.
            task = asyncio.current_task()
            if expired and (task is None or not task.cancelling()):
                raise TimeoutError(f"{what}: no answer within {timeout_ms / 1000:g} s") from None
            raise
        finally:
            timer.cancel()

    async def _connect(self, conn: Any, uri: str) -> None:
        """``conn.connect()`` (an aiormq Connection made for ``uri``) within the
        URI's connection_timeout."""
        await self._within(
            conn.connect(), Timeouts.of(uri).connect_ms, f"connecting to {redact(uri)}"
        )

    async def _rpc(self, awaitable: Awaitable[T], uri: str, what: str) -> T:
        """One RPC to the peer at ``uri`` within its rpc_timeout."""
        return await self._within(awaitable, Timeouts.of(uri).rpc_ms, f"{what} on {redact(uri)}")

    # -- states ---------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        self.state = state
        self._changed()

    def _changed(self) -> None:
        """Wake the waiters on this runner and its component: what ``info()``
        shows has changed (a state, or a subclass's own field)."""
        self._waiters.notify()
        if self._on_change is not None:
            self._on_change()

    def _set_running(self) -> None:
        """The session is up: what a subclass calls once it consumes (a session
        that was stopped on the way ends here, see ``_end_if_stopped``)."""
        self._end_if_stopped()
        self._ran = True
        self.reason = None
        self.since = self.clock.now_ms() / 1000
        self._set_state(RUNNING)
        self.log.info("%s running", self.label)

    @staticmethod
    def _end_if_stopped() -> None:
        """Raise CancelledError if this task was cancelled, though what it awaited
        swallowed the cancellation.

        aiormq does: an RPC of a channel the peer closes (a passive declare's
        404) is cancelled to deliver the channel's error, and a cancellation of
        the caller that meets it comes out as that error, ChannelNotFoundEntity,
        which a session catches and goes on. The task still counts the request
        (``cancelling()``): checked here, on the way to running and before a
        restart, a stop ends the loop whatever the session was doing (a broker
        stop used to hang for good there, the session running on).
        """
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        delay = self.reconnect_delay
        while True:
            self._end_if_stopped()
            self._ran = False
            self._set_state(STARTING)
            try:
                await self._session()
                raise ConnectionError("the session ended")
            except asyncio.CancelledError:
                raise
            except Finished as done:
                self.reason = str(done)
                self._set_state(self.FAILED)
                self.log.info("%s finished: %s", self.label, done)
                self._finished()
                return
            except Exception as exc:
                self._end_if_stopped()  # the stop came out as the session's error
                if self._ran:  # it worked for a while: the backoff starts over
                    delay = self.reconnect_delay
                self.reason = f"{type(exc).__name__}: {exc}"
                self._set_state(self.FAILED)
                if self.ZERO_DELAY_STOPS and self.reconnect_delay == 0:
                    self.log.warning(
                        "%s failed: %s; not restarting (reconnect-delay 0)", self.label, self.reason
                    )
                    return
                self.log.warning(
                    "%s failed: %s; restarting in %.1f s", self.label, self.reason, delay
                )
            await clocks.sleep(self.clock, delay * 1000)
            delay = min(max(delay * 2, self.MIN_BACKOFF), MAX_BACKOFF)
