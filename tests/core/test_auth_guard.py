"""Failed logins are delayed and, past a limit per address, refused unchecked:
AMQP, MQTT and the management API (core/auth_guard.py).

The delays are timers on the broker's clock: the tests give it a ManualClock,
see each refusal held by a timer of the expected delay, and release it by
moving the clock, so none waits for time to pass. The logins run in memory
(tests/harness, issue 29): AMQP's over MemoryAMQP, MQTT's over RawMQTT, the
management API's through ``harness.http()``; every in-memory connection comes
from 127.0.0.1, one address for the guard, as sockets on the loopback."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from harness import Harness
from harness.management import Pending
from pamqp import commands

from warren.core.auth_guard import MAX_DELAY_MS, AuthGuard
from warren.core.clock import ManualClock
from warren.mqtt.codec import encode
from warren.mqtt.packets import ConnAck, Connect

T = TypeVar("T", covariant=True)


def test_delays_double_and_age_out() -> None:
    clock = ManualClock()
    guard = AuthGuard(delay_ms=100, per_minute=5, clock=clock)
    assert guard.failed("10.0.0.1") == 0.0  # a single mistake costs nothing
    assert [guard.failed("10.0.0.1") for _ in range(3)] == [100, 200, 400]
    assert not guard.blocked("10.0.0.1")
    guard.failed("10.0.0.1")
    assert guard.blocked("10.0.0.1") and not guard.blocked("10.0.0.2")
    assert guard.failed("10.0.0.2") == 0.0  # per address
    clock.advance(61_000)  # the failures age out
    assert not guard.blocked("10.0.0.1") and guard.failed("10.0.0.1") == 0.0
    for _ in range(20):
        delay = guard.failed("10.0.0.3")
    assert delay == MAX_DELAY_MS


def test_disabled() -> None:
    guard = AuthGuard(delay_ms=0, per_minute=0)
    assert all(guard.failed("h") == 0.0 for _ in range(100))
    assert not guard.blocked("h")


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        auth_failure_delay=100,
        auth_failures_per_minute=4,
    ) as b:
        yield b


def _timers(b: Harness) -> Counter[int]:
    """The broker clock's pending timers, as ms from now."""
    clock = b.broker.clock
    assert isinstance(clock, ManualClock)
    return b.call(lambda: Counter(t - clock.now_ms() for t in clock.pending()))


class Login(Protocol[T]):
    """A login sent, its answer perhaps held by the broker."""

    def done(self) -> bool:
        """Whether the broker has answered (without running its loop)."""
        ...

    def result(self) -> T:
        """The answer, the broker's loop run until it comes."""
        ...


def _attempt(b: Harness, login: Callable[[], Login[T]], held_ms: int) -> T:
    """Send ``login``: the broker must count a refusal and hold it by a new
    timer of ``held_ms`` (none when 0), which moving the clock by that much
    releases."""
    guard = b.broker.auth_guard
    before_timers = _timers(b)
    before = b.call(lambda: guard.refused)
    attempt = login()  # sent, and the broker's loop run until it has nothing to do
    assert b.call(lambda: guard.refused) == before + 1
    if held_ms:
        # New timers: the refusal's, and maybe the broker's own rounds.
        new = _timers(b) - before_timers
        assert new[held_ms] >= 1, new
        assert not attempt.done()  # held, time standing still
        b.advance(held_ms)
    return attempt.result()


class _AMQPLogin:
    """Protocol header, connection.start, start-ok as guest: tune (True) or a
    connection.close with 403 (False)."""

    def __init__(self, b: Harness, password: str) -> None:
        self.amqp = b.amqp()
        self.amqp.start_ok("guest", password)
        b.settle()
        self.frames = self.amqp.frames_now()

    def done(self) -> bool:
        self.frames += self.amqp.frames_now()
        return bool(self.frames)

    def result(self) -> bool:
        _, frame = self.frames[0] if self.frames else self.amqp.read_frame()
        if isinstance(frame, commands.Connection.Tune):
            return True
        assert isinstance(frame, commands.Connection.Close), frame
        assert frame.reply_code == 403, frame
        return False


def test_amqp_refusals_slow_down_then_even_the_right_password_is_refused(
    guarded: Harness,
) -> None:
    assert not _attempt(guarded, lambda: _AMQPLogin(guarded, "wrong"), 0)
    assert not _attempt(guarded, lambda: _AMQPLogin(guarded, "wrong"), 100)
    assert not _attempt(guarded, lambda: _AMQPLogin(guarded, "wrong"), 200)
    assert not _attempt(guarded, lambda: _AMQPLogin(guarded, "wrong"), 400)
    # Four failures within the minute: refused without checking, right password or not.
    assert not _attempt(guarded, lambda: _AMQPLogin(guarded, "guest"), 800)
    assert guarded.call(lambda: guarded.broker.auth_guard.refused) == 5


class _MQTTConnect:
    """MQTT 5 CONNECT as guest: the CONNACK's reason code."""

    def __init__(self, b: Harness, password: bytes) -> None:
        self.mqtt = b.mqtt_raw(5)
        self.mqtt.send_raw(encode(Connect("guard", 5, username="guest", password=password), 5))
        b.settle()

    def done(self) -> bool:
        return bool(self.mqtt.backlog or self.mqtt.inbox)

    def result(self) -> int:
        ack = self.mqtt.recv()
        assert isinstance(ack, ConnAck)
        return ack.reason_code


def _mqtt_connack(b: Harness, password: bytes) -> int:
    return _MQTTConnect(b, password).result()


class _HTTPLogin:
    """GET /api/whoami as guest: the status."""

    def __init__(self, b: Harness, password: str) -> None:
        self.pending: Pending = b.http("guest", password).begin("GET", "/api/whoami")

    def done(self) -> bool:
        return self.pending.done()

    def result(self) -> int:
        return self.pending.reply().status


def test_mqtt_and_http_count_with_amqp(guarded: Harness) -> None:
    """The count is per address, whatever the protocol."""
    assert _mqtt_connack(guarded, b"guest") == 0
    assert _attempt(guarded, lambda: _MQTTConnect(guarded, b"wrong"), 0) == 0x86
    assert _attempt(guarded, lambda: _MQTTConnect(guarded, b"wrong"), 100) == 0x86
    assert _attempt(guarded, lambda: _HTTPLogin(guarded, "wrong"), 200) == 401
    assert _attempt(guarded, lambda: _HTTPLogin(guarded, "wrong"), 400) == 401
    # Blocked now: the right password is refused by every protocol.
    assert _attempt(guarded, lambda: _HTTPLogin(guarded, "guest"), 800) == 401
    assert _attempt(guarded, lambda: _MQTTConnect(guarded, b"guest"), 1600) == 0x9F
