"""A paho-mqtt client wrapped for tests: connect, subscribe and publish wait for the
broker's answer; received messages queue up for `next`."""

from __future__ import annotations

import queue
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

V311 = mqtt.MQTTv311
V5 = mqtt.MQTTv5
TIMEOUT = 10.0



def send_subscribe(
    paho: mqtt.Client,
    protocol: int,
    topic: str,
    qos: int,
    no_local: bool,
    retain_as_published: bool,
    retain_handling: int,
    properties: Properties | None,
) -> int:
    """Send a SUBSCRIBE with paho (MQTT 5's options where the protocol has them);
    its packet id. Shared by the socket client and the in-memory one."""
    if protocol == V5:
        opts = SubscribeOptions(
            qos=qos,
            noLocal=no_local,
            retainAsPublished=retain_as_published,
            retainHandling=retain_handling,
        )
        _, mid = paho.subscribe(topic, options=opts, properties=properties)
    else:
        _, mid = paho.subscribe(topic, qos)
    return int(mid)

class Client:
    def __init__(
        self,
        port: int,
        client_id: str = "",
        protocol: int = V311,
        clean: bool = True,
        username: str | None = None,
        password: str | None = None,
        transport: str = "tcp",
    ) -> None:
        self.port = port
        self.protocol = protocol
        self.clean = clean
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=clean if protocol != V5 else None,
            transport=transport,  # type: ignore[arg-type]
        )
        if username is not None:
            self.paho.username_pw_set(username, password)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: tuple[Any, Any, Any] | None = None
        self.disconnect_reason: Any = None
        self._subacks: dict[int, threading.Event] = {}
        self.suback_codes: dict[int, list[Any]] = {}
        self._unsubacks: dict[int, threading.Event] = {}
        p = self.paho
        p.on_connect = self._on_connect
        p.on_message = lambda c, u, m: self.messages.put(m)
        p.on_subscribe = self._on_subscribe
        p.on_unsubscribe = self._on_unsubscribe
        p.on_disconnect = self._on_disconnect

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack = (flags, rc, props)
        self.connected.set()

    def _on_disconnect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnect_reason = rc
        self.disconnected.set()

    def _on_subscribe(self, c: Any, u: Any, mid: int, codes: Any, props: Any) -> None:
        self.suback_codes[mid] = list(codes)
        self._subacks.setdefault(mid, threading.Event()).set()

    def _on_unsubscribe(self, c: Any, u: Any, mid: int, codes: Any, props: Any) -> None:
        self._unsubacks.setdefault(mid, threading.Event()).set()

    def connect(
        self, keepalive: int = 60, properties: Properties | None = None, clean_start: Any = None
    ) -> tuple[Any, Any, Any]:
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.protocol == V5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            if properties is not None:
                kwargs["properties"] = properties
        self.paho.connect("127.0.0.1", self.port, **kwargs)
        self.paho.loop_start()
        assert self.connected.wait(TIMEOUT), "no CONNACK"
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
        event = self._subacks.setdefault(mid, threading.Event())
        assert event.wait(TIMEOUT), "no SUBACK"
        return self.suback_codes[mid]

    def unsubscribe(self, topic: str) -> None:
        _, mid = self.paho.unsubscribe(topic)
        event = self._unsubacks.setdefault(mid, threading.Event())
        assert event.wait(TIMEOUT), "no UNSUBACK"

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> mqtt.MQTTMessageInfo:
        info = self.paho.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), "no acknowledgement for the PUBLISH"
        return info

    def next(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def nothing_more(self, timeout: float = 0.3) -> bool:
        """True when no further message arrives within ``timeout`` (used only after a
        round trip that proves earlier messages were routed)."""
        try:
            self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (an abrupt loss)."""
        sock = self.paho.socket()
        self.paho.loop_stop()
        if sock is not None:
            sock.close()


def props(packet: int = PacketTypes.PUBLISH, **values: Any) -> Properties:
    p = Properties(packet)
    for name, value in values.items():
        setattr(p, name, value)
    return p
