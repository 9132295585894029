"""MQTT durability that only a real process shows: kill -9 of a broker process
and its restart on the same data dir, talked to over real sockets (RawClient,
paho). The rest of the persistence tests run in memory:
tests/protocol/mqtt/test_mqtt_persistence.py."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import mqttraw
import pytest
from conftest import start_broker
from mqttraw import RawClient, paho_publish
from procs import Process, start_warren_mqtt

from warren.core.clock import ManualClock
from warren.mqtt import properties as P
from warren.mqtt.packets import (
    MQTT_5,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from warren.mqtt.session import queue_name

pytestmark = pytest.mark.timeout(60)


def persistent(level: int) -> dict[str, Any]:
    """CONNECT arguments for a session that outlives its connection."""
    if level == MQTT_5:
        return {"clean": False, "properties": {P.SESSION_EXPIRY_INTERVAL: 3600}}
    return {"clean": False}


def retained_on(port: int, topic_filter: str, level: int = MQTT_5) -> dict[str, bytes]:
    """The retained messages a fresh subscription gets (mqttraw.retained_on)."""
    return mqttraw.retained_on(RawClient(port, level), topic_filter)


def kill_9(proc: Process) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def stop(proc: Process) -> None:
    """The end of a test with a broker process, whatever state it is in."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_retained_messages_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren_mqtt(data)
    try:
        # QoS 1: the PUBACK comes after the retained store is synced.
        paho_publish(port, "k/a", [b"kept"], retain=True)
        paho_publish(port, "k/b", [b"to-clear"], retain=True)
        kill_9(proc)
        proc, port = start_warren_mqtt(data)
        assert retained_on(port, "k/#") == {"k/a": b"kept", "k/b": b"to-clear"}
        paho_publish(port, "k/b", [b""], retain=True, level=4)
        assert retained_on(port, "k/#") == {"k/a": b"kept"}
        kill_9(proc)
        proc, port = start_warren_mqtt(data)
        assert retained_on(port, "k/#") == {"k/a": b"kept"}
    finally:
        stop(proc)


def test_persistent_session_survives_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren_mqtt(data)
    try:
        with RawClient(port) as sub:
            sub.connect("k9-session", **persistent(MQTT_5))
            sub.subscribe("k9/#", qos=1)
            sub.disconnect()
        paho_publish(port, "k9/x", [b"one", b"two"])
        kill_9(proc)
        proc, port = start_warren_mqtt(data)
        with RawClient(port) as sub:
            assert sub.connect("k9-session", **persistent(MQTT_5)).session_present
            got = sub.publishes(2)
            assert [p.payload for p in got] == [b"one", b"two"]
            sub.send(*(PubAck(p.packet_id or 0) for p in got))
            sub.disconnect()
    finally:
        stop(proc)


def test_qos2_inbound_state_survives_kill_9(tmp_path: Path) -> None:
    """PUBREC is sent only once the packet id is on disk: after kill -9 the resent
    PUBLISH is still recognised as a duplicate."""
    data = tmp_path / "data"
    proc, port = start_warren_mqtt(data)
    try:
        with RawClient(port) as w:
            w.connect("k9-watch", **persistent(MQTT_5))
            w.subscribe("k9q2/#", qos=1)
            w.disconnect()
        with RawClient(port) as pub:
            pub.connect("k9-q2", **persistent(MQTT_5))
            pub.send(Publish("k9q2/t", b"once", qos=2, packet_id=5))
            assert pub.expect(PubRec).packet_id == 5
            kill_9(proc)
        proc, port = start_warren_mqtt(data)
        with RawClient(port) as pub:
            assert pub.connect("k9-q2", **persistent(MQTT_5)).session_present
            pub.send(Publish("k9q2/t", b"once", qos=2, dup=True, packet_id=5))
            assert pub.expect(PubRec).packet_id == 5
            pub.send(PubRel(5))
            assert pub.expect(PubComp).packet_id == 5
            pub.send(Publish("k9q2/t", b"marker", qos=1, packet_id=6))
            assert pub.expect(PubAck).packet_id == 6
            pub.disconnect()
        with RawClient(port) as w:
            assert w.connect("k9-watch", **persistent(MQTT_5)).session_present
            got = w.publishes(2)
            assert [p.payload for p in got] == [b"once", b"marker"]
            w.send(*(PubAck(p.packet_id or 0) for p in got))
            w.disconnect()
    finally:
        stop(proc)


def test_session_connected_at_kill_9_still_expires(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session whose connection was up when the broker died has no disconnect time
    on disk: its expiry counts from the restart, it does not live forever. The
    restart is an embedded broker on a ManualClock, so the interval runs out
    when the test moves the clock."""
    data = tmp_path / "data"
    proc, port = start_warren_mqtt(data)
    try:
        c = RawClient(port)
        c.connect("k9-exp", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 1})
        c.subscribe("k9exp/#", qos=1)  # the SUBACK comes after the session is synced
        kill_9(proc)
        c.close()
    finally:
        stop(proc)
    caplog.set_level(logging.INFO, "warren.mqtt")
    b = start_broker(data, clock=ManualClock())
    try:
        queue = queue_name("k9-exp")
        b.advance(999)  # 1 ms short of the interval, counted from the restart
        assert b.call(lambda: queue in b.broker.vhosts["/"].queues)
        assert "expired" not in caplog.text
        b.advance(1)
        assert b.call(lambda: queue not in b.broker.vhosts["/"].queues)
        assert "MQTT session 'k9-exp' in vhost '/' expired" in caplog.text
        with RawClient(b.mqtt_port) as c:
            ack = c.connect("k9-exp", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 1})
            assert not ack.session_present
            c.disconnect()
    finally:
        b.stop()
