"""A token's topic permissions, worked out per exchange name when it is first
checked (core/oauth2.py's TopicScopes, User.topic_permission): an exchange
declared after the login is checked as RabbitMQ checks it. In memory; the
same over pika and paho in tests/integration/test_oauth2_topic_exchanges.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness, channel_error
from oauth2help import FULL, SigningKey

from warren.core.clock import ManualClock
from warren.core.oauth2 import Token, TopicScopes, token_user
from warren.core.users import MAX_RESOLVED_TOPICS, User

KEY = SigningKey("key-1")


def test_topic_scopes_match_the_exchange_name_when_asked() -> None:
    resolve = TopicScopes(
        ["write:{vhost}/t.*/{sub}.*", "read:prod/t.*/#", "write:*/*", "configure:*/*/x"],
        {"sub": "alice"},
    )
    perm = resolve("prod", "t.later")
    assert perm.allows("write", "alice.1") and not perm.allows("write", "bob.1")
    assert perm.allows("read", "#") and not perm.allows("read", "a")
    # No three-part write or read scope names it: no key at all.
    assert not resolve("prod", "other").allows("write", "alice.1")
    assert not resolve("dev", "t.x").allows("read", "#")  # read:prod/... only


def token(scopes: list[str]) -> Token:
    return Token("alice", scopes, [], None, {"sub": "alice"})


def test_a_token_user_checks_every_exchange_and_keeps_the_result() -> None:
    user = token_user(token([*FULL, "write:*/t.*/ok.*"]), ["/", "prod"])
    assert user.topic_permissions == {"/": {}, "prod": {}}  # truthy: publishes check
    perm = user.topic_permission("/", "t.1")
    assert perm is not None and perm.allows("write", "ok.1")
    assert user.topic_permission("/", "t.1") is perm  # kept
    for n in range(MAX_RESOLVED_TOPICS + 1):  # exchanges come and go: bounded
        user.topic_permission("/", f"x{n}")
    assert len(user.topic_permissions["/"]) <= MAX_RESOLVED_TOPICS
    # A user store's user: an exchange without an entry allows every key.
    assert User("bob", "").topic_permission("/", "t.1") is None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
    ) as harness:
        yield harness


def test_exchange_declared_after_the_login_amqp(broker: Harness) -> None:
    t = broker.broker.clock.now_ms() // 1000
    conn = broker.amqp_connection("", KEY.token(t, [*FULL, "write:*/late/ok.*"]))
    ch = conn.channel()
    ch.exchange_declare("late", "topic")
    ch.exchange_declare("late2", "topic")
    ch.confirm_delivery()
    ch.basic_publish("late", "ok.1", b"x")
    text = channel_error(403, ch.basic_publish, "late", "no.1", b"x")
    assert text.startswith("ACCESS_REFUSED - access to topic 'no.1' in exchange 'late'")
    ch = conn.channel()
    ch.queue_declare("q")
    # No read scope with a routing key: no binding key on a topic exchange.
    text = channel_error(403, ch.queue_bind, "q", "late2", "ok.1")
    assert "access to topic 'ok.1' in exchange 'late2'" in text
    conn.close()
