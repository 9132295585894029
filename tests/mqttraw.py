"""A raw MQTT client over a real socket, built on Warren's codec: the test decides
every byte and every acknowledgement (paho would acknowledge on its own)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from warren.mqtt.codec import Decoder, encode
from warren.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)

T = TypeVar("T")
C = TypeVar("C", bound="MQTTPackets")


class Closed(Exception):
    """The broker closed the connection."""


class MQTTPackets:
    """A raw MQTT client's packets, whatever carries the bytes: the test decides
    every byte and every acknowledgement. A transport provides send_raw(),
    recv(), close() and _closed() (RawClient: a socket; tests/harness/mqtt.py's
    RawMQTT: a broker's connection in memory)."""

    level: int
    timeout: float

    # -- the transport ---------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        raise NotImplementedError

    def recv(self, timeout: float | None = None) -> Packet:
        """The next packet; Closed at EOF, TimeoutError if none comes in time."""
        raise NotImplementedError

    def close(self) -> None:
        """Abrupt: the connection goes away without DISCONNECT."""
        raise NotImplementedError

    def _closed(self) -> None:
        """After a DISCONNECT and the broker's close: let go of the transport."""

    # -- sending ---------------------------------------------------------------------
    def send(self, *packets: Packet) -> None:
        self.send_raw(b"".join(encode(p, self.level) for p in packets))

    def connect(
        self,
        client_id: str,
        clean: bool = True,
        keep_alive: int = 60,
        properties: dict[int, Any] | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
    ) -> ConnAck:
        self.send(
            Connect(
                client_id,
                self.level,
                clean,
                keep_alive,
                username,
                password,
                will,
                properties or {},
            )
        )
        return self.expect(ConnAck)

    def subscribe(self, topic_filter: str, qos: int = 1, pid: int = 1, **props: Any) -> SubAck:
        self.send(Subscribe(pid, [Subscription(topic_filter, qos)], dict(props)))
        ack = self.expect(SubAck)
        assert ack.packet_id == pid
        return ack

    def disconnect(self, reason_code: int = 0, properties: dict[int, Any] | None = None) -> None:
        self.send(Disconnect(reason_code, properties or {}))
        self.wait_closed()
        self._closed()

    # -- receiving -------------------------------------------------------------------
    def expect(self, cls: type[T], timeout: float | None = None) -> T:
        pkt = self.recv(timeout)
        assert isinstance(pkt, cls), f"expected {cls.__name__}, got {pkt!r}"
        return pkt

    def publishes(self, n: int, timeout: float | None = None) -> list[Publish]:
        return [self.expect(Publish, timeout) for _ in range(n)]

    def wait_closed(self, timeout: float | None = None) -> list[Packet]:
        """Every packet up to the broker's close (which must come in time)."""
        got: list[Packet] = []
        while True:
            try:
                got.append(self.recv(timeout))
            except Closed:
                return got

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawClient(MQTTPackets):
    """A raw MQTT client over a real socket."""

    def __init__(
        self, port: int, level: int = MQTT_5, timeout: float = 5.0, host: str = "127.0.0.1"
    ) -> None:
        self.level = level
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = Decoder(level)
        self.backlog: list[Packet] = []
        self.eof = False

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def _closed(self) -> None:
        self.sock.close()

    def recv(self, timeout: float | None = None) -> Packet:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.backlog:
            if self.eof:
                raise Closed()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet from the broker")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                continue
            self.backlog.extend(self.decoder.feed(data))
        return self.backlog.pop(0)

    def nothing_more(self, timeout: float = 0.3) -> None:
        """Nothing arrives within ``timeout`` (a negative check: the window is the claim)."""
        try:
            pkt = self.recv(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected {pkt!r}")


def retained_on(client: MQTTPackets, topic_filter: str) -> dict[str, bytes]:
    """The retained messages a fresh subscription gets (all with the retain flag),
    through ``client`` (a new connection, closed here)."""
    with client as c:
        c.connect("retained-reader")
        c.subscribe(topic_filter, qos=1)
        # Retained messages are sent with the SUBACK: a PINGRESP asked for after it
        # ends the burst.
        c.send(PingReq())
        got: dict[str, bytes] = {}
        while True:
            p = c.recv()
            if isinstance(p, PingResp):
                break
            assert isinstance(p, Publish) and p.retain, p
            got[p.topic] = p.payload
            if p.qos:
                c.send(PubAck(p.packet_id or 0))
        c.disconnect()
    return got


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it is truthy (returned), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def paho_publish(
    port: int,
    topic: str,
    payloads: list[bytes],
    qos: int = 1,
    retain: bool = False,
    level: int = MQTT_5,
) -> None:
    """Publish with a real paho client, each message confirmed (PUBACK/PUBCOMP)."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        protocol=mqtt.MQTTv5 if level == MQTT_5 else mqtt.MQTTv311,
    )
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for payload in payloads:
            info = client.publish(topic, payload, qos=qos, retain=retain)
            info.wait_for_publish(5)
            assert info.is_published(), f"{topic}: {payload!r} not acknowledged"
    finally:
        client.disconnect()
        client.loop_stop()
