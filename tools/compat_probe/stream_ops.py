"""Scenarios: stream queues, refused and other queue operations."""

from __future__ import annotations

from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from .common import Observation, scenario
from .stream_consume import FIVE, stream_settle_probe
from .stream_declare import STREAM_EXCHANGE, settled_counts
from .stream_session import brief, briefed, consume_stream, stream_session

# -- refusals and other queue operations -----------------------------------------------

STREAM_OPS_QUEUE = "compat-stream-ops"


def stream_op(host: str, port: int, method: PamqpMethod, consume: bool = False) -> Observation:
    """m1..m3 in the stream (and, with ``consume``, read unacked by a consumer on channel
    3); ``method`` sent on channel 2: frames per channel and the socket."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        if consume:
            consume_stream(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3)
            s.settle()
        s.client.method(2, method)
        obs = s.outcome(s.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_get(host: str, port: int) -> Observation:
    """basic.get (no_ack=false) on a stream holding m1..m3."""
    return stream_op(host, port, commands.Basic.Get(queue=STREAM_OPS_QUEUE))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_get_no_ack(host: str, port: int) -> Observation:
    """basic.get no_ack=true on a stream holding m1..m3."""
    return stream_op(host, port, commands.Basic.Get(queue=STREAM_OPS_QUEUE, no_ack=True))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_purge(host: str, port: int) -> Observation:
    """queue.purge of a stream holding m1..m3."""
    return stream_op(host, port, commands.Queue.Purge(queue=STREAM_OPS_QUEUE))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete(host: str, port: int) -> Observation:
    """queue.delete of a stream holding m1..m3 (its message_count has settled at 3)."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        settled = settled_counts(session, STREAM_OPS_QUEUE, 3)
        session.client.method(2, commands.Queue.Delete(queue=STREAM_OPS_QUEUE))
        obs = session.outcome(session.settle())
        session.client.method(2, commands.Queue.Declare(queue=STREAM_OPS_QUEUE, passive=True))
        after = session.outcome(session.settle())
        return {"settled_before": settled, "delete": obs, "passive_declare_after": after}


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete_if_empty(host: str, port: int) -> Observation:
    """queue.delete if_empty=true of a stream holding m1..m3."""
    return stream_op(host, port, commands.Queue.Delete(queue=STREAM_OPS_QUEUE, if_empty=True))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete_if_unused(host: str, port: int) -> Observation:
    """queue.delete if_unused=true (channel 2) of a stream a consumer on channel 3 reads."""
    return stream_op(
        host, port, commands.Queue.Delete(queue=STREAM_OPS_QUEUE, if_unused=True), consume=True
    )


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_requeue(host: str, port: int) -> Observation:
    """basic.recover requeue=true on a channel holding unacked stream deliveries."""
    return stream_settle_probe(host, port, commands.Basic.Recover(requeue=True), STREAM_OPS_QUEUE)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_no_requeue(host: str, port: int) -> Observation:
    """basic.recover requeue=false on a channel holding unacked stream deliveries."""
    return stream_settle_probe(host, port, commands.Basic.Recover(requeue=False), STREAM_OPS_QUEUE)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_all_acked(host: str, port: int) -> Observation:
    """basic.recover requeue=true on a channel whose stream consumer acked all it got."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"})
        session.settle()
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        session.client.method(2, commands.Basic.Recover(requeue=True))
        obs = session.outcome(session.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_after_cancel(host: str, port: int) -> Observation:
    """basic.recover requeue=true after a stream consumer was cancelled with m1..m3 unacked."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"})
        session.settle()
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        session.client.method(2, commands.Basic.Recover(requeue=True))
        obs = session.outcome(session.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE], exchanges=[STREAM_EXCHANGE])
def s_stream_bind_unbind(host: str, port: int) -> Observation:
    """A stream bound to direct exchange compat-stream-direct (key 'rk'); mandatory
    publishes there before and after queue.unbind; the stream read from 'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE) as session:
        session.call(
            1,
            commands.Exchange.Declare(exchange=STREAM_EXCHANGE, exchange_type="direct"),
            "Exchange.DeclareOk",
        )
        bind = session.call(
            2,
            commands.Queue.Bind(queue=STREAM_OPS_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"),
            "Queue.BindOk",
        )
        bound = session.publish(["bound"], "rk", STREAM_EXCHANGE, mandatory=True)
        bound_returns = session.settle()
        unbind = session.call(
            2,
            commands.Queue.Unbind(
                queue=STREAM_OPS_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"
            ),
            "Queue.UnbindOk",
        )
        unbound = session.publish(["unbound"], "rk", STREAM_EXCHANGE, mandatory=True)
        unbound_returns = session.settle()
        consume_stream(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=2)
        return {
            "bind": bind["frame"],
            "publish_bound": {"confirms": bound, "other_frames": bound_returns},
            "unbind": unbind["frame"],
            "publish_unbound": {"confirms": unbound, "other_frames": unbound_returns},
            "consume": brief(session.settle()),
        }


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_exclusive(host: str, port: int) -> Observation:
    """An exclusive consumer (channel 2) on a stream, then a second, non-exclusive one
    (channel 3); both from 'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        consume_stream(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, tag="a", exclusive=True)
        s.settle()
        consume_stream(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b")
        obs = s.outcome(s.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_exclusive_when_consumer_exists(host: str, port: int) -> Observation:
    """A consumer (channel 2) on a stream, then an exclusive one (channel 3); both from
    'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        consume_stream(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, tag="a")
        s.settle()
        consume_stream(
            s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b", exclusive=True
        )
        obs = s.outcome(s.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_priority(host: str, port: int) -> Observation:
    """basic.consume on a stream with x-priority 5 (and x-stream-offset 'first')."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        consume_stream(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first", "x-priority": 5})
        obs = session.outcome(session.settle())
        return briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_filter(host: str, port: int) -> Observation:
    """Stream filtering (a RabbitMQ 3.13 feature): m1 published with header
    x-stream-filter-value 'f1', m2 with 'f2', m3 without; consumed from 'first' with
    x-stream-filter 'f1' and x-stream-match-unfiltered false."""
    with stream_session(host, port, STREAM_OPS_QUEUE) as session:
        for body, value in (("m1", "f1"), ("m2", "f2"), ("m3", None)):
            headers = {"x-stream-filter-value": value} if value else None
            session.publish(
                [body], STREAM_OPS_QUEUE, properties=commands.Basic.Properties(headers=headers)
            )
        consume_stream(
            session,
            STREAM_OPS_QUEUE,
            {
                "x-stream-offset": "first",
                "x-stream-filter": "f1",
                "x-stream-match-unfiltered": False,
            },
        )
        obs = session.outcome(session.settle())
        return briefed(obs)
