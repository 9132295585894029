"""Scenarios: framing and protocol misbehaviour after the handshake."""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from .common import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, Observation, scenario
from .raw import RawClient, describe, raw_client, raw_frame, raw_get, raw_method, shortstr

# ======================================================================================
# Scenarios: framing and protocol misbehaviour after the handshake
# ======================================================================================


def after_handshake(
    host: str,
    port: int,
    data: bytes | Callable[[RawClient], None],
    *,
    ping: int | None = 1,
    **handshake: Any,
) -> Observation:
    """Handshake (channel 1 open), send ``data`` (or run it), observe with a ping on ch 1."""
    with raw_client(host, port) as client:
        client.handshake(**handshake)
        if callable(data):
            data(client)
        else:
            client.send(data)
        return client.observe(ping=ping)


@scenario()
def s_frame_larger_than_frame_max(host: str, port: int) -> Observation:
    """frame_max negotiated to 4096; a body frame of 5000 payload bytes."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 5000, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"x" * 5000))

    return after_handshake(host, port, send, frame_max=4096)


def _body_frame_probe(host: str, port: int, payload_size: int) -> Observation:
    """frame_max negotiated to 4096; publish with one body frame of ``payload_size`` bytes."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(
            pframe.marshal(pheader.ContentHeader(0, payload_size, commands.Basic.Properties()), 1)
        )
        client.send(raw_frame(FRAME_BODY, 1, b"x" * payload_size))

    return after_handshake(host, port, send, frame_max=4096)


@scenario()
def s_frame_exactly_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame of exactly 4096 bytes in total (payload 4088)."""
    return _body_frame_probe(host, port, 4088)


@scenario()
def s_frame_one_over_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame of 4097 bytes in total (payload 4089)."""
    return _body_frame_probe(host, port, 4089)


@scenario()
def s_frame_payload_equals_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame whose payload alone is 4096 bytes (4104 in total)."""
    return _body_frame_probe(host, port, 4096)


@scenario()
def s_frame_payload_exceeds_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame whose payload is 4097 bytes (4105 in total)."""
    return _body_frame_probe(host, port, 4097)


@scenario()
def s_frame_unknown_type(host: str, port: int) -> Observation:
    """A frame of type 9 on channel 0."""
    return after_handshake(host, port, raw_frame(9, 0, b"\x00\x00\x00\x00"))


@scenario()
def s_frame_unknown_type_on_channel(host: str, port: int) -> Observation:
    """A frame of type 9 on channel 1."""
    return after_handshake(host, port, raw_frame(9, 1, b"\x00\x00\x00\x00"))


@scenario()
def s_frame_bad_end_octet(host: str, port: int) -> Observation:
    """A channel.open frame (channel 2) whose frame-end octet is 0x00."""
    return after_handshake(host, port, raw_method(2, 20, 10, shortstr(""))[:-1] + b"\x00")


@scenario()
def s_frame_heartbeat_on_channel_1(host: str, port: int) -> Observation:
    """A heartbeat frame on channel 1."""
    return after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 1, b""))


@scenario()
def s_frame_heartbeat_with_payload(host: str, port: int) -> Observation:
    """A heartbeat frame on channel 0 with a 2-byte payload."""
    return after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 0, b"hi"))


@scenario()
def s_frame_heartbeat_ok(host: str, port: int) -> Observation:
    """A well-formed heartbeat frame on channel 0 (nothing should happen)."""
    return after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 0, b""))


@scenario()
def s_method_unknown_class(host: str, port: int) -> Observation:
    """Method 99/10 on open channel 1."""
    return after_handshake(host, port, raw_method(1, 99, 10))


@scenario()
def s_method_unknown_class_on_channel_0(host: str, port: int) -> Observation:
    """Method 99/10 on channel 0."""
    return after_handshake(host, port, raw_method(0, 99, 10))


@scenario()
def s_method_unknown_method(host: str, port: int) -> Observation:
    """Method 60/99 (unknown method in class basic) on open channel 1."""
    return after_handshake(host, port, raw_method(1, 60, 99))


@scenario()
def s_method_server_only_method_from_client(host: str, port: int) -> Observation:
    """basic.deliver (60/60) with content, sent by the client on channel 1."""

    def send(client: RawClient) -> None:
        args = shortstr("ctag") + struct.pack(">QB", 1, 0) + shortstr("") + shortstr("rk")
        client.send(raw_method(1, 60, 60, args))
        client.content(1, b"abc")

    return after_handshake(host, port, send)


@scenario()
def s_method_server_only_sync_method_from_client(host: str, port: int) -> Observation:
    """queue.declare-ok (50/11) sent by the client on channel 1."""
    args = shortstr("compat-q") + struct.pack(">II", 0, 0)
    return after_handshake(host, port, raw_method(1, 50, 11, args))


@scenario()
def s_method_on_unopened_channel(host: str, port: int) -> Observation:
    """basic.qos on channel 5, which was never opened."""
    return after_handshake(host, port, pframe.marshal(commands.Basic.Qos(prefetch_count=1), 5))


@scenario()
def s_method_on_closed_channel(host: str, port: int) -> Observation:
    """basic.qos on channel 2 after it was opened and closed again."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.call(2, commands.Channel.Close(200, "bye", 0, 0), "Channel.CloseOk")
        client.method(2, commands.Basic.Qos(prefetch_count=1))

    return after_handshake(host, port, send)


@scenario()
def s_channel_open_twice(host: str, port: int) -> Observation:
    """channel.open on channel 1, which is already open."""
    return after_handshake(host, port, pframe.marshal(commands.Channel.Open(), 1))


@scenario()
def s_channel_open_above_channel_max(host: str, port: int) -> Observation:
    """channel.open on channel_max + 1 (channel_max as proposed by the server)."""

    def send(client: RawClient) -> None:
        client.method(2048, commands.Channel.Open())

    return after_handshake(host, port, send)


@scenario()
def s_channel_open_at_channel_max(host: str, port: int) -> Observation:
    """channel.open on the negotiated channel_max itself (10) works."""

    def send(client: RawClient) -> None:
        client.method(10, commands.Channel.Open())

    return after_handshake(host, port, send, channel_max=10)


@scenario()
def s_channel_open_above_negotiated_channel_max(host: str, port: int) -> Observation:
    """channel_max negotiated to 10; channel.open on channel 11."""

    def send(client: RawClient) -> None:
        client.method(11, commands.Channel.Open())

    return after_handshake(host, port, send, channel_max=10)


@scenario()
def s_channel_open_count_above_negotiated_channel_max(host: str, port: int) -> Observation:
    """channel_max negotiated to 2; channels 1 and 2 open; channel.open on channel 3."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.method(3, commands.Channel.Open())

    return after_handshake(host, port, send, channel_max=2)


@scenario()
def s_channel_open_on_channel_0(host: str, port: int) -> Observation:
    """channel.open on channel 0."""
    return after_handshake(host, port, pframe.marshal(commands.Channel.Open(), 0))


@scenario()
def s_channel_method_on_channel_0(host: str, port: int) -> Observation:
    """basic.qos on channel 0."""
    return after_handshake(host, port, pframe.marshal(commands.Basic.Qos(prefetch_count=1), 0))


@scenario()
def s_connection_method_on_channel_1(host: str, port: int) -> Observation:
    """connection.tune-ok sent on channel 1."""
    return after_handshake(
        host, port, pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 1)
    )


@scenario()
def s_content_header_without_publish(host: str, port: int) -> Observation:
    """A content header frame on channel 1 with no basic.publish before it."""
    return after_handshake(
        host, port, pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1)
    )


@scenario()
def s_content_body_without_publish(host: str, port: int) -> Observation:
    """A content body frame on channel 1 with no basic.publish before it."""
    return after_handshake(host, port, raw_frame(FRAME_BODY, 1, b"abc"))


@scenario()
def s_content_body_without_header(host: str, port: int) -> Observation:
    """basic.publish followed directly by a body frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(raw_frame(FRAME_BODY, 1, b"abc"))

    return after_handshake(host, port, send)


@scenario()
def s_content_body_longer_than_header(host: str, port: int) -> Observation:
    """Header announces 5 bytes, the body frame carries 10."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 5, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"0123456789"))

    return after_handshake(host, port, send)


@scenario()
def s_content_extra_body_frame(host: str, port: int) -> Observation:
    """Header announces 3 bytes, then a 3-byte body frame and another 3-byte body frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"abc") + raw_frame(FRAME_BODY, 1, b"def"))

    return after_handshake(host, port, send)


@scenario()
def s_content_method_while_body_expected(host: str, port: int) -> Observation:
    """Header announces 10 bytes, 4 arrive, then a basic.qos method frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 10, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"0123"))
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return after_handshake(host, port, send)


@scenario()
def s_content_method_while_header_expected(host: str, port: int) -> Observation:
    """basic.publish then a basic.qos method frame instead of the content header."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return after_handshake(host, port, send)


@scenario()
def s_content_header_wrong_class(host: str, port: int) -> Observation:
    """basic.publish then a content header whose class id is 50 (queue)."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQH", 50, 0, 0, 0)))

    return after_handshake(host, port, send)


@scenario()
def s_content_header_on_other_channel(host: str, port: int) -> Observation:
    """basic.publish on channel 1, its content header on (open) channel 2."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 2))

    return after_handshake(host, port, send, ping=2)


@scenario()
def s_content_zero_body_size(host: str, port: int) -> Observation:
    """A message with body_size 0 and no body frame is accepted and can be fetched."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Queue.Declare(queue="compat-empty-body"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-empty-body"))
        client.send(pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 1))

    with raw_client(host, port) as client:
        client.handshake()
        send(client)
        got = raw_get(client, 1, "compat-empty-body", no_ack=True)
        client.call(1, commands.Queue.Delete(queue="compat-empty-body"), "Queue.DeleteOk")
        return {"get": got, **client.observe(ping=1)}


@scenario()
def s_content_multi_frame_body(host: str, port: int) -> Observation:
    """frame_max 4096; a 10000-byte body split over three body frames round-trips."""
    with raw_client(host, port) as client:
        client.handshake(frame_max=4096)
        client.call(1, commands.Queue.Declare(queue="compat-multi-frame"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-multi-frame"))
        body = bytes(i % 251 for i in range(10000))
        client.send(
            pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
        )
        for i in range(0, len(body), 4088):
            client.send(raw_frame(FRAME_BODY, 1, body[i : i + 4088]))
        client.method(1, commands.Basic.Get(queue="compat-multi-frame", no_ack=True))
        client.expect("Basic.GetOk", 1)
        hdr = client.expect("ContentHeader", 1)
        sizes = []
        received = b""
        while len(received) < hdr.body_size:
            chunk = client.expect("ContentBody", 1).value
            sizes.append(len(chunk))
            received += chunk
        client.call(1, commands.Queue.Delete(queue="compat-multi-frame"), "Queue.DeleteOk")
        return {"body_size": hdr.body_size, "body_frame_sizes": sizes, "intact": received == body}


@scenario()
def s_garbage_after_handshake(host: str, port: int) -> Observation:
    """Fifteen bytes of text after a completed handshake."""
    return after_handshake(host, port, b"hello, world!\r\n", ping=None)


@scenario()
def s_method_truncated_payload(host: str, port: int) -> Observation:
    """queue.declare whose queue-name shortstr claims 10 bytes but the frame ends after 3."""
    args = struct.pack(">H", 0) + b"\x0aabc"
    return after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario()
def s_method_payload_too_short_for_ids(host: str, port: int) -> Observation:
    """A method frame with a 2-byte payload (no method id)."""
    return after_handshake(host, port, raw_frame(FRAME_METHOD, 1, b"\x00\x3c"))


@scenario()
def s_method_trailing_garbage(host: str, port: int) -> Observation:
    """basic.qos with 4 extra bytes after its arguments."""
    args = struct.pack(">IHB", 0, 1, 0) + b"junk"
    return after_handshake(host, port, raw_method(1, 60, 10, args))


@scenario()
def s_method_invalid_table(host: str, port: int) -> Observation:
    """queue.declare whose arguments table contains an unknown field type 'Z'."""
    table = shortstr("x-compat") + b"Z" + b"\x00"
    args = (
        struct.pack(">H", 0)
        + shortstr("compat-bad-table")
        + b"\x00"
        + struct.pack(">I", len(table))
        + table
    )
    return after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario()
def s_publish_immediate(host: str, port: int) -> Observation:
    """basic.publish with immediate=true."""

    def send(client: RawClient) -> None:
        client.publish(1, b"imm", "amq.direct", "compat-nowhere", immediate=True)

    return after_handshake(host, port, send)


@scenario()
def s_publish_mandatory_unroutable_confirm(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish with no route: frames received, in order."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere", mandatory=True)

    return after_handshake(host, port, send)


@scenario()
def s_publish_mandatory_routable_confirm(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish to a queue via the default exchange."""

    def send(client: RawClient) -> None:
        client.call(
            1,
            commands.Queue.Declare(queue="compat-mandatory-ok", exclusive=True),
            "Queue.DeclareOk",
        )
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "", "compat-mandatory-ok", mandatory=True)

    return after_handshake(host, port, send)


@scenario()
def s_channel_flow_inactive(host: str, port: int) -> Observation:
    """channel.flow active=false from the client."""
    return after_handshake(host, port, pframe.marshal(commands.Channel.Flow(active=False), 1))


@scenario()
def s_channel_flow_active(host: str, port: int) -> Observation:
    """channel.flow active=true from the client."""
    return after_handshake(host, port, pframe.marshal(commands.Channel.Flow(active=True), 1))


@scenario()
def s_client_connection_close_with_open_channel(host: str, port: int) -> Observation:
    """connection.close from the client while channel 1 is open."""
    return after_handshake(
        host, port, pframe.marshal(commands.Connection.Close(200, "Goodbye", 0, 0), 0), ping=None
    )


@scenario()
def s_client_channel_close(host: str, port: int) -> Observation:
    """channel.close from the client, then channel.open on the same number again."""
    with raw_client(host, port) as client:
        client.handshake()
        client.method(1, commands.Channel.Close(200, "bye", 0, 0))
        first = client.next_frame()
        client.method(1, commands.Channel.Open())
        second = client.next_frame()
        return {
            "after_close": describe(first.channel, first.frame)
            if first.kind == "frame"
            else first.kind,
            "after_reopen": describe(second.channel, second.frame)
            if second.kind == "frame"
            else second.kind,
            **client.observe(ping=1),
        }


@scenario()
def s_client_close_ok_without_close(host: str, port: int) -> Observation:
    """connection.close-ok from the client without any connection.close."""
    return after_handshake(host, port, pframe.marshal(commands.Connection.CloseOk(), 0))


@scenario()
def s_client_channel_close_ok_without_close(host: str, port: int) -> Observation:
    """channel.close-ok on open channel 1 without any channel.close."""
    return after_handshake(host, port, pframe.marshal(commands.Channel.CloseOk(), 1))


@scenario()
def s_client_connection_close_then_method(host: str, port: int) -> Observation:
    """connection.close from the client, then (before close-ok arrives) a basic.qos on channel 1."""

    def send(client: RawClient) -> None:
        client.method(0, commands.Connection.Close(200, "Goodbye", 0, 0))
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return after_handshake(host, port, send, ping=None)


@scenario()
def s_connection_open_twice(host: str, port: int) -> Observation:
    """A second connection.open after the handshake completed."""
    return after_handshake(
        host, port, pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
    )


@scenario()
def s_method_before_open(host: str, port: int) -> Observation:
    """channel.open sent after tune-ok but before connection.open."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.method(1, commands.Channel.Open())
        return client.observe()


@scenario()
def s_basic_recover_async(host: str, port: int) -> Observation:
    """Two unacked basic.get messages, then basic.recover-async requeue=true; get again."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(
            1,
            commands.Queue.Declare(queue="compat-recover-async", exclusive=True),
            "Queue.DeclareOk",
        )
        client.publish(1, b"m1", "", "compat-recover-async")
        client.publish(1, b"m2", "", "compat-recover-async")
        first = [raw_get(client, 1, "compat-recover-async") for _ in range(2)]
        with warnings.catch_warnings():  # pamqp warns that the method is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            recover_async = commands.Basic.RecoverAsync(requeue=True)
        client.method(1, recover_async)
        obs = client.observe(ping=1)
        second = [raw_get(client, 1, "compat-recover-async") for _ in range(3)]
        return {"first": first, "after_recover_async": obs, "second": second}
