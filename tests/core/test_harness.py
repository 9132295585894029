"""tests/harness: the broker driven in memory behaves as over a socket.

The same exchanges a socket test makes, through MemoryAMQP: the handshake,
a publish and a get decoded by pamqp, a refused login held back by the
failed-login guard, a channel error, a definitions change's reply held
until its sync, and a close the broker asks for."""

from __future__ import annotations

from pathlib import Path

from harness import Harness
from pamqp import commands
from rawamqp import publish_frames

from warren.core.clock import ManualClock


def test_a_connection_opens_publishes_and_gets(harness: Harness) -> None:
    amqp = harness.amqp()
    amqp.handshake()
    assert amqp.start is not None and amqp.start.version_major == 0
    amqp.open_channel(1)
    amqp.send_method(1, commands.Queue.Declare(queue="q", durable=True))
    assert amqp.expect_method(commands.Queue.DeclareOk).queue == "q"
    amqp.send(publish_frames(1, b"hello", "q"))
    amqp.send_method(1, commands.Basic.Get(queue="q", no_ack=True))
    got = amqp.expect_method(commands.Basic.GetOk)
    _header, body = amqp.expect_content()
    assert (got.routing_key, body) == ("q", b"hello")
    assert harness.call(lambda: harness.broker.vhosts["/"].queues["q"].message_count) == 0
    amqp.close()


def test_time_in_memory_is_the_brokers_manual_clock(tmp_path: Path) -> None:
    """A harness made with a ManualClock: a message TTL runs out when the test
    moves the clock, with nothing waited for."""
    with Harness(tmp_path / "data", clock=ManualClock()) as harness:
        amqp = harness.amqp()
        amqp.handshake()
        amqp.open_channel(1)
        args = {"x-message-ttl": 1000}
        amqp.send_method(1, commands.Queue.Declare(queue="ttl", arguments=args))
        amqp.expect_method(commands.Queue.DeclareOk)
        amqp.send(publish_frames(1, b"kept", "ttl"))
        harness.advance(999)
        amqp.send_method(1, commands.Basic.Get(queue="ttl", no_ack=True))
        amqp.expect_method(commands.Basic.GetOk)
        assert amqp.expect_content()[1] == b"kept"
        amqp.send(publish_frames(1, b"expired", "ttl"))
        harness.advance(1000)
        amqp.send_method(1, commands.Basic.Get(queue="ttl", no_ack=True))
        amqp.expect_method(commands.Basic.GetEmpty)
        amqp.close()


def test_a_refused_login_is_answered_and_closed(harness: Harness) -> None:
    amqp = harness.amqp()
    amqp.start_ok(password="wrong")
    code, text, _, _ = amqp.expect_close()
    assert code == 403 and text.startswith("ACCESS_REFUSED - Login was refused")
    assert amqp.wait_eof()


def test_a_channel_error_closes_the_channel_only(harness: Harness) -> None:
    amqp = harness.amqp()
    amqp.handshake()
    amqp.open_channel(1)
    amqp.send_method(1, commands.Queue.Declare(queue="missing", passive=True))
    code, text, _, _ = amqp.expect_channel_close(1)
    assert code == 404 and "no queue 'missing'" in text
    amqp.send_method(1, commands.Channel.CloseOk())
    amqp.open_channel(2)  # the connection goes on


def test_the_broker_closing_a_connection_ends_it(harness: Harness) -> None:
    amqp = harness.amqp()
    amqp.handshake()
    amqp.send(b"\x09\x00\x00\x00\x00\x00\x00\xce")  # frame type 9: unknown
    code, _text, _, _ = amqp.expect_close()
    assert code == 501
    assert amqp.wait_eof()
    assert harness.call(lambda: len(harness.broker.connections)) == 0


def test_mqtt_through_paho_in_memory(harness: Harness) -> None:
    """paho's own client, its packets fed straight to the broker's MQTTConnection."""
    sub = harness.mqtt("sub", protocol=5)
    assert sub.connect(clean_start=True) == 0
    granted: list[object] = []
    sub.paho.on_subscribe = lambda _c, _u, _mid, codes, _p: granted.extend(codes)
    sub.paho.subscribe("a/+", qos=1)
    sub.until(lambda: bool(granted))
    assert [c.value for c in granted] == [1]  # type: ignore[attr-defined]
    got: list[tuple[str, bytes, int]] = []
    sub.paho.on_message = lambda _c, _u, m: got.append((m.topic, m.payload, m.qos))

    pub = harness.mqtt("pub")
    assert pub.connect() == 0
    acked: list[int] = []
    pub.paho.on_publish = lambda _c, _u, mid, _rc, _p: acked.append(mid)
    info = pub.paho.publish("a/b", b"hello", qos=1)
    pub.until(lambda: info.mid in acked)
    sub.until(lambda: bool(got))
    assert got == [("a/b", b"hello", 1)]


def test_an_mqtt_login_refused_in_memory(harness: Harness) -> None:
    client = harness.mqtt("x")
    client.paho.username_pw_set("guest", "wrong")
    assert client.connect() == 134  # MQTT 3.1.1 CONNACK 4: bad user name or password
    assert client.eof  # and the broker closed the connection
