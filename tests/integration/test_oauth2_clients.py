"""OAuth 2 access tokens as the password of real clients over sockets: pika
and aio-pika (AMQP 0-9-1, update-secret, expiry), paho (MQTT), qpid-proton
(AMQP 1.0), rstream (the stream protocol) and the management API's Bearer.
Keys are made here and given as PEM files; the broker's clock is a ManualClock
so expiry needs no waiting."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from diskhelp import eventually
from mqttclient import V5, V311, Client
from oauth2help import FULL, TOPICS, SigningKey

from warren.core.clock import ManualClock

pytestmark = [pytest.mark.timeout(120)]

KEY = SigningKey("rsa-1")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
        amqp1_announce_rabbitmq=True,  # for RabbitMQ's own AMQP 1.0 client
    )
    try:
        yield b
    finally:
        b.stop()


def token(b: BrokerThread, scopes: list[str] = FULL, lifetime: int = 3600, **claims: Any) -> str:
    return KEY.token(b.clock.now_ms() // 1000, scopes, lifetime=lifetime, **claims)


def pika_params(b: BrokerThread, password: str, user: str = "ignored") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", b.port, credentials=pika.PlainCredentials(user, password)
    )


def test_pika_token_login_permissions_and_expiry(broker: BrokerThread) -> None:
    conn = pika.BlockingConnection(
        pika_params(broker, token(broker, ["configure:*/tok-*", "write:*/*", "read:*/*"], 60))
    )
    ch = conn.channel()
    ch.queue_declare("tok-q")
    ch.basic_publish("", "tok-q", b"hi")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().queue_declare("other")
    assert refused.value.reply_code == 403
    broker.advance(61_000)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(100):
            conn.process_data_events(0.1)
    assert (closed.value.reply_code, closed.value.reply_text) == (
        320,
        "CONNECTION_FORCED - credential expired",
    )


def test_pika_refuses_bad_tokens(broker: BrokerThread) -> None:
    for bad in (token(broker, lifetime=-10), token(broker, aud="other")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika_params(broker, bad))


def test_aio_pika_update_secret(broker: BrokerThread) -> None:
    import aio_pika

    async def run() -> None:
        conn = await aio_pika.connect(
            host="127.0.0.1",
            port=broker.port,
            login="x",
            password=token(broker, ["read:*/*"], 60),
        )
        try:
            await conn.update_secret(token(broker, FULL, 600), reason="refresh")
            ch = await conn.channel()
            await ch.declare_queue("after-refresh")  # the new token's configure scope
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.mark.parametrize("protocol", [V311, V5])
def test_paho_token_as_mqtt_password(broker: BrokerThread, protocol: int) -> None:
    scopes = [*FULL, *TOPICS]  # MQTT publishes to and binds on a topic exchange
    client = Client(broker.mqtt_port, "tok", protocol, username="", password=token(broker, scopes))
    assert not client.connect()[1].is_failure
    client.subscribe("t/1")
    client.publish("t/1", b"x")
    assert client.next().payload == b"x"
    client.close()
    expired = token(broker, lifetime=-5)
    refused = Client(broker.mqtt_port, "bad", protocol, username="", password=expired)
    rc = refused.connect()[1]
    # 3.1.1: 4 bad user name or password; 5: 0x86 Bad User Name or Password.
    assert rc.is_failure and rc.value in (4, 0x86), rc
    refused.close()


def test_proton_token_as_amqp1_password(broker: BrokerThread) -> None:
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    conn = BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user="ignored",
        password=token(broker),
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )
    guest = pika.BlockingConnection(pika_params(broker, "guest", "guest"))
    guest.channel().queue_declare("to-proton")
    guest.close()
    conn.create_sender("/queues/to-proton").send(proton.Message(body=b"by token"))
    receiver = conn.create_receiver("/queues/to-proton")
    assert receiver.receive(timeout=10).body == b"by token"
    receiver.accept()
    conn.close()
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(
            f"amqp://127.0.0.1:{broker.port}",
            user="ignored",
            password=token(broker, aud="other"),
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
            timeout=10,
        )


def test_rstream_token_as_stream_password(broker: BrokerThread) -> None:
    from rstream import Producer, exceptions

    port = broker.broker.listener("stream").port

    async def run() -> None:
        async with Producer("127.0.0.1", port, username="", password=token(broker)) as p:
            await p.create_stream("tok-stream")
            assert await p.stream_exists("tok-stream")
            await p.delete_stream("tok-stream")
        with pytest.raises(exceptions.AuthenticationFailure):
            await Producer(
                "127.0.0.1", port, username="", password=token(broker, lifetime=-5)
            ).start()

    asyncio.run(run())


def test_management_api_bearer(broker: BrokerThread) -> None:
    url = f"http://127.0.0.1:{broker.broker.listener('http').port}/api/whoami"

    def get(tok: str) -> tuple[int, Any]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {tok}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None

    status, body = get(token(broker, ["tag:administrator"], sub="ops"))
    assert (status, body) == (200, {"name": "ops", "tags": ["administrator"]})
    assert get(token(broker, ["tag:administrator"], lifetime=-1))[0] == 401


def test_mqtt5_disconnected_with_maximum_connect_time_when_the_token_expires(
    broker: BrokerThread,
) -> None:
    client = Client(broker.mqtt_port, "exp", V5, username="", password=token(broker, FULL, 30))
    assert not client.connect()[1].is_failure
    broker.advance(30_000)
    assert client.disconnected.wait(10)
    assert client.disconnect_reason.value == 0xA0  # Maximum connect time, as RabbitMQ
    client.close()


def test_amqp1_closed_unauthorized_when_the_token_expires(broker: BrokerThread) -> None:
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    conn = BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user="ignored",
        password=token(broker, FULL, 30),
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )
    broker.advance(30_000)
    with pytest.raises(proton.ConnectionException, match="credential expired"):
        conn.create_receiver("/queues/never")
        conn.wait(lambda: False, timeout=5)


def test_rabbitmq_amqp_client_refresh_token(broker: BrokerThread) -> None:
    """RabbitMQ's AMQP 1.0 client: OAuth2Options, then refresh_token (PUT
    /auth/tokens) before the first token expires."""
    client = pytest.importorskip("rabbitmq_amqp_python_client")

    env = client.Environment(
        f"amqp://127.0.0.1:{broker.port}/",
        oauth2_options=client.OAuth2Options(token=token(broker, FULL, 60)),
    )
    try:
        conn = env.connection()
        conn.dial()
        conn.refresh_token(token(broker, FULL, 600))
        broker.advance(120_000)  # past the first token's expiry
        management = conn.management()
        management.declare_queue(client.QuorumQueueSpecification(name="after-refresh"))
        management.close()
    finally:
        env.close()


def test_jwks_fetched_at_start_and_again_for_a_rotated_key(tmp_path: Path) -> None:
    """The broker's keys from a JWKS URL (a local aiohttp server on a thread of
    its own): pika logs in with a key from it; after the identity provider
    rotates its key, the first login with the new kid is refused and starts a
    fetch, the next one is let in."""
    import threading

    from oauth2help import jwks, serve_jwks

    old, new = SigningKey("jwks-old"), SigningKey("jwks-new", "ec")
    document = jwks(old)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, url, hits = asyncio.run_coroutine_threadsafe(serve_jwks(document), loop).result(10)
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_jwks_url=url,
        oauth2_jwks_min_refetch_interval=0,
    )
    try:
        now = b.clock.now_ms() // 1000
        assert hits[0] == 1
        pika.BlockingConnection(pika_params(b, old.token(now, FULL))).close()
        document["keys"] = [new.jwk()]
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika_params(b, new.token(now, FULL)))
        backend = b.broker.oauth2
        assert backend is not None
        # The fetch runs on the broker's loop, over a socket: wait for it.
        eventually(lambda: backend.fetches == 2, what="the JWKS fetched again")
        assert hits[0] == 2
        pika.BlockingConnection(pika_params(b, new.token(now, FULL))).close()
    finally:
        b.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
