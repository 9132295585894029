"""Scenarios: publisher confirms and transactions."""

from __future__ import annotations

from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from .basic import raw_with_queues, remaining_messages
from .common import Observation, scenario
from .framing import after_handshake
from .pika_helpers import attempt, connection, get_one, publish_bodies
from .raw import RawClient, describe, raw_client

# ======================================================================================
# Scenarios: publisher confirms and transactions
# ======================================================================================


@scenario()
def s_confirm_then_tx_select(host: str, port: int) -> Observation:
    """confirm.select then tx.select on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        return attempt(ch.tx_select)


@scenario()
def s_tx_then_confirm_select(host: str, port: int) -> Observation:
    """tx.select then confirm.select on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.tx_select()
        return attempt(ch.confirm_delivery)


@scenario()
def s_confirm_select_twice(host: str, port: int) -> Observation:
    """confirm.select twice on the same channel (raw)."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.method(1, commands.Confirm.Select())

    return after_handshake(host, port, send)


@scenario()
def s_confirm_delivery_tags_sequential(host: str, port: int) -> Observation:
    """Confirm mode; three publishes, each awaited: the acks' tags and multiple flags."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        acks = []
        for body in (b"m1", b"m2", b"m3"):
            client.publish(1, body, "", "compat-q-confirm")
            ack = client.expect("Basic.Ack", 1)
            acks.append({"delivery_tag": ack.delivery_tag, "multiple": ack.multiple})
        return {"acks": acks}


@scenario()
def s_confirm_delivery_tags_batch(host: str, port: int) -> Observation:
    """Confirm mode; ten publishes in one write: every tag 1..10 confirmed (multiple may merge)."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        data = b""
        for i in range(10):
            data += pframe.marshal(
                commands.Basic.Publish(exchange="", routing_key="compat-q-confirm"), 1
            )
            data += pframe.marshal(pheader.ContentHeader(0, 2, commands.Basic.Properties()), 1)
            data += pframe.marshal(pbody.ContentBody(f"m{i}".encode()[:2]), 1)
        client.send(data)
        acked: set[int] = set()
        nacked: set[int] = set()
        while max(acked | nacked, default=0) < 10:
            frame = client.expect_any(("Basic.Ack", "Basic.Nack"), 1)
            tags = set(range(1, frame.delivery_tag + 1)) if frame.multiple else {frame.delivery_tag}
            (acked if frame.name == "Basic.Ack" else nacked).update(tags)
        return {"acked": sorted(acked), "nacked": sorted(nacked)}


def expand_acks(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each basic.ack/nack by one entry per delivery tag it confirms.

    A broker may merge confirms with ``multiple`` as it likes; what a client can
    rely on is which tags are confirmed and in what order relative to other frames.
    """
    out: list[dict[str, Any]] = []
    confirmed = 0
    for frame in received:
        if frame.get("frame") in ("Basic.Ack", "Basic.Nack"):
            tag = frame["delivery_tag"]
            tags = range(confirmed + 1, tag + 1) if frame.get("multiple") else [tag]
            for one in tags:
                out.append(
                    {"frame": frame["frame"], "channel": frame["channel"], "delivery_tag": one}
                )
            confirmed = max(confirmed, tag)
        else:
            out.append(frame)
    return out


@scenario()
def s_confirm_tags_with_return(host: str, port: int) -> Observation:
    """Confirm mode; routable (awaited), unroutable-mandatory, routable: frames in order,
    acks expanded to one entry per confirmed tag."""
    with raw_client(host, port) as client:
        client.handshake()
        raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "", "compat-q-confirm")
        first = client.expect("Basic.Ack", 1)
        client.publish(1, b"m2", "amq.direct", "compat-nowhere", mandatory=True)
        client.publish(1, b"m3", "", "compat-q-confirm", mandatory=True)
        obs = client.observe(ping=1)
        received = [describe(1, first), *obs["received"]]
        return {**obs, "received": expand_acks(received)}


@scenario()
def s_tx_commit_without_select(host: str, port: int) -> Observation:
    """tx.commit on a channel that is not transactional."""
    with connection(host, port) as conn:
        return attempt(conn.channel().tx_commit)


@scenario()
def s_tx_rollback_without_select(host: str, port: int) -> Observation:
    """tx.rollback on a channel that is not transactional."""
    with connection(host, port) as conn:
        return attempt(conn.channel().tx_rollback)


@scenario()
def s_tx_select_twice(host: str, port: int) -> Observation:
    """tx.select twice on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.tx_select()
        return attempt(ch.tx_select)


@scenario(queues=["compat-q-tx"])
def s_tx_publish_rollback(host: str, port: int) -> Observation:
    """tx: publish m1, rollback, get (empty?); publish m2, commit, get."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-tx")
        ch.tx_select()
        ch.basic_publish("", "compat-q-tx", b"m1")
        before_rollback = ch.queue_declare("compat-q-tx", passive=True).method.message_count
        ch.tx_rollback()
        after_rollback = get_one(ch, "compat-q-tx", auto_ack=True)
        ch.basic_publish("", "compat-q-tx", b"m2")
        ch.tx_commit()
        after_commit = get_one(ch, "compat-q-tx", auto_ack=True)
        return {
            "message_count_before_rollback": before_rollback,
            "get_after_rollback": after_rollback,
            "get_after_commit": after_commit,
        }


@scenario(queues=["compat-q-tx"])
def s_tx_ack_rollback_recover(host: str, port: int) -> Observation:
    """tx: get m1, ack it, rollback (ack discarded?), basic.recover requeue, get again."""
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.queue_declare("compat-q-tx")
        setup.confirm_delivery()
        publish_bodies(setup, "compat-q-tx", ["m1"])
        ch = conn.channel()
        ch.tx_select()
        got = get_one(ch, "compat-q-tx")
        assert got is not None
        ch.basic_ack(got["delivery_tag"])
        ch.tx_rollback()
        ready_after_rollback = setup.queue_declare("compat-q-tx", passive=True).method.message_count
        ch.basic_recover(requeue=True)
        again = get_one(ch, "compat-q-tx")
        ch.tx_commit()
        return {"ready_after_rollback": ready_after_rollback, "get_after_recover": again}


@scenario(queues=["compat-q-tx"])
def s_tx_ack_commit(host: str, port: int) -> Observation:
    """tx: get m1, ack, commit, close channel: m1 is gone."""
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.queue_declare("compat-q-tx")
        setup.confirm_delivery()
        publish_bodies(setup, "compat-q-tx", ["m1"])
        ch = conn.channel()
        ch.tx_select()
        got = get_one(ch, "compat-q-tx")
        assert got is not None
        ch.basic_ack(got["delivery_tag"])
        ch.tx_commit()
        ch.close()
        return {"remaining": remaining_messages(conn, "compat-q-tx")}


@scenario(queues=["compat-q-tx"])
def s_tx_uncommitted_publish_on_close(host: str, port: int) -> Observation:
    """tx: publish m1 and close the channel without commit: nothing delivered."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-tx")
        ch.tx_select()
        ch.basic_publish("", "compat-q-tx", b"m1")
        ch.close()
        return {"remaining": remaining_messages(conn, "compat-q-tx")}


@scenario()
def s_tx_mandatory_unroutable(host: str, port: int) -> Observation:
    """tx: mandatory unroutable publish, then tx.commit: frames in order (raw)."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Tx.Select(), "Tx.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere", mandatory=True)
        client.method(1, commands.Tx.Commit())

    return after_handshake(host, port, send)
