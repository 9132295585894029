"""The MQTT files on disk, sessions.log and retained.log, as real brokers restarted
on the same data directory read them: the layout (one record per subscription,
older files read and rewritten)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from mqttraw import RawClient

from warren.mqtt import properties as P
from warren.mqtt.packets import MQTT_5, PubAck, PubComp, Publish, PubRel, UnsubAck, Unsubscribe
from warren.mqtt.server import MQTTListener

pytestmark = pytest.mark.timeout(60)

Factory = Callable[..., BrokerThread]
PERSISTENT: dict[str, Any] = {"clean": False, "properties": {P.SESSION_EXPIRY_INTERVAL: 3600}}


def mqtt_port(b: BrokerThread) -> int:
    listener = b.broker.listener("mqtt")
    assert isinstance(listener, MQTTListener)
    return listener.port


def mqtt_dir(data_dir: Path, vhost: str = "/") -> Path:
    return data_dir / "mqtt" / hashlib.sha1(vhost.encode()).hexdigest()


def live_keys(path: Path) -> list[str]:
    """The keys the log holds after replaying its adds and deletes, in order
    (each line: an optional checksum, then JSON)."""
    keys: dict[str, None] = {}
    for line in path.read_bytes().splitlines():
        entry = json.loads(line[line.index(b"{") :])
        if entry["op"] == "add":
            keys[entry["key"]] = None
        else:
            keys.pop(entry["key"], None)
    return list(keys)


def test_a_subscription_is_a_record_of_its_own(broker_factory: Factory, tmp_path: Path) -> None:
    """Subscribing and unsubscribing write one record each; the session's record
    does not repeat its subscriptions (it was rewritten whole for each change)."""
    b = broker_factory()
    with RawClient(mqtt_port(b)) as c:
        c.connect("rec", **PERSISTENT)
        for i in range(3):
            c.subscribe(f"rec/{i}", qos=1, pid=i + 1)
        c.send(Unsubscribe(9, ["rec/0"]))
        assert c.expect(UnsubAck).reason_codes == [0]
        c.disconnect()
    b.stop()
    path = mqtt_dir(tmp_path / "data") / "sessions.log"
    assert live_keys(path) == ["rec\x00", "rec\x00rec/1", "rec\x00rec/2"]
    for line in path.read_bytes().splitlines():
        assert b'"subscriptions"' not in line
    b = broker_factory()
    with RawClient(mqtt_port(b)) as c:
        assert c.connect("rec", **PERSISTENT).session_present
        for i in range(3):
            c.send(Publish(f"rec/{i}", b"%d" % i, 1, packet_id=i + 1))
        got = [c.recv() for _ in range(5)]  # 3 PUBACKs, 2 deliveries
        assert sorted(p.payload for p in got if isinstance(p, Publish)) == [b"1", b"2"]
        c.disconnect()


def test_a_sessions_log_of_the_older_layout_is_read_and_rewritten(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """A sessions.log an earlier Warren wrote (subscriptions inside the session's
    record, keyed by the bare client id) is read as it is, then rewritten."""
    data = tmp_path / "data"
    broker_factory().stop()  # a data directory with its vhost
    older = {
        "client_id": "old-client",
        "expiry": 0xFFFFFFFF,
        "subscriptions": {"old/#": [1, False, False, 0, 0, "old.#", None]},
        "awaiting_release": [7],
        "released": [],
        "redeliver": [],
        "disconnected_at": 1,
        "pending_will": None,
    }
    path = mqtt_dir(data) / "sessions.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"op": "add", "key": "old-client", "value": older}) + "\n")
    b = broker_factory()
    assert live_keys(path) == ["old-client\x00", "old-client\x00old/#"]  # rewritten
    with RawClient(mqtt_port(b), level=4) as c:
        assert c.connect("old-client", clean=False).session_present
        c.send(PubRel(7))  # still awaiting release: completed
        assert c.expect(PubComp) == PubComp(7)
        c.send(Publish("old/news", b"routed", 1, packet_id=1))
        got = [c.recv(), c.recv()]
        delivered = [p for p in got if isinstance(p, Publish)]
        assert [p.payload for p in delivered] == [b"routed"]
        c.send(PubAck(delivered[0].packet_id or 0))
        c.disconnect()
    b.stop()
    b = broker_factory()
    with RawClient(mqtt_port(b), level=MQTT_5) as c:
        assert c.connect("old-client", **PERSISTENT).session_present
        c.disconnect()
