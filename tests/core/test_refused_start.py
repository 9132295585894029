"""A start refused over its definitions file (``load_definitions``) leaves the
data dir exactly as it was: no users file with no users in a new directory
(the next start without definitions would have no guest), no cluster id, no
vhosts file, nothing of the refused file applied, and in a directory with data
every file byte for byte as the last stop left it (users, vhosts, permissions,
definitions logs, messages, the delivered marks).

The brokers run in memory (tests/harness); a restart is a new Harness on the
same data dir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from harness.channel import Properties

from warren.definitions_document import DefinitionsError

pytestmark = pytest.mark.timeout(60)

#: Definitions refused at different points: the file itself, the document, the
#: document against what the data dir holds, a queue's arguments (checked as a
#: declaration is, once only when it was applied), a later file of a directory.
BAD: dict[str, Any] = {
    "not-json": "{ not json",
    "document": {"users": [{"name": "eve", "password": "pw", "tags": ""}], "vhosts": [{"name": 5}]},
    "missing-vhost": {
        "users": [{"name": "eve", "password": "pw", "tags": ""}],
        "vhosts": [{"name": "v9"}],
        "queues": [{"name": "q", "vhost": "nowhere", "durable": True}],
    },
    "quorum-arguments": {
        "users": [{"name": "eve", "password": "pw", "tags": ""}],
        "vhosts": [{"name": "/"}, {"name": "v9"}],
        "queues": [
            {
                "name": "qq",
                "vhost": "v9",
                "durable": True,
                "arguments": {"x-queue-type": "quorum", "x-max-priority": 5},
            }
        ],
    },
    "second-file": [
        {"users": [{"name": "eve", "password": "pw", "tags": ""}], "vhosts": [{"name": "v9"}]},
        {"queues": [{"name": "q", "vhost": "v9", "durable": True, "arguments": {"x-expires": 0}}]},
    ],
}


def definitions(tmp_path: Path, content: Any) -> str:
    """The file (or, for a list, the directory of files) ``load_definitions`` names."""
    if isinstance(content, list):
        directory = tmp_path / "defs.d"
        directory.mkdir()
        for i, doc in enumerate(content):
            (directory / f"{i}.json").write_text(json.dumps(doc))
        return str(directory)
    path = tmp_path / "defs.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def files(data_dir: Path) -> dict[str, bytes]:
    """Every file of the data dir and its bytes, but the lock (a start takes it)
    and the transient area (wiped at every start: non-durable queues)."""
    out: dict[str, bytes] = {}
    for path in sorted(data_dir.rglob("*")):
        rel = path.relative_to(data_dir)
        if rel.parts[0] in (".lock", "transient") or not path.is_file():
            continue
        out[str(rel)] = path.read_bytes()
    return out


@pytest.mark.parametrize("bad", sorted(BAD))
def test_refused_start_on_a_new_dir_writes_nothing(tmp_path: Path, bad: str) -> None:
    data = tmp_path / "data"
    with pytest.raises(DefinitionsError):
        Harness(data, load_definitions=definitions(tmp_path, BAD[bad]))
    assert files(data) == {}  # no users.json without users, no cluster id, no vhosts.json
    # The next start is a first start: the default vhost and guest/guest.
    with Harness(data) as b:
        with b.amqp_connection("guest", "guest", "/") as conn:
            assert conn.is_open
        assert b.call(lambda: (sorted(b.broker.vhosts), sorted(b.broker.users.users))) == (
            ["/"],
            ["guest"],
        )


def _fill(b: Harness) -> None:
    """Users, vhosts, permissions, a topic permission, a policy, limits, a
    durable queue with persistent messages, some of them delivered."""
    api = b.http()
    for path, body in [
        ("users/alice", {"password": "s3cret", "tags": "management"}),
        ("vhosts/v1", {}),
        ("permissions/v1/alice", {"configure": "^a-", "write": ".*", "read": ".*"}),
        ("topic-permissions/v1/alice", {"exchange": "amq.topic", "write": "^x", "read": ".*"}),
        ("policies/v1/ttl", {"pattern": "^q", "definition": {"message-ttl": 60000}}),
        ("vhost-limits/v1/max-queues", {"value": 20}),
    ]:
        reply = api.request("PUT", f"/api/{path}", body)
        assert reply.status in (201, 204), reply
    with b.amqp_connection("guest", "guest", "v1") as conn:
        ch = conn.channel()
        ch.queue_declare("q1", durable=True)
        for i in range(5):
            ch.basic_publish("", "q1", b"m%d" % i, Properties(delivery_mode=2))
        got = ch.basic_get("q1")
        assert got[0] is not None
        ch.basic_ack(got[0].delivery_tag)
    b.settle()


@pytest.mark.parametrize("bad", sorted(BAD))
def test_refused_start_leaves_a_dir_with_data_as_it_was(tmp_path: Path, bad: str) -> None:
    data = tmp_path / "data"
    with Harness(data) as b:
        _fill(b)
    before = files(data)
    assert {"users.json", "vhosts.json", "cluster_id.json", "delivered.json"} <= set(before)
    with pytest.raises(DefinitionsError):
        Harness(data, load_definitions=definitions(tmp_path, BAD[bad]))
    after = files(data)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []
    # And the broker on it has what it had, eve and v9 nowhere.
    with Harness(data) as b:
        assert b.call(lambda: (sorted(b.broker.vhosts), sorted(b.broker.users.users))) == (
            ["/", "v1"],
            ["alice", "guest"],
        )
        with b.amqp_connection("alice", "s3cret", "v1") as conn:
            ch = conn.channel()
            assert ch.queue_declare("q1", durable=True, passive=True).method.message_count == 4
        perms = b.http().get("permissions/v1/alice")
        assert (perms["configure"], perms["write"], perms["read"]) == ("^a-", ".*", ".*")
        assert b.http().get("topic-permissions/v1/alice")[0]["write"] == "^x"
        assert [p["name"] for p in b.http().get("policies/v1")] == ["ttl"]
        assert b.http().get("vhost-limits/v1")[0]["value"] == {"max-queues": 20}
