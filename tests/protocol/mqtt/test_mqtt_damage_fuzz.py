"""Bit flips and truncations in the last KB of the MQTT session and retained logs
(issue 25).

A data directory with persistent sessions (subscriptions, a QoS 2 id awaiting
release) and retained messages is damaged at a byte hypothesis picks (a flipped
bit, or the file cut there) in sessions.log or retained.log, then a broker
starts on it. Whatever the damage: the start succeeds or refuses with
DamagedFile naming that file and changes nothing; with set-aside it always
succeeds; every record on an intact line before the damage is there, and
nothing that never was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, start_broker
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mqttraw import RawClient, paho_publish

from examples import examples
from warren import Config
from warren.mqtt import properties as P
from warren.mqtt.packets import Publish, PubRec
from warren.mqtt.server import MQTTListener
from warren.store.damage import DamagedFile

pytestmark = pytest.mark.timeout(300)

FILES = ["sessions.log", "retained.log"]


def mqtt_dir(data: Path) -> Path:
    return data / "mqtt" / hashlib.sha1(b"/").hexdigest()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("template") / "data"
    b = start_broker(data, http_port=-1)
    try:
        port = b.mqtt_port
        for i in range(8):
            with RawClient(port) as c:
                c.connect(f"client-{i}", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})
                c.subscribe(f"s/{i}/a", qos=1, pid=1)
                c.subscribe(f"s/{i}/+/b", qos=2, pid=2)
                c.send(Publish(f"q2/{i}", b"once", 2, packet_id=9))
                c.expect(PubRec)  # awaiting release: in the session's record
                c.disconnect()
        for i in range(8):
            paho_publish(port, f"r/{i}", [b"retained-%d" % i], retain=True)
    finally:
        b.stop()
    return data


def keys_on_intact_lines(path: Path, end: int) -> set[str]:
    """Keys added on the lines that end before byte ``end`` (and not deleted)."""
    keys: set[str] = set()
    data = path.read_bytes()[:end]
    for line in data.split(b"\n")[:-1]:
        entry = json.loads(line[line.index(b"{") :])
        if entry["op"] == "add":
            keys.add(entry["key"])
        else:
            keys.discard(entry["key"])
    return keys


def loaded_keys(b: BrokerThread, name: str) -> set[str]:
    """The records the broker has, as keys of the file ``name``."""
    listener = b.broker.listener("mqtt")
    assert isinstance(listener, MQTTListener)
    state = listener.state

    def keys() -> set[str]:
        if name == "retained.log":
            return set(state.retained("/").messages)
        out = set()
        for cid, session in state.sessions("/").sessions.items():
            out.add(cid + "\x00")
            out.update(f"{cid}\x00{tf}" for tf, _ in session.subscriptions.items())
        return out

    return b.call(keys)


def start(data: Path, **config: Any) -> BrokerThread | DamagedFile:
    b = BrokerThread(Config(data_dir=str(data), amqp_port=0, http_port=-1, mqtt_port=0, stream_port=0, prometheus_port=0, **config))
    try:
        b.start()
    except DamagedFile as exc:
        b.stop()
        return exc
    return b


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(FILES),
    back=st.integers(1, 1024),
    bit=st.integers(-1, 7),  # -1: cut the file there
    policy=st.sampled_from(["refuse", "set-aside"]),
)
def test_damage_anywhere_in_the_last_kb(
    template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    back: int,
    bit: int,
    policy: str,
) -> None:
    data = tmp_path_factory.mktemp("damaged") / "data"
    shutil.copytree(template, data)
    path = mqtt_dir(data) / name
    raw = bytearray(path.read_bytes())
    at = max(len(raw) - back, 0)
    all_keys = keys_on_intact_lines(path, len(raw))
    intact = keys_on_intact_lines(path, at)
    if bit < 0:
        del raw[at:]
    else:
        raw[at] ^= 1 << bit
    path.write_bytes(bytes(raw))
    before = tree(data)

    result = start(data, damaged_metadata=policy)
    event(f"{name}, {policy}: {'refused' if isinstance(result, DamagedFile) else 'started'}")
    if isinstance(result, DamagedFile):
        assert policy == "refuse", f"set-aside refused: {result}"
        assert result.path == path
        assert tree(data) == before  # nothing changed, nothing deleted
        return
    try:
        loaded = loaded_keys(result, name)
        assert intact <= loaded <= all_keys
    finally:
        result.stop()
