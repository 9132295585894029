"""Scenarios: stream queues, declaring and publishing."""

from __future__ import annotations

import decimal
import time
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from .common import Observation, scenario
from .pika_helpers import attempt, cleanup, connection
from .stream_session import (
    STREAM_ARGS,
    STREAM_COUNT_SETTLE,
    StreamSession,
    briefed,
    consume_stream,
    declare_stream,
    stream_session,
)

# -- declare ---------------------------------------------------------------------------

STREAM_DECLARE_QUEUE = "compat-stream-declare"


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_durable(host: str, port: int) -> Observation:
    """queue.declare durable, x-queue-type=stream; then the same declare again, and a
    passive declare."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def declare(**kw: Any) -> Any:
            return ch.queue_declare(STREAM_DECLARE_QUEUE, arguments=STREAM_ARGS, **kw)

        return {
            "declare": attempt(lambda: declare(durable=True)),
            "redeclare": attempt(lambda: declare(durable=True)),
            "passive": attempt(lambda: ch.queue_declare(STREAM_DECLARE_QUEUE, passive=True)),
        }


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_non_durable(host: str, port: int) -> Observation:
    """queue.declare of a stream with durable=false."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, durable=False)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_exclusive(host: str, port: int) -> Observation:
    """queue.declare of a durable, exclusive stream."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, exclusive=True)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_auto_delete(host: str, port: int) -> Observation:
    """queue.declare of a durable, auto-delete stream."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, auto_delete=True)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_every_flag_wrong(host: str, port: int) -> Observation:
    """queue.declare of a stream non-durable, exclusive and auto-delete: which is named."""
    return declare_stream(
        host, port, STREAM_DECLARE_QUEUE, durable=False, exclusive=True, auto_delete=True
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_non_durable_and_bad_argument(host: str, port: int) -> Observation:
    """queue.declare of a non-durable stream with x-max-age '1X' and, separately, with
    x-max-length 1: are arguments checked before the durable flag?"""
    return {
        "max_age_1X": declare_stream(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-age": "1X"}, durable=False
        ),
        "max_length": declare_stream(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-length": 1}, durable=False
        ),
    }


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_server_named(host: str, port: int) -> Observation:
    """queue.declare with an empty name and x-queue-type=stream (durable)."""
    return declare_stream(host, port, "")


def _stream_redeclare(
    host: str, port: int, first: dict[str, Any], second: dict[str, Any]
) -> Observation:
    with connection(host, port) as conn:
        conn.channel().queue_declare(STREAM_DECLARE_QUEUE, **first)
        return attempt(lambda: conn.channel().queue_declare(STREAM_DECLARE_QUEUE, **second))


_DURABLE_STREAM = {"durable": True, "arguments": STREAM_ARGS}


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_as_classic(host: str, port: int) -> Observation:
    """A stream redeclared durable with x-queue-type=classic."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": True, "arguments": {"x-queue-type": "classic"}}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_as_quorum(host: str, port: int) -> Observation:
    """A stream redeclared durable with x-queue-type=quorum."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_without_queue_type(host: str, port: int) -> Observation:
    """A stream redeclared durable without any x-queue-type argument."""
    return _stream_redeclare(host, port, _DURABLE_STREAM, {"durable": True})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_non_durable(host: str, port: int) -> Observation:
    """A stream redeclared with x-queue-type=stream but durable=false."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": False, "arguments": STREAM_ARGS}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_added_max_age(host: str, port: int) -> Observation:
    """A stream declared without x-max-age, redeclared with x-max-age '1D'."""
    return _stream_redeclare(
        host,
        port,
        _DURABLE_STREAM,
        {"durable": True, "arguments": {**STREAM_ARGS, "x-max-age": "1D"}},
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_passive_other_type(host: str, port: int) -> Observation:
    """A stream passively redeclared with x-queue-type=classic and durable=false."""
    return _stream_redeclare(
        host,
        port,
        _DURABLE_STREAM,
        {"passive": True, "durable": False, "arguments": {"x-queue-type": "classic"}},
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_over_classic(host: str, port: int) -> Observation:
    """A durable classic queue (no x-queue-type) redeclared as a stream."""
    return _stream_redeclare(host, port, {"durable": True}, _DURABLE_STREAM)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_queue_type_case(host: str, port: int) -> Observation:
    """queue.declare with x-queue-type 'STREAM' (upper case)."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                STREAM_DECLARE_QUEUE, durable=True, arguments={"x-queue-type": "STREAM"}
            )
        )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_invalid_unit(host: str, port: int) -> Observation:
    """Stream declared with x-max-age '1X' (unknown unit)."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": "1X"})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_number(host: str, port: int) -> Observation:
    """Stream declared with x-max-age 5 (a number, which pika sends as 'I' signed 32-bit)."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": 5})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_forms(host: str, port: int) -> Observation:
    """Stream declared with each x-max-age string form in turn (each on a fresh queue):
    the accepted units are Y M D h m s after a positive integer; '-1s', ' 1s', 's' and ''
    crash RabbitMQ's connection (541)."""
    forms = ["1Y", "1M", "7D", "1h", "30m", "10s", "007s", "0s", "1d", "1H", "1S", "1h1m",
             "1.5h", "-1s", " 1s", "s", ""]  # fmt: skip
    out: dict[str, Observation] = {}
    for form in forms:
        out[form] = declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": form})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_length_bytes_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-max-length-bytes 'big', then -1, then 0 (fresh queue each)."""
    out: dict[str, Observation] = {}
    for value in ("big", -1, 0):
        out[repr(value)] = declare_stream(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-length-bytes": value}
        )
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_segment_size_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-stream-max-segment-size-bytes 'x', -5, 0, 3000000000 and
    3000000001 (fresh queue each; pika sends the last two as 'l' 64-bit)."""
    out: dict[str, Observation] = {}
    for value in ("x", -5, 0, 3_000_000_000, 3_000_000_001):
        out[repr(value)] = declare_stream(
            host, port, STREAM_DECLARE_QUEUE, {"x-stream-max-segment-size-bytes": value}
        )
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_unknown_argument(host: str, port: int) -> Observation:
    """Stream declared with x-compat=1 (an argument no broker knows)."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-compat": 1})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_valid_arguments(host: str, port: int) -> Observation:
    """Stream declared with x-max-age '7D', x-max-length-bytes 1000000,
    x-stream-max-segment-size-bytes 500000, x-initial-cluster-size 1 and
    x-queue-leader-locator 'balanced', all at once."""
    arguments = {
        "x-max-age": "7D",
        "x-max-length-bytes": 1_000_000,
        "x-stream-max-segment-size-bytes": 500_000,
        "x-initial-cluster-size": 1,
        "x-queue-leader-locator": "balanced",
    }
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, arguments)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_cluster_arguments_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-initial-cluster-size 0, then x-queue-leader-locator 'bogus'."""
    out: dict[str, Observation] = {}
    for key, value in (("x-initial-cluster-size", 0), ("x-queue-leader-locator", "bogus")):
        out[key] = declare_stream(host, port, STREAM_DECLARE_QUEUE, {key: value})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_classic_arguments(host: str, port: int) -> Observation:
    """Stream declared with each argument of classic queues that streams refuse
    (valid values, fresh queue each)."""
    arguments: list[tuple[str, Any]] = [
        ("x-max-length", 5),
        ("x-message-ttl", 1000),
        ("x-expires", 10000),
        ("x-max-priority", 5),
        ("x-dead-letter-exchange", "amq.direct"),
        ("x-overflow", "reject-publish"),
        ("x-queue-mode", "lazy"),
    ]
    out: dict[str, Observation] = {}
    for key, value in arguments:
        out[key] = declare_stream(host, port, STREAM_DECLARE_QUEUE, {key: value})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_single_active_consumer(host: str, port: int) -> Observation:
    """Stream declared with x-single-active-consumer=true."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-single-active-consumer": True})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_filter_size(host: str, port: int) -> Observation:
    """Stream declared with x-stream-filter-size-bytes 16 (a RabbitMQ 3.13 argument)."""
    return declare_stream(host, port, STREAM_DECLARE_QUEUE, {"x-stream-filter-size-bytes": 16})


STREAM_COUNTS_QUEUE = "compat-stream-counts"


def settled_counts(session: StreamSession, queue: str, expect: int) -> dict[str, Any]:
    """Passive declares until message_count is ``expect`` (or STREAM_COUNT_SETTLE passed):
    the settled message_count and every consumer_count seen meanwhile."""
    deadline = time.monotonic() + STREAM_COUNT_SETTLE
    consumer_counts: set[int] = set()
    while True:
        ok = session.call(1, commands.Queue.Declare(queue=queue, passive=True), "Queue.DeclareOk")
        consumer_counts.add(ok["consumer_count"])
        if ok["message_count"] == expect or time.monotonic() > deadline:
            return {
                "message_count": ok["message_count"],
                "consumer_counts": sorted(consumer_counts),
            }
        time.sleep(0.25)


@scenario(queues=[STREAM_COUNTS_QUEUE])
def s_stream_declare_counts(host: str, port: int) -> Observation:
    """message_count / consumer_count of a stream: declare-ok of the fresh stream; after 3
    confirmed publishes (settled: RabbitMQ refreshes the figure every 5 s and reports 0
    until then); with a consumer (prefetch 10) that got and acked all 3; after it is
    cancelled. RabbitMQ counts every message in the stream, read or not, and never
    counts consumers."""
    with stream_session(host, port, STREAM_COUNTS_QUEUE) as session:
        fresh = session.call(
            1,
            commands.Queue.Declare(queue=STREAM_COUNTS_QUEUE, durable=True, arguments=STREAM_ARGS),
            "Queue.DeclareOk",
        )
        session.publish(["m1", "m2", "m3"], STREAM_COUNTS_QUEUE)
        published = settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        consume_stream(session, STREAM_COUNTS_QUEUE, {"x-stream-offset": "first"})
        got = [f["body"] for f in session.settle() if f.get("frame") == "Basic.Deliver"]
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        consumed = settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        cancelled = settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        return {
            "fresh": {k: fresh[k] for k in ("message_count", "consumer_count")},
            "after_publish": published,
            "consumer_got": got,
            "with_consumer_after_ack": consumed,
            "after_cancel": cancelled,
        }


# -- publish ---------------------------------------------------------------------------

STREAM_PUBLISH_QUEUE = "compat-stream-publish"
STREAM_EXCHANGE = "compat-stream-direct"


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_confirms_default_exchange(host: str, port: int) -> Observation:
    """Confirm mode; m1..m3 published to a stream via the default exchange, each confirm
    awaited; then consumed from 'first' (full deliveries)."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        confirms = session.publish(["m1", "m2", "m3"], STREAM_PUBLISH_QUEUE)
        consume_stream(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        return {"confirms": confirms, **session.outcome(session.settle())}


@scenario(queues=[STREAM_PUBLISH_QUEUE], exchanges=[STREAM_EXCHANGE])
def s_stream_publish_confirms_direct_exchange(host: str, port: int) -> Observation:
    """A stream bound to direct exchange compat-stream-direct with key 'rk'; confirm mode;
    m1, m2 published there, m3 via the default exchange; consumed from 'first': the
    exchange and routing key each delivery carries."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        session.call(
            1,
            commands.Exchange.Declare(exchange=STREAM_EXCHANGE, exchange_type="direct"),
            "Exchange.DeclareOk",
        )
        session.call(
            1,
            commands.Queue.Bind(
                queue=STREAM_PUBLISH_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"
            ),
            "Queue.BindOk",
        )
        confirms = session.publish(["m1", "m2"], "rk", STREAM_EXCHANGE)
        confirms += session.publish(["m3"], STREAM_PUBLISH_QUEUE)
        consume_stream(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        return {"confirms": confirms, **session.outcome(session.settle())}


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_batch_confirms(host: str, port: int) -> Observation:
    """Confirm mode; ten publishes to a stream in one write: which tags are confirmed (acks
    expanded, as a broker may merge them), then every message read from 'first'."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        data = b""
        for i in range(10):
            data += pframe.marshal(
                commands.Basic.Publish(exchange="", routing_key=STREAM_PUBLISH_QUEUE), 1
            )
            data += pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1)
            data += pframe.marshal(pbody.ContentBody(f"m{i:02}".encode()), 1)
        session.client.send(data)
        acked: set[int] = set()
        nacked: set[int] = set()
        while max(acked | nacked, default=0) < 10:
            frame = session.wait_for(("Basic.Ack", "Basic.Nack"), 1)
            tag = frame["delivery_tag"]
            tags = set(range(1, tag + 1)) if frame["multiple"] else {tag}
            (acked if frame["frame"] == "Basic.Ack" else nacked).update(tags)
        consume_stream(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        frames = session.settle()
        consumed = [
            [f["body"], f.get("properties", {}).get("headers", {}).get("x-stream-offset")]
            for f in frames
            if f.get("frame") == "Basic.Deliver"
        ]
        return {"acked": sorted(acked), "nacked": sorted(nacked), "consumed": consumed}


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_mandatory(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish to the stream (routable), then mandatory publish to
    amq.direct with no binding (unroutable), each confirm awaited: frames on channel 1."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        routed = session.publish(["m1"], STREAM_PUBLISH_QUEUE, mandatory=True)
        routed_frames = session.settle()
        unrouted = session.publish(["m2"], "compat-nowhere", "amq.direct", mandatory=True)
        return {
            "routable": {"confirms": routed, "other_frames": routed_frames},
            "unroutable": {"confirms": unrouted, "other_frames": session.settle()},
        }


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_tx(host: str, port: int) -> Observation:
    """A tx channel publishes m1 and commits, m2 and rolls back, m3 and commits; the
    stream read from 'first'."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE, channels=(1, 2, 3)) as session:
        session.call(3, commands.Tx.Select(), "Tx.SelectOk")
        for body, end in (("m1", "Commit"), ("m2", "Rollback"), ("m3", "Commit")):
            session.client.publish(3, body.encode(), "", STREAM_PUBLISH_QUEUE)
            if end == "Commit":
                session.call(3, commands.Tx.Commit(), "Tx.CommitOk")
            else:
                session.call(3, commands.Tx.Rollback(), "Tx.RollbackOk")
        consume_stream(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        obs = session.outcome(session.settle())
        return briefed(obs)


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_decimal_header(host: str, port: int) -> Observation:
    """Confirm mode; a message with a decimal header value (D 1.5) published to a stream
    (RabbitMQ 3.10 cannot convert it for the stream and its connection crashes: 541)."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        props = commands.Basic.Properties(headers={"dec": decimal.Decimal("1.5")})
        session.client.publish(1, b"m1", "", STREAM_PUBLISH_QUEUE, properties=props)
        return session.outcome(session.settle())
