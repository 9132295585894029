"""core/clock.py: ManualClock's time line (what every test on it relies on) and
LoopClock's timers on a real loop."""

from __future__ import annotations

import asyncio

import pytest

from warren.core import clock as clocks
from warren.core.clock import LoopClock, ManualClock


def test_advance_runs_due_timers_in_order_each_at_its_time() -> None:
    clock = ManualClock(start_ms=1_000)
    seen: list[tuple[str, int]] = []
    clock.call_later(300, lambda: seen.append(("c", clock.now_ms())))
    clock.call_at(1_100, lambda: seen.append(("a", clock.now_ms())))
    clock.call_later(100, lambda: seen.append(("b", clock.now_ms())))  # same time: set later
    assert clock.advance(99) == 0 and seen == []
    assert clock.advance(201) == 3
    assert seen == [("a", 1_100), ("b", 1_100), ("c", 1_300)]
    assert clock.now_ms() == 1_300 and clock.monotonic_ms() == 300


def test_timers_set_by_timers_run_within_the_same_advance() -> None:
    clock = ManualClock(start_ms=0)
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(clock.now_ms())
        clock.call_later(500, tick)

    clock.call_later(500, tick)
    clock.advance(2_200)
    assert ticks == [500, 1_000, 1_500, 2_000]
    assert clock.pending() == [2_500]


def test_cancel() -> None:
    clock = ManualClock(start_ms=0)
    ran: list[str] = []
    handle = clock.call_later(10, lambda: ran.append("x"))
    handle.cancel()
    assert clock.pending() == []
    assert clock.advance(20) == 0 and ran == []
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_a_timer_already_due_runs_on_the_next_loop_turn() -> None:
    async def scenario() -> list[str]:
        clock = ManualClock(start_ms=0)
        clock.attach(asyncio.get_running_loop())
        ran: list[str] = []
        clock.call_at(0, lambda: ran.append("due"))
        clock.call_later(-5, lambda: ran.append("overdue"))
        clock.call_later(1, lambda: ran.append("later"))
        assert ran == []
        await asyncio.sleep(0)
        return ran

    assert asyncio.run(scenario()) == ["due", "overdue"]


def test_timers_of_a_closed_loop_are_dropped() -> None:
    """A stopped broker's timers never run into its closed objects: the same clock
    serves its restart."""
    clock = ManualClock(start_ms=0)
    ran: list[str] = []

    async def arm() -> None:
        clock.attach(asyncio.get_running_loop())
        clock.call_later(100, lambda: ran.append("old broker"))

    asyncio.run(arm())  # the loop is closed after
    clock.call_later(100, lambda: ran.append("no loop"))
    assert clock.advance(200) == 1 and ran == ["no loop"]


def test_sleep_waits_on_the_clock() -> None:
    async def scenario() -> list[str]:
        clock = ManualClock(start_ms=0)
        clock.attach(asyncio.get_running_loop())
        done: list[str] = []

        async def sleeper() -> None:
            await clocks.sleep(clock, 1_000)
            done.append("woke")

        task = asyncio.ensure_future(sleeper())
        await asyncio.sleep(0)
        clock.advance(999)
        await asyncio.sleep(0)
        assert done == []
        clock.advance(1)
        await task
        return done

    assert asyncio.run(scenario()) == ["woke"]


def test_loop_clock_arms_the_loops_timers() -> None:
    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        clock = LoopClock()
        clock.attach(loop)
        fired = loop.create_future()
        clock.call_at(clock.now_ms() - 10, lambda: fired.set_result(True))  # due: at once
        cancelled: list[bool] = []
        clock.call_later(0, lambda: cancelled.append(True)).cancel()
        await asyncio.wait_for(fired, 5)
        await asyncio.sleep(0)
        return fired.result(), not cancelled

    assert asyncio.run(scenario()) == (True, True)
