"""A token's topic scopes on topic exchanges declared after its login (issue 33):
RabbitMQ's rabbit_auth_backend_oauth2 matches ``write:<vhost>/<exchange>/<key>``
against the exchange's name at each check, whatever existed at the login. pika
(AMQP 0-9-1, connection.update-secret) and paho (MQTT, its exchange declared
after the client connected) over sockets; tokens signed by PyJWT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerThread, start_broker
from diskhelp import eventually
from mqttclient import V5, Client
from oauth2help import FULL, SigningKey

from warren.core.clock import ManualClock

pytestmark = [pytest.mark.timeout(120)]

KEY = SigningKey("rsa-1")
#: Routing keys ok.* on exchanges named late.*; binding keys ok.# there.
LATE = ["write:*/late.*/ok.*", "read:*/late.*/ok.#"]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
        mqtt_exchange="late.mqtt",  # not there when the MQTT client logs in
    )
    try:
        yield b
    finally:
        b.stop()


def token(b: BrokerThread, scopes: list[str]) -> str:
    return KEY.token(b.clock.now_ms() // 1000, [*FULL, *scopes])


def connect(b: BrokerThread, password: str, user: str = "ignored") -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", b.port, credentials=pika.PlainCredentials(user, password)
    )
    return pika.BlockingConnection(params)


def declare(b: BrokerThread, name: str, kind: str = "topic") -> None:
    """Declared by another user, after the token's login."""
    guest = connect(b, "guest", "guest")
    guest.channel().exchange_declare(name, kind)
    guest.close()


def refused(conn: pika.BlockingConnection, exchange: str, key: str) -> str:
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(exchange, key, b"x")
    assert info.value.reply_code == 403
    return str(info.value.reply_text)


def test_pika_publish_to_a_topic_exchange_declared_after_the_login(
    broker: BrokerThread,
) -> None:
    conn = connect(broker, token(broker, LATE))
    declare(broker, "late.t")
    declare(broker, "other.t")
    declare(broker, "late.d", "direct")
    ch = conn.channel()
    ch.confirm_delivery()  # a refused publish closes the channel
    ch.basic_publish("late.t", "ok.1", b"x")
    ch.basic_publish("late.d", "any", b"x")  # not a topic exchange: no topic check
    assert refused(conn, "late.t", "no.1") == (
        "ACCESS_REFUSED - access to topic 'no.1' in exchange 'late.t' in vhost '/' "
        "refused for user 'alice'"
    )
    # An exchange no three-part scope names allows no routing key.
    assert "access to topic 'ok.1' in exchange 'other.t'" in refused(conn, "other.t", "ok.1")
    # Binding keys: the read scopes, on the same exchange.
    ch = conn.channel()
    ch.queue_declare("late-q")
    ch.queue_bind("late-q", "late.t", "ok.#")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind("late-q", "late.t", "no.#")
    assert info.value.reply_code == 403
    conn.close()


def test_pika_update_secret_changes_the_topic_scopes(broker: BrokerThread) -> None:
    conn = connect(broker, token(broker, LATE))
    declare(broker, "late.r")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("late.r", "ok.1", b"x")  # worked out, kept for the connection
    conn.update_secret(token(broker, ["write:*/late.*/new.*"]), "refresh")
    declare(broker, "late.s")
    for exchange in ("late.r", "late.s"):  # both by the new token's scopes
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, "new.1", b"x")
        assert f"access to topic 'ok.1' in exchange '{exchange}'" in refused(conn, exchange, "ok.1")
    conn.close()


def test_paho_topic_checks_on_an_mqtt_exchange_declared_after_the_login(
    broker: BrokerThread,
) -> None:
    scopes = ["write:*/late.mqtt/ok.*", "read:*/late.mqtt/ok.*"]
    client = Client(broker.mqtt_port, "late", V5, username="", password=token(broker, scopes))
    assert not client.connect()[1].is_failure
    acks: dict[int, int] = {}
    client.paho.on_publish = lambda _c, _u, mid, rc, _p: acks.__setitem__(mid, rc.value)
    declare(broker, "late.mqtt")
    assert not client.subscribe("ok/#")[0].is_failure
    assert client.subscribe("no/#")[0].value == 0x87  # its binding key: Not authorized
    assert acks[client.publish("no/1", b"no", qos=1).mid] == 0x87
    assert acks[client.publish("ok/1", b"yes", qos=1).mid] == 0  # or 0x10: no subscribers
    assert client.next().payload == b"yes"
    client.close()


def test_paho_will_is_checked_against_the_topic_scopes(broker: BrokerThread) -> None:
    """RabbitMQ checks a will's topic when it sends it (check_publish_permitted)."""
    declare(broker, "late.mqtt")
    watcher = Client(broker.mqtt_port, "watch", V5, username="guest", password="guest")
    watcher.connect()
    watcher.subscribe("#")
    password = token(broker, ["write:*/late.mqtt/ok.*"])
    for topic in ("no/will", "ok/will"):
        client = Client(broker.mqtt_port, topic[:2], V5, username="", password=password)
        client.paho.will_set(topic, b"will")
        assert not client.connect()[1].is_failure
        client.drop()  # no DISCONNECT: the will is sent
        # Its will sent (or refused) before the next client's.
        eventually(lambda: broker.call(lambda: len(broker.broker.connections)) == 1)
    message = watcher.next()
    assert (message.topic, message.payload) == ("ok/will", b"will")
    assert watcher.nothing_more()
    watcher.close()
