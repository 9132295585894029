"""Failed logins are delayed and, past a limit per address, refused unchecked:
AMQP, MQTT and the management API (core/auth_guard.py)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerThread, start_broker

from warren.core.auth_guard import MAX_DELAY_S, AuthGuard


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delays_double_and_age_out() -> None:
    clock = FakeClock()
    guard = AuthGuard(delay_ms=100, per_minute=5, clock=clock)
    assert guard.failed("10.0.0.1") == 0.0  # a single mistake costs nothing
    assert [guard.failed("10.0.0.1") for _ in range(3)] == [0.1, 0.2, 0.4]
    assert not guard.blocked("10.0.0.1")
    guard.failed("10.0.0.1")
    assert guard.blocked("10.0.0.1") and not guard.blocked("10.0.0.2")
    assert guard.failed("10.0.0.2") == 0.0  # per address
    clock.now += 61  # the failures age out
    assert not guard.blocked("10.0.0.1") and guard.failed("10.0.0.1") == 0.0
    for _ in range(20):
        delay = guard.failed("10.0.0.3")
    assert delay == MAX_DELAY_S


def test_disabled() -> None:
    guard = AuthGuard(delay_ms=0, per_minute=0)
    assert all(guard.failed("h") == 0.0 for _ in range(100))
    assert not guard.blocked("h")


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(tmp_path / "data", auth_failure_delay=100, auth_failures_per_minute=4)
    try:
        yield b
    finally:
        b.stop()


def _amqp_login(b: BrokerThread, password: str) -> tuple[bool, float]:
    start = time.monotonic()
    try:
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                b.port,
                credentials=pika.PlainCredentials("guest", password),
                connection_attempts=1,
            )
        ).close()
        ok = True
    except pika.exceptions.ProbableAuthenticationError:
        ok = False
    return ok, time.monotonic() - start


def test_amqp_refusals_slow_down_then_even_the_right_password_is_refused(
    guarded: BrokerThread,
) -> None:
    ok, first = _amqp_login(guarded, "wrong")
    assert not ok
    ok, second = _amqp_login(guarded, "wrong")
    assert not ok and second >= 0.09 and second > first
    ok, third = _amqp_login(guarded, "wrong")
    assert not ok and third >= 0.19
    assert not _amqp_login(guarded, "wrong")[0]
    # Four failures within the minute: refused without checking, right password or not.
    assert not _amqp_login(guarded, "guest")[0]
    assert guarded.call(lambda: guarded.broker.auth_guard.refused) == 5


def _mqtt_connack(b: BrokerThread, password: bytes) -> tuple[int, float]:
    """MQTT 5 CONNECT as guest; the CONNACK reason code and how long it took."""
    import socket

    from warren.mqtt.codec import Decoder, encode
    from warren.mqtt.packets import ConnAck, Connect

    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", b.mqtt_port), timeout=10) as s:
        s.sendall(encode(Connect("guard", 5, username="guest", password=password), 5))
        decoder = Decoder(level=5)
        while True:
            packets = decoder.feed(s.recv(1024))
            if packets:
                (ack,) = packets
                assert isinstance(ack, ConnAck)
                return ack.reason_code, time.monotonic() - start


def test_mqtt_and_http_count_with_amqp(guarded: BrokerThread) -> None:
    """The count is per address, whatever the protocol."""
    assert _mqtt_connack(guarded, b"guest")[0] == 0
    code, _ = _mqtt_connack(guarded, b"wrong")
    assert code == 0x86
    code, took = _mqtt_connack(guarded, b"wrong")
    assert code == 0x86 and took >= 0.09
    start = time.monotonic()
    assert _http_status(guarded, "wrong") == 401
    assert time.monotonic() - start >= 0.19
    assert _http_status(guarded, "wrong") == 401
    # Blocked now: the right password is refused by every protocol.
    assert _http_status(guarded, "guest") == 401
    assert _mqtt_connack(guarded, b"guest")[0] == 0x9F  # Connection rate exceeded


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
