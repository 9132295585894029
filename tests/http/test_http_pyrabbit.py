"""pyrabbit2, a maintained third-party client of RabbitMQ's management API, against Warren."""

from __future__ import annotations

import pytest
from conftest import BrokerThread
from pikahelp import uniq

pyrabbit2 = pytest.importorskip("pyrabbit2.api", reason="pyrabbit2 (test extra) not installed")

pytestmark = pytest.mark.timeout(60)


def test_pyrabbit_manages_a_vhost_end_to_end(broker: BrokerThread) -> None:
    client = pyrabbit2.Client(f"127.0.0.1:{broker.http_port}", "guest", "guest")
    assert client.is_alive()
    assert client.get_overview()["product_name"] == "Warren"
    vhost = uniq("vh")
    client.create_vhost(vhost)
    client.set_vhost_permissions(vhost, "guest", ".*", ".*", ".*")
    assert vhost in client.get_vhost_names()
    client.create_exchange(vhost, "orders", "direct")
    client.create_queue(vhost, "billing", durable=True)
    client.create_binding(vhost, "orders", "billing", "invoice")
    assert ("orders", "billing", "invoice") in [
        (b["source"], b["destination"], b["routing_key"]) for b in client.get_bindings()
    ]
    assert client.publish(vhost, "orders", "invoice", "hello") is True
    assert client.publish(vhost, "orders", "nowhere", "lost") is False
    assert client.get_queue_depth(vhost, "billing") == 1
    [message] = client.get_messages(vhost, "billing", count=1, requeue=False)
    assert message["payload"] == "hello" and message["routing_key"] == "invoice"
    assert client.get_queue_depth(vhost, "billing") == 0
    assert "guest" in [u["name"] for u in client.get_users()]
    client.delete_queue(vhost, "billing")
    client.delete_exchange(vhost, "orders")
    client.delete_vhost(vhost)
    assert vhost not in client.get_vhost_names()
