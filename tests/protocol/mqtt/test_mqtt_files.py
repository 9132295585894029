"""The MQTT files on disk, sessions.log and retained.log, as real brokers restarted
on the same data directory read them: the layout (one record per subscription,
older files read and rewritten), and damage (issue 25): a line that cannot be
read refuses the start, naming the file and line, and changes nothing; with
damaged_metadata = set-aside the file is kept aside and every record that
reads goes on; a torn last line (a crash mid-write) is cut off."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, data_tree, refused_start
from mqttraw import RawClient, paho_publish
from procs import SRC

from warren.mqtt import properties as P
from warren.mqtt.packets import MQTT_5, PubAck, PubComp, Publish, PubRel, UnsubAck, Unsubscribe
from warren.mqtt.server import MQTTListener
from warren.store.definitions import encode_line

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


# -- damage ---------------------------------------------------------------------------------


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def sessions_with_subscriptions(b: BrokerThread, client_ids: list[str]) -> None:
    for cid in client_ids:
        with RawClient(mqtt_port(b)) as c:
            c.connect(cid, **PERSISTENT)
            assert c.subscribe(f"{cid}/x", qos=1).reason_codes == [1]
            c.disconnect()


def delivers(b: BrokerThread, client_id: str) -> bool:
    """The stored session resumes, and its subscription delivers."""
    with RawClient(mqtt_port(b)) as c:
        assert c.connect(client_id, **PERSISTENT).session_present
        c.send(Publish(f"{client_id}/x", b"hello", 0))
        try:
            got = c.expect(Publish, 1.0)
        except TimeoutError:
            return False
        finally:
            c.disconnect()
        return got.payload == b"hello"


def test_a_flipped_byte_in_the_sessions_log_refuses_the_start(
    broker_factory: Factory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    b = broker_factory()
    sessions_with_subscriptions(b, ["s-a", "s-b", "s-c"])
    b.stop()
    path = mqtt_dir(data) / "sessions.log"
    lines = lines_of(path)
    number = next(i for i, line in enumerate(lines) if b'"s-b\\u0000s-b/x"' in line)
    # Still valid JSON and still a subscription (QoS 1 became 2): only the
    # checksum tells.
    lines[number] = lines[number].replace(b'"options":[1,', b'"options":[2,')
    path.write_bytes(b"\n".join(lines) + b"\n")
    before = data_tree(data)

    exc = refused_start(data)
    assert exc.path == path
    assert f"line {number + 1}: checksum mismatch" in str(exc)
    assert "damaged_metadata = set-aside" in str(exc)
    assert data_tree(data) == before  # not a byte changed, not a file deleted

    b = broker_factory(damaged_metadata="set-aside")
    aside = list(path.parent.glob("sessions.log.damaged-*"))
    assert [p.read_bytes() for p in aside] == [before[str(path.relative_to(data))]]
    assert "kept aside" in caplog.text
    assert delivers(b, "s-a") and delivers(b, "s-c")
    assert not delivers(b, "s-b")  # its session is there, its damaged subscription is not
    b.stop()
    b = broker_factory()  # the log was rewritten from what read: no damage left
    assert delivers(b, "s-a")


def test_a_flipped_byte_in_the_retained_log_refuses_the_start(
    broker_factory: Factory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    b = broker_factory()
    for topic in ("r/a", "r/b", "r/c"):
        paho_publish(mqtt_port(b), topic, [topic.encode()], retain=True)
    b.stop()
    path = mqtt_dir(data) / "retained.log"
    lines = lines_of(path)
    number = next(i for i, line in enumerate(lines) if b'"key":"r/b"' in line)
    lines[number] = lines[number].replace(b'"qos":1', b'"qos":0')
    path.write_bytes(b"\n".join(lines) + b"\n")
    before = data_tree(data)

    exc = refused_start(data)
    assert exc.path == path and f"line {number + 1}: checksum mismatch" in str(exc)
    assert data_tree(data) == before

    b = broker_factory(damaged_metadata="set-aside")
    assert len(list(path.parent.glob("retained.log.damaged-*"))) == 1
    with RawClient(mqtt_port(b)) as c:
        c.connect("reader")
        c.subscribe("r/#", qos=1)
        got = c.publishes(2)
        assert [(p.topic, p.payload) for p in got] == [("r/a", b"r/a"), ("r/c", b"r/c")]
        c.nothing_more()


def test_a_torn_last_line_is_cut_off(broker_factory: Factory, tmp_path: Path) -> None:
    """A crash in the middle of writing a line: the line goes (its reply was never
    sent), its bytes kept beside the log, everything before it stays."""
    data = tmp_path / "data"
    b = broker_factory()
    sessions_with_subscriptions(b, ["t-a", "t-b"])
    b.stop()
    path = mqtt_dir(data) / "sessions.log"
    torn = encode_line({"op": "add", "key": "t-c\x00", "value": {"client_id": "t-c"}})[:25]
    with path.open("ab") as f:
        f.write(torn)
    b = broker_factory()
    assert delivers(b, "t-a") and delivers(b, "t-b")
    assert path.with_name("sessions.log.torn").read_bytes() == torn + b"\n"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(
            encode_line({"op": "add", "key": "x\x00", "value": {"client_id": "x", "expiry": "?"}}),
            id="checksummed, not a session",
        ),
        pytest.param(
            encode_line(
                {"op": "add", "key": "x\x00f", "value": {"options": [7, 0, 0, 0, 0, "f", None]}}
            ),
            id="checksummed, not a subscription",
        ),
        pytest.param(
            encode_line({"op": "add", "key": "y\x00", "value": {"client_id": "x", "expiry": 1}}),
            id="a session under another client id",
        ),
        pytest.param(b'{"op":"add","key":"x","value":{"client_id":"x"}}\n', id="older, not a session"),
        pytest.param(b'{"op":"add","key":"x","value":{"client_id"\n', id="older, torn inside"),
    ],
)
def test_a_record_that_is_no_session_refuses_the_start(
    broker_factory: Factory, tmp_path: Path, line: bytes
) -> None:
    """Lines with a right checksum (or none, as older Warrens wrote) whose record is
    not what the broker writes are damage too, never skipped in silence."""
    data = tmp_path / "data"
    b = broker_factory()
    sessions_with_subscriptions(b, ["kept"])
    b.stop()
    path = mqtt_dir(data) / "sessions.log"
    with path.open("ab") as f:
        f.write(line)
    f_lines = lines_of(path)
    exc = refused_start(data)
    assert exc.path == path and f"line {len(f_lines)}:" in str(exc)
    b = broker_factory(damaged_metadata="set-aside")
    assert delivers(b, "kept")


def test_the_warren_process_names_the_damaged_mqtt_file(
    broker_factory: Factory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker_factory().stop()
    path = mqtt_dir(data) / "retained.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_line({"op": "add", "key": "a", "value": {}}).replace(b"a", b"b", 1))
    run = subprocess.run(
        [sys.executable, "-m", "warren", "-D", str(data), "--amqp-port", "0",
         "--http-port", "-1", "--mqtt-port", "0", "--stream-port", "0", "--prometheus-port", "0"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        timeout=60,
    )  # fmt: skip
    assert run.returncode == 1
    assert f"warren: cannot start: {path}: 1 unreadable line(s) (line 1:" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
