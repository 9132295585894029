"""The socket tests' helpers, in memory: what tests/protocol/mqtt's modules used
(`broker`, `broker_factory`, `RawClient`, `paho_publish`, `wait_for`) with
the same shape, so a test moved to the harness keeps its body."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from harness import Harness, RawMQTT
from mqttclient import send_subscribe
from paho.mqtt.properties import Properties

from warren.mqtt.packets import MQTT_5

V311 = paho.MQTTv311
V5 = paho.MQTTv5

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


def live_ids(b: Harness) -> set[str]:
    """The client ids of the MQTT connections the broker holds now."""
    state = b.mqtt_listener().state
    return b.call(lambda: {cid for _vh, cid in state.live})


class Client:
    """tests/mqttclient.py's Client in memory: paho's own client (harness.MemoryMQTT)
    with the same calls (connect, subscribe, publish and unsubscribe wait for the
    broker's answer; received messages queue up for ``next``). No thread: each
    call runs paho and the broker's loop until its answer came."""

    def __init__(
        self,
        b: Harness,
        client_id: str = "",
        protocol: int = V311,
        clean: bool = True,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.harness = b
        self.protocol = protocol
        self.clean = clean
        self.mem = b.mqtt(
            client_id,
            protocol,
            peer=("127.0.0.1", next(_ports)),
            clean_session=clean if protocol != V5 else None,
        )
        self.paho = p = self.mem.paho
        if username is not None:
            p.username_pw_set(username, password)
        self.messages: deque[paho.MQTTMessage] = deque()
        self.connack: tuple[Any, Any, Any] | None = None
        self.disconnect_reason: Any = None
        self.suback_codes: dict[int, list[Any]] = {}
        self._unsubacks: set[int] = set()
        p.on_connect = self._on_connect
        p.on_message = lambda c, u, m: self.messages.append(m)
        p.on_subscribe = self._on_subscribe
        p.on_unsubscribe = lambda c, u, mid, codes, props: self._unsubacks.add(mid)
        p.on_disconnect = self._on_disconnect

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack = (flags, rc, props)

    def _on_disconnect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnect_reason = rc

    def _on_subscribe(self, c: Any, u: Any, mid: int, codes: Any, props: Any) -> None:
        self.suback_codes[mid] = list(codes)

    def until(self, done: Callable[[], bool], what: str) -> None:
        try:
            self.mem.until(done)
        except AssertionError:
            raise AssertionError(f"no {what}") from None

    def connect(
        self, keepalive: int = 60, properties: Properties | None = None, clean_start: Any = None
    ) -> tuple[Any, Any, Any]:
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.protocol == V5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            if properties is not None:
                kwargs["properties"] = properties
        self.paho.connect("127.0.0.1", 1883, **kwargs)
        self.until(lambda: self.connack is not None, "CONNACK")
        assert self.connack is not None
        return self.connack

    def subscribe(
        self,
        topic: str,
        qos: int = 0,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
        properties: Properties | None = None,
    ) -> list[Any]:
        mid = send_subscribe(
            self.paho,
            self.protocol,
            topic,
            qos,
            no_local,
            retain_as_published,
            retain_handling,
            properties,
        )
        self.until(lambda: mid in self.suback_codes, "SUBACK")
        return self.suback_codes[mid]

    def unsubscribe(self, topic: str) -> None:
        _, mid = self.paho.unsubscribe(topic)
        self.until(lambda: mid in self._unsubacks, "UNSUBACK")

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> paho.MQTTMessageInfo:
        info = self.paho.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        self.until(info.is_published, "acknowledgement for the PUBLISH")
        return info

    def next(self) -> paho.MQTTMessage:
        self.until(lambda: bool(self.messages), "message")
        return self.messages.popleft()

    def nothing_more(self) -> bool:
        """True when no further message has come once the broker's loop has
        done all it can (Harness.settle) and paho has read what it wrote."""
        self.harness.settle()
        self.mem.until(lambda: not self.mem.inbox)
        return not self.messages

    def close(self) -> None:
        if not self.mem.eof:
            self.paho.disconnect()
            self.mem.until(lambda: self.mem.eof)


class Bystander:
    """The well-behaved client beside a hostile one: paho (in memory) publishing
    QoS 1 messages to itself. Without a thread it cannot publish *while* the test
    acts, so it has messages in flight instead: published and routed, their
    PUBACKs and deliveries not yet read, when the hostile client starts;
    ``check`` publishes more and reads everything back."""

    IN_FLIGHT = 5

    def __init__(self, b: Harness, level: int = MQTT_5) -> None:
        self.harness = b
        self.received: list[int] = []
        self.disconnects: list[Any] = []
        self.sent = 0
        self._unacked: list[paho.MQTTMessageInfo] = []
        self.mem = b.mqtt(
            "bystander", V5 if level == MQTT_5 else V311, peer=("127.0.0.1", next(_ports))
        )
        client = self.mem.paho
        client.on_message = lambda _c, _u, msg: self.received.append(int(msg.payload))
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self.disconnects.append(rc)
        subscribed: list[int] = []
        client.on_subscribe = lambda _c, _u, mid, _codes, _p: subscribed.append(mid)
        assert self.mem.connect(keepalive=30) == 0
        _, mid = client.subscribe("bystander/#", qos=1)
        self.mem.until(lambda: mid in subscribed)
        self._publish(5)
        self._settled()
        self._publish(self.IN_FLIGHT)

    def _publish(self, n: int) -> None:
        for _ in range(n):
            self._unacked.append(self.mem.paho.publish("bystander/n", b"%d" % self.sent, qos=1))
            self.sent += 1

    def _settled(self) -> None:
        """Every message it published acknowledged and back."""
        self.mem.until(
            lambda: all(i.is_published() for i in self._unacked) and len(self.received) >= self.sent
        )
        self._unacked.clear()

    def check(self) -> None:
        """Everything it published came back, in order, and it was never disconnected."""
        self._publish(5)
        self._settled()
        assert self.received == list(range(self.sent))
        assert not self.disconnects and self.mem.paho.is_connected() and not self.mem.eof

    def close(self) -> None:
        if not self.mem.eof:
            self.mem.paho.disconnect()
            self.mem.until(lambda: self.mem.eof)
