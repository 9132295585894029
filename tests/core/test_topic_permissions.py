"""Topic permissions, enforced as RabbitMQ 3.10.8 does (checked with pika against it):
write on the routing key of basic.publish, read on the binding key of queue.bind,
queue.unbind, exchange.bind and exchange.unbind, for topic exchanges only; the
reply texts are RabbitMQ's.

In memory (issue 29): tests/harness brokers, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp), the management API through
``harness.http()``; a restart is a new Harness on the same data dir.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Channel, Harness, channel_error, harness_fixture
from pamqp import commands

from warren.core.errors import AccessRefused
from warren.core.users import TopicPermission, User, UserStore
from warren.definitions_document import DefinitionsError

pytestmark = pytest.mark.timeout(60)

memory = harness_fixture()


def refused(key: str, exchange: str = "amq.topic", vhost: str = "/", user: str = "u") -> str:
    return (
        f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost "
        f"'{vhost}' refused for user '{user}'"
    )


def add_user(b: Harness, name: str = "u", vhosts: tuple[str, ...] = ("/",)) -> None:
    def add() -> None:
        for vhost in vhosts:
            if vhost not in b.broker.vhosts:
                b.broker.add_vhost(vhost)
        b.broker.users.add_user(name, "pw")
        for vhost in vhosts:
            b.broker.users.set_permissions(name, vhost)
        b.broker.save_users()

    b.call(add)


def set_topic(b: Harness, vhost: str, exchange: str, write: str, read: str) -> None:
    b.call(lambda: b.broker.users.set_topic_permission("u", vhost, exchange, write, read))


@pytest.fixture
def user_channel(memory: Harness) -> Callable[..., Channel]:
    """In-memory channels (publisher confirms on: a refused publish raises) of user ``u``."""
    add_user(memory, vhosts=("/", "v2"))

    def open_channel(vhost: str = "/") -> Channel:
        ch = memory.amqp_connection("u", "pw", vhost).channel()
        ch.confirm_delivery()
        return ch

    return open_channel


# -- the check itself --------------------------------------------------------------------


def test_check_topic_follows_rabbitmq() -> None:
    user = User("u", "")
    UserStore.check_topic(user, "/", "amq.topic", "anything", "write")  # no permission: allowed
    user.topic_permissions["/"] = {
        "amq.topic": TopicPermission(write="^a\\.{username}\\.", read="b"),
        "t": TopicPermission(write="", read="^{client_id}/{vhost}$"),
    }
    variables = {"username": "u", "vhost": "/", "client_id": "c1"}

    def allowed(exchange: str, key: str, kind: str) -> bool:
        try:
            UserStore.check_topic(user, "/", exchange, key, kind, variables)
        except AccessRefused as exc:
            assert exc.reply_text == refused(key, exchange)
            return False
        return True

    assert allowed("amq.topic", "a.u.x", "write")
    assert not allowed("amq.topic", "a.v.x", "write")
    assert allowed("amq.topic", "xbx", "read")  # unanchored, unlike resource permissions
    assert not allowed("amq.topic", "a.u.x", "read")
    assert allowed("t", "", "write") and not allowed("t", "x", "write")  # "" is ^$
    assert allowed("t", "c1//", "read") and not allowed("t", "c2//", "read")
    assert allowed("other", "whatever", "write")  # no permission on that exchange
    UserStore.check_topic(user, "v2", "amq.topic", "z", "write", variables)  # nor vhost
    # Values are pasted in unescaped, as RabbitMQ's binary:replace: a broken regex
    # matches nothing.
    variables["client_id"] = "("
    assert not allowed("t", "(//", "read")


def test_store_operations() -> None:
    store = UserStore()
    store.add_user("u", "pw")
    assert store.set_topic_permission("u", "/", "x", "w", "r") is False
    assert store.set_topic_permission("u", "/", "x", "w2", "r2") is True
    store.set_topic_permission("u", "/", "y")
    store.set_topic_permission("u", "v", "x")
    assert store.clear_topic_permissions("u", "/", "x") is True
    assert list(store.users["u"].topic_permissions["/"]) == ["y"]
    assert store.clear_topic_permissions("u", "/", "x") is False
    assert store.clear_topic_permissions("u", "/") is True
    assert "/" not in store.users["u"].topic_permissions  # no empty table left
    store.forget_vhost("v")
    assert store.users["u"].topic_permissions == {}


# -- AMQP: publish and bind ----------------------------------------------------------------


def test_publish_is_checked_against_write(
    memory: Harness, user_channel: Callable[..., Channel]
) -> None:
    set_topic(memory, "/", "amq.topic", "^a\\.{username}", "b")
    ch = user_channel()
    ch.basic_publish("amq.topic", "a.u.x", b"ok")
    text = channel_error(403, ch.basic_publish, "amq.topic", "x.a.u", b"no")
    assert text == refused("x.a.u")
    # Checked before the user-id property, as RabbitMQ.
    ch = user_channel()
    props = commands.Basic.Properties(user_id="other")
    assert channel_error(403, ch.basic_publish, "amq.topic", "x", b"", props) == refused("x")
    # The internal-exchange check comes first.
    ch = user_channel()
    ch.exchange_declare("inner", "topic", internal=True)
    set_topic(memory, "/", "inner", "^$", "^$")
    text = channel_error(403, ch.basic_publish, "inner", "x", b"")
    assert text == "ACCESS_REFUSED - cannot publish to internal exchange 'inner' in vhost '/'"


def test_binds_and_unbinds_are_checked_against_read(
    memory: Harness, user_channel: Callable[..., Channel]
) -> None:
    set_topic(memory, "/", "amq.topic", ".*", "b")
    ch = user_channel()
    ch.queue_declare("tq")
    ch.exchange_declare("dest", "fanout")
    ch.queue_bind("tq", "amq.topic", "xbx")
    ch.queue_unbind("tq", "amq.topic", "xbx")
    ch.exchange_bind("dest", "amq.topic", "b")
    ch.exchange_unbind("dest", "amq.topic", "b")
    ch.exchange_bind("amq.topic", "dest", "a")  # amq.topic as the destination: no check
    cases: list[tuple[str, Callable[[Channel], Any]]] = [
        ("queue.bind", lambda c: c.queue_bind("tq", "amq.topic", "a")),
        ("missing queue", lambda c: c.queue_bind("no-such-queue", "amq.topic", "a")),
        ("queue.unbind", lambda c: c.queue_unbind("tq", "amq.topic", "a")),
        ("exchange.bind", lambda c: c.exchange_bind("dest", "amq.topic", "a")),
        ("exchange.unbind", lambda c: c.exchange_unbind("dest", "amq.topic", "a")),
    ]
    for what, call in cases:
        assert channel_error(403, call, user_channel()) == refused("a"), what
    # A missing source exchange is not found, not refused.
    ch = user_channel()
    text = channel_error(404, ch.queue_bind, "tq", "nope", "a")
    assert text == "NOT_FOUND - no exchange 'nope' in vhost '/'"


def test_variables_and_empty_patterns(
    memory: Harness, user_channel: Callable[..., Channel]
) -> None:
    set_topic(memory, "v2", "amq.topic", "", "{vhost}")
    ch = user_channel("v2")
    ch.queue_declare("tq")
    ch.basic_publish("amq.topic", "", b"")
    ch.queue_bind("tq", "amq.topic", "xv2x")
    assert channel_error(403, ch.basic_publish, "amq.topic", "x", b"") == refused("x", vhost="v2")
    ch = user_channel("v2")
    assert channel_error(403, ch.queue_bind, "tq", "amq.topic", "x") == refused("x", vhost="v2")
    # The same user's other vhost has no topic permission: unaffected.
    user_channel("/").basic_publish("amq.topic", "x", b"")


def test_other_exchanges_and_exchange_types_are_unaffected(
    memory: Harness, user_channel: Callable[..., Channel]
) -> None:
    set_topic(memory, "/", "amq.topic", "^$", "^$")
    set_topic(memory, "/", "amq.direct", "^$", "^$")  # not a topic exchange: never checked
    ch = user_channel()
    ch.exchange_declare("mine", "topic")
    ch.queue_declare("tq")
    for exchange in ("mine", "amq.direct", "amq.fanout", ""):
        ch.basic_publish(exchange, "x", b"")
    ch.queue_bind("tq", "mine", "x")
    ch.queue_bind("tq", "amq.direct", "x")


def test_changes_apply_to_open_channels(
    memory: Harness, user_channel: Callable[..., Channel]
) -> None:
    ch = user_channel()
    ch.basic_publish("amq.topic", "x", b"")
    set_topic(memory, "/", "amq.topic", "^y", ".*")
    assert channel_error(403, ch.basic_publish, "amq.topic", "x", b"") == refused("x")
    ch = user_channel()
    ch.basic_publish("amq.topic", "y", b"")
    memory.call(lambda: memory.broker.users.clear_topic_permissions("u", "/"))
    ch.basic_publish("amq.topic", "x", b"")


# -- management API, persistence, definitions --------------------------------------------


def test_http_api_sets_and_clears(memory: Harness, user_channel: Callable[..., Channel]) -> None:
    api = memory.http()
    body = {"exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}
    assert api.put("/api/topic-permissions/%2F/u", body).status == 201
    assert api.put("/api/topic-permissions/%2F/u", body).status == 204
    assert api.get("/api/users/u/topic-permissions") == [{"user": "u", "vhost": "/", **body}]
    ch = user_channel()
    ch.basic_publish("amq.topic", "u.x", b"")
    assert channel_error(403, ch.basic_publish, "amq.topic", "v.x", b"") == refused("v.x")
    assert api.delete("/api/topic-permissions/%2F/u").status == 204
    assert api.delete("/api/topic-permissions/%2F/u").status == 404
    user_channel().basic_publish("amq.topic", "v.x", b"")


def test_deleted_with_the_user_and_the_vhost(memory: Harness) -> None:
    api = memory.http()
    api.put("/api/vhosts/v3")
    api.put("/api/users/w", {"password": "pw", "tags": ""})
    for vhost in ("%2F", "v3"):
        api.put(f"/api/permissions/{vhost}/w", {"configure": ".*", "write": ".*", "read": ".*"})
        api.put(f"/api/topic-permissions/{vhost}/w", {"exchange": "x", "write": "", "read": ""})
    api.put("/api/topic-permissions/v3/guest", {"exchange": "x", "write": "", "read": ""})
    assert api.delete("/api/vhosts/v3").status == 204
    api.put("/api/vhosts/v3")  # created again: no topic permission comes back
    assert [(t["user"], t["vhost"]) for t in api.get("/api/topic-permissions")] == [("w", "/")]
    assert api.delete("/api/users/w").status == 204
    assert api.get("/api/topic-permissions") == []


def _confirming(b: Harness, vhost: str = "/") -> Channel:
    """A channel of user ``u`` with publisher confirms (a refused publish raises)."""
    ch = b.amqp_connection("u", "pw", vhost).channel()
    ch.confirm_delivery()
    return ch


def test_persisted_across_a_restart(tmp_path: Path) -> None:
    with Harness(tmp_path / "d") as b:
        add_user(b)
        body = {"exchange": "amq.topic", "write": "^a", "read": "^b"}
        assert b.http().put("/api/topic-permissions/%2F/u", body).status == 201
    with Harness(tmp_path / "d") as b:
        listed = b.http().get("/api/topic-permissions")
        assert listed == [{"user": "u", "vhost": "/", **body}]
        ch = _confirming(b)
        ch.basic_publish("amq.topic", "a", b"")
        assert channel_error(403, ch.basic_publish, "amq.topic", "b", b"") == refused("b")


def test_definitions_round_trip(memory: Harness, tmp_path: Path) -> None:
    add_user(memory, vhosts=("/", "v2"))
    set_topic(memory, "v2", "amq.topic", "^a", "")
    set_topic(memory, "/", "t", ".*", "^r")
    exported = memory.http().get("/api/definitions")
    expected = [
        {"user": "u", "vhost": "/", "exchange": "t", "write": ".*", "read": "^r"},
        {"user": "u", "vhost": "v2", "exchange": "amq.topic", "write": "^a", "read": ""},
    ]
    assert exported["topic_permissions"] == expected
    with Harness(tmp_path / "other") as other:
        assert other.http().post("/api/definitions", exported).status == 204
        assert other.call(other.broker.export_definitions)["topic_permissions"] == expected
        assert json.loads((tmp_path / "other" / "users.json").read_text())["users"]
        ch = _confirming(other, "v2")
        text = channel_error(403, ch.basic_publish, "amq.topic", "b", b"")
        assert text == refused("b", vhost="v2")
        # A topic permission of an unknown user refuses the whole import.
        bad = {"topic_permissions": [{**expected[0], "user": "nobody"}]}
        with pytest.raises(DefinitionsError, match="user 'nobody' does not exist"):
            other.call(lambda: other.broker.import_definitions(bad))


def test_mgmt_json_entries_move_to_users_json(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with Harness(data) as b:
        add_user(b)
        b.http().put("/api/vhosts/v", {"description": "kept"})
    # What an older Warren's management API wrote (no checksum: store/layout.py).
    mgmt = json.loads((data / "mgmt.json").read_text())
    del mgmt["checksum"]
    old = {"user": "u", "vhost": "/", "exchange": "amq.topic", "write": "^a", "read": ".*"}
    gone = {"user": "ghost", "vhost": "/", "exchange": "amq.topic", "write": "", "read": ""}
    mgmt["topic_permissions"] = [old, gone]
    (data / "mgmt.json").write_text(json.dumps(mgmt))
    with Harness(data) as b:
        assert b.http().get("/api/topic-permissions") == [old]
        assert b.http().get("/api/vhosts/v")["description"] == "kept"
        mgmt = json.loads((data / "mgmt.json").read_text())
        assert "topic_permissions" not in mgmt
        (u,) = [
            u for u in json.loads((data / "users.json").read_text())["users"] if u["name"] == "u"
        ]
        assert u["topic_permissions"] == {"/": {"amq.topic": {"write": "^a", "read": ".*"}}}
        ch = _confirming(b)
        assert channel_error(403, ch.basic_publish, "amq.topic", "b", b"") == refused("b")
