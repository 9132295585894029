"""rhea (Node.js's AMQP 1.0 client) against the embedded broker over real
sockets: the scripts under js/ send and take messages on the port given on
their command line, and print JSON; skipped without node or without rhea
(`make rhea`, or `npm ci` in js/)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pika
import pytest
from paths import TESTS

JS = TESTS / "protocol" / "amqp1" / "js"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(NODE is None, reason="no node (Node.js)"),
    pytest.mark.skipif(
        not (JS / "node_modules" / "rhea").is_dir(), reason="rhea is not installed: make rhea"
    ),
]


def run(script: str, broker: Any, *args: Any) -> tuple[int, list[dict[str, Any]]]:
    """Run js/``script`` against ``broker``: its exit status and JSON lines."""
    assert NODE is not None
    result = subprocess.run(
        [NODE, script, str(broker.port), *map(str, args)],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode in (0, 2), result.stderr
    return result.returncode, lines


def channel(broker: Any) -> Any:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def declare(broker: Any, name: str) -> None:
    conn = channel(broker)
    try:
        conn.channel().queue_declare(name, durable=True)
    finally:
        conn.close()


def test_rhea_sends_and_receives(broker) -> None:
    declare(broker, "rhea")
    status, outcomes = run("send.js", broker, "/queues/rhea", 300)  # beyond one credit
    assert (status, outcomes) == (0, [{"accepted": 300, "released": 0, "rejected": 0}])
    status, messages = run("receive.js", broker, "/queues/rhea", 300)
    assert status == 0
    assert [m["body"] for m in messages] == [f"message {i}" for i in range(300)]
    first = messages[0]
    assert first["message_id"] == "rhea-0"
    assert first["content_type"] == "text/plain"
    assert first["durable"] is True
    assert first["application_properties"] == {"n": 0}


def test_rhea_to_and_from_amqp091(broker) -> None:
    declare(broker, "from-rhea")
    declare(broker, "to-rhea")
    assert run("send.js", broker, "/queues/from-rhea", 1)[0] == 0
    conn = channel(broker)
    try:
        ch = conn.channel()
        _, props, body = ch.basic_get("from-rhea", auto_ack=True)
        assert props.message_id == "rhea-0"
        assert props.headers == {"n": 0}
        assert props.delivery_mode == 2
        # An amqp-value body: the 1.0 sections, marked for a 1.0 consumer.
        assert props.type == "amqp-1.0"
        ch.basic_publish(
            "",
            "to-rhea",
            b"from pika",
            pika.BasicProperties(
                correlation_id="c-9", content_type="text/plain", headers={"k": "v"}
            ),
        )
    finally:
        conn.close()
    status, messages = run("receive.js", broker, "/queues/to-rhea", 1)
    assert status == 0
    (message,) = messages
    assert message["body"] == "from pika"
    assert message["correlation_id"] == "c-9"
    assert message["application_properties"] == {"k": "v"}
    assert message["durable"] is False


def test_rhea_unroutable_is_released(broker) -> None:
    status, outcomes = run("send.js", broker, "/exchanges/amq.direct/nowhere", 2)
    assert (status, outcomes) == (0, [{"accepted": 0, "released": 2, "rejected": 0}])


def test_rhea_missing_queue_is_not_found(broker) -> None:
    assert run("send.js", broker, "/queues/missing", 1) == (2, [{"error": "amqp:not-found"}])
    assert run("receive.js", broker, "/queues/missing", 1) == (2, [{"error": "amqp:not-found"}])


def test_rhea_unknown_vhost_is_refused(broker) -> None:
    status, lines = run("send.js", broker, "/queues/q", 1, "nowhere")
    assert (status, lines) == (2, [{"error": "amqp:unauthorized-access"}])
