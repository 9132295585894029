"""MQTT 5 enhanced authentication with OAuth 2 tokens (mqtt/connect.py): the
OAUTH2-JWT Authentication Method at CONNECT, and re-authentication with an AUTH
packet (reason 0x19) carrying a new token, whose expiry then rules. In memory:
paho 2 logs in (it cannot send AUTH); the AUTH packets are written with paho's
property codec, the broker's answers read by harness.mqtt_decode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness, RawMQTT
from oauth2help import FULL, TOPICS, SigningKey
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from warren.core.clock import ManualClock
from warren.mqtt import properties as P
from warren.mqtt.packets import Auth, ConnAck, Disconnect, PubAck, Publish

KEY = SigningKey("key-1")
METHOD = "OAUTH2-JWT"
SCOPES = [*FULL, *TOPICS]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
    ) as harness:
        yield harness


def now_s(h: Harness) -> int:
    return h.broker.clock.now_ms() // 1000


def auth_packet(reason: int, method: str | None, data: bytes | None) -> bytes:
    """An AUTH packet by the spec (section 3.15), its properties packed by paho."""
    props = Properties(PacketTypes.AUTH)
    if method is not None:
        props.AuthenticationMethod = method
    if data is not None:
        props.AuthenticationData = data
    body = bytes([reason]) + props.pack()
    length, size = b"", len(body)
    while True:
        byte, size = size % 128, size // 128
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return b"\xf0" + length + body


def token_connect(h: Harness, token: str, client_id: str = "c") -> tuple[RawMQTT, ConnAck]:
    client = h.mqtt_raw()
    props = {P.AUTHENTICATION_METHOD: METHOD, P.AUTHENTICATION_DATA: token.encode()}
    return client, client.connect(client_id, keep_alive=0, properties=props)


def test_paho_logs_in_with_the_token_as_authentication_data(broker: Harness) -> None:
    client = broker.mqtt("paho", protocol=5)
    props = Properties(PacketTypes.CONNECT)
    props.AuthenticationMethod = METHOD
    props.AuthenticationData = KEY.token(now_s(broker), SCOPES).encode()
    got: list[object] = []
    client.paho.on_connect = lambda _c, _u, _f, rc, p: got.append((rc, p))
    client.paho.connect("127.0.0.1", 1883, properties=props)
    client.until(lambda: bool(got))
    rc, connack = got[0]
    assert rc == 0 and connack.AuthenticationMethod == METHOD  # type: ignore[attr-defined]
    assert [c.user.name for c in broker.broker.connections if c.user] == ["alice"]


def test_reauthentication_replaces_the_token_and_its_expiry(broker: Harness) -> None:
    t = now_s(broker)
    client, connack = token_connect(broker, KEY.token(t, ["read:*/*", "read:*/*/*"], lifetime=60))
    assert connack.reason_code == 0
    assert connack.properties[P.AUTHENTICATION_METHOD] == METHOD
    # The first token may not publish; QoS 1 tells (0x87 Not authorized).
    client.send(Publish("t/1", b"x", qos=1, packet_id=1))
    assert client.expect(PubAck).reason_code == P.NOT_AUTHORIZED
    new = KEY.token(t, SCOPES, lifetime=600)
    client.send_raw(auth_packet(P.RE_AUTHENTICATE, METHOD, new.encode()))
    answer = client.expect(Auth)
    assert (answer.reason_code, answer.properties) == (0, {P.AUTHENTICATION_METHOD: METHOD})
    client.send(Publish("t/1", b"x", qos=1, packet_id=2))
    assert client.expect(PubAck).reason_code in (0, P.NO_MATCHING_SUBSCRIBERS)
    broker.advance(120_000)  # past the first token's expiry: still connected
    client.nothing_more()
    broker.advance(480_000)
    gone = client.expect(Disconnect)
    assert gone.reason_code == P.MAXIMUM_CONNECT_TIME


@pytest.mark.parametrize(
    ("packet", "code"),
    [
        # Another user's token: refused, Not authorized.
        (lambda t: auth_packet(0x19, METHOD, KEY.token(t, SCOPES, sub="mallory").encode()), 0x87),
        (lambda t: auth_packet(0x19, METHOD, KEY.token(t - 7200, SCOPES).encode()), 0x87),
        (lambda t: auth_packet(0x19, METHOD, b"not a token"), 0x87),
        # Another method, none, or Continue authentication (no multi-step method here).
        (lambda t: auth_packet(0x19, "SCRAM-SHA-256", b"x"), P.PROTOCOL_ERROR),
        (lambda t: auth_packet(0x19, None, KEY.token(t, SCOPES).encode()), P.PROTOCOL_ERROR),
        (lambda t: auth_packet(0x18, METHOD, KEY.token(t, SCOPES).encode()), P.PROTOCOL_ERROR),
    ],
)
def test_refused_reauthentication_disconnects(broker: Harness, packet: object, code: int) -> None:
    t = now_s(broker)
    client, connack = token_connect(broker, KEY.token(t, SCOPES))
    assert connack.reason_code == 0
    client.send_raw(packet(t))  # type: ignore[operator]
    assert client.expect(Disconnect).reason_code == code
    client.wait_closed()


def test_auth_after_a_password_login_is_a_protocol_error(broker: Harness) -> None:
    client = broker.mqtt_raw()
    token = KEY.token(now_s(broker), SCOPES)
    assert client.connect("c", username="", password=token.encode()).reason_code == 0
    client.send_raw(auth_packet(0x19, METHOD, token.encode()))
    assert client.expect(Disconnect).reason_code == P.PROTOCOL_ERROR


def test_connect_methods_and_tokens_refused(broker: Harness, tmp_path: Path) -> None:
    t = now_s(broker)
    client = broker.mqtt_raw()
    other = {P.AUTHENTICATION_METHOD: "SCRAM-SHA-256", P.AUTHENTICATION_DATA: b"x"}
    assert client.connect("c", properties=other).reason_code == P.BAD_AUTHENTICATION_METHOD
    _, connack = token_connect(broker, KEY.token(t - 7200, SCOPES))
    assert connack.reason_code == P.BAD_USER_NAME_OR_PASSWORD
    # No data: the password is the token.
    client = broker.mqtt_raw()
    props = {P.AUTHENTICATION_METHOD: METHOD}
    token = KEY.token(t, SCOPES).encode()
    assert client.connect("d", properties=props, password=token).reason_code == 0
    # Without [oauth2], the method is unknown.
    with Harness(tmp_path / "plain", clock=ManualClock()) as plain:
        _, connack = token_connect(plain, KEY.token(t, SCOPES))
        assert connack.reason_code == P.BAD_AUTHENTICATION_METHOD
