"""Misbehaving clients at the protocol level, in memory (tests/harness).

Moved from tests/test_protocol_errors.py, where every test opened a raw socket
to a broker with listeners: what these tests check is how AMQPConnection
answers bytes (reply codes, texts, class/method ids, what it keeps or drops),
which needs no socket. The same frames, built with tests/rawamqp.py and decoded
with pamqp, are fed to the broker's AMQPConnection by MemoryAMQP; "still
serving other clients" is a second in-memory connection, and the timers of
the listener's protocol (heartbeats, the handshake timeout) run on the
harness's ManualClock.

The reference is RabbitMQ 3.10.8, observed with the same raw client over a socket.
Where RabbitMQ answers a protocol error with a connection.close, the code, the
reply-text prefix and the class/method ids asserted here are the ones it sends.
Where RabbitMQ just drops the socket (sometimes 3 s later) or leaves the client
hanging, Warren does better: a proper connection.close with the fitting code.
Those cases say so in a comment.

Every test ends by checking that another client is still served by the same broker.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, MemoryAMQP
from harness.amqp import assert_still_serving
from pamqp import commands
from rawamqp import (
    PROTOCOL_HEADER,
    AMQPFrames,
    body_frame,
    header_frame,
    method_frame,
    method_payload,
    publish_frames,
    raw_frame,
)

from warren.amqp.server import HANDSHAKE_TIMEOUT_MS
from warren.core.clock import ManualClock

pytestmark = pytest.mark.timeout(30)

RawFactory = Callable[[], MemoryAMQP]


@pytest.fixture
def raw(harness: Harness) -> Iterator[RawFactory]:
    """In-memory connections to ``harness``'s broker; all closed at the end."""
    made: list[MemoryAMQP] = []

    def factory() -> MemoryAMQP:
        client = harness.amqp()
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close_socket()


def opened(client: AMQPFrames, **handshake: Any) -> Any:
    """Handshake done, channel 1 open."""
    client.handshake(**handshake)
    client.open_channel(1)
    return client


def assert_closed_with(
    client: AMQPFrames, code: int, text_prefix: str, ids: tuple[int, int] = (0, 0)
) -> str:
    """connection.close with this code, text prefix and class/method ids, then EOF."""
    reply_code, reply_text, class_id, method_id = client.expect_close()
    assert (reply_code, class_id, method_id) == (code, *ids), reply_text
    assert reply_text.startswith(text_prefix), reply_text
    assert client.wait_eof(5)
    return reply_text


def assert_refused(
    h: Harness,
    raw: RawFactory,
    data: bytes,
    code: int,
    text_prefix: str,
    ids: tuple[int, int] = (0, 0),
) -> None:
    """``data`` sent on a new connection with channel 1 open gets it closed as
    :func:`assert_closed_with` checks; the broker still serves other clients."""
    client = opened(raw())
    client.send(data)
    assert_closed_with(client, code, text_prefix, ids)
    assert_still_serving(h)


def queue_counts(h: Harness, name: str) -> tuple[int, int, int] | None:
    """(ready, unacked, consumers) of a queue in vhost '/', or None when it does not exist.

    Read on the broker's loop, where core state lives.
    """

    def counts() -> tuple[int, int, int] | None:
        q = h.broker.vhosts["/"].queues.get(name)
        if q is None:
            return None
        return q.message_count, q.unacked, q.consumer_count

    return h.call(counts)


def declare(client: AMQPFrames, queue: str, channel: int = 1, **flags: Any) -> None:
    client.send_method(channel, commands.Queue.Declare(queue=queue, **flags))
    client.expect_method(commands.Queue.DeclareOk, channel=channel)


# -- protocol header --------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x09\x02",  # unknown 0-9 revision
        b"AMQP\x01\x01\x00\x0a",  # AMQP 1.0
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    ],
    ids=["amqp-0-9-2", "amqp-1-0", "http"],
)
def test_wrong_protocol_header(harness: Harness, raw: RawFactory, header: bytes) -> None:
    # RabbitMQ: answers with its own protocol header and closes the socket.
    client = raw()
    client.send(header)
    assert client.raw_until_eof() == b"AMQP\x00\x00\x09\x01"
    assert_still_serving(harness)


def test_protocol_header_in_pieces(harness: Harness, raw: RawFactory) -> None:
    client = raw()
    client.send(PROTOCOL_HEADER[:3])
    client.send(PROTOCOL_HEADER[3:])
    client.expect_method(commands.Connection.Start)
    assert_still_serving(harness)


# -- authentication, vhost, tuning ------------------------------------------------------


def test_bad_credentials_with_authentication_failure_close(
    harness: Harness, raw: RawFactory
) -> None:
    # RabbitMQ: connection.close 403 with exactly this text, then the socket closes.
    client = raw()
    client.start_ok(password="wrong")
    assert_closed_with(
        client,
        403,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile.",
    )
    assert_still_serving(harness)


def test_bad_credentials_without_capability(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: without authentication_failure_close the socket just closes.
    client = raw()
    client.start_ok(password="wrong", capabilities={})
    assert client.frames_until_eof() == []
    assert_still_serving(harness)


def test_unknown_mechanism(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ drops the socket 3 s later without a word; Warren says why (403) and closes.
    client = raw()
    client.start_ok(mechanism="NO-SUCH-MECH", capabilities={})
    assert_closed_with(client, 403, "ACCESS_REFUSED - ")
    assert_still_serving(harness)


def test_unknown_vhost(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 530 "NOT_ALLOWED - vhost nosuch not found", naming connection.open (10/40).
    client = raw()
    client.handshake(open_connection=False)
    client.open("nosuch")
    text = assert_closed_with(client, 530, "NOT_ALLOWED - ", (10, 40))
    assert text == "NOT_ALLOWED - vhost nosuch not found"
    assert_still_serving(harness)


@pytest.mark.parametrize("frame_max", [1024, 4095, 0, 10_000_000])
def test_tune_ok_frame_max_out_of_range(harness: Harness, raw: RawFactory, frame_max: int) -> None:
    # RabbitMQ refuses frame_max below 4096 or above its own (0 included) by closing
    # the socket 3 s later, silently. Warren sends the 530 RabbitMQ uses internally.
    client = raw()
    client.start_ok()
    tune = client.expect_method(commands.Connection.Tune)
    client.tune_ok(tune.channel_max, frame_max, 0)
    text = assert_closed_with(client, 530, "NOT_ALLOWED - frame_max=", (10, 31))
    assert str(frame_max) in text
    assert_still_serving(harness)


# -- frame-level errors -----------------------------------------------------------------


def test_frame_larger_than_frame_max(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 501 "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}",
    # as soon as the frame header arrives (the rest of the frame is never sent here).
    client = opened(raw(), frame_max=4096)
    declare(client, "big")
    client.send(method_frame(1, commands.Basic.Publish(routing_key="big")))
    client.send(header_frame(1, 5000))
    client.send(raw_frame(3, 1, b"x" * 5000)[:100])
    assert_closed_with(client, 501, "FRAME_ERROR - ")
    assert queue_counts(harness, "big") == (0, 0, 0)
    assert_still_serving(harness)


def test_unknown_frame_type(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 501 "FRAME_ERROR - type 7, all octets = <<"abc">>: unknown_frame".
    assert_refused(harness, raw, raw_frame(7, 1, b"abc"), 501, "FRAME_ERROR - ")


def test_bad_frame_end_octet(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 501 "FRAME_ERROR - type 1, all octets = <<...>>: {invalid_frame_end_marker,0}".
    payload = method_payload(commands.Basic.Qos(prefetch_count=1))
    assert_refused(harness, raw, raw_frame(1, 1, payload, end=0x00), 501, "FRAME_ERROR - ")


def test_heartbeat_on_a_channel(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - type 8, all octets = <<>>".
    assert_refused(harness, raw, raw_frame(8, 1, b""), 505, "UNEXPECTED_FRAME - ")


def test_garbage_after_handshake(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ reads a frame header out of the garbage: 501 "... {frame_too_large,...}".
    assert_refused(harness, raw, b"\xde\xad\xbe\xef" * 16, 501, "FRAME_ERROR - ")


def test_frames_after_server_connection_close_are_ignored(
    harness: Harness, raw: RawFactory
) -> None:
    client = opened(raw())
    client.send(raw_frame(7, 1, b"abc"))
    close = client.expect_method(commands.Connection.Close, channel=0)
    assert close.reply_code == 501
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    client.send_method(2, commands.Channel.Open())
    client.send_method(0, commands.Connection.CloseOk())
    assert client.frames_until_eof() == []
    assert_still_serving(harness)


# -- method-level errors ----------------------------------------------------------------


@pytest.mark.parametrize("ids", [(99, 10), (60, 99)], ids=["class", "method"])
def test_unknown_class_or_method(harness: Harness, raw: RawFactory, ids: tuple[int, int]) -> None:
    # RabbitMQ drops the socket without a close; Warren closes with 540 NOT_IMPLEMENTED.
    assert_refused(
        harness, raw, raw_frame(1, 1, struct.pack(">HH", *ids)), 540, "NOT_IMPLEMENTED - ", ids
    )


def test_connection_method_on_a_channel(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 503 "COMMAND_INVALID - unimplemented method", naming the method.
    client = opened(raw())
    client.send_method(1, commands.Connection.Open(virtual_host="/"))
    text = assert_closed_with(client, 503, "COMMAND_INVALID - ", (10, 40))
    assert text == "COMMAND_INVALID - unimplemented method"
    assert_still_serving(harness)


def test_channel_method_on_channel_zero(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 504 "CHANNEL_ERROR - unexpected method in connection state running".
    client = raw()
    client.handshake()
    client.send_method(0, commands.Basic.Qos(prefetch_count=1))
    text = assert_closed_with(client, 504, "CHANNEL_ERROR - ", (60, 10))
    assert text == "CHANNEL_ERROR - unexpected method in connection state running"
    assert_still_serving(harness)


def test_unsolicited_connection_close_ok(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: the same 504, naming connection.close-ok (10/51).
    client = raw()
    client.handshake()
    client.send_method(0, commands.Connection.CloseOk())
    assert_closed_with(client, 504, "CHANNEL_ERROR - unexpected method", (10, 51))
    assert_still_serving(harness)


def test_truncated_method_payload(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 501 "FRAME_ERROR - cannot decode <<0,0,3,97>>", naming queue.declare
    # (50/10); not 502 SYNTAX_ERROR.
    payload = method_payload(commands.Queue.Declare(queue="abc"))
    assert_refused(
        harness, raw, raw_frame(1, 1, payload[:8]), 501, "FRAME_ERROR - cannot decode", (50, 10)
    )


def test_method_frame_without_method_id(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 501 "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame".
    assert_refused(harness, raw, raw_frame(1, 1, b"\x00\x3c"), 501, "FRAME_ERROR - ")


def test_method_before_connection_open(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,1,48>>".
    client = raw()
    client.handshake(open_connection=False)
    client.send_method(1, commands.Channel.Open())
    assert_closed_with(client, 505, "UNEXPECTED_FRAME - ")
    assert_still_serving(harness)


# -- channels ---------------------------------------------------------------------------


def test_method_on_channel_never_opened(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 504 "CHANNEL_ERROR - expected 'channel.open'", naming basic.qos (60/10).
    client = raw()
    client.handshake()
    client.send_method(3, commands.Basic.Qos(prefetch_count=1))
    assert_closed_with(client, 504, "CHANNEL_ERROR - expected 'channel.open'", (60, 10))
    assert_still_serving(harness)


def test_channel_open_twice(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 504 "CHANNEL_ERROR - second 'channel.open' seen", naming channel.open.
    client = opened(raw())
    client.send_method(1, commands.Channel.Open())
    assert_closed_with(client, 504, "CHANNEL_ERROR - second 'channel.open' seen", (20, 10))
    assert_still_serving(harness)


def test_more_channels_than_channel_max(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ counts open channels (it accepts any channel number): opening a third
    # with channel_max=2 gives 530 "NOT_ALLOWED - number of channels opened (2) has
    # reached the negotiated channel_max (2)".
    client = raw()
    client.handshake(channel_max=2)
    client.open_channel(1)
    client.open_channel(2)
    client.send_method(3, commands.Channel.Open())
    assert_closed_with(client, 530, "NOT_ALLOWED - ")
    assert_still_serving(harness)


def test_client_channel_close(harness: Harness, raw: RawFactory) -> None:
    client = opened(raw())
    client.send_method(
        1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    client.expect_method(commands.Channel.CloseOk, channel=1)
    client.open_channel(1)  # the number is free again
    client.close()
    assert_still_serving(harness)


def test_client_connection_close(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ sends close-ok and then waits for the client to close the socket;
    # Warren closes it itself right after close-ok, which clients accept.
    client = opened(raw())
    client.send_method(
        0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    client.expect_method(commands.Connection.CloseOk, channel=0)
    assert client.wait_eof(5)
    assert_still_serving(harness)


def test_frames_after_server_channel_close_are_ignored(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 404 on channel 1 naming queue.declare; until the client's close-ok
    # every frame on that channel is dropped, after it the channel can be reopened.
    client = opened(raw())
    declare(client, "target")
    client.send_method(1, commands.Queue.Declare(queue="no-such-queue", passive=True))
    code, text, class_id, method_id = client.expect_channel_close(1)
    assert (code, class_id, method_id) == (404, 50, 10)
    assert text == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    client.send(publish_frames(1, b"dropped", "target"))
    client.send_method(1, commands.Queue.Declare(queue="ignored"))
    client.send_method(1, commands.Channel.CloseOk())
    # Nothing was answered in between: the next frame is the open-ok.
    client.open_channel(1)
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    client.expect_method(commands.Basic.QosOk, channel=1)
    assert queue_counts(harness, "target") == (0, 0, 0)
    assert queue_counts(harness, "ignored") is None
    assert_still_serving(harness)


# -- content ----------------------------------------------------------------------------


def test_content_header_without_publish(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - expected method frame, got non method frame instead".
    assert_refused(harness, raw, header_frame(1, 3), 505, "UNEXPECTED_FRAME - ")


@pytest.mark.parametrize("channel", [0, 5], ids=["channel-0", "never-opened"])
def test_content_frame_outside_an_open_channel(
    harness: Harness, raw: RawFactory, channel: int
) -> None:
    # RabbitMQ: the same 505 for content on channel 0 or on a channel never opened.
    client = raw()
    client.handshake()
    client.send(body_frame(channel, b"abc"))
    assert_closed_with(client, 505, "UNEXPECTED_FRAME - ")
    assert_still_serving(harness)


def test_method_while_header_expected(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - expected content header for class 60, got non
    # content header frame instead", naming basic.publish (60/40).
    client = opened(raw())
    client.send_method(1, commands.Basic.Publish(routing_key="q"))
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    assert_closed_with(client, 505, "UNEXPECTED_FRAME - expected content header", (60, 40))
    assert_still_serving(harness)


def test_method_while_body_expected(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - expected content body, got non content body
    # frame instead", naming basic.publish (60/40).
    client = opened(raw())
    declare(client, "partial")
    client.send_method(1, commands.Basic.Publish(routing_key="partial"))
    client.send(header_frame(1, 10))
    client.send(body_frame(1, b"12345"))
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    assert_closed_with(client, 505, "UNEXPECTED_FRAME - expected content body", (60, 40))
    assert queue_counts(harness, "partial") == (0, 0, 0)
    assert_still_serving(harness)


def test_content_header_of_another_class(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ: 505 "UNEXPECTED_FRAME - expected content header for class 60, got one for
    # class 50 instead", naming basic.publish (60/40).
    client = opened(raw())
    client.send_method(1, commands.Basic.Publish(routing_key="q"))
    client.send(raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 3, 0)))
    text = assert_closed_with(client, 505, "UNEXPECTED_FRAME - ", (60, 40))
    assert text == (
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead"
    )
    assert_still_serving(harness)


def test_body_longer_than_announced(harness: Harness, raw: RawFactory) -> None:
    # RabbitMQ neither delivers nor rejects such a message: the channel waits forever
    # for the body to "complete" and the next frame gets 505 "expected content body",
    # naming basic.publish. Warren sends that same close at once; either way nothing
    # (corrupted) is enqueued.
    client = opened(raw())
    declare(client, "exact")
    client.send(publish_frames(1, b"abcdef", "exact", announced_size=3))
    text = assert_closed_with(client, 505, "UNEXPECTED_FRAME - ", (60, 40))
    assert text == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    assert queue_counts(harness, "exact") == (0, 0, 0)
    assert_still_serving(harness)


def test_a_long_reply_text_is_cut_on_a_character_boundary(harness: Harness) -> None:
    """The reply text names the header; cut to 255 octets, it must stay valid UTF-8
    (it once ended in half a U+FFFD and pamqp could not decode the close).
    Moved from tests/protocol/amqp/test_hostile_headers.py (pika only checked the broker still
    served others)."""
    name = b"\x80" * 100  # not UTF-8: each byte is named as U+FFFD, three octets
    table = bytes([len(name)]) + name + b"Z"
    properties = struct.pack(">HI", 0x3000, len(table)) + table + b"\x02"
    with harness.amqp() as bad:
        bad.handshake()
        bad.open_channel(1)
        bad.send(
            method_frame(1, commands.Basic.Publish(routing_key="poison"))
            + raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 6) + properties)
            + raw_frame(3, 1, b"poison")
        )
        code, text, class_id, method_id = bad.expect_close()
    assert (code, class_id, method_id) == (501, 60, 40)
    assert text.startswith("FRAME_ERROR - cannot decode the message's properties: in header ")
    assert text.endswith("\ufffd...")
    assert len(text.encode()) <= 255
    assert_still_serving(harness)


def test_message_over_max_message_size(tmp_path: Path) -> None:
    # RabbitMQ (max_message_size = 1000): channel.close 406 "PRECONDITION_FAILED - message
    # size 2000 is larger than configured max size 1000", naming basic.publish; the
    # connection stays usable and a message of exactly 1000 bytes is accepted.
    with Harness(tmp_path / "data", max_message_size=1000) as b, b.amqp() as client:
        opened(client)
        declare(client, "limited")
        client.send(publish_frames(1, b"x" * 2000, "limited"))
        code, text, class_id, method_id = client.expect_channel_close(1)
        assert (code, class_id, method_id) == (406, 60, 40)
        assert text == (
            "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
        )
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(1)
        client.send(publish_frames(1, b"y" * 1000, "limited"))
        client.send_method(1, commands.Basic.Get(queue="limited", no_ack=True))
        client.expect_method(commands.Basic.GetOk, channel=1)
        _, data = client.expect_content()
        assert data == b"y" * 1000
        client.close()
        assert_still_serving(b)


# -- writes: many frames at once, one frame in many pieces -------------------------------


def test_many_frames_in_one_write(harness: Harness, raw: RawFactory) -> None:
    client = opened(raw())
    declare(client, "batch")
    frames = b"".join(publish_frames(1, f"m{i}".encode(), "batch") for i in range(100))
    frames += method_frame(1, commands.Queue.Declare(queue="batch", passive=True))
    client.send(frames)
    assert client.expect_method(commands.Queue.DeclareOk).message_count == 100
    client.send(
        b"".join(
            method_frame(1, commands.Basic.Get(queue="batch", no_ack=True)) for _ in range(100)
        )
    )
    for i in range(100):
        client.expect_method(commands.Basic.GetOk, channel=1)
        _, data = client.expect_content()
        assert data == f"m{i}".encode()
    client.close()
    assert_still_serving(harness)


def test_frames_sent_byte_by_byte(harness: Harness, raw: RawFactory) -> None:
    client = raw()
    client.bytewise = True  # every send below goes out one byte per write
    opened(client)
    declare(client, "trickle")
    client.send(publish_frames(1, b"one byte at a time", "trickle"))
    client.send_method(1, commands.Basic.Get(queue="trickle", no_ack=True))
    client.expect_method(commands.Basic.GetOk, channel=1)
    _, data = client.expect_content()
    assert data == b"one byte at a time"
    client.close()
    assert_still_serving(harness)


# -- vanishing clients ------------------------------------------------------------------


def test_client_vanishes_mid_frame(harness: Harness, raw: RawFactory) -> None:
    client = opened(raw())
    declare(client, "mine", exclusive=True)
    declare(client, "shared")
    for i in range(3):
        client.send(publish_frames(1, f"s{i}".encode(), "shared"))
    client.send_method(1, commands.Basic.Consume(queue="shared"))
    client.expect_method(commands.Basic.ConsumeOk)
    for _ in range(3):
        client.expect_method(commands.Basic.Deliver)
        client.expect_content()
    assert queue_counts(harness, "shared") == (0, 3, 1)
    client.send(publish_frames(1, b"never finished", "shared")[:13])
    client.close_socket()  # the transport's connection_lost, on the broker's loop
    harness.pump()
    assert harness.call(lambda: len(harness.broker.connections)) == 0
    # The exclusive queue is gone, the unacked messages are back, the consumer is gone.
    assert queue_counts(harness, "mine") is None
    assert queue_counts(harness, "shared") == (3, 0, 0)
    assert_still_serving(harness)


def test_unacked_messages_of_a_vanished_client_are_redelivered(
    harness: Harness, raw: RawFactory
) -> None:
    client = opened(raw())
    declare(client, "jobs")
    for i in range(5):
        client.send(publish_frames(1, f"job{i}".encode(), "jobs"))
    client.send_method(1, commands.Basic.Consume(queue="jobs"))
    client.expect_method(commands.Basic.ConsumeOk)
    for i in range(5):
        deliver = client.expect_method(commands.Basic.Deliver)
        assert not deliver.redelivered
        assert client.expect_content()[1] == f"job{i}".encode()
    with harness.amqp() as other:
        opened(other)
        # Subscribed while the raw client still holds every message, then it vanishes.
        other.send_method(1, commands.Basic.Consume(queue="jobs"))
        other.expect_method(commands.Basic.ConsumeOk, channel=1)
        assert queue_counts(harness, "jobs") == (0, 5, 2)
        client.close_socket()
        got: list[tuple[bytes, bool]] = []
        for _ in range(5):
            deliver = other.expect_method(commands.Basic.Deliver, channel=1)
            got.append((other.expect_content()[1], bool(deliver.redelivered)))
            other.send_method(1, commands.Basic.Ack(delivery_tag=deliver.delivery_tag))
        assert got == [(f"job{i}".encode(), True) for i in range(5)]
        other.close()
    assert queue_counts(harness, "jobs") == (0, 0, 0)
    assert_still_serving(harness)


# -- timeouts (heartbeats: test_amqp_heartbeats.py) ------------------------------------


@pytest.mark.parametrize("send_header", [True, False], ids=["header-only", "nothing"])
def test_handshake_timeout(tmp_path: Path, send_header: bool) -> None:
    # RabbitMQ (handshake_timeout 10 s): after connection.start and nothing more, the
    # socket closes 10 s later without a connection.close. The broker's ManualClock
    # is moved to the deadline; the timer is the listener's protocol's, armed when
    # the connection is accepted (made).
    with Harness(tmp_path / "data", clock=ManualClock()) as b:
        protocols = b.amqp_listener.protocols
        with b.amqp_protocol() as client:
            if send_header:
                client.send(PROTOCOL_HEADER)
                client.expect_method(commands.Connection.Start)
            b.advance(HANDSHAKE_TIMEOUT_MS - 1)
            assert len(protocols) == 1
            b.advance(1)
            assert client.frames_until_eof(timeout=5) == []
            assert len(protocols) == 0
        assert_still_serving(b)


# -- isolation --------------------------------------------------------------------------


def test_bad_connection_does_not_disturb_a_consumer(harness: Harness, raw: RawFactory) -> None:
    with harness.amqp() as pub, harness.amqp() as sub:
        opened(pub)
        opened(sub)
        declare(pub, "steady")
        sub.send_method(1, commands.Basic.Qos(prefetch_count=10))
        sub.expect_method(commands.Basic.QosOk, channel=1)
        got: list[bytes] = []

        def consume_until(count: int) -> None:
            while len(got) < count:
                deliver = sub.expect_method(commands.Basic.Deliver, channel=1)
                got.append(sub.expect_content()[1])
                sub.send_method(1, commands.Basic.Ack(delivery_tag=deliver.delivery_tag))

        sub.send_method(1, commands.Basic.Consume(queue="steady"))
        sub.expect_method(commands.Basic.ConsumeOk, channel=1)
        for i in range(100):
            pub.send(publish_frames(1, f"n{i}".encode(), "steady"))
        consume_until(40)
        assert queue_counts(harness, "steady") == (50, 10, 1)
        # Deliveries are in flight (prefetch 10) while another client breaks the protocol.
        bad = opened(raw())
        bad.send(raw_frame(1, 1, method_payload(commands.Basic.Qos(prefetch_count=1)), end=0))
        assert_closed_with(bad, 501, "FRAME_ERROR - ")
        for i in range(100, 200):
            pub.send(publish_frames(1, f"n{i}".encode(), "steady"))
        consume_until(200)
        assert got == [f"n{i}".encode() for i in range(200)]
        sub.close()
        pub.send_method(1, commands.Queue.Delete(queue="steady"))
        pub.expect_method(commands.Queue.DeleteOk, channel=1)
        pub.close()
    assert_still_serving(harness)


def test_access_request_is_granted_like_rabbitmq(harness: Harness) -> None:
    # Deprecated in 0-9-1, still sent by old clients: RabbitMQ answers request-ok, ticket 1.
    with harness.amqp() as client:
        client.handshake()
        client.open_channel(1)
        # pamqp 4 has no access class, so frame and parse it by hand.
        realm = b"/data"
        payload = struct.pack(">HHB", 30, 10, len(realm)) + realm + b"\x1c"
        client.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
        expected = struct.pack(">BHIHHH", 1, 1, 6, 30, 11, 1) + b"\xce"
        deadline = time.monotonic() + 5
        while len(client.buf) < len(expected) and client._recv(deadline):
            pass
        assert client.buf == expected
    assert_still_serving(harness)


def test_trailing_bytes_after_method_arguments_are_a_frame_error(harness: Harness) -> None:
    # RabbitMQ 3.10: "FRAME_ERROR - cannot decode ..." for a basic.qos with extra bytes.
    with harness.amqp() as client:
        client.handshake()
        client.open_channel(1)
        payload = struct.pack(">HHIHB", 60, 10, 0, 1, 0) + b"xyz"
        client.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
        code, _text, class_id, method_id = client.expect_close()
        assert (code, class_id, method_id) == (501, 60, 10)
    assert_still_serving(harness)
