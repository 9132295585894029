"""How the Spark data source reaches the broker (warren.spark.endpoint.Endpoint and
warren.spark.connection.connect): a list of URLs tried in turn, retries with
backoff while no broker answers, refusals that fail at once, credentials and
tokens from options. No SparkSession needed: these run on the driver and in
every task the same way."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import BrokerThread, start_broker

from warren.spark.connection import connect
from warren.spark.endpoint import Endpoint
from warren.spark.options import OptionError, SourceOptions


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def broker(tmp_path: Path) -> BrokerThread:
    b = start_broker(tmp_path / "data", sync=False)
    yield b  # type: ignore[misc]
    b.stop()


def test_the_next_url_is_tried_when_one_does_not_answer(broker: BrokerThread) -> None:
    dead = f"amqp://127.0.0.1:{_closed_port()}/"
    live = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    endpoint = Endpoint.parse({"url": f"{dead}, {live}", "maxRetries": "0"})
    assert endpoint.urls == (dead, live)
    with connect(endpoint, 5.0) as client:
        assert "warren_version" in client.server_properties


def test_no_broker_answering_is_retried_with_backoff(tmp_path: Path) -> None:
    port = _closed_port()
    endpoint = Endpoint.parse(
        {
            "url": f"amqp://127.0.0.1:{port}/",
            "maxRetries": "5",
            "retryBackoffMs": "100",
            "retryMaxBackoffMs": "300",
        }
    )
    waits: list[float] = []
    started: list[BrokerThread] = []

    def sleep(seconds: float) -> None:
        # The broker comes up during the third wait: the fourth attempt connects.
        waits.append(seconds)
        if len(waits) == 3:
            started.append(start_broker(tmp_path / "data", sync=False, amqp_port=port))

    try:
        with connect(endpoint, 5.0, sleep=sleep) as client:
            assert "warren_version" in client.server_properties
        assert waits == [0.1, 0.2, 0.3]
    finally:
        for b in started:
            b.stop()


def test_giving_up_names_every_url_and_the_retries() -> None:
    ports = (_closed_port(), _closed_port())
    endpoint = Endpoint.parse(
        {"url": ",".join(f"amqp://u:secret@127.0.0.1:{p}/" for p in ports), "maxRetries": "2"}
    )
    waits: list[float] = []
    with pytest.raises(OptionError) as info:
        connect(endpoint, 5.0, sleep=waits.append)
    text = str(info.value)
    assert waits == [0.5, 1.0]
    assert "option 'url': cannot connect to any of" in text and "after 2 retries" in text
    assert all(f":{p}" in text for p in ports) and "secret" not in text


def test_a_refused_login_is_not_retried(broker: BrokerThread) -> None:
    endpoint = Endpoint.parse(
        {"url": f"amqp://guest:wrong@127.0.0.1:{broker.port}/", "maxRetries": "3"}
    )
    waits: list[float] = []
    with pytest.raises(OptionError, match="ACCESS_REFUSED") as info:
        connect(endpoint, 5.0, sleep=waits.append)
    assert waits == [] and "wrong" not in str(info.value)


def test_a_missing_vhost_is_not_retried(broker: BrokerThread) -> None:
    endpoint = Endpoint.parse({"url": f"amqp://127.0.0.1:{broker.port}/nowhere"})
    waits: list[float] = []
    with pytest.raises(OptionError, match="NOT_ALLOWED"):
        connect(endpoint, 5.0, sleep=waits.append)
    assert waits == []


def test_credentials_from_options_override_the_url(broker: BrokerThread) -> None:
    def add_bob() -> None:
        broker.broker.users.add_user("bob", "s3cret")
        broker.broker.users.set_permissions("bob", "/")

    broker.call(add_bob)
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    endpoint = Endpoint.parse({"url": url, "username": "bob", "password": "s3cret"})
    with connect(endpoint, 5.0, name="by-options"):
        users = broker.call(lambda: [c.info()["user"] for c in broker.broker.connections])
        assert users == ["bob"]


def test_a_token_is_the_password_and_its_file_is_read_at_every_connection(
    broker: BrokerThread, tmp_path: Path
) -> None:
    # OAuth 2.0 as RabbitMQ takes it: the access token as the password. Warren
    # checks it as a password until it validates tokens itself (issue 33).
    def add_svc(password: str) -> None:
        broker.broker.users.add_user("svc", password)
        broker.broker.users.set_permissions("svc", "/")

    broker.call(lambda: add_svc("token-1"))
    token_file = tmp_path / "token"
    token_file.write_text("token-1\n")
    options = {"url": f"amqp://127.0.0.1:{broker.port}/", "username": "svc"}
    with connect(Endpoint.parse(dict(options, token="token-1")), 5.0):
        pass
    endpoint = Endpoint.parse(dict(options, tokenFile=str(token_file), maxRetries="0"))
    with connect(endpoint, 5.0):
        pass
    broker.call(lambda: add_svc("token-2"))  # the token rotated
    with pytest.raises(OptionError, match="ACCESS_REFUSED"):
        connect(endpoint, 5.0)
    token_file.write_text("token-2\n")
    with connect(endpoint, 5.0):
        pass


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"url": "amqp://h/,"}, "url", "an empty URL"),
        ({"url": "amqp://h/", "tls.caFile": "/x.pem"}, "url", "need an amqps:// URL"),
        ({"url": "amqps://h/", "tls.caFile": "/nonexistent.pem"}, "url", "no such file"),
        ({"url": "amqps://h/", "authMechanism": "EXTERNAL"}, "authMechanism", "client certificate"),
        ({"url": "amqp://h/", "authMechanism": "GSSAPI"}, "authMechanism", "PLAIN or EXTERNAL"),
        ({"url": "amqp://h/", "token": "t", "password": "p"}, "token", "not both"),
        ({"url": "amqp://h/", "token": "t", "tokenFile": "/t"}, "tokenFile", "not both"),
        ({"url": "amqp://h/", "maxRetries": "-1"}, "maxRetries", "integer >= 0"),
        ({"url": "amqp://h/", "tls.verify": "maybe"}, "tls.verify", "true or false"),
    ],
)
def test_bad_endpoint_options_name_the_option(
    options: dict[str, str], option: str, message: str
) -> None:
    with pytest.raises(OptionError, match=message) as info:
        Endpoint.parse(options)
    assert info.value.option == option


def test_kafka_retry_names_are_aliases() -> None:
    e = Endpoint.parse(
        {"url": "amqp://h/", "fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "10"}
    )
    assert (e.max_retries, e.retry_backoff_ms) == (3, 10)
    o = SourceOptions.parse({"url": "amqp://a/,amqp://b/", "queue": "s"}, streaming=False)
    assert o.endpoint.urls == ("amqp://a/", "amqp://b/") and o.url == "amqp://a/"
