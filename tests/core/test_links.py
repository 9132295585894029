"""warren.links.LinkRunner, the loop shovels and federation links share, with a
scripted session instead of a broker: the states the API reports, the backoff
(doubling, capped, starting over after a session that ran), a reconnect-delay
of 0, Finished, stop and start, and wait_for_state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from warren.core.clock import Clock, TimerHandle
from warren.links import MAX_BACKOFF, Finished, LinkRunner


class Scripted(LinkRunner):
    """Each session runs the next step: "fail", "run-then-fail", "finish", "hang",
    or "404-then-run" and "404-fails" (a passive declare that a stop meets, below)."""

    FAILED = "terminated"
    log = logging.getLogger("tests.links")

    def __init__(self, steps: list[str], delay: float = 1.0, **kw: Any) -> None:
        super().__init__(delay, **kw)
        self.steps = iter(steps)
        self.sessions = 0
        self.closed = 0
        self.finished = False
        self.declaring = asyncio.Event()  # set while a 404 step awaits its declare

    @property
    def label(self) -> str:
        return "scripted link"

    def info(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "sessions": self.sessions}

    def _finished(self) -> None:
        self.finished = True

    async def _passive_declare(self) -> None:
        """An RPC whose channel the peer closes (404) just as the stop cancels the
        session: aiormq delivers the channel's error, not the cancellation."""
        self.declaring.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise LookupError("404 NOT_FOUND") from None

    async def _session(self) -> None:
        self.sessions += 1
        step = next(self.steps, "hang")
        try:
            if step == "404-then-run":
                with contextlib.suppress(LookupError):  # as a shovel: declare it, run
                    await self._passive_declare()
                self._set_running()
                await asyncio.Event().wait()
            if step == "404-fails":
                await self._passive_declare()
            if step == "finish":
                raise Finished("all moved")
            if step == "run-then-fail":
                self._set_running()
                await asyncio.sleep(0)
            if step == "hang":
                self._set_running()
                await asyncio.Event().wait()
            raise ConnectionError(f"session {self.sessions}")
        finally:
            self.closed += 1


class RecordingClock(Clock):
    """The runner's clock (core/clock.py): each wait recorded (in s) and ended on
    the next loop turn, so the back-off is seen without being waited out."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def now_ms(self) -> int:
        return 0

    def monotonic_ms(self) -> float:
        return 0.0

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return self.call_later(when_ms, callback)

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        if delay_ms:  # 0: a retry at once
            self.waits.append(delay_ms / 1000)
        return asyncio.get_running_loop().call_soon(callback)


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


def test_the_backoff_doubles_up_to_a_minute_and_starts_over_after_a_run(
    clock: RecordingClock,
) -> None:
    async def body() -> None:
        link = Scripted(["fail"] * 8 + ["run-then-fail", "fail"], clock=clock)
        link.start()
        # The ninth session runs a moment, the eleventh hangs, running.
        await link.wait_for_state(lambda s: s == "running" and link.sessions == 11, 5)
        assert link.closed == 10
        await link.stop()
        assert link.closed == 11

    run(body)
    assert clock.waits == [1, 2, 4, 8, 16, 32, MAX_BACKOFF, MAX_BACKOFF, 1, 2]


def test_a_failure_is_reported_with_its_reason_and_logged_once(
    clock: RecordingClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        link = Scripted(["fail"], clock=clock)
        link.start()
        info = await link.wait_for_state(lambda s: s == "terminated", 5)
        assert info == {
            "state": "terminated",
            "reason": "ConnectionError: session 1",
            "sessions": 1,
        }
        running = await link.wait_for_state(lambda s: s == "running", 5)
        assert running["reason"] is None
        await link.stop()

    with caplog.at_level(logging.INFO, logger="tests.links"):
        run(body)
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert failures == ["scripted link failed: ConnectionError: session 1; restarting in 1.0 s"]


def test_a_zero_delay_either_stops_or_retries_at_once(clock: RecordingClock) -> None:
    class NoRestart(Scripted):
        ZERO_DELAY_STOPS = True

    class Federated(Scripted):
        FAILED = "error"
        MIN_BACKOFF = 0.1

    async def body() -> None:
        once = NoRestart(["fail"], delay=0, clock=clock)
        once.start()
        assert once._task is not None
        await once._task  # the loop ended: no restart
        assert once.state == "terminated" and once.sessions == 1
        again = Federated(["fail", "fail", "fail"], delay=0, clock=clock)
        again.start()
        await again.wait_for_state(lambda s: s == "running", 5)
        assert again.sessions == 4
        await again.stop()

    run(body)
    assert clock.waits == [0.1, 0.2]  # the first retry is at once (a sleep of 0)


def test_finished_ends_the_loop_with_the_reason(clock: RecordingClock) -> None:
    async def body() -> None:
        link = Scripted(["finish"], clock=clock)
        link.start()
        info = await link.wait_for_state(lambda s: s != "starting", 5)
        assert info["state"] == "terminated" and info["reason"] == "all moved"
        assert link._task is not None
        await link._task
        assert link.finished and link.sessions == 1 and not clock.waits

    run(body)


def test_start_and_stop_are_idempotent_and_stop_waits_for_the_cleanup() -> None:
    changes: list[str] = []

    async def body() -> None:
        link: Scripted

        def seen() -> None:
            changes.append(link.state)

        link = Scripted(["hang"], on_change=seen)
        link.start()
        link.start()  # already running: no second loop
        await link.wait_for_state(lambda s: s == "running", 5)
        await link.stop()
        assert link.sessions == 1 and link.closed == 1
        await link.stop()

    run(body)
    assert changes == ["starting", "running"]


def test_wait_for_state_times_out_saying_where_the_runner_is(clock: RecordingClock) -> None:
    async def body() -> None:
        link = Scripted(["hang"], clock=clock)
        link.start()
        with pytest.raises(TimeoutError, match=r"not within 0.05 s: scripted link is running"):
            await link.wait_for_state(lambda s: s == "terminated", 0.05)
        assert not link._waiters._waiting  # the waiter is gone
        await link.stop()

    run(body)


@pytest.mark.parametrize("step", ["404-then-run", "404-fails"])
def test_a_stop_the_session_swallows_still_ends_the_loop(
    step: str, clock: RecordingClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop of a broker hung for good when it met a shovel's passive declare
    as the peer refused it: aiormq turned the cancellation into the 404, which the
    shovel caught and went on to running (or, raised, it restarted). The task
    still counts the cancellation, and the runner ends there."""

    async def body() -> None:
        link = Scripted([step], clock=clock)
        link.start()
        await link.declaring.wait()
        await link.stop()  # run() fails the test if it does not return
        assert link.sessions == 1 and link.closed == 1
        assert link.state == "starting"  # never reported running, nor failed

    with caplog.at_level(logging.INFO, logger="tests.links"):
        run(body)
    assert not clock.waits  # no restart was even planned
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_stop_does_not_swallow_the_cancellation_of_its_caller() -> None:
    async def body() -> None:
        link = Scripted(["404-then-run"])
        link.start()
        await link.declaring.wait()
        stopping = asyncio.ensure_future(link.stop())
        await asyncio.sleep(0)  # stop() has cancelled the link's task and waits for it
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping

    run(body)
