"""The AMQP 1.0 connection in memory, Qpid Proton's engine as the client and the oracle.

Proton's engine checks every frame the broker writes as a real client does;
the test reads proton's endpoint state (remote open, conditions, credit,
deliveries and their remote states) for what the broker meant.
"""

from __future__ import annotations

import struct

import proton
import pytest
from harness import harness_fixture
from harness.amqp1 import MemoryAMQP1, ProtonClient

from warren import __version__
from warren.amqp1.connection import amqp1_version
from warren.amqp1.frames import AMQP_HEADER, HEARTBEAT, SASL_HEADER

pytest.importorskip("proton")

broker = harness_fixture(manual_clock=True)


def client(harness, **options) -> ProtonClient:
    return ProtonClient(harness, **options).open()


def test_sasl_plain_and_open(broker) -> None:
    c = client(broker)
    assert c.connection.state & proton.Endpoint.REMOTE_ACTIVE
    assert c.transport.sasl().outcome == proton.SASL.OK
    props = c.connection.remote_properties
    # Warren by default; RabbitMQ only when [amqp1] announce_rabbitmq asks.
    assert props[proton.symbol("product")] == "Warren"
    assert props[proton.symbol("version")] == __version__
    offered = c.connection.remote_offered_capabilities
    assert proton.symbol("ANONYMOUS-RELAY") in list(offered)
    assert c.conn.vhost is not None and c.conn.vhost.name == "/"
    assert c.conn.info()["protocol"] == "AMQP 1-0"
    c.close()
    assert c.broker.lost


def test_bad_password_is_refused(broker) -> None:
    c = client(broker, password="wrong")
    assert c.transport.sasl().outcome == proton.SASL.AUTH
    assert c.broker.lost


def test_anonymous_logs_in_as_the_default_user(broker) -> None:
    c = client(broker, mechs="ANONYMOUS", user=None, password=None)
    assert c.transport.sasl().outcome == proton.SASL.OK
    assert c.conn.user is not None and c.conn.user.name == "guest"


def test_unknown_vhost_closes_with_unauthorized_access(broker) -> None:
    c = client(broker, hostname="vhost:nope")
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:unauthorized-access"
    assert "nope" in cond.description


def test_amqp_header_without_sasl_gets_the_sasl_header_and_the_close(broker) -> None:
    m = MemoryAMQP1(broker)
    assert m.exchange(AMQP_HEADER) == SASL_HEADER
    assert m.lost


def test_garbage_closes_only_that_connection(broker) -> None:
    good = client(broker)
    bad = MemoryAMQP1(broker)
    out = bad.exchange(SASL_HEADER)
    assert out.startswith(SASL_HEADER)
    bad.exchange(b"\x00\x00\x00\x10garbage!garbage!")
    assert bad.lost
    assert not good.broker.lost
    session = good.session()
    assert session.state & proton.Endpoint.REMOTE_ACTIVE


def declare(harness, name: str, **kw) -> None:
    harness.call(lambda: harness.broker.vhosts["/"].declare_queue(name, **kw))


def test_publish_and_consume_a_queue(broker) -> None:
    declare(broker, "q", durable=False)
    c = client(broker)
    sender = c.sender("/queues/q")
    assert sender.credit == 170
    d = c.send(sender, proton.Message(body="hello", properties={"k": 1}))
    assert d.remote_state == proton.Delivery.ACCEPTED and d.settled
    receiver = c.receiver("/queues/q", credit=10)
    got = c.receive(receiver)
    assert [m.body for _, m in got] == ["hello"]
    assert got[0][1].properties == {"k": 1}
    c.settle(got[0][0])
    assert broker.broker.vhosts["/"].queues["q"].message_count == 0


def test_unknown_queue_detaches_with_not_found(broker) -> None:
    c = client(broker)
    receiver = c.receiver("/queues/missing", credit=1)
    cond = receiver.remote_condition
    assert cond is not None and cond.name == "amqp:not-found"
    sender = c.sender("/queues/missing")
    assert sender.remote_condition.name == "amqp:not-found"


def test_unroutable_is_released(broker) -> None:
    c = client(broker)
    sender = c.sender("/exchanges/amq.direct/nowhere")
    d = c.send(sender, proton.Message(body="x"))
    assert d.remote_state == proton.Delivery.RELEASED


def test_sessions_and_channel_max(broker) -> None:
    c = client(broker)
    assert c.transport.remote_channel_max == 63  # RabbitMQ 4's 64 sessions
    sessions = [c.session() for _ in range(3)]
    assert all(s.state & proton.Endpoint.REMOTE_ACTIVE for s in sessions)
    assert len(c.conn.sessions) == 3
    sessions[1].close()
    c.pump()
    assert len(c.conn.sessions) == 2
    assert len(c.conn.channels_info()) == 2


def test_a_frame_past_max_frame_size_closes_with_a_framing_error(broker) -> None:
    c = client(broker)
    c.broker.feed(struct.pack(">IBBH", c.conn.max_frame + 1, 2, 0, 0))
    c.pump()
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:connection:framing-error"
    # The frames after the bad one cannot be read, the client's close neither:
    # the socket closes after the closing timeout (as RabbitMQ 4's).
    broker.advance(30_000)
    c.pump()
    assert c.broker.lost


def test_idle_timeout_heartbeats_and_the_silent_client(broker) -> None:
    c = client(broker, idle_timeout=10.0)
    conn = c.conn
    assert conn.peer_idle_timeout > 0
    # This side's timeout is announced halved (2.4.5).
    assert c.transport.remote_idle_timeout * 1000 == conn.idle_timeout // 2
    start = conn.last_tx_ms
    half = conn.peer_idle_timeout // 2
    due = broker.call(lambda: conn.tick(start + half))
    assert c.broker.take() == HEARTBEAT
    assert 0 < due <= half
    silent = conn.last_rx_ms + conn.idle_timeout
    assert broker.call(lambda: conn.tick(silent)) == 0
    c.pump()
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:resource-limit-exceeded"


def test_a_short_idle_timeout_is_refused(broker) -> None:
    c = client(broker, idle_timeout=0.5)
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:not-allowed"


def test_external_with_a_client_certificate(broker) -> None:
    c = client(broker, mechs="EXTERNAL", user=None, password=None, cert_login="guest")
    assert c.transport.sasl().outcome == proton.SASL.OK
    assert c.conn.user is not None and c.conn.user.name == "guest"
    assert c.conn.auth_mechanism == "EXTERNAL"


def test_external_is_not_offered_without_a_certificate(broker) -> None:
    m = MemoryAMQP1(broker)
    out = m.exchange(SASL_HEADER)
    assert b"EXTERNAL" not in out and b"PLAIN" in out


def test_anonymous_can_be_turned_off(broker) -> None:
    broker.config.amqp1_allow_anonymous = False
    c = client(broker, mechs="ANONYMOUS", user=None, password=None)
    assert c.transport.sasl().outcome != proton.SASL.OK
    assert b"ANONYMOUS" not in c.received and c.conn.user is None


def test_guest_only_from_loopback(broker) -> None:
    c = client(broker, peer=("10.0.0.7", 40000))
    assert c.transport.sasl().outcome == proton.SASL.AUTH


def test_vhost_connection_limit(broker) -> None:
    vhost = broker.broker.vhosts["/"]
    broker.call(lambda: vhost.limiter.set_limits({"max-connections": 0}))
    c = client(broker)
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:resource-limit-exceeded"


def test_listed_by_the_management_api(broker) -> None:
    declare(broker, "q")
    c = client(broker, container="listed-container")
    c.receiver("/queues/q", credit=3)
    http = broker.http()
    (conn,) = [x for x in http.get("/api/connections") if x["protocol"] == "AMQP 1-0"]
    assert conn["user"] == "guest" and conn["vhost"] == "/"
    assert conn["client_properties"]["container_id"] == "listed-container"
    (channel,) = http.get("/api/channels")
    assert channel["consumer_count"] == 1
    (consumer,) = http.get("/api/consumers")
    assert consumer["queue"]["name"] == "q"
    c.close()
    assert [x for x in http.get("/api/connections") if x["protocol"] == "AMQP 1-0"] == []


def test_an_error_close_waits_for_the_clients_close(broker) -> None:
    """As RabbitMQ 4 (rabbit_amqp_reader:close/2): after its close the broker
    keeps reading until the client's close, so frames the client sent before
    seeing it never reset the socket under the close (a client then loses
    the error: rhea did); a client that never answers is cut off after 30 s."""
    c = client(broker, hostname="vhost:nope")
    cond = c.remote_condition
    assert cond is not None and cond.name == "amqp:unauthorized-access"
    assert not c.broker.lost
    c.session()  # frames after the close: read and ignored
    c.pump()
    assert not c.broker.lost
    c.close()
    assert c.broker.lost

    silent = client(broker, hostname="vhost:nope")
    assert silent.remote_condition is not None
    broker.advance(29_999)
    silent.pump()
    assert not silent.broker.lost
    broker.advance(1)
    silent.pump()
    assert silent.broker.lost


def test_rabbitmq_announced_when_asked(broker) -> None:
    broker.config.amqp1_announce_rabbitmq = True
    props = client(broker).connection.remote_properties
    assert props[proton.symbol("product")] == "RabbitMQ"
    # RabbitMQ's own 1.0 clients need 4.0 or later (4.1 for stream filters);
    # 0-9-1's stay told 3.x.
    assert props[proton.symbol("version")] == "4.1.0"
    assert props[proton.symbol("platform")].startswith(f"Warren {__version__} ")
    broker.config.rabbitmq_version = "4.1.2"
    props = client(broker).connection.remote_properties
    assert props[proton.symbol("version")] == "4.1.2"


def test_the_version_amqp1_clients_are_told() -> None:
    assert amqp1_version("3.10.8") == "4.1.0"
    assert amqp1_version("4.0.9") == "4.1.0"
    assert amqp1_version("4.1.2") == "4.1.2"
    assert amqp1_version("4.2") == "4.2"
    assert amqp1_version("nonsense") == "4.1.0"
