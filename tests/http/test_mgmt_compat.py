"""The management API's changes, refusals and health checks answer as RabbitMQ's.

Every case of ``tools/mgmt_compat.py`` is run against an embedded Warren and
its answer (status, body, and the GETs after it that show what it changed)
compared with RabbitMQ 3.10.8's, recorded by the same script in
``rabbitmq_mgmt_answers.json`` (``python tools/mgmt_compat.py --json
tests/http/rabbitmq_mgmt_answers.json`` starts a private RabbitMQ).
:data:`DIFFERENCES` lists where Warren answers otherwise on purpose, with the
reason and what Warren answers instead (checked too).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, start_broker

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mgmt_compat.py"
RECORDED = Path(__file__).resolve().with_name("rabbitmq_mgmt_answers.json")


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("mgmt_compat", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mgmt_compat"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


tool = _load_tool()
EXPECTED: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8"))


#: case -> (why Warren differs, the parts of Warren's answer that differ).
DIFFERENCES: dict[str, tuple[str, dict[str, Any]]] = {
    "queue.get.bad-ackmode": (
        "RabbitMQ crashes (500, no body) on an unknown ackmode; Warren refuses it",
        {"status": 400, "body": {"error": "bad_request", "reason": "Invalid ackmode: bogus"}},
    ),
    "exchange.put.bad-type": (
        "RabbitMQ says 'unknown exchange type' the first time a name is used and "
        "'invalid exchange type' once the name is an Erlang atom; Warren always says 'unknown'",
        {"body": {"error": "bad_request", "reason": "unknown exchange type 'bogus'"}},
    ),
    "queue.put.body-type-bogus": (
        "RabbitMQ ignores a body's 'type' (not a queue.declare field); Warren takes it as "
        "x-queue-type, as its clients send it, so a type that does not exist is refused",
        {
            "status": 400,
            "body": {
                "error": "bad_request",
                "reason": "invalid arg 'x-queue-type' for queue 'tb' in vhost 'compat': "
                "\"unsupported queue type 'bogus'\"",
            },
            "then": [[404, {"error": "Object Not Found", "reason": "Not Found"}]],
        },
    ),
    "cluster-name.put.int": (
        "RabbitMQ crashes (500) on a name that is not a string; Warren refuses it",
        {"status": 400, "body": {"error": "bad_request", "reason": "name must be a non-empty string"}},
    ),
    "policy.put.bad-apply-to": (
        "RabbitMQ 4.x's apply-to values (classic_queues, quorum_queues, streams, as "
        "quorum queues follow 4.x) and its text",
        {
            "body": {
                "error": "bad_request",
                "reason": "Validation failed\n\napply-to 'bogus' unrecognised; should be one "
                "of: 'queues', 'classic_queues',  'quorum_queues', 'streams', 'exchanges', "
                "or 'all'\n",
            }
        },
    ),
    "policy.put.definition-list": (
        "RabbitMQ crashes (500) on a definition that is a list; Warren refuses it",
        {"status": 400, "body": {"error": "bad_request", "reason": "Validation failed\n\nno policy provided\n"}},
    ),
    "permission.put.bad-regex": (
        "RabbitMQ answers PCRE's error as Erlang terms (the regex and message as lists of "
        "character codes); Warren names the field and gives its regex engine's words",
        {"body": {"error": "bad_request", "reason": "configure: invalid regular expression: "
                  "missing ), unterminated subpattern at position 0"}},
    ),
    "topic-permission.put.bad-regex": (
        "as permission.put.bad-regex",
        {"body": {"error": "bad_request", "reason": "write: invalid regular expression: "
                  "missing ), unterminated subpattern at position 0"}},
    ),
    "policy.put.bad-pattern": (
        "the regex engine's words and position (PCRE counts from 1, Python from 0)",
        {"body": {"error": "bad_request", "reason": "Validation failed\n\npattern should be "
                  "regular expression but is invalid: {\"missing ), unterminated subpattern\",0}\n"}},
    ),
    "vhost.put.description-int": (
        "RabbitMQ keeps a description that is not a string as it came (1); Warren keeps "
        "descriptions as strings ('1'), as every client reads them",
        {"then": [[200, {"name": "compat-v1", "description": "1", "tags": []}]]},
    ),
    "vhost.put.long-name": (
        "RabbitMQ 3.10 takes a vhost name of any length, which AMQP clients cannot then "
        "name in connection.open (a short string); Warren refuses it (docs/http-api.md, Names)",
        {"status": 400, "body": {"error": "bad_request",
                                 "reason": "vhost should be less than 255 bytes, actually was 256\n"}},
    ),
    "definitions.post.bad-queue": (
        "RabbitMQ's import answers a wrong type with the Erlang crash it caused "
        "('function_clause'); Warren names the entry and the problem",
        {"body": {"error": "bad_request",
                  "reason": "queues[0] 'dq': 'durable' must be true or false, not \"yes\""}},
    ),
    **{
        f"ui.auth{variant}": (
            "RabbitMQ 3.11 and later UIs read oauth_enabled (3.10's enable_uaa): Warren "
            "answers both, so either UI shows its login form",
            {"body": {"enable_uaa": False, "uaa_client_id": "", "uaa_location": "",
                      "oauth_enabled": False}},
        )
        for variant in ("", ".anonymous", ".bad-credentials")
    },
    "exchange.put.delayed-without-plugin": (
        "Warren has the delayed-message exchange built in (RabbitMQ needs its plugin): "
        "what it refuses is the missing x-delayed-type, in the plugin's words",
        {
            "body": {
                "error": "bad_request",
                "reason": "Invalid argument, 'x-delayed-type' must be an existing exchange type",
            }
        },
    ),
}


@pytest.fixture(scope="module")
def warren(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    broker = start_broker(tmp_path_factory.mktemp("mgmt_compat") / "data")
    try:
        yield broker
    finally:
        broker.stop()


def _comparable(answer: dict[str, Any], compare: str) -> dict[str, Any]:
    """What of an answer is compared: bodies that name ports, nodes or listeners
    are compared by their keys and their ``status``/``reason``."""
    if compare == "status":
        return {"status": answer["status"]}
    if compare == "keys" and isinstance(answer["body"], dict):
        body = answer["body"]
        kept = {k: body[k] for k in ("status", "reason", "missing") if k in body}
        return {**answer, "body": {"keys": sorted(body), **kept}}
    return answer


def test_recording_covers_every_case() -> None:
    assert sorted(EXPECTED) == sorted([*tool.CASES, tool.LIMITS_KEY, tool.DEFINITIONS_KEY])


def ordered(text: str) -> Any:
    """A JSON text with its objects' key order kept (as tuples of pairs) and lists of
    objects sorted: RabbitMQ lists parameters in its tables' hash order."""

    def obj(pairs: list[tuple[str, Any]]) -> tuple[Any, ...]:
        return ("{", *(
            (k, sorted(v, key=repr) if isinstance(v, list) and v and isinstance(v[0], tuple) else v)
            for k, v in pairs
        ))

    return json.loads(text, object_pairs_hook=obj)


#: RabbitMQ 3.10's /api/definitions writes a vhost as its name alone; Warren writes
#: 3.13's fields so a vhost's description and tags survive an export and import.
VHOST_313 = {"name": "compat", "description": "", "tags": [],
             "metadata": {"description": "", "tags": []}}


def test_definitions_exports_as_rabbitmq(warren: BrokerThread) -> None:
    """The same objects exported by Warren and RabbitMQ 3.10.8: the per-vhost export
    the same JSON (keys in RabbitMQ's order), the node-wide one the same entries."""
    got = tool.definitions(f"http://127.0.0.1:{warren.http_port}")
    expected = EXPECTED[tool.DEFINITIONS_KEY]
    assert ordered(got["vhost"]) == ordered(expected["vhost"])
    full = json.loads(expected["full"])
    full["vhosts"] = [VHOST_313]
    assert ordered(got["full"]) == ordered(json.dumps(full))


def test_limits_refuse_amqp_clients_as_rabbitmq(warren: BrokerThread) -> None:
    """vhost max-connections and max-queues, user max-connections and max-channels:
    the same codes and texts as RabbitMQ's, through pika."""
    got = tool.limit_refusals(f"http://127.0.0.1:{warren.http_port}", warren.port)
    assert got == EXPECTED[tool.LIMITS_KEY]


@pytest.mark.parametrize("name", sorted(tool.CASES))
def test_answers_as_rabbitmq(warren: BrokerThread, name: str) -> None:
    case = tool.CASES[name]
    got = tool.run_case(tool.Client(f"http://127.0.0.1:{warren.http_port}"), case)
    expected = dict(EXPECTED[name])
    if name in DIFFERENCES:
        expected.update(DIFFERENCES[name][1])
    assert _comparable(got, case.compare) == _comparable(expected, case.compare)


def test_a_refused_change_is_logged(
    warren: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="warren.http"):
        tool.run_case(tool.Client(f"http://127.0.0.1:{warren.http_port}"),
                      tool.CASES["queue.put.durable-yes"])
    assert "PUT /api/queues/compat/dyes from 127.0.0.1 refused: 400 ['not_boolean', 'yes']" in (
        caplog.text)
