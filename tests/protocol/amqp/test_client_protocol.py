"""warren.client's sans-IO protocol, in memory: bytes in, events and bytes out.

Two oracles: pamqp (an independent AMQP 0-9-1 codec) encodes what a server
would send and decodes what the client writes; and the broker's own
AMQPConnection, fed the client's bytes with no socket in between (a core
Broker with no listeners), which shows that the two ends agree.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, harness_fixture
from pamqp import commands, frame, heartbeat
from pamqp.base import Frame
from pamqp.header import ProtocolHeader

from warren.amqp import spec
from warren.amqp.connection import AMQPConnection
from warren.amqp.frames import content_frames, method_frame
from warren.amqp.replica import ReplicaConnection
from warren.broker import Broker
from warren.client.blocking import CLIENT_CAPABILITIES
from warren.client.confirms import ConfirmTracker
from warren.client.protocol import (
    AMQPError,
    ChannelClosed,
    ClientProtocol,
    ConnectionClosed,
    ContentFrame,
    MethodReceived,
    Opened,
)
from warren.core.properties import BasicProperties
from warren.store.replica_catalog import ReplicaCatalog


def server_bytes(channel: int, value: Frame) -> bytes:
    """What a server would write, encoded by pamqp."""
    return frame.marshal(value, channel)


def decoded(data: bytes) -> list[tuple[int, Any]]:
    """Every frame in ``data``, decoded by pamqp: (channel, pamqp frame)."""
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def opened(proto: ClientProtocol, **tune: int) -> ClientProtocol:
    """Take ``proto`` through the handshake with a pamqp server."""
    proto.connect()
    assert proto.data_to_send() == ProtocolHeader().marshal()
    proto.receive_data(
        server_bytes(
            0,
            commands.Connection.Start(
                server_properties={"product": "pamqp"}, mechanisms="PLAIN AMQPLAIN"
            ),
        )
    )
    assert proto.next_event() is None
    proto.receive_data(server_bytes(0, commands.Connection.Tune(**tune)))
    assert proto.next_event() is None
    proto.receive_data(server_bytes(0, commands.Connection.OpenOk()))
    assert isinstance(proto.next_event(), Opened)
    return proto


def test_the_handshake_as_pamqp_decodes_it() -> None:
    proto = ClientProtocol(user="ann", password="secret", vhost="/v", frame_max=65536, heartbeat=30)
    proto.connect()
    assert proto.data_to_send() == b"AMQP\x00\x00\x09\x01"
    start = commands.Connection.Start(
        server_properties={"product": "pamqp", "version": "1"}, mechanisms="AMQPLAIN PLAIN"
    )
    proto.receive_data(server_bytes(0, start))
    assert proto.next_event() is None
    [(ch, start_ok)] = decoded(proto.data_to_send())
    assert ch == 0 and isinstance(start_ok, commands.Connection.StartOk)
    assert start_ok.mechanism == "PLAIN" and start_ok.response == "\0ann\0secret"
    assert proto.server_properties["product"] == "pamqp"
    # The server offers a larger frame_max and a shorter heartbeat: the client takes
    # the smaller of each.
    proto.receive_data(
        server_bytes(0, commands.Connection.Tune(channel_max=100, frame_max=131072, heartbeat=10))
    )
    assert proto.next_event() is None
    [(_, tune_ok), (_, open_)] = decoded(proto.data_to_send())
    assert isinstance(tune_ok, commands.Connection.TuneOk)
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (100, 65536, 10)
    assert isinstance(open_, commands.Connection.Open) and open_.virtual_host == "/v"
    assert proto.state == "open-ok"
    proto.receive_data(server_bytes(0, commands.Connection.OpenOk()))
    assert isinstance(proto.next_event(), Opened)
    assert (proto.state, proto.frame_max, proto.heartbeat, proto.channel_max) == (
        "open",
        65536,
        10,
        100,
    )


def test_heartbeat_zero_from_the_client_switches_them_off() -> None:
    proto = opened(ClientProtocol(heartbeat=0), heartbeat=60)
    [(_, _start_ok), (_, tune_ok), (_, _open)] = decoded(proto.data_to_send())
    assert tune_ok.heartbeat == 0 and proto.heartbeat == 0


def test_a_server_without_the_mechanism_is_refused_before_anything_is_sent() -> None:
    proto = ClientProtocol(mechanism="EXTERNAL")
    proto.connect()
    proto.data_to_send()
    proto.receive_data(server_bytes(0, commands.Connection.Start(mechanisms="PLAIN")))
    with pytest.raises(AMQPError) as refused:
        proto.next_event()
    assert refused.value.reply_code == spec.ACCESS_REFUSED
    assert proto.data_to_send() == b""


def test_bytes_one_at_a_time_give_the_same_events() -> None:
    proto = opened(ClientProtocol())
    proto.data_to_send()
    deliver = commands.Basic.Deliver(
        consumer_tag="c1", delivery_tag=7, exchange="x", routing_key="k"
    )
    data = (
        server_bytes(1, deliver)
        + b"".join(content_frames(1, BasicProperties().encode(), b"hello", 4096))
        + server_bytes(1, commands.Basic.QosOk())
    )
    events = []
    for i in range(len(data)):
        proto.receive_data(data[i : i + 1])
        while (event := proto.next_event()) is not None:
            events.append(event)
    assert [type(e) for e in events] == [MethodReceived, ContentFrame, ContentFrame, MethodReceived]
    first = events[0]
    assert isinstance(first, MethodReceived) and isinstance(first.method, spec.BasicDeliver)
    assert (first.channel, first.method.delivery_tag, first.method.routing_key) == (1, 7, "k")
    body = events[2]
    assert isinstance(body, ContentFrame) and body.payload == b"hello"


def test_heartbeats_are_answered_and_give_no_event() -> None:
    proto = opened(ClientProtocol())
    proto.data_to_send()
    proto.receive_data(heartbeat.Heartbeat().marshal())
    assert proto.next_event() is None
    [(ch, beat)] = decoded(proto.data_to_send())
    assert ch == 0 and isinstance(beat, heartbeat.Heartbeat)


def test_closes_are_answered_and_reported() -> None:
    proto = opened(ClientProtocol())
    proto.data_to_send()
    proto.receive_data(
        server_bytes(
            3,
            commands.Channel.Close(
                reply_code=404, reply_text="NOT_FOUND - no queue", class_id=50, method_id=10
            ),
        )
    )
    event = proto.next_event()
    assert isinstance(event, ChannelClosed) and event.channel == 3
    assert event.error().reply_code == 404 and "no queue" in str(event.error())
    [(ch, close_ok)] = decoded(proto.data_to_send())
    assert ch == 3 and isinstance(close_ok, commands.Channel.CloseOk)

    proto.receive_data(
        server_bytes(
            0,
            commands.Connection.Close(
                reply_code=320, reply_text="CONNECTION_FORCED", class_id=0, method_id=0
            ),
        )
    )
    event = proto.next_event()
    assert isinstance(event, ConnectionClosed) and event.reply_code == 320
    [(ch, close_ok)] = decoded(proto.data_to_send())
    assert ch == 0 and isinstance(close_ok, commands.Connection.CloseOk)
    assert proto.state == "closed"


def test_blocked_and_unblocked_set_the_flag() -> None:
    proto = opened(ClientProtocol())
    proto.receive_data(server_bytes(0, commands.Connection.Blocked(reason="low on disk")))
    assert proto.next_event() is None and proto.blocked
    proto.receive_data(server_bytes(0, commands.Connection.Unblocked()))
    assert proto.next_event() is None and not proto.blocked


def test_a_bad_frame_end_is_a_frame_error() -> None:
    proto = opened(ClientProtocol())
    bad = bytearray(server_bytes(1, commands.Basic.QosOk()))
    bad[-1] = 0
    proto.receive_data(bytes(bad))
    with pytest.raises(AMQPError) as broken:
        proto.next_event()
    assert broken.value.reply_code == spec.FRAME_ERROR


def test_unread_and_push_back_hand_bytes_to_a_hot_loop_and_back() -> None:
    proto = opened(ClientProtocol())
    ok = server_bytes(1, commands.Basic.QosOk())
    proto.receive_data(ok + ok[:5])
    assert proto.unread() == ok + ok[:5]
    assert proto.next_frame() is None
    proto.push_back(ok[:5])
    proto.receive_data(ok[5:])
    event = proto.next_event()
    assert isinstance(event, MethodReceived) and isinstance(event.method, spec.BasicQosOk)


def test_confirm_tracker_counts_multiple_single_and_nacks() -> None:
    tracker = ConfirmTracker()

    def ack(tag: int, multiple: bool) -> bytes:
        return server_bytes(1, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    nack = server_bytes(1, commands.Basic.Nack(delivery_tag=4, multiple=False))
    data = ack(2, True) + ack(5, False) + nack + ack(3, False)
    used = tracker.feed(data + data[:9])
    assert used == len(data)
    assert (tracker.acked_upto, tracker.singles, tracker.confirmed) == (5, set(), 5)
    assert (tracker.nacked, tracker.last_nacked) == (1, 4)

    closing = ConfirmTracker()
    with pytest.raises(AMQPError) as closed:
        closing.feed(
            server_bytes(0, commands.Connection.Close(reply_code=320, class_id=0, method_id=0))
        )
    assert closed.value.reply_code == 320


# -- against the broker's own connection, in memory ---------------------------------------


#: A core Broker with no listeners on the harness's loop (the tests run its
#: pending callbacks with ``pump``; no time passes).
broker = harness_fixture()


class Wire:
    """A ClientProtocol and a server connection (the broker's AMQPConnection, or a
    follower's ReplicaConnection), joined by byte copies."""

    def __init__(self, broker: Broker | None, replica: ReplicaConnection | None = None) -> None:
        self.client = ClientProtocol(
            frame_max=8192, properties={"capabilities": CLIENT_CAPABILITIES}
        )
        self.closed = False
        self.server: AMQPConnection | ReplicaConnection
        if replica is not None:
            self.server = replica
        else:
            assert broker is not None
            self.server = AMQPConnection(broker, ("127.0.0.1", 40000), lambda: None, self._close)

    def _close(self) -> None:
        self.closed = True

    def pump(self) -> list[Any]:
        """Carry bytes both ways until neither side has more; the client's events."""
        events = []
        while True:
            out = self.client.data_to_send()
            if out:
                self.server.feed(out)
            back = b"".join(self.server.take_output())
            if back:
                self.client.receive_data(back)
            while (event := self.client.next_event()) is not None:
                events.append(event)
            if isinstance(self.server, ReplicaConnection) and self.server.closed:
                self.closed = True
            if not out and not back:
                return events

    def call(self, channel: int, method: spec.Method) -> list[Any]:
        self.client.send_method(channel, method)
        return self.pump()


def methods(events: list[Any]) -> list[spec.Method]:
    return [e.method for e in events if isinstance(e, MethodReceived)]


def test_the_client_and_the_broker_connection_agree(broker: Harness) -> None:
    wire = Wire(broker.broker)
    wire.client.connect()
    assert [type(e) for e in wire.pump()] == [Opened]
    assert wire.client.server_properties["product"] == "RabbitMQ"
    assert wire.client.frame_max == 8192 and wire.server.frame_max == 8192
    [ok] = methods(wire.call(1, spec.ChannelOpen()))
    assert isinstance(ok, spec.ChannelOpenOk)
    [declared] = methods(wire.call(1, spec.QueueDeclare(queue="q")))
    assert isinstance(declared, spec.QueueDeclareOk) and declared.queue == "q"
    # A message larger than frame_max goes out in several body frames.
    body = bytes(range(256)) * 80
    publish = method_frame(1, spec.BasicPublish(routing_key="q"))
    wire.client.send(
        publish + b"".join(content_frames(1, b"\x00\x00", body, wire.client.frame_max))
    )
    wire.pump()
    [consume_ok] = methods(wire.call(1, spec.BasicConsume(queue="q", no_ack=True)))
    assert isinstance(consume_ok, spec.BasicConsumeOk)
    events = wire.pump()
    deliver = [m for m in methods(events) if isinstance(m, spec.BasicDeliver)]
    if not deliver:  # the delivery pass runs on the loop's next turn
        events = _turn(broker, wire)
        deliver = [m for m in methods(events) if isinstance(m, spec.BasicDeliver)]
    assert len(deliver) == 1 and deliver[0].routing_key == "q"
    content = [e for e in events if isinstance(e, ContentFrame)]
    header_size = struct.unpack_from(">Q", content[0].payload, 4)[0]
    assert header_size == len(body)
    assert b"".join(e.payload for e in content[1:]) == body

    # A refusal: the broker closes the channel, the client answers close-ok.
    events = wire.call(2, spec.ChannelOpen())
    events = wire.call(2, spec.QueueDeclare(queue="missing", passive=True))
    [closed] = [e for e in events if isinstance(e, ChannelClosed)]
    assert closed.channel == 2 and closed.reply_code == spec.NOT_FOUND
    assert 2 not in wire.server.channels

    wire.call(0, spec.ConnectionClose(reply_code=200, reply_text="bye"))
    assert wire.closed


def _turn(broker: Harness, wire: Wire) -> list[Any]:
    """Let the broker's loop run its scheduled work once, then carry the bytes."""
    broker.pump()
    return wire.pump()


def test_a_wrong_password_is_refused_as_the_client_expects(broker: Harness) -> None:
    wire = Wire(broker.broker)
    wire.client.password = "wrong"
    wire.client.connect()
    [closed] = wire.pump()
    assert isinstance(closed, ConnectionClosed) and closed.reply_code == spec.ACCESS_REFUSED
    assert wire.closed


# -- a follower's read service: the same frame loop and handshake ---------------------------

LEADER = "amqp://leader.example:5672"


def replica_wire(tmp_path: Path) -> Wire:
    catalog = ReplicaCatalog(tmp_path / "follower")
    return Wire(None, ReplicaConnection(catalog, "reader", lambda: LEADER, lambda: 0))


def test_a_follower_opens_with_the_shared_handshake_and_refuses_a_publish(
    tmp_path: Path,
) -> None:
    wire = replica_wire(tmp_path)
    wire.client.connect()
    assert [type(e) for e in wire.pump()] == [Opened]
    assert wire.client.server_properties["product"] == "Warren"
    wire.call(1, spec.ChannelOpen())
    # The publish is refused naming the leader; its content frames are ignored.
    wire.client.send_method(1, spec.BasicPublish(routing_key="s"))
    wire.client.send(b"".join(content_frames(1, b"\x00\x00", b"body", 8192)))
    [closed] = [e for e in wire.pump() if isinstance(e, ChannelClosed)]
    assert closed.reply_code == spec.ACCESS_REFUSED and LEADER in closed.reply_text
    [ok] = methods(wire.call(1, spec.ChannelOpen()))
    assert isinstance(ok, spec.ChannelOpenOk)
    wire.call(0, spec.ConnectionClose(reply_code=200, reply_text="bye"))
    assert wire.closed


def test_a_follower_refuses_a_wrong_password_as_the_broker_does(
    broker: Harness, tmp_path: Path
) -> None:
    replies = []
    for wire in (Wire(broker.broker), replica_wire(tmp_path)):
        wire.client.password = "wrong"
        wire.client.connect()
        [closed] = wire.pump()
        assert isinstance(closed, ConnectionClosed) and wire.closed
        replies.append((closed.reply_code, closed.reply_text))
    assert replies[0] == replies[1]
    assert replies[0][0] == spec.ACCESS_REFUSED


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"\x01\x00\x01\x00\x00\x00\x04\x00\x0a\x00\x0a\x00", id="bad-end"),
        pytest.param(b"\x09\x00\x00\x00\x00\x00\x00\xce", id="unknown-type"),
        pytest.param(b"\x03\x00\x00\x00\x00\x00\x02ab\xce", id="body-on-channel-0"),
        pytest.param(b"\x01\x00\x00\x00\x00\x00\x04\x00\x63\x00\x01\xce", id="unknown-method"),
    ],
)
def test_a_follower_answers_bad_frames_as_the_broker_does(
    broker: Harness, tmp_path: Path, bad: bytes
) -> None:
    """One frame loop: the same bytes get the same connection.close from both."""
    replies = []
    for wire in (Wire(broker.broker), replica_wire(tmp_path)):
        wire.client.connect()
        wire.pump()
        wire.client.send(bad)
        [closed] = [e for e in wire.pump() if isinstance(e, ConnectionClosed)]
        replies.append((closed.reply_code, closed.reply_text))
    assert replies[0] == replies[1]
    assert replies[0][0] in (spec.FRAME_ERROR, spec.UNEXPECTED_FRAME, spec.NOT_IMPLEMENTED)
