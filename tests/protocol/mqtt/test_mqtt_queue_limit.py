"""An MQTT subscription that needs a queue beyond the vhost's max-queues.

The scenario is tools/mgmt_gaps.py's (paho clients): a persistent session
subscribes, reconnects and subscribes again within the limit; a new session
subscribing beyond it is refused; the persistent session goes on receiving;
clean sessions' queues go with them, freeing their place. Compared with RabbitMQ
3.10.8's recorded answers (MQTT 3.1.1; 3.10 has no MQTT 5): the same but for the
refusal itself, where 3.10 closes the connection without a SUBACK (its
connection process crashes) and Warren answers as RabbitMQ 3.13 and 4.x do
(rabbit_mqtt_processor: a SUBACK failing that filter and the rest, 0x80, or
MQTT 5's 0x97 Quota exceeded, then the connection closed).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest
from conftest import BrokerThread
from paths import HTTP_DATA, TOOLS

sys.path.insert(0, str(TOOLS))
import mgmt_gaps  # noqa: E402

# The tool's own (tests/http/test_mgmt_compat.py loads mgmt_compat afresh).
Client = mgmt_gaps.Client

pytestmark = pytest.mark.timeout(120)

RECORDED = json.loads(
    (HTTP_DATA / "rabbitmq_gap_answers.json").read_text()
)["mqtt_max_queues"]
REFUSED = "a new session subscribes beyond the limit"


def _run(b: BrokerThread, v5: bool) -> dict[str, Any]:
    return mgmt_gaps.mqtt_max_queues(Client(f"http://127.0.0.1:{b.http_port}"), b.mqtt_port, v5)


def test_mqtt_311_as_rabbitmq(broker: BrokerThread, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="warren.mqtt"):
        answers = _run(broker, v5=False)
    refused = answers.pop(REFUSED)
    expected = dict(RECORDED)
    recorded_refusal = expected.pop(REFUSED)
    assert answers == expected
    # Both close the connection; RabbitMQ 3.13/4.x (and Warren) answer the SUBACK first.
    assert refused["closed"] is recorded_refusal["closed"] is True
    assert recorded_refusal["suback"] is None
    assert refused["suback"] == [0x80, 0x80]
    assert (
        "subscription to 't/new' refused: cannot declare queue 'mqtt-subscription-new-"
        in caplog.text
    )
    assert "queue limit in vhost 'compat-gaps' (1) is reached; closing the connection" in caplog.text


def test_mqtt_5_gets_quota_exceeded(broker: BrokerThread) -> None:
    answers = _run(broker, v5=True)
    assert answers[REFUSED] == {"suback": [0x97, 0x97], "closed": True}
    assert answers["the persistent session after"] == {
        "connected": True,
        "messages": ["t/kept", "t/kept2"],
    }
    assert answers["persistent session reconnects"] == {"connack": [0, True]}
    for step in (
        "persistent session subscribes",
        "persistent session subscribes again",
        "a clean session within the limit",
        "another clean session after the first one's queue went",
    ):
        assert answers[step] == {"suback": [1], "closed": False}, step
