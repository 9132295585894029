"""One RabbitMQ version, [main] rabbitmq_version, announced over AMQP and the management API.

Clients and tools that check the version (kombu's qos semantics, rabbitmqadmin,
dashboards) must see the same release whichever way they ask.
"""

from __future__ import annotations

from pathlib import Path

import pika
import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api

from warren import Config
from warren.cli import build_config
from warren.config import ConfigError


def _announced(b: BrokerThread) -> dict[str, str]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    try:
        amqp = conn._impl.server_properties["version"]
    finally:
        conn.close()
    http = b.broker.listener("http")
    assert http is not None
    api = Api(http.port)
    overview = api.get("/api/overview")
    (node,) = api.get("/api/nodes")
    rabbit = [a["version"] for a in node["applications"] if a["name"] == "rabbit"]
    return {
        "amqp": amqp.decode() if isinstance(amqp, bytes) else amqp,
        "rabbitmq_version": overview["rabbitmq_version"],
        "management_version": overview["management_version"],
        "nodes rabbit application": rabbit[0] if rabbit else "",
    }


@pytest.mark.parametrize("setting", [None, "3.13.7"])
def test_amqp_and_the_api_announce_one_version(tmp_path: Path, setting: str | None) -> None:
    extra = {} if setting is None else {"rabbitmq_version": setting}
    b = start_broker(tmp_path / "data", **extra)
    try:
        announced = _announced(b)
    finally:
        b.stop()
    expected = setting or Config().rabbitmq_version
    assert announced == dict.fromkeys(announced, expected)


def test_default_is_the_recorded_management_release() -> None:
    # tests/http's recorded answers are RabbitMQ 3.10.8's (test_mgmt_persistent.py).
    assert Config().rabbitmq_version == "3.10.8"


def test_setting_from_the_ini_file_and_the_flag(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text("[main]\nrabbitmq_version = 3.12.0\n")
    assert build_config(["-c", str(ini)]).rabbitmq_version == "3.12.0"
    assert build_config(["-c", str(ini), "--rabbitmq-version", "4.0.5"]).rabbitmq_version == "4.0.5"
    with pytest.raises(ConfigError, match="version number"):
        build_config(["--rabbitmq-version", "latest"])
