"""Scenarios: stream queues, consuming, settling and x-stream-offset."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Sequence
from typing import Any

from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from .common import Observation, scenario
from .raw import raw_client, raw_method, shortstr
from .stream_session import (
    StreamSession,
    brief,
    briefed,
    by_channel,
    consume_stream,
    stream_session,
)

# -- consume ---------------------------------------------------------------------------

STREAM_CONSUME_QUEUE = "compat-stream-consume"
FIVE = ("m1", "m2", "m3", "m4", "m5")


def _stream_consume_probe(
    host: str,
    port: int,
    arguments: dict[str, Any] | None,
    *,
    prefetch: int | None = 10,
    late: Sequence[str] = ("late1", "late2"),
    **flags: Any,
) -> Observation:
    """m1..m5 published one at a time (each its own chunk); channel 2 consumes with
    ``arguments``; what it gets; then, if the connection survived, ``late`` published
    (one at a time) and what it gets of those. Deliveries in brief."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, arguments, prefetch=prefetch, **flags)
        first = session.settle()
        obs: Observation = {"consume": {k: brief(v) for k, v in by_channel(first).items()}}
        if not session.eof and late:
            session.publish(late, STREAM_CONSUME_QUEUE)
            obs["after_late_publish"] = {
                k: brief(v) for k, v in by_channel(session.settle()).items()
            }
        final = session.outcome([])
        obs.update(briefed(final))
        return obs


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_without_qos(host: str, port: int) -> Observation:
    """basic.consume on a stream from a channel that never sent basic.qos (prefetch 0)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"}, prefetch=None)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_global_qos(host: str, port: int) -> Observation:
    """basic.consume on a stream from a channel with only a global basic.qos (prefetch 10,
    global=true)."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        session.call(2, commands.Basic.Qos(prefetch_count=10, global_=True), "Basic.QosOk")
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, prefetch=None)
        obs = session.outcome(session.settle())
        return briefed(obs)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_no_ack(host: str, port: int) -> Observation:
    """basic.consume no_ack=true on a stream (prefetch 10)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"}, no_ack=True)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_deliveries(host: str, port: int) -> Observation:
    """Prefetch 10, manual ack; m1..m3 (no properties) read from 'first': every field of
    each basic.deliver, its properties and the field type of each header."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_properties_round_trip(host: str, port: int) -> Observation:
    """A message with every basic property set and scalar headers of each field type
    (b s u I i l t f T S x V) published to a stream, read from 'first': what comes back."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE) as session:
        headers = {
            "b": 1, "neg": -5, "s": 1000, "u": 40000, "I": 100000, "i": 3_000_000_000,
            "l": 2**40, "bool": True, "f": 1.5, "T": datetime.datetime(2020, 1, 2, 3, 4, 5),
            "str": "v", "bytes": bytearray(b"\x01\x02"), "void": None,
        }  # fmt: skip
        props = commands.Basic.Properties(
            content_type="text/plain",
            content_encoding="gzip",
            headers=headers,
            delivery_mode=2,
            priority=3,
            correlation_id="c1",
            reply_to="r1",
            expiration="60000",
            message_id="id1",
            timestamp=datetime.datetime(2021, 5, 6, 7, 8, 9),
            message_type="t1",
            user_id="guest",
            app_id="a1",
        )
        session.publish(["full"], STREAM_CONSUME_QUEUE, properties=props)
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_nested_headers(host: str, port: int) -> Observation:
    """Messages with a table header {tbl: {k: 1}}, an array header {arr: [1, 'a']}, and
    both beside a string header, published to a stream and read from 'first'."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE) as session:
        for headers in (
            {"tbl": {"k": 1}},
            {"arr": [1, "a"]},
            {"tbl": {"k": 1}, "arr": [1, "a"], "str": "v"},
        ):
            props = commands.Basic.Properties(headers=headers)
            session.publish(["m"], STREAM_CONSUME_QUEUE, properties=props)
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_publisher_offset_header(host: str, port: int) -> Observation:
    """A message published with its own header x-stream-offset=99 (and x-stream-timestamp
    'x'), read from 'first': which values the consumer sees."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, ["m1"]) as session:
        props = commands.Basic.Properties(
            headers={"x-stream-offset": 99, "x-stream-timestamp": "x"}
        )
        session.publish(["m2"], STREAM_CONSUME_QUEUE, properties=props)
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_prefetch_credit(host: str, port: int) -> Observation:
    """Prefetch 2 and m1..m6 in the stream, read from 'first': what comes at once; after
    acking tag 1; after acking up to tag 3 with multiple=true; after acking everything."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, [*FIVE, "m6"]) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, prefetch=2)
        steps = {"initial": brief(session.settle())}
        for name, tag, multiple in (
            ("after_ack_1", 1, False),
            ("after_ack_multiple_3", 3, True),
            ("after_ack_multiple_5", 5, True),
        ):
            session.client.method(2, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
            steps[name] = brief(session.settle())
        return {**steps, "socket": session.outcome([])["socket"]}


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_two_channels(host: str, port: int) -> Observation:
    """Two consumers on channels 2 and 3, both from 'first' (prefetch 10): each reads all
    of m1..m3 independently (delivery tags are per channel)."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        consume_stream(s, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, tag="a")
        consume_stream(s, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b")
        obs = s.outcome(s.settle())
        return briefed(obs)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_two_on_one_channel(host: str, port: int) -> Observation:
    """Consumer 'a' from 'first' on channel 2 reads m1..m3; then consumer 'b' from offset 1
    on the same channel; then m4 is published: who gets what, with which tags. Which of
    the two gets m4 first varies on RabbitMQ, so for m4 only the deliveries (by consumer
    tag, without their tags) and the set of delivery tags used are recorded."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, tag="a")
        a = brief(session.settle())
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE, consumer_tag="b", arguments={"x-stream-offset": 1}
            ),
        )
        b = brief(session.settle())
        session.publish(["m4"], STREAM_CONSUME_QUEUE)
        late = brief(session.settle())
        return {
            "consumer_a": a,
            "consumer_b": b,
            "after_publish_m4": sorted(
                ({k: v for k, v in f.items() if k != "delivery_tag"} for f in late),
                key=lambda f: str(f.get("consumer_tag")),
            ),
            "after_publish_m4_delivery_tags": sorted(f.get("delivery_tag", 0) for f in late),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_ack_cancel_next(host: str, port: int) -> Observation:
    """Read m1..m3 from 'first', ack all, cancel, consume again from 'next' on the same
    channel (nothing: there is no server-side position), then m4 is published."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        first = brief(session.settle())
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        cancel = session.call(
            2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk"
        )
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE,
                consumer_tag="compat-ctag-2",
                arguments={"x-stream-offset": "next"},
            ),
        )
        again = brief(session.settle())
        session.publish(["m4"], STREAM_CONSUME_QUEUE)
        return {
            "first": first,
            "cancel": brief([cancel]),
            "consume_next": again,
            "after_publish_m4": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_cancel_unacked_then_first(host: str, port: int) -> Observation:
    """Read m1..m3 from 'first' without acking; cancel; ack tag 3 multiple=true (after the
    cancel); consume again from 'first' on the same channel."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        first = brief(session.settle())
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE,
                consumer_tag="compat-ctag-2",
                arguments={"x-stream-offset": "first"},
            ),
        )
        return {
            "first": first,
            "after_ack_and_consume": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


def stream_settle_probe(
    host: str, port: int, method: PamqpMethod, queue: str = STREAM_CONSUME_QUEUE
) -> Observation:
    """m1..m3 read from 'first' on channel 2 (not acked); then ``method`` on channel 2."""
    with stream_session(host, port, queue, FIVE[:3]) as session:
        consume_stream(session, queue, {"x-stream-offset": "first"})
        got = brief(session.settle())
        session.client.method(2, method)
        obs = session.outcome(session.settle())
        return {"got": got, **briefed(obs)}


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_nack_requeue(host: str, port: int) -> Observation:
    """basic.nack requeue=true of a stream delivery (tag 1)."""
    return stream_settle_probe(host, port, commands.Basic.Nack(delivery_tag=1, requeue=True))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_nack_no_requeue(host: str, port: int) -> Observation:
    """basic.nack requeue=false of a stream delivery (tag 1)."""
    return stream_settle_probe(host, port, commands.Basic.Nack(delivery_tag=1, requeue=False))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_reject_requeue(host: str, port: int) -> Observation:
    """basic.reject requeue=true of a stream delivery (tag 2)."""
    return stream_settle_probe(host, port, commands.Basic.Reject(delivery_tag=2, requeue=True))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_reject_no_requeue(host: str, port: int) -> Observation:
    """basic.reject requeue=false of a stream delivery (tag 2)."""
    return stream_settle_probe(host, port, commands.Basic.Reject(delivery_tag=2, requeue=False))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_ack_unknown_tag(host: str, port: int) -> Observation:
    """basic.ack of delivery tag 9 on a channel holding stream deliveries 1..3."""
    return stream_settle_probe(host, port, commands.Basic.Ack(delivery_tag=9))


# -- x-stream-offset -------------------------------------------------------------------


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_absent(host: str, port: int) -> Observation:
    """m1..m5 in the stream; basic.consume without x-stream-offset; then late1, late2."""
    return _stream_consume_probe(host, port, None)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_first(host: str, port: int) -> Observation:
    """m1..m5 in the stream; x-stream-offset 'first'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_last(host: str, port: int) -> Observation:
    """m1..m5 each published alone (confirm awaited, so each is its own chunk);
    x-stream-offset 'last' (RabbitMQ: from the start of the last chunk); then late1,
    late2. (Messages published in one burst may share a chunk, and 'last' then delivers
    that whole chunk: timing dependent, not recorded.)"""
    return _stream_consume_probe(host, port, {"x-stream-offset": "last"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_next(host: str, port: int) -> Observation:
    """m1..m5 in the stream; x-stream-offset 'next'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "next"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_integer(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 3 (pamqp sends it as 'b', a signed 8-bit
    integer); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 3})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_integer_long(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 2 sent as 'l' (signed 64-bit, by hand); then late1, late2."""
    table = shortstr("x-stream-offset") + b"l" + struct.pack(">q", 2)
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        session.call(2, commands.Basic.Qos(prefetch_count=10), "Basic.QosOk")
        args = (
            struct.pack(">H", 0)
            + shortstr(STREAM_CONSUME_QUEUE)
            + shortstr("compat-ctag")
            + b"\x00"
            + struct.pack(">I", len(table))
            + table
        )
        session.client.send(raw_method(2, 60, 20, args))
        first = brief(session.settle())
        session.publish(["late1", "late2"], STREAM_CONSUME_QUEUE)
        return {
            "consume": first,
            "after_late_publish": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_at_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 5 (the next offset); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 5})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_past_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 6; then late1, late2 (offsets 5, 6)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 6})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_far_past_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 100 (pamqp: 'b'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 100})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_negative(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset -1 (pamqp: 'b'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": -1})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_float(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 1.5 (pamqp: 'f', a 32-bit float)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 1.5})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_boolean(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset true (pamqp: 't')."""
    return _stream_consume_probe(host, port, {"x-stream-offset": True})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_timestamp_past(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset the timestamp 2000-01-01T00:00:00Z ('T'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": datetime.datetime(2000, 1, 1)})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_timestamp_future(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset the timestamp 2100-01-01T00:00:00Z ('T'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": datetime.datetime(2100, 1, 1)})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_minute(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1m'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1m"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_hour(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1h'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1h"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_day(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1D'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1D"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_invalid_string(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 'nonsense' (no leading digits: RabbitMQ's interval parser
    crashes, 541)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "nonsense"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_uppercase_first(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 'FIRST' (only lower case names are offset specs)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "FIRST"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_invalid_unit(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset '5X' (digits, then an unknown unit)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "5X"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_zero_interval(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset '0s'."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "0s"})


@scenario(queues=["compat-stream-classic"])
def s_stream_offset_on_classic_queue(host: str, port: int) -> Observation:
    """basic.consume with x-stream-offset on a classic queue, for 'first', 3, 'nonsense'
    and 1.5 (each on a fresh channel)."""
    out: dict[str, Observation] = {}
    with raw_client(host, port) as client:
        client.handshake()
        session = StreamSession(client)
        session.call(
            1,
            commands.Queue.Declare(queue="compat-stream-classic", exclusive=True),
            "Queue.DeclareOk",
        )
        for channel, value in enumerate(("first", 3, "nonsense", 1.5), start=2):
            session.call(channel, commands.Channel.Open(), "Channel.OpenOk")
            session.client.method(
                channel,
                commands.Basic.Consume(
                    queue="compat-stream-classic",
                    consumer_tag="compat-ctag",
                    arguments={"x-stream-offset": value},
                ),
            )
            out[repr(value)] = brief(session.settle())
        out["socket"] = session.outcome([])["socket"]
        return out
