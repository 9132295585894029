"""Definitions in RabbitMQ's JSON format: load_definitions at start, import and export.

``data/rabbitmq-3.10.8-definitions.json`` is ``rabbitmqctl export_definitions -``
from RabbitMQ 3.10.8 with a user (alice / s3cret), a vhost (demo), permissions,
a topic permission, two policies, an operator policy, vhost limits, queues,
exchanges and bindings (one exchange-to-exchange).

The brokers run in memory (issue 29): tests/harness brokers, pika's calls over
MemoryAMQP (harness.channel, frames by pamqp; pika over a socket before); a
restart is a new Harness on the same data dir. The `warren` command's refusal
runs the real process.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import Connection, Harness, channel_error, connection_error, harness_fixture
from harness.channel import Properties
from paths import DATA, SRC

from warren.cli import build_config
from warren.config import Config
from warren.core.policies import effective_queue_settings
from warren.definitions_document import DefinitionsError

pytestmark = pytest.mark.timeout(60)

FIXTURE = DATA / "rabbitmq-3.10.8-definitions.json"

broker = harness_fixture()


def fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def write(tmp_path: Path, data: Any, name: str = "defs.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def login(b: Harness, user: str, password: str, vhost: str) -> Connection:
    return b.amqp_connection(user, password, vhost)


def connect(b: Harness) -> Connection:
    return b.amqp_connection()


# -- the RabbitMQ export, loaded at start ------------------------------------------------


def test_rabbitmq_export_is_loaded_at_start(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", load_definitions=str(FIXTURE)) as b:
        _loaded_at_start(b)


def _loaded_at_start(b: Harness) -> None:
    broker = b.broker

    def state() -> dict[str, Any]:
        demo = broker.vhosts["demo"]
        q = demo.queues["orders.new"]
        return {
            "vhosts": sorted(broker.vhosts),
            "alice": broker.users.users["alice"].tags,
            "perms": sorted(
                (u.name, v, p.configure)
                for u in broker.users.users.values()
                for v, p in u.permissions.items()
            ),
            "policies": [(p.name, p.priority, p.apply_to) for p in demo.policies],
            "ops": [(p.name, p.definition) for p in demo.operator_policies],
            "limits": demo.limits,
            "queues": {n: (x.durable, x.arguments) for n, x in demo.queues.items()},
            "exchanges": {
                n: (x.type, x.arguments)
                for n, x in demo.exchanges.items()
                if n and not n.startswith("amq.")
            },
            "orders": (q.policy and q.policy.name, q.operator_policy and q.operator_policy.name),
            "effective": effective_queue_settings(q.arguments, q.policy, q.operator_policy),
            "events_ae": demo.exchanges["events"].alternate_exchange,
        }

    assert b.call(state) == {
        "vhosts": ["/", "demo"],
        "alice": ["monitoring", "management"],
        "perms": [("alice", "demo", "^alice-.*"), ("guest", "/", ".*"), ("guest", "demo", ".*")],
        "policies": [("ttl-policy", 5, "queues"), ("ae-policy", 0, "exchanges")],
        "ops": [("op-cap", {"expires": 3600000, "max-length": 500})],
        "limits": {"max-connections": 10, "max-queues": 20},
        "queues": {"orders.new": (True, {"x-max-priority": 10}), "unrouted-q": (True, {})},
        "exchanges": {
            "events": ("topic", {}),
            "dlx": ("direct", {"x-note": "dead letters"}),
            "unrouted": ("fanout", {}),
        },
        "orders": ("ttl-policy", "op-cap"),
        # operator policy max-length 500 beats the policy's 1000
        "effective": {
            "expires": 3600000,
            "dead-letter-exchange": "dlx",
            "message-ttl": 60000,
            "max-length": 500,
        },
        "events_ae": "unrouted",
    }

    # The password hashes are RabbitMQ's: alice logs in with her password.
    with login(b, "alice", "s3cret", "demo") as conn:
        ch = conn.channel()
        channel_error(403, ch.queue_declare, "not-hers")
        ch = conn.channel()
        assert ch.queue_declare("alice-q").method.queue == "alice-q"
    with login(b, "guest", "guest", "demo") as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("events", "order.created", b"order")  # queue binding
        ch.basic_publish("events", "audit.login", b"audit")  # exchange-to-exchange binding
        ch.basic_publish("events", "unmatched", b"stray")  # alternate exchange by policy
        assert ch.basic_get("orders.new", auto_ack=True)[2] == b"order"
        got = [ch.basic_get("unrouted-q", auto_ack=True)[2] for _ in range(2)]
        assert got == [b"audit", b"stray"]


def test_loading_again_at_restart_is_idempotent(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", load_definitions=str(FIXTURE)) as first:
        with login(first, "guest", "guest", "demo") as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "orders.new", b"kept", Properties(delivery_mode=2))

        def drift() -> None:
            b = first.broker
            b.set_policy("demo", "ttl-policy", "^elsewhere$", {"max-length": 1})
            b.set_vhost_limits("demo", {"max-queues": 99})
            b.users.users["alice"].tags = ["changed"]

        first.call(drift)
    with Harness(tmp_path / "data", load_definitions=str(FIXTURE)) as second:
        _loaded_again(second)


def _loaded_again(second: Harness) -> None:

    def state() -> Any:
        b = second.broker
        demo = b.vhosts["demo"]
        return (
            [(p.name, p.pattern) for p in demo.policies],
            demo.limits,
            b.users.users["alice"].tags,
            sorted(demo.queues),
        )

    # Policies, limits and users are set again from the file; queues are left as they are.
    assert second.call(state) == (
        [("ttl-policy", "^orders\\."), ("ae-policy", "^events$")],
        {"max-connections": 10, "max-queues": 20},
        ["monitoring", "management"],
        ["orders.new", "unrouted-q"],
    )
    with login(second, "guest", "guest", "demo") as conn:
        assert conn.channel().basic_get("orders.new", auto_ack=True)[2] == b"kept"


def test_existing_queue_and_exchange_are_left_as_they_are(broker: Harness) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("mine", durable=True, arguments={"x-max-length": 5})
        ch.exchange_declare("mine-x", "fanout")
    defs = {
        "queues": [
            {"name": "mine", "vhost": "/", "durable": False, "auto_delete": True, "arguments": {}}
        ],
        "exchanges": [
            {
                "name": "mine-x",
                "vhost": "/",
                "type": "topic",
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
        ],
    }
    broker.call(lambda: broker.broker.import_definitions(defs))
    v = broker.broker.vhosts["/"]
    assert broker.call(
        lambda: (v.queues["mine"].arguments, v.queues["mine"].durable, v.exchanges["mine-x"].type)
    ) == (
        {"x-max-length": 5},
        True,
        "fanout",
    )


def test_new_node_with_definitions_gets_no_default_user_or_vhost(tmp_path: Path) -> None:
    defs = {
        "users": [{"name": "bob", "password": "pw", "tags": "monitoring, management"}],
        "vhosts": [{"name": "v1"}],
    }
    with Harness(tmp_path / "data", load_definitions=write(tmp_path, defs)) as b:
        assert b.call(lambda: (sorted(b.broker.vhosts), sorted(b.broker.users.users))) == (
            ["v1"],
            ["bob"],
        )
        assert b.call(lambda: b.broker.users.users["bob"].tags) == ["monitoring", "management"]
        # guest/guest on "/", pika's defaults: no such user (ACCESS_REFUSED).
        connection_error(403, b.amqp_connection)


def test_node_with_data_keeps_its_default_user(tmp_path: Path) -> None:
    Harness(tmp_path / "data").stop()
    defs = write(tmp_path, {"vhosts": [{"name": "v1"}]})
    with Harness(tmp_path / "data", load_definitions=defs) as b:
        assert b.call(lambda: sorted(b.broker.vhosts)) == ["/", "v1"]
        with connect(b) as conn:
            assert conn.is_open


def test_import_details(broker: Harness, caplog: pytest.LogCaptureFixture) -> None:
    defs = {
        "rabbit_version": "3.10.8",
        "users": [{"name": "carol", "password_hash": "", "tags": ""}],
        "vhosts": [{"name": "v2", "metadata": {"description": "d", "tags": []}}],
        "permissions": [
            {"user": "carol", "vhost": "v2", "configure": "", "write": ".*", "read": ".*"}
        ],
        "topic_permissions": [
            {"user": "carol", "vhost": "v2", "exchange": "amq.topic", "write": ".*", "read": ".*"}
        ],
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@elsewhere"}],
        "parameters": [
            {
                "vhost": "v2",
                "component": "mqtt-retainer",  # a plugin Warren does not have
                "name": "up",
                "value": {"uri": "amqp://"},
            },
            {
                "vhost": "v2",
                "component": "operator_policy",
                "name": "op",
                "value": {
                    "pattern": "^q",
                    "definition": {"max-length": 9},
                    "priority": 0,
                    "apply-to": "queues",
                },
            },
        ],
        "queues": [
            {
                "name": "amq.skip",
                "vhost": "v2",
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            },
            {
                "name": "q1",
                "vhost": "v2",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-message-ttl": 5},
            },
        ],
        "exchanges": [
            {
                "name": "amq.skip",
                "vhost": "v2",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            },
            {
                "name": "inner",
                "vhost": "v2",
                "type": "headers",
                "durable": True,
                "auto_delete": False,
                "internal": True,
                "arguments": {},
            },
        ],
        "bindings": [
            {
                "source": "inner",
                "vhost": "v2",
                "destination": "q1",
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {"x-match": "any", "k": "v"},
            }
        ],
    }
    with caplog.at_level(logging.INFO):
        broker.call(lambda: broker.broker.import_definitions(defs))
        broker.call(lambda: broker.broker.import_definitions(defs))  # twice: idempotent
    b = broker.broker

    def state() -> Any:
        v = b.vhosts["v2"]
        carol = b.users.users["carol"]
        (binding,) = v.exchanges["inner"].bindings.values()
        return (
            carol.tags,
            carol.password_hash,
            carol.permissions["v2"].configure,
            sorted(v.queues),
            v.exchanges["inner"].internal,
            "amq.skip" in v.exchanges,
            binding.arguments,
            v.queues["q1"].operator_policy and v.queues["q1"].operator_policy.name,
            [(x, p.write, p.read) for x, p in carol.topic_permissions["v2"].items()],
        )

    assert broker.call(state) == (
        [],
        "",
        "",
        ["q1"],
        True,
        False,
        {"x-match": "any", "k": "v"},
        "op",
        [("amq.topic", ".*", ".*")],
    )
    logged = caplog.text
    assert "global parameter 'cluster_name' skipped" in logged
    assert "parameter component 'mqtt-retainer' is not supported" in logged
    assert "queue 'amq.skip' skipped" in logged
    # carol has an empty password hash: no password lets her in.
    connection_error(403, login, broker, "carol", "", "v2")


def test_queue_limit_of_the_vhost_before_the_import_is_checked(broker: Harness) -> None:
    def queue(name: str, vhost: str = "/") -> dict[str, Any]:
        return {
            "name": name,
            "vhost": vhost,
            "durable": True,
            "auto_delete": False,
            "arguments": {},
        }

    b = broker.broker
    broker.call(lambda: b.set_vhost_limits("/", {"max-queues": 1}))
    broker.call(lambda: b.vhosts["/"].declare_queue("existing"))
    with pytest.raises(DefinitionsError) as info:
        broker.call(lambda: b.import_definitions({"queues": [queue("existing"), queue("new")]}))
    assert str(info.value) == (
        'Adding 1 queue(s) to virtual host "/" would exceed the limit of 1 queue(s).\n\n'
        "This virtual host currently has 1 queue(s) defined.\n\nImport aborted!"
    )
    # A file's own limits do not restrict the queues it declares (as RabbitMQ 3.10).
    defs = {
        "vhosts": [{"name": "v3"}],
        "parameters": [
            {
                "vhost": "v3",
                "component": "vhost-limits",
                "name": "limits",
                "value": {"max-queues": 1},
            }
        ],
        "queues": [queue("a", "v3"), queue("b", "v3")],
    }
    broker.call(lambda: b.import_definitions(defs))
    assert broker.call(lambda: (sorted(b.vhosts["v3"].queues), b.vhosts["v3"].limits)) == (
        ["a", "b"],
        {"max-queues": 1},
    )


# -- bad definitions ------------------------------------------------------------------


def _user(**extra: Any) -> dict[str, Any]:
    return {"name": "u", "password_hash": "", "tags": [], **extra}


BAD = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "definitions must be a JSON object"),
    ({"queues": {"name": "q"}}, "'queues' must be a JSON array"),
    ({"queues": [5]}, "queues[0]: must be a JSON object"),
    (
        {
            "policies": [
                {"vhost": "/", "name": "p", "pattern": ".*", "definition": {"max-length": -1}}
            ]
        },
        "policies[0] 'p': -1 is not a valid maximum length",
    ),
    (
        {
            "policies": [
                {"vhost": "/", "name": "p", "pattern": ".*", "definition": {}, "apply-to": "x"}
            ]
        },
        "policies[0] 'p': no policy provided; apply-to 'x' unrecognised",
    ),
    (
        {
            "permissions": [
                {"user": "nobody", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
            ]
        },
        "permissions[0]: user 'nobody' does not exist",
    ),
    (
        {"queues": [{"name": "q", "vhost": "nope", "durable": True}]},
        "queues[0] 'q': virtual host 'nope' does not exist",
    ),
    (
        {"queues": [{"name": "q", "vhost": "/", "arguments": {"x-max-length": -1}}]},
        "queues[0] 'q': invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}",
    ),
    (
        {"users": [_user(hashing_algorithm="rabbit_password_hashing_sha3")]},
        "users[0] 'u': hashing_algorithm 'rabbit_password_hashing_sha3' is not supported",
    ),
    ({"users": [{"name": "u", "password_hash": ""}]}, "users[0] 'u': user has no 'tags'"),
    (
        {"users": [_user(password_hash="%%%")]},
        "users[0] 'u': 'password_hash' is not a rabbit_password_hashing_sha256 hash",
    ),
    (
        {"rabbit_version": "3.5.7", "users": [_user(password_hash="AAAA")]},
        "'password_hash' is not a rabbit_password_hashing_md5 hash",
    ),
    (
        {"exchanges": [{"name": "x", "vhost": "/", "type": "x-bogus-type"}]},
        "exchanges[0] 'x': unknown exchange type 'x-bogus-type'",
    ),
    (
        {
            "bindings": [
                {
                    "source": "amq.direct",
                    "vhost": "/",
                    "destination": "missing",
                    "destination_type": "queue",
                }
            ]
        },
        "bindings[0]: destination queue 'missing' in vhost '/' does not exist",
    ),
    (
        {
            "parameters": [
                {
                    "vhost": "/",
                    "component": "vhost-limits",
                    "name": "limits",
                    "value": {"max-queues": "x"},
                }
            ]
        },
        "parameters[0] 'limits': max-queues should be a number",
    ),
    (
        {"parameters": [{"vhost": "/", "component": "policy", "name": "p", "value": {}}]},
        "policies may not be set using this method",
    ),
]


@pytest.mark.parametrize(("content", "problem"), BAD)
def test_bad_definitions_stop_the_start(tmp_path: Path, content: Any, problem: str) -> None:
    if isinstance(content, dict):  # a new node with definitions has no vhost of its own
        content = {"vhosts": [{"name": "/"}], **content}
    path = write(tmp_path, content)
    with pytest.raises(DefinitionsError) as info:
        Harness(tmp_path / "data", load_definitions=path)  # stopped when refused
    assert problem in str(info.value)
    assert str(info.value).startswith(f"definitions file {path}: ")
    # The refused start let go of the data dir: a broker can use it now.
    with Harness(tmp_path / "data") as b:
        assert b.call(lambda: "/" in b.broker.vhosts)


def test_a_problem_found_in_the_document_changes_nothing(broker: Harness) -> None:
    defs = {
        "users": [_user(name="dave")],
        "vhosts": [{"name": "v4"}],
        "policies": [{"vhost": "v4", "name": "p", "pattern": ".*", "definition": {"expires": 0}}],
    }
    with pytest.raises(DefinitionsError, match="0 is not a valid queue expiry"):
        broker.call(lambda: broker.broker.import_definitions(defs))
    assert broker.call(
        lambda: ("v4" in broker.broker.vhosts, "dave" in broker.broker.users.users)
    ) == (
        False,
        False,
    )


def test_warren_command_refuses_to_start_on_bad_definitions(tmp_path: Path) -> None:
    path = write(tmp_path, {"vhosts": [{"name": 5}]})
    env = dict(os.environ, PYTHONPATH=str(SRC))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "warren",
            "--amqp-port",
            "0",
            "--http-port",
            "0",
            "--mqtt-port",
            "0",
            "--stream-port",
            "0",
            "--prometheus-port",
            "0",
            "-D",
            str(tmp_path / "d"),
            "--load-definitions",
            path,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"warren: cannot start: definitions file {path}: ")
    assert "vhosts[0]: 'name' must be a string" in result.stderr


def test_definitions_from_a_directory(tmp_path: Path) -> None:
    d = tmp_path / "defs.d"
    d.mkdir()
    write(d, {"vhosts": [{"name": "a"}]}, "1.json")
    write(d, {"queues": [{"name": "qa", "vhost": "a", "durable": True}]}, "2.json")
    write(d, "ignored", "notes.txt")
    with Harness(tmp_path / "data", load_definitions=str(d)) as b:
        assert b.call(lambda: sorted(b.broker.vhosts["a"].queues)) == ["qa"]


def test_config_file_and_flag(tmp_path: Path) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text("[main]\nload_definitions = /etc/warren/defs.json\n")
    assert Config.from_ini(ini).load_definitions == "/etc/warren/defs.json"
    assert (
        build_config(["-c", str(ini), "--load-definitions", "/x.json"]).load_definitions
        == "/x.json"
    )
    ini.write_text("[main]\nload_definitions =\n")
    assert Config.from_ini(ini).load_definitions is None
    assert Config().load_definitions is None


# -- export ---------------------------------------------------------------------------


def _normalised(defs: dict[str, Any]) -> dict[str, Any]:
    """Order-independent view; operator policy definitions as objects; no internal flag."""
    out: dict[str, Any] = {}
    for key, value in defs.items():
        if not isinstance(value, list):
            continue
        rows = copy.deepcopy(value)
        for row in rows:
            row.pop("internal", None)
            if row.get("component") == "operator_policy":
                d = row["value"]["definition"]
                if isinstance(d, list):
                    row["value"]["definition"] = dict(d)
        out[key] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return out


def test_export_of_the_rabbitmq_export_gives_it_back(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", load_definitions=str(FIXTURE)) as b:
        exported = b.call(b.broker.export_definitions)
    ours, theirs = _normalised(exported), _normalised(fixture())
    for key in (
        "users",
        "permissions",
        "policies",
        "queues",
        "exchanges",
        "bindings",
        "parameters",
        "topic_permissions",
    ):
        assert ours[key] == theirs[key], key
    assert [(v["name"], v["limits"]) for v in exported["vhosts"]] == [
        ("/", []),
        ("demo", [["max-connections", 10], ["max-queues", 20]]),
    ]
    assert exported["rabbitmq_version"] == "3.10.8"
    json.dumps(exported)  # plain JSON


def test_export_then_import_into_a_fresh_broker_round_trips(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", load_definitions=str(FIXTURE)) as a:
        exported = _exported_after_changes(a)
    with Harness(tmp_path / "fresh") as fresh:
        _round_trip(fresh, exported)


def _exported_after_changes(a: Harness) -> dict[str, Any]:
    with login(a, "guest", "guest", "demo") as conn:
        ch = conn.channel()
        ch.exchange_declare("hidden", "headers", internal=True)
        ch.queue_declare(
            "typed",
            durable=False,
            auto_delete=True,
            arguments={"x-expires": 60000, "x-custom": {"n": [1, "s", True]}},
        )
        ch.queue_bind("typed", "hidden", "", arguments={"x-match": "all", "a": 1})
        ch.queue_declare("excl", exclusive=True)
        ch.queue_bind("excl", "events", "#")
        a.call(lambda: a.broker.set_vhost_limits("/", {"max-queues": -1}))
        a.call(lambda: a.broker.set_operator_policy("/", "o", "^t", {"message-ttl": 5}, 2, "all"))
        exported: dict[str, Any] = a.call(a.broker.export_definitions)
    names = [q["name"] for q in exported["queues"]]
    assert "excl" not in names and "typed" in names
    assert all(bd["destination"] != "excl" for bd in exported["bindings"])
    return exported


def _round_trip(fresh: Harness, exported: dict[str, Any]) -> None:
    fresh.call(lambda: fresh.broker.import_definitions(json.loads(json.dumps(exported))))
    again = fresh.call(fresh.broker.export_definitions)
    assert again == exported
    with login(fresh, "alice", "s3cret", "demo") as conn:
        assert conn.is_open
    with login(fresh, "guest", "guest", "demo") as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("events", "order.x", b"routed")
        assert ch.basic_get("orders.new", auto_ack=True)[2] == b"routed"
