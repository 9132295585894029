"""MQTT behaviour that only a broker with listeners shows; everything else about
the protocol runs in memory (test_mqtt_broker.py, test_mqtt_hostile.py, and
here the management API's listing of MQTT connections, harness.http()).

- A client that never reads: what it shows is backpressure, the socket's and
  the kernel's buffers filling and asyncio's transport stopping the writes
  (its write buffer, the protocol told to pause), which an in-memory
  transport does not have. Its bystander is a paho client on a thread,
  publishing all the while.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from conftest import BrokerThread
from harness import Harness
from mqttraw import RawClient, wait_for

from warren.mqtt.codec import encode
from warren.mqtt.packets import MQTT_5, Disconnect, PubAck, Publish
from warren.mqtt.server import MQTTListener


def mqtt_port(b: BrokerThread) -> int:
    listener = b.broker.listener("mqtt")
    assert listener is not None
    return listener.port


class Bystander:
    """A paho client that publishes QoS 1 to itself without pause (each message
    acknowledged before the next) for as long as the test runs."""

    def __init__(self, port: int, level: int = MQTT_5) -> None:
        self.received: list[int] = []
        self.disconnects: list[Any] = []
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        subscribed = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id="bystander",
            protocol=mqtt.MQTTv5 if level == MQTT_5 else mqtt.MQTTv311,
        )
        self.client.on_message = lambda _c, _u, msg: self.received.append(int(msg.payload))
        self.client.on_disconnect = lambda _c, _u, _f, rc, _p: self.disconnects.append(rc)
        self.client.on_subscribe = lambda *_a: subscribed.set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        sock = self.client.socket()
        assert isinstance(sock, socket.socket)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # paho leaves Nagle on
        self.client.loop_start()
        self.client.subscribe("bystander/#", qos=1)
        assert subscribed.wait(5)
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()
        wait_for(lambda: self.sent >= 5, what="the bystander to publish")

    def _publish(self) -> None:
        try:
            while not self._stop.is_set():
                info = self.client.publish("bystander/n", b"%d" % self.sent, qos=1)
                info.wait_for_publish(5)
                if not info.is_published():
                    raise AssertionError(f"bystander message {self.sent} not acknowledged")
                self.sent += 1
        except BaseException as exc:
            self.errors.append(exc)

    def check(self) -> None:
        """Everything it published came back, in order, and it was never disconnected."""
        sent_before = self.sent
        wait_for(lambda: self.sent >= sent_before + 5 or self.errors, what="more publishes")
        self._stop.set()
        self._thread.join(10)
        assert not self.errors, self.errors
        wait_for(lambda: len(self.received) >= self.sent, what="the bystander's messages")
        assert self.received == list(range(self.sent))
        assert not self.disconnects

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def bystander(broker: BrokerThread) -> Iterator[Bystander]:
    b = Bystander(mqtt_port(broker))
    try:
        yield b
    finally:
        b.close()


def test_connections_listed_by_the_management_api(tmp_path: Path) -> None:
    """In memory: paho's client (harness.mqtt), the API through harness.http()."""
    with Harness(tmp_path / "data") as b:
        c = b.mqtt("listed", protocol=5)
        c.paho.username_pw_set("guest", "guest")
        assert c.connect() == 0
        subscribed: list[int] = []
        c.paho.on_subscribe = lambda _c, _u, mid, _codes, _props: subscribed.append(mid)
        _, mid = c.paho.subscribe("x/#", qos=1)
        c.until(lambda: mid in subscribed)
        listed = b.http().get("/api/connections")
        (conn,) = [x for x in listed if x["protocol"].startswith("MQTT")]
        assert conn["protocol"] == "MQTT 5-0"
        assert conn["client_properties"]["client_id"] == "listed"
        assert conn["user"] == "guest" and conn["vhost"] == "/"
        c.paho.disconnect()
        c.until(lambda: c.eof)


def test_a_client_that_never_reads(broker: BrokerThread, bystander: Bystander) -> None:
    """Its messages wait in its queue, not in the broker's write buffer; the others
    go on."""
    port = mqtt_port(broker)
    listener = broker.broker.listener("mqtt")
    assert isinstance(listener, MQTTListener)
    with RawClient(port) as hog, RawClient(port) as pub:
        hog.connect("hog")
        hog.subscribe("flood/#", qos=0)
        pub.connect("flooder")
        batch = encode(Publish("flood/x", b"x" * 1000), MQTT_5) * 500
        for _ in range(40):
            pub.send_raw(batch)
        pub.send(Publish("flood/x", b"end", 1, packet_id=1))
        assert pub.expect(PubAck).packet_id == 1

        def backlog() -> tuple[int, int, bool]:
            proto = next(p for p in listener.protocols if p.conn and p.conn.client_id == "hog")
            assert proto.transport is not None and proto.conn is not None
            queue = broker.broker.vhosts["/"].queues["mqtt-subscription-hogqos1"]
            return (
                proto.transport.get_write_buffer_size(),
                queue.message_count,
                proto.conn.writable,
            )

        # (The kernel's socket buffers hold some MB of the 20 MB; the rest waits.)
        buffered, queued, writable = broker.call(backlog)
        assert buffered < 4_000_000, buffered
        assert queued > 0 and not writable, (queued, writable)
        bystander.check()
        # Reading again: everything arrives, in order.
        got = [hog.expect(Publish).payload for _ in range(20001)]
        assert got[-1] == b"end" and got[:-1] == [b"x" * 1000] * 20000
        hog.disconnect()
        pub.disconnect()


def test_a_broker_shutting_down_closes_its_clients_first(broker: BrokerThread) -> None:
    """The stop tells each MQTT 5 client (DISCONNECT 0x8B Server shutting down) and
    waits until its connection is gone (the listener's OpenClients)."""
    listener = broker.broker.listener("mqtt")
    assert isinstance(listener, MQTTListener)
    with RawClient(listener.port) as client:
        client.connect("leaving")
        broker.stop()
        assert len(listener.protocols) == 0
        (goodbye,) = client.wait_closed()
        assert isinstance(goodbye, Disconnect) and goodbye.reason_code == 0x8B
