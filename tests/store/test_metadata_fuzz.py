"""Bit flips and truncations anywhere in the metadata files (issue 25).

A data directory with users, two vhosts, durable queues holding messages, a
delayed exchange, bindings and a policy is damaged at a byte hypothesis picks
(a flipped bit, or the file cut there) in users.json, vhosts.json, mgmt.json,
delivered.json or a definitions log, then a broker starts on it. Whatever the
damage: the start succeeds or refuses with DamagedFile naming a file; no
message file is deleted or changed; with set-aside the start always succeeds;
every queue whose definition survived serves all its messages; and the users
are those it had, or none, never others.
"""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pikahelp import connect

from examples import examples
from warren import Config
from warren.store.damage import DamagedFile
from warren.store.layout import hashed

# The metadata files are read by interpreted modules in both builds (34 s of
# the pure pass); the messages behind them are the store tests' (both passes).
pytestmark = pytest.mark.passes("compiled")

PERSISTENT = pika.BasicProperties(delivery_mode=2)
QUEUES = {"/": ["a", "b", "c"], "v2": ["d"]}
COUNT = 3
QUIET = {"http_port": 0, "mqtt_port": -1, "stream_port": -1, "prometheus_port": -1}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("template") / "data"
    b = start_broker(data, **QUIET)
    try:

        put = urllib.request.Request(  # v2 with a description: mgmt.json too
            f"http://127.0.0.1:{b.http_port}/api/vhosts/v2",
            data=b'{"description": "the second"}',
            method="PUT",
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(put, timeout=10).close()

        def setup() -> None:
            b.broker.users.add_user("alice", "pw", ["administrator"])
            for vhost in QUEUES:
                b.broker.users.set_permissions("alice", vhost)
                b.broker.users.set_permissions("guest", vhost)
            b.broker.save_users()
            b.broker.set_policy("/", "ttl", "^c$", {"message-ttl": 3600000})

        b.call(setup)
        for vhost, queues in QUEUES.items():
            conn = pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", b.port, virtual_host=vhost)
            )
            ch = conn.channel()
            ch.confirm_delivery()
            ch.exchange_declare("x", "direct", durable=True)
            ch.exchange_declare(
                "later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
            )
            for q in queues:
                ch.queue_declare(q, durable=True)
                ch.queue_bind(q, "x", q)
                for i in range(COUNT):
                    ch.basic_publish("x", q, b"%d" % i, PERSISTENT)
            conn.close()
        conn = connect(b)  # one delivered, unacked: delivered.json records it
        conn.channel().basic_get("a")
        conn.close()
    finally:
        b.stop()
    return data


def message_files(data: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(data)): p.read_bytes()
        for p in sorted((data / "vhosts").rglob("*"))
        if p.is_file() and (p.name.startswith("msgs.") or p.name.startswith("acks."))
    }


def damaged_copy(template: Path, tmp: Path, target: str, at: float, cut: bool, bit: int) -> Path:
    data = tmp / "data"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(template, data)
    path = data / target
    raw = bytearray(path.read_bytes())
    start = max(0, len(raw) - 1024)  # the last KB (these files are small)
    pos = start + int(at * (len(raw) - start))
    if cut:
        del raw[pos:]
    elif pos < len(raw):
        raw[pos] ^= 1 << bit
    path.write_bytes(bytes(raw))
    return data


TARGETS = [
    "users.json",
    "vhosts.json",
    "mgmt.json",
    "delivered.json",
    f"vhosts/{hashed('/')}/definitions.log",
    f"vhosts/{hashed('v2')}/definitions.log",
]


def served(b: BrokerThread) -> dict[tuple[str, str], int]:
    def counts() -> dict[tuple[str, str], int]:
        return {
            (v.name, q.name): q.message_count
            for v in b.broker.vhosts.values()
            for q in v.queues.values()
        }

    result: Any = b.call(counts)
    return result


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=st.sampled_from(TARGETS),
    at=st.floats(0, 1, exclude_max=True),
    cut=st.booleans(),
    bit=st.integers(0, 7),
    set_aside=st.booleans(),
)
def test_damage_anywhere_in_the_metadata_never_costs_a_message(
    template: Path,
    tmp_path: Path,
    target: str,
    at: float,
    cut: bool,
    bit: int,
    set_aside: bool,
) -> None:
    data = damaged_copy(template, tmp_path, target, at, cut, bit)
    before = message_files(data)
    policy = "set-aside" if set_aside else "refuse"
    b = BrokerThread(
        Config(data_dir=str(data), amqp_port=0, damaged_metadata=policy, **QUIET)
    )
    try:
        try:
            b.start()
        except DamagedFile as exc:
            assert not set_aside, f"set-aside refused: {exc}"
            assert str(exc.path).startswith(str(data))
            assert message_files(data) == before  # refused: nothing touched
            return
        counts = served(b)
        users = b.call(lambda: set(b.broker.users.users))
    finally:
        b.stop()
    # Started: no message file lost, and every queue it serves holds all its
    # messages (queues whose definitions were lost stay on disk as orphans).
    after = message_files(data)
    assert set(before) <= set(after), "a message file was deleted"
    # The users it had, or (set aside) none: never others, never guest alone.
    assert users in ({"alice", "guest"}, set()), users
    for (vhost, queue), count in counts.items():
        assert count == COUNT, (vhost, queue, count)
    if not set_aside and target != f"vhosts/{hashed('v2')}/definitions.log":
        # Damage the broker repaired on its own (vhosts.json, delivered.json, a
        # torn end of a log) never loses a vhost or a queue of the other vhost.
        assert {v for v, _ in counts} == set(QUEUES)
