"""The connection class as a pika (BlockingConnection) client observes it.

Authentication (PLAIN, AMQPLAIN, refused logins), virtual hosts, tuning
(heartbeat, channel_max, frame_max), server properties and capabilities, and
the 320 CONNECTION_FORCED a client gets when the broker shuts down.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.compat import as_bytes
from pika.exceptions import (
    AMQPConnectionError,
    AuthenticationError,
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)
from pikahelp import params

from warren import Config, __version__
from warren.amqp.handshake import SERVER_CAPABILITIES
from warren.core.clock import ManualClock

pytestmark = pytest.mark.timeout(30)


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def opened() -> Iterator[list[BlockingConnection]]:
    """Connections a test opens; closed at the end whatever happened."""
    conns: list[BlockingConnection] = []
    yield conns
    for conn in conns:
        if conn.is_open:
            conn.close()


def connect(opened: list[BlockingConnection], broker: Any, **kwargs: Any) -> BlockingConnection:
    conn = pika.BlockingConnection(params(broker, **kwargs))
    opened.append(conn)
    return conn


def pump(conn: BlockingConnection, seconds: float) -> None:
    """Run the client's I/O loop (heartbeats included) for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=min(0.1, max(0.0, deadline - time.monotonic())))


def wait_on_broker(broker: Any, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll broker state (on the broker's loop) until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while not broker.call(predicate):
        if time.monotonic() > deadline:
            raise AssertionError("broker condition not reached in time")


def server_connections(broker: Any) -> list[Any]:
    return broker.call(lambda: list(broker.broker.connections))


class AMQPlainCredentials(pika.PlainCredentials):
    """Log in with AMQPLAIN (pika itself speaks only PLAIN and EXTERNAL).

    The response is a field table holding LOGIN and PASSWORD, without the
    table's length prefix. Also records the mechanisms the server offered.
    """

    TYPE = "AMQPLAIN"

    def __init__(self, username: str, password: str) -> None:
        super().__init__(username, password)
        self.offered: list[bytes] = []

    def response_for(self, start: Any) -> tuple[str | None, bytes | None]:
        self.offered = as_bytes(start.mechanisms).split()
        if b"AMQPLAIN" not in self.offered:
            return None, None
        pieces: list[bytes] = []
        pika.data.encode_table(pieces, {"LOGIN": self.username, "PASSWORD": self.password})
        return self.TYPE, b"".join(pieces)[4:]


# -- authentication -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "password"),
    [("guest", "wrong"), ("guest", ""), ("nobody", "guest")],
    ids=["wrong-password", "empty-password", "unknown-user"],
)
def test_refused_login(broker: Any, user: str, password: str) -> None:
    creds = pika.PlainCredentials(user, password)
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)) as info:
        pika.BlockingConnection(params(broker, credentials=creds))
    # pika announces authentication_failure_close, so the reason is sent, not just a hang-up.
    assert "403" in str(info.value)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        info.value
    )


def test_refused_login_leaves_no_connection(broker: Any) -> None:
    with pytest.raises(AMQPConnectionError):
        pika.BlockingConnection(params(broker, credentials=pika.PlainCredentials("guest", "nope")))
    wait_on_broker(broker, lambda: not broker.broker.connections)


def test_amqplain_login(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker, credentials=AMQPlainCredentials("guest", "guest"))
    used = conn._impl.params.credentials  # pika works on a copy
    assert isinstance(used, AMQPlainCredentials)
    assert {b"PLAIN", b"AMQPLAIN"} <= set(used.offered)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"amqplain")
    assert ch.basic_get(q, auto_ack=True)[2] == b"amqplain"


def test_amqplain_wrong_password_refused(broker: Any) -> None:
    creds = AMQPlainCredentials("guest", "wrong")
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)) as info:
        pika.BlockingConnection(params(broker, credentials=creds))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism AMQPLAIN" in str(
        info.value
    )


def test_external_mechanism_not_offered(broker: Any) -> None:
    with pytest.raises(AuthenticationError) as info:
        pika.BlockingConnection(params(broker, credentials=pika.credentials.ExternalCredentials()))
    assert "EXTERNAL" in str(info.value)


# -- virtual hosts ----------------------------------------------------------------------------


def test_unknown_vhost_is_refused_with_530(broker: Any) -> None:
    name = f"no-such-vhost-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params(broker, virtual_host=name))
    assert "530" in str(info.value)
    assert f"NOT_ALLOWED - vhost {name} not found" in str(info.value)


def test_vhost_without_permission_is_refused(broker: Any) -> None:
    broker.call(lambda: broker.broker.add_vhost("locked"))
    with pytest.raises(ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params(broker, virtual_host="locked"))
    assert "NOT_ALLOWED - access to vhost 'locked' refused for user 'guest'" in str(info.value)


def test_vhosts_are_isolated(broker: Any, opened: list[BlockingConnection]) -> None:
    def add() -> None:
        broker.broker.add_vhost("other")
        broker.broker.users.set_permissions("guest", "other")

    broker.call(add)
    root = connect(opened, broker).channel()
    other_conn = connect(opened, broker, virtual_host="other")
    other = other_conn.channel()
    root.queue_declare("only-in-root")
    root.basic_publish("", "only-in-root", b"x")
    with pytest.raises(ChannelClosedByBroker) as info:
        other.queue_declare("only-in-root", passive=True)
    assert info.value.reply_text == "NOT_FOUND - no queue 'only-in-root' in vhost 'other'"
    other = other_conn.channel()
    ok = other.queue_declare("only-in-root").method
    assert ok.message_count == 0
    assert root.queue_declare("only-in-root", passive=True).method.message_count == 1


# -- tuning: heartbeat, channel_max, frame_max ---------------------------------------------


def test_heartbeat_keeps_an_idle_connection_alive(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    """3.5 s of the broker's ManualClock with nothing but heartbeats: the broker
    sends them, pika reads them, and pika's own heartbeat
    frame (what its send timer writes every half interval of wall time, here
    when the test moves the clock) keeps the broker from closing."""
    broker = broker_factory(clock=ManualClock())
    conn = connect(opened, broker, heartbeat=1)
    assert conn._impl.params.heartbeat == 1
    assert [c.heartbeat for c in server_connections(broker)] == [1]
    checker = conn._impl._heartbeat_checker
    assert checker is not None
    for _ in range(7):  # idle well beyond two heartbeat intervals
        broker.advance(500)
        checker._send_heartbeat_frame()
        conn.process_data_events(time_limit=0)  # written out, and what came read
    # At least one from the broker per interval (it sends one in a half interval
    # in which it wrote nothing else).
    deadline = time.monotonic() + 10
    while checker._heartbeat_frames_received < 3:
        assert time.monotonic() < deadline, (
            f"{checker._heartbeat_frames_received} heartbeats from the server"
        )
        conn.process_data_events(time_limit=0.01)
    assert conn.is_open
    assert len(server_connections(broker)) == 1
    ch = conn.channel()
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_server_heartbeat_proposal_is_used(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    b = broker_factory(heartbeat=7)
    conn = connect(opened, b)  # pika accepts the server's proposal by default
    assert conn._impl.params.heartbeat == 7
    assert [c.heartbeat for c in server_connections(b)] == [7]


def test_client_can_disable_heartbeats(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker, heartbeat=0)
    assert conn._impl.params.heartbeat == 0
    assert [c.heartbeat for c in server_connections(broker)] == [0]
    assert conn._impl._heartbeat_checker is None


def test_silent_client_is_disconnected(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    broker = broker_factory(clock=ManualClock())
    conn = connect(opened, broker, heartbeat=1)
    # Not running pika's I/O loop means no heartbeats from the client: the
    # broker gives up as RabbitMQ does: its receiver checks every interval and
    # closes at the second check in a row with nothing read, 3 s after the open.
    broker.advance(2999)
    assert len(server_connections(broker)) == 1
    broker.advance(1)
    wait_on_broker(broker, lambda: not broker.broker.connections, timeout=10)
    with pytest.raises(AMQPConnectionError):
        pump(conn, 1.0)
    assert conn.is_closed


def test_channel_max_negotiated_down_to_client(
    broker: Any, opened: list[BlockingConnection]
) -> None:
    conn = connect(opened, broker, channel_max=3)
    assert conn._impl.params.channel_max == 3
    chans = [conn.channel(channel_number=n) for n in (1, 2, 10)]  # the count is what counts
    for ch in chans:
        ch.exchange_declare("amq.direct", passive=True)
    with pytest.raises(ConnectionClosedByBroker) as info:
        conn.channel(channel_number=4)
    assert info.value.reply_code == 530
    assert info.value.reply_text == (
        "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)"
    )


def test_closed_channels_free_their_slot(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker, channel_max=2)
    first = conn.channel()
    conn.channel()
    first.close()
    third = conn.channel()
    third.exchange_declare("amq.direct", passive=True)
    assert conn.is_open


def test_server_channel_max_is_proposed(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    b = broker_factory(channel_max=5)
    conn = connect(opened, b)
    assert conn._impl.params.channel_max == 5
    assert [c.channel_max for c in server_connections(b)] == [5]


def test_many_channels_open_and_close(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker)
    chans = [conn.channel() for _ in range(100)]
    assert len({ch.channel_number for ch in chans}) == 100
    for ch in chans[::2]:
        ch.close()
    for ch in chans[1::2]:
        ch.exchange_declare("amq.direct", passive=True)
    again = [conn.channel() for _ in range(50)]
    for ch in again:
        ch.exchange_declare("amq.direct", passive=True)


def test_channel_error_leaves_connection_and_other_channels(
    broker: Any, opened: list[BlockingConnection]
) -> None:
    conn = connect(opened, broker)
    good, bad = conn.channel(), conn.channel()
    q = good.queue_declare("", exclusive=True).method.queue
    with pytest.raises(ChannelClosedByBroker):
        bad.queue_declare("missing-" + uuid.uuid4().hex, passive=True)
    assert conn.is_open and good.is_open and bad.is_closed
    good.basic_publish("", q, b"still fine")
    assert good.basic_get(q, auto_ack=True)[2] == b"still fine"


@pytest.mark.parametrize("frame_max", [4096, 8192, 131072])
def test_frame_max_negotiated(
    broker: Any, opened: list[BlockingConnection], frame_max: int
) -> None:
    conn = connect(opened, broker, frame_max=frame_max)
    assert conn._impl.params.frame_max == frame_max
    assert [c.frame_max for c in server_connections(broker)] == [frame_max]
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytes(range(256)) * 100  # several frames at the smaller sizes
    ch.basic_publish("", q, body)
    assert ch.basic_get(q, auto_ack=True)[2] == body


def test_server_frame_max_is_proposed(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    b = broker_factory(frame_max=16384)
    conn = connect(opened, b)
    assert conn._impl.params.frame_max == 16384
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = b"z" * 100_000
    ch.basic_publish("", q, body)
    assert ch.basic_get(q, auto_ack=True)[2] == body


# -- server properties ------------------------------------------------------------------


def test_server_properties(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker)
    props = conn._impl.server_properties
    # Clients (kombu) choose qos semantics by product and version, so Warren
    # announces the RabbitMQ release it behaves like and names itself elsewhere.
    assert props["product"] == "RabbitMQ"
    assert props["version"] == Config().rabbitmq_version
    assert props["warren_version"] == __version__
    assert "Warren" in props["platform"]
    assert "Warren" in props["information"]
    for key in ("copyright", "cluster_name"):
        assert isinstance(props[key], str) and props[key], key
    caps = props["capabilities"]
    assert set(SERVER_CAPABILITIES) <= set(caps)
    for key in SERVER_CAPABILITIES:
        assert caps[key] is True, key
    assert conn.publisher_confirms_supported
    assert conn.basic_nack_supported
    assert conn.consumer_cancel_notify_supported
    assert conn.exchange_exchange_bindings_supported


def test_update_secret_is_accepted(broker: Any, opened: list[BlockingConnection]) -> None:
    conn = connect(opened, broker)
    conn.update_secret("guest", "rotation")
    assert conn.is_open
    conn.channel().exchange_declare("amq.direct", passive=True)


def test_client_close_releases_the_server_side(
    broker: Any, opened: list[BlockingConnection]
) -> None:
    conn = connect(opened, broker)
    conn.channel().queue_declare("", exclusive=True)
    assert len(server_connections(broker)) == 1
    conn.close()
    wait_on_broker(broker, lambda: not broker.broker.connections)
    assert broker.call(lambda: list(broker.broker.vhosts["/"].queues)) == []


# -- broker shutdown ------------------------------------------------------------------------


def test_broker_stop_closes_clients_with_320(
    broker_factory: Callable[..., Any], opened: list[BlockingConnection]
) -> None:
    b = broker_factory()
    conn = connect(opened, b)
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)
    # Broker.stop() -- what BrokerThread.stop() runs -- leaving the loop for the
    # fixture to stop. It waits for the client's close-ok, so run it aside.
    stopper = threading.Thread(target=b.run, args=(b.broker.stop(),))
    stopper.start()
    try:
        with pytest.raises(ConnectionClosedByBroker) as info:
            pump(conn, 10)
    finally:
        stopper.join(15)
    assert not stopper.is_alive()
    assert info.value.reply_code == 320
    assert info.value.reply_text == (
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    )
    assert conn.is_closed
    with pytest.raises(AMQPConnectionError):
        pika.BlockingConnection(params(b))
