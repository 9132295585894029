"""Failed logins are delayed and, past a limit per address, refused unchecked:
AMQP, MQTT and the management API (core/auth_guard.py).

The delays are timers on the broker's clock: the tests give it a ManualClock,
see each refusal held by a timer of the expected delay, and release it by
moving the clock, so none waits for time to pass."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from base64 import b64encode
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pika
import pytest
from conftest import BrokerThread, start_broker

from warren.core.auth_guard import MAX_DELAY_MS, AuthGuard
from warren.core.clock import ManualClock
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.packets import ConnAck, Connect

T = TypeVar("T")


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
def guarded(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        auth_failure_delay=100,
        auth_failures_per_minute=4,
    )
    try:
        yield b
    finally:
        b.stop()


def _timers(b: BrokerThread) -> Counter[int]:
    """The broker clock's pending timers, as ms from now."""
    clock = b.clock
    return b.call(lambda: Counter(t - clock.now_ms() for t in clock.pending()))


def _attempt(b: BrokerThread, login: Callable[[], T], held_ms: int) -> T:
    """Run ``login`` (a client that blocks until the broker answers) beside the
    broker: its refusal must be held by a new timer of ``held_ms`` (none when 0),
    which moving the clock by that much releases."""
    guard = b.broker.auth_guard
    before_timers = _timers(b)
    before = b.call(lambda: guard.refused)
    with ThreadPoolExecutor(1) as pool:
        future: Future[T] = pool.submit(login)
        while True:  # until the broker refused it
            done = future.done()  # before the count: a refusal is counted, then sent
            if b.call(lambda: guard.refused) != before:
                break
            if done:
                future.result()  # the client's own failure, if that is what ended it
                raise AssertionError("answered before the broker counted a refusal")
        if held_ms:
            # New timers: the refusal's, the connection's handshake timeout (10 s),
            # and maybe a close-ok timeout or the broker's own rounds.
            new = _timers(b) - before_timers
            assert new[held_ms] >= 1, new
            assert not future.done()  # held, time standing still
            b.advance(held_ms)
        return future.result(timeout=30)


def _amqp_login(b: BrokerThread, password: str) -> bool:
    try:
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                b.port,
                credentials=pika.PlainCredentials("guest", password),
                connection_attempts=1,
            )
        ).close()
        return True
    except pika.exceptions.ProbableAuthenticationError:
        return False


def test_amqp_refusals_slow_down_then_even_the_right_password_is_refused(
    guarded: BrokerThread,
) -> None:
    assert not _attempt(guarded, lambda: _amqp_login(guarded, "wrong"), 0)
    assert not _attempt(guarded, lambda: _amqp_login(guarded, "wrong"), 100)
    assert not _attempt(guarded, lambda: _amqp_login(guarded, "wrong"), 200)
    assert not _attempt(guarded, lambda: _amqp_login(guarded, "wrong"), 400)
    # Four failures within the minute: refused without checking, right password or not.
    assert not _attempt(guarded, lambda: _amqp_login(guarded, "guest"), 800)
    assert guarded.call(lambda: guarded.broker.auth_guard.refused) == 5


def _mqtt_connack(b: BrokerThread, password: bytes) -> int:
    """MQTT 5 CONNECT as guest; the CONNACK's reason code."""
    with socket.create_connection(("127.0.0.1", b.mqtt_port), timeout=10) as s:
        s.sendall(encode(Connect("guard", 5, username="guest", password=password), 5))
        decoder = Decoder(level=5)
        while True:
            packets = decoder.feed(s.recv(1024))
            if packets:
                (ack,) = packets
                assert isinstance(ack, ConnAck)
                return ack.reason_code


def test_mqtt_and_http_count_with_amqp(guarded: BrokerThread) -> None:
    """The count is per address, whatever the protocol."""
    assert _mqtt_connack(guarded, b"guest") == 0
    assert _attempt(guarded, lambda: _mqtt_connack(guarded, b"wrong"), 0) == 0x86
    assert _attempt(guarded, lambda: _mqtt_connack(guarded, b"wrong"), 100) == 0x86
    assert _attempt(guarded, lambda: _http_status(guarded, "wrong"), 200) == 401
    assert _attempt(guarded, lambda: _http_status(guarded, "wrong"), 400) == 401
    # Blocked now: the right password is refused by every protocol.
    assert _attempt(guarded, lambda: _http_status(guarded, "guest"), 800) == 401
    assert _attempt(guarded, lambda: _mqtt_connack(guarded, b"guest"), 1600) == 0x9F


def _http_status(b: BrokerThread, password: str) -> int:
    http = b.broker.listener("http")
    assert http is not None
    req = urllib.request.Request(f"http://127.0.0.1:{http.port}/api/whoami")
    req.add_header("Authorization", "Basic " + b64encode(f"guest:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
