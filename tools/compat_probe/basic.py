"""Scenarios: basic (consume, ack, qos, get, return, recover)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from pamqp import commands

from .common import CLIENT_CAPABILITIES, TIMEOUT, Observation, ProbeError, scenario
from .framing import after_handshake
from .pika_helpers import attempt, connection, drain, get_all, get_one, publish_bodies, sync
from .raw import RawClient, describe, raw_client, raw_get

# ======================================================================================
# Scenarios: basic (consume, ack, qos, get, return, recover)
# ======================================================================================


def raw_with_queues(client: RawClient, *queues: str) -> None:
    for q in queues:
        client.call(1, commands.Queue.Declare(queue=q, exclusive=True), "Queue.DeclareOk")


@scenario()
def s_consume_duplicate_tag(host: str, port: int) -> Observation:
    """Two basic.consume with consumer tag 'compat-tag' (two queues) on one channel."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-c1", "compat-q-c2")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Basic.Consume(queue="compat-q-c2", consumer_tag="compat-tag"))
        return client.observe(ping=1)


@scenario()
def s_consume_duplicate_tag_other_channel(host: str, port: int) -> Observation:
    """The same consumer tag on two different channels is fine."""
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2))
        raw_with_queues(client, "compat-q-c1")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(2, commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"))
        return client.observe(ping=2)


@scenario()
def s_consume_server_generated_tag(host: str, port: int) -> Observation:
    """basic.consume with an empty consumer tag: the generated tag's shape."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-c1")
        ok = client.call(1, commands.Basic.Consume(queue="compat-q-c1"), "Basic.ConsumeOk")
        tag = ok.consumer_tag
        return {
            "prefix": tag[:9],
            "length": len(tag),
            "charset_ok": bool(re.fullmatch(r"amq\.ctag-[A-Za-z0-9_\-]+", tag)),
        }


@scenario()
def s_consume_nowait(host: str, port: int) -> Observation:
    """basic.consume with nowait=true: no consume-ok; a message is still delivered."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-c1")
        client.method(
            1, commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag", nowait=True)
        )
        client.publish(1, b"m1", "", "compat-q-c1")
        return client.observe(ping=1)


@scenario()
def s_cancel_unknown_tag(host: str, port: int) -> Observation:
    """basic.cancel of a consumer tag that does not exist."""
    with raw_client(host, port) as client:
        client.handshake()
        client.method(1, commands.Basic.Cancel(consumer_tag="compat-unknown"))
        return client.observe(ping=1)


def _cancel_on_delete(host: str, port: int, capabilities: dict[str, Any] | None) -> Observation:
    """A consumer on channel 1; its queue deleted from channel 2. Frames per channel."""
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2), capabilities=capabilities)
        client.call(
            1, commands.Queue.Declare(queue="compat-q-cancel", exclusive=True), "Queue.DeclareOk"
        )
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-cancel", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(2, commands.Queue.Delete(queue="compat-q-cancel"))
        frames: list[dict[str, Any]] = []
        while not any(f.get("frame") == "Queue.DeleteOk" for f in frames):
            got = client.next_frame()
            if got.kind != "frame":
                raise ProbeError(f"waiting for queue.delete-ok: {got.kind}")
            frames.append(describe(got.channel, got.frame))
        obs = client.observe(ping=1)
        frames += obs["received"]
        return {
            "channel_1": [f for f in frames if f.get("channel") == 1],
            "channel_2": [f for f in frames if f.get("channel") == 2],
            "other": [f for f in frames if f.get("channel") not in (1, 2)],
            "socket": obs["socket"],
        }


@scenario()
def s_consumer_cancel_notify_on_queue_delete(host: str, port: int) -> Observation:
    """Client with consumer_cancel_notify; its consumed queue is deleted from channel 2."""
    return _cancel_on_delete(host, port, None)


@scenario()
def s_consumer_cancel_no_capability(host: str, port: int) -> Observation:
    """Client without consumer_cancel_notify; its consumed queue is deleted from channel 2."""
    caps = {k: v for k, v in CLIENT_CAPABILITIES.items() if k != "consumer_cancel_notify"}
    return _cancel_on_delete(host, port, caps)


@scenario(queues=["compat-q-delcons"])
def s_queue_delete_while_consuming(host: str, port: int) -> Observation:
    """queue.delete on the channel that consumes the queue (consumer_cancel_notify on)."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(1, commands.Queue.Declare(queue="compat-q-delcons"), "Queue.DeclareOk")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-delcons", consumer_tag="compat-ctag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Queue.Delete(queue="compat-q-delcons"))
        return client.observe(ping=1)


@scenario(queues=["compat-q-delcons"])
def s_queue_delete_consumed_by_other_channel(host: str, port: int) -> Observation:
    """A consumer on channel 2; queue.delete on channel 1. Frames per channel.

    Whether channel 2's basic.cancel or channel 1's delete-ok comes first varies
    from run to run on RabbitMQ (each channel has its own writer), so only the
    order within each channel is recorded.
    """
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2))
        client.call(1, commands.Queue.Declare(queue="compat-q-delcons"), "Queue.DeclareOk")
        client.call(
            2,
            commands.Basic.Consume(queue="compat-q-delcons", consumer_tag="compat-ctag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Queue.Delete(queue="compat-q-delcons"))
        obs = client.observe(ping=1)
        frames = obs["received"]
        return {
            "channel_1": [f for f in frames if f.get("channel") == 1],
            "channel_2": [f for f in frames if f.get("channel") == 2],
            "other": [f for f in frames if f.get("channel") not in (1, 2)],
            "socket": obs["socket"],
        }


@scenario(queues=["compat-q-cons"])
def s_consume_exclusive_when_consumer_exists(host: str, port: int) -> Observation:
    """Exclusive basic.consume on a queue that already has a consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None)
        return attempt(
            lambda: conn.channel().basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        )


@scenario(queues=["compat-q-cons"])
def s_consume_when_exclusive_consumer_exists(host: str, port: int) -> Observation:
    """basic.consume on a queue that has an exclusive consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        return attempt(lambda: conn.channel().basic_consume("compat-q-cons", lambda *_: None))


@scenario(queues=["compat-q-cons"])
def s_get_when_exclusive_consumer_exists(host: str, port: int) -> Observation:
    """basic.get on a queue that has an exclusive consumer (another channel)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        return attempt(lambda: get_one(conn.channel(), "compat-q-cons"))


@scenario()
def s_consume_missing_queue(host: str, port: int) -> Observation:
    """basic.consume from a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().basic_consume("compat-q-missing", lambda *_: None))


def _unacked(
    conn: Any, queue: str, bodies: Sequence[str], take: int | None = None
) -> tuple[Any, list[int]]:
    """Declare ``queue``, publish ``bodies``, basic.get ``take`` of them unacked on a new channel."""
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    publish_bodies(ch, queue, bodies)
    getter = conn.channel()
    tags = []
    for _ in range(len(bodies) if take is None else take):
        method, _props, _body = getter.basic_get(queue)
        tags.append(method.delivery_tag)
    return getter, tags


def remaining_messages(conn: Any, queue: str) -> list[dict[str, Any]]:
    """Messages left in ``queue``, fetched (and acked on close) from a fresh channel."""
    ch = conn.channel()
    out = get_all(ch, queue)
    ch.close()
    return out


@scenario(queues=["compat-q-ack"])
def s_ack_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.ack of delivery tag 99 on a channel with one unacked message."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(99)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_double(host: str, port: int) -> Observation:
    """basic.ack of the same delivery tag twice."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(tags[0])
            ch.basic_ack(tags[0])
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_tag_zero_single(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=false with one unacked message."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(0, multiple=False)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_multiple_zero(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=true with 3 unacked: all acked?"""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1", "m2", "m3"])

        def go() -> None:
            ch.basic_ack(0, multiple=True)
            sync(ch)
            ch.close()

        result = attempt(go)
        return {"ack": result, "remaining": remaining_messages(conn, "compat-q-ack")}


@scenario()
def s_ack_multiple_zero_nothing_outstanding(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=true with nothing unacked."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_ack(0, multiple=True)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_multiple_partial(host: str, port: int) -> Observation:
    """basic.ack tag 2 multiple=true with tags 1..3 unacked; which remain after channel close."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-ack", ["m1", "m2", "m3"])

        def go() -> None:
            ch.basic_ack(tags[1], multiple=True)
            sync(ch)
            ch.close()

        result = attempt(go)
        return {"ack": result, "remaining": remaining_messages(conn, "compat-q-ack")}


@scenario(queues=["compat-q-ack"])
def s_ack_after_auto_ack_get(host: str, port: int) -> Observation:
    """basic.ack of the delivery tag of a no-ack basic.get."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ack")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-ack", ["m1"])
        got = get_one(ch, "compat-q-ack", auto_ack=True)
        assert got is not None

        def go() -> None:
            ch.basic_ack(got["delivery_tag"])
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_on_other_channel(host: str, port: int) -> Observation:
    """basic.ack on channel B of a delivery tag received on channel A."""
    with connection(host, port) as conn:
        _ch, tags = _unacked(conn, "compat-q-ack", ["m1"])
        other = conn.channel()

        def go() -> None:
            other.basic_ack(tags[0])
            sync(other)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_nack_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.nack of an unknown delivery tag."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_nack(42)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_reject_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.reject of an unknown delivery tag."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_reject(42)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-order"])
def s_nack_requeue_order(host: str, port: int) -> Observation:
    """m1..m5 all fetched unacked; nack m4 then m2 with requeue; fetch again (same channel)."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"])
        ch.basic_nack(tags[3], requeue=True)
        ch.basic_nack(tags[1], requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_reject_requeue_order_partial(host: str, port: int) -> Observation:
    """m1..m5 published, m1..m3 fetched; reject m3 then m1 with requeue; fetch the rest."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"], take=3)
        ch.basic_reject(tags[2], requeue=True)
        ch.basic_reject(tags[0], requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_nack_multiple_requeue(host: str, port: int) -> Observation:
    """m1..m4 fetched unacked; nack tag 0 multiple=true requeue=true; fetch again."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4"])
        ch.basic_nack(0, multiple=True, requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_reject_no_requeue_discards(host: str, port: int) -> Observation:
    """m1, m2 fetched; reject m1 requeue=false (no DLX): it is gone."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2"])
        ch.basic_reject(tags[0], requeue=False)
        ch.close()
        return {"remaining": remaining_messages(conn, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_close_channel_with_unacked(host: str, port: int) -> Observation:
    """m1..m5 published; m1..m3 fetched on channel A, m2 acked, A closed; fetch all on B."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"], take=3)
        ch.basic_ack(tags[1])
        ch.close()
        return {"after_close": remaining_messages(conn, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_close_connection_with_unacked_consumer(host: str, port: int) -> Observation:
    """A consumer (prefetch 2) gets m1, m2 of m1..m4, its connection closes; fetch all."""
    with connection(host, port) as setup:
        ch = setup.channel()
        ch.queue_declare("compat-q-order")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-order", ["m1", "m2", "m3", "m4"])
    with connection(host, port) as consumer_conn:
        cch = consumer_conn.channel()
        cch.basic_qos(prefetch_count=2)
        got: list[str] = []
        cch.basic_consume("compat-q-order", lambda _c, _m, _p, body: got.append(body.decode()))
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 2 and time.monotonic() < deadline:
            consumer_conn.process_data_events(0.1)
    with connection(host, port) as conn:
        return {"consumer_got": got, "after_close": remaining_messages(conn, "compat-q-order")}


@scenario()
def s_qos_prefetch_size_nonzero(host: str, port: int) -> Observation:
    """basic.qos prefetch_size=1."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().basic_qos(prefetch_size=1))


def _qos_counts(host: str, port: int, settings: Sequence[tuple[int, bool]]) -> Observation:
    """Two queues with 5 messages each, one channel with the given basic.qos calls and
    one consumer per queue: how many (unacked) deliveries each consumer gets in 1 s."""
    queues = ("compat-q-qos1", "compat-q-qos2")
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.confirm_delivery()
        for q in queues:
            setup.queue_declare(q)
            publish_bodies(setup, q, [f"m{i}" for i in range(5)])
        ch = conn.channel()
        for count, global_qos in settings:
            ch.basic_qos(prefetch_count=count, global_qos=global_qos)
        counts = dict.fromkeys(queues, 0)
        for q in queues:
            ch.basic_consume(q, lambda _c, _m, _p, _b, q=q: counts.__setitem__(q, counts[q] + 1))
        drain(conn, 1.0)
        return {"deliveries": counts, "total": sum(counts.values())}


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_per_consumer(host: str, port: int) -> Observation:
    """prefetch_count=2 global=false, two consumers on one channel."""
    return _qos_counts(host, port, [(2, False)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_global(host: str, port: int) -> Observation:
    """prefetch_count=3 global=true, two consumers on one channel."""
    return _qos_counts(host, port, [(3, True)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_global_and_per_consumer(host: str, port: int) -> Observation:
    """prefetch_count=3 global=true then prefetch_count=2 global=false, two consumers."""
    return _qos_counts(host, port, [(3, True), (2, False)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_per_consumer_then_global(host: str, port: int) -> Observation:
    """prefetch_count=2 global=false then prefetch_count=3 global=true, two consumers."""
    return _qos_counts(host, port, [(2, False), (3, True)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_after_consume_not_applied(host: str, port: int) -> Observation:
    """basic.qos prefetch_count=1 issued after the consumers started: consumers unaffected?"""
    queues = ("compat-q-qos1", "compat-q-qos2")
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.confirm_delivery()
        ch = conn.channel()
        counts = dict.fromkeys(queues, 0)
        for q in queues:
            setup.queue_declare(q)
            ch.basic_consume(q, lambda _c, _m, _p, _b, q=q: counts.__setitem__(q, counts[q] + 1))
        ch.basic_qos(prefetch_count=1)
        for q in queues:
            publish_bodies(setup, q, [f"m{i}" for i in range(3)])
        drain(conn, 1.0)
        return {"deliveries": counts}


@scenario()
def s_basic_get_empty(host: str, port: int) -> Observation:
    """basic.get on an empty queue (raw: the get-empty frame itself)."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-get")
        return raw_get(client, 1, "compat-q-get")


@scenario()
def s_basic_get_ok_fields(host: str, port: int) -> Observation:
    """basic.get with 3 messages queued (raw: get-ok fields, header, body)."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-get")
        for body in (b"m1", b"m2", b"m3"):
            client.publish(1, body, "", "compat-q-get")
        return raw_get(client, 1, "compat-q-get")


@scenario()
def s_basic_get_missing_queue(host: str, port: int) -> Observation:
    """basic.get from a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: get_one(conn.channel(), "compat-q-missing"))


@scenario()
def s_basic_deliver_fields(host: str, port: int) -> Observation:
    """A consumer's basic.deliver, content header and body (raw)."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-deliver")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-deliver", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        props = commands.Basic.Properties(
            content_type="text/plain", delivery_mode=2, headers={"k": "v"}
        )
        client.publish(1, b"hello", "", "compat-q-deliver", properties=props)
        return client.observe(ping=1)


@scenario()
def s_publish_mandatory_unroutable(host: str, port: int) -> Observation:
    """Mandatory publish to amq.direct with no matching binding (no confirms)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append(
                {"reply_code": m.reply_code, "reply_text": m.reply_text, "exchange": m.exchange,
                 "routing_key": m.routing_key, "body": b.decode()}
            )
        )  # fmt: skip
        ch.basic_publish("amq.direct", "compat-nowhere", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario()
def s_publish_mandatory_default_exchange_missing_queue(host: str, port: int) -> Observation:
    """Mandatory publish to the default exchange naming a missing queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append(
                [m.reply_code, m.reply_text, m.exchange, m.routing_key]
            )
        )
        ch.basic_publish("", "compat-q-missing", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario()
def s_publish_unroutable_confirm(host: str, port: int) -> Observation:
    """Confirm mode, non-mandatory publish with no route: acked?"""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere")

    return after_handshake(host, port, send)


@scenario(queues=["compat-q-recover"])
def s_basic_recover_requeue_true(host: str, port: int) -> Observation:
    """m1, m2 fetched unacked; basic.recover requeue=true; fetch again."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-recover", ["m1", "m2"])
        result = attempt(lambda: ch.basic_recover(requeue=True))
        return {"recover": result, "after": get_all(ch, "compat-q-recover")}


@scenario(queues=["compat-q-recover"])
def s_basic_recover_requeue_false(host: str, port: int) -> Observation:
    """m1, m2 fetched unacked; basic.recover requeue=false."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-recover", ["m1", "m2"])
        result = attempt(lambda: ch.basic_recover(requeue=False))
        return {"recover": result}


@scenario(queues=["compat-q-recover"])
def s_basic_recover_consumer_redelivery(host: str, port: int) -> Observation:
    """A consumer holds m1, m2 unacked; basic.recover requeue=true redelivers them to it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-recover")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-recover", ["m1", "m2"])
        deliveries: list[dict[str, Any]] = []
        ch.basic_consume(
            "compat-q-recover",
            lambda _c, m, _p, b: deliveries.append(
                {"body": b.decode(), "redelivered": m.redelivered, "delivery_tag": m.delivery_tag}
            ),
        )
        deadline = time.monotonic() + TIMEOUT
        while len(deliveries) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        ch.basic_recover(requeue=True)
        while len(deliveries) < 4 and time.monotonic() < deadline + TIMEOUT:
            conn.process_data_events(0.1)
        return {"deliveries": deliveries}
