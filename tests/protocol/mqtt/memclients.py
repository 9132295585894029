"""The socket tests' helpers, in memory: what tests/protocol/mqtt's modules used
(`broker`, `broker_factory`, `RawClient`, `paho_publish`, `wait_for`) with
the same shape, so a test moved to the harness keeps its body."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import Harness, RawMQTT

from warren.mqtt.packets import MQTT_5

Factory = Callable[..., Harness]
BrokerThread = Harness  # what the socket tests called the broker (same call/advance/stop)

_ports = itertools.count(50000)

#: The harnesses of the running test (wait_for runs their loops).
_live: list[Harness] = []


def harnesses(tmp_path: Path) -> Iterator[Factory]:
    """What a module's ``broker_factory`` fixture yields: harnesses with custom
    settings (and ``clock=``) on the test's data dir, each with its MQTT
    listener started (as a broker's is), all stopped at the end."""

    def factory(**settings: Any) -> Harness:
        data_dir = Path(settings.pop("data_dir", tmp_path / "data"))
        h = Harness(data_dir, **settings)
        h.mqtt_listener()
        _live.append(h)
        return h

    yield factory
    while _live:
        _live.pop().stop()


def mqtt_port(b: Harness) -> Harness:
    """Where a client connects: the harness itself (no port in memory)."""
    return b


def RawClient(  # noqa: N802
    b: Harness, level: int = MQTT_5, timeout: float = 5.0, host: str = "127.0.0.1"
) -> RawMQTT:
    """RawClient(port, level, timeout, host)'s shape: ``host`` is the peer address
    the broker sees (any address, no interface needed)."""
    return b.mqtt_raw(level, peer=(host, next(_ports)), timeout=timeout)


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """``cond``'s value once the brokers' loops have done all they can now
    (Harness.settle: ready callbacks run, file sync rounds awaited, nothing
    polled); AssertionError if it does not hold then, as nothing more would
    happen without the test (``timeout`` bounds the settling, a safety net)."""
    value = cond()
    if value:
        return value
    for h in _live:
        if not h.closed:
            h.settle(timeout)
    value = cond()
    if not value:
        raise AssertionError(f"{what}: not so once the broker had nothing left to do")
    return value


def paho_publish(
    b: Harness,
    topic: str,
    payloads: list[bytes],
    qos: int = 1,
    retain: bool = False,
    level: int = MQTT_5,
) -> None:
    """Publish with paho's client in memory, each message confirmed (PUBACK/PUBCOMP)."""
    client = b.mqtt("", protocol=level)
    assert client.connect() == 0
    done: list[int] = []
    client.paho.on_publish = lambda _c, _u, mid, _rc, _p: done.append(mid)
    for payload in payloads:
        info = client.paho.publish(topic, payload, qos=qos, retain=retain)
        client.until(lambda info=info: info.mid in done or qos == 0)
        assert qos == 0 or info.mid in done, f"{topic}: {payload!r} not acknowledged"
    client.paho.disconnect()
    client.until(lambda: client.eof)
