"""Deleting a vhost deletes its MQTT sessions and retained messages: a new vhost of
the same name starts without them, also after a restart (issue 25: deleted data
must not come back)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import BrokerThread
from mqttclient import Client


def make_vhost(b: BrokerThread, name: str) -> None:
    def make() -> None:
        b.broker.add_vhost(name)
        b.broker.users.set_permissions("guest", name)
        b.broker.save_users()

    b.call(make)


def test_a_deleted_vhosts_sessions_and_retained_messages_stay_deleted(
    broker_factory: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    b = broker_factory()
    make_vhost(b, "v2")
    c = Client(b.mqtt_port, "keeper", clean=False, username="v2:guest", password="guest")
    c.connect()
    c.subscribe("t/#", qos=1)
    c.publish("t/r", b"retained", qos=1, retain=True)
    assert c.next().payload == b"retained"
    c.close()
    assert (tmp_path / "data" / "mqtt").is_dir()

    b.call(lambda: b.broker.delete_vhost("v2"))
    make_vhost(b, "v2")
    fresh = Client(b.mqtt_port, "keeper", clean=False, username="v2:guest", password="guest")
    flags, _rc, _props = fresh.connect()
    assert not flags.session_present  # the old session went with the vhost
    fresh.subscribe("t/#", qos=1)
    assert fresh.nothing_more()  # and so did the retained message
    fresh.close()
    b.stop()

    b = broker_factory()  # the same data dir: nothing comes back either
    again = Client(b.mqtt_port, "other", clean=True, username="v2:guest", password="guest")
    again.connect()
    again.subscribe("t/#", qos=1)
    assert again.nothing_more()
    again.close()
