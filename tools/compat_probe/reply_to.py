"""Scenarios: direct reply-to."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions
import pika.spec

from .common import TIMEOUT, Observation, ProbeError, scenario
from .pika_helpers import attempt, connection, sync
from .raw import props_dict

# ======================================================================================
# Scenarios: direct reply-to
# ======================================================================================

REPLY_TO = "amq.rabbitmq.reply-to"


@scenario()
def s_reply_to_consume_without_no_ack(host: str, port: int) -> Observation:
    """basic.consume on amq.rabbitmq.reply-to with no_ack=false."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().basic_consume(REPLY_TO, lambda *_: None, auto_ack=False)
        )


@scenario()
def s_reply_to_consume_twice(host: str, port: int) -> Observation:
    """Two no-ack consumers on amq.rabbitmq.reply-to on one channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)
        return attempt(lambda: ch.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True))


@scenario()
def s_reply_to_publish_without_consumer(host: str, port: int) -> Observation:
    """basic.publish with reply_to=amq.rabbitmq.reply-to and no reply consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_publish(
                "amq.direct", "compat-nowhere", b"q", pika.BasicProperties(reply_to=REPLY_TO)
            )
            sync(ch)

        return attempt(go)


@scenario()
def s_reply_to_passive_declare(host: str, port: int) -> Observation:
    """Passive queue.declare of amq.rabbitmq.reply-to."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare(REPLY_TO, passive=True))


@scenario()
def s_reply_to_non_passive_declare(host: str, port: int) -> Observation:
    """Non-passive queue.declare of amq.rabbitmq.reply-to."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare(REPLY_TO))


@scenario(queues=["compat-q-rpc"])
def s_reply_to_rpc_round_trip(host: str, port: int) -> Observation:
    """A full direct reply-to RPC: the reply_to the server sees and the reply delivery."""
    with connection(host, port) as client_conn, connection(host, port) as server_conn:
        server = server_conn.channel()
        server.queue_declare("compat-q-rpc")
        client = client_conn.channel()
        replies: list[dict[str, Any]] = []
        tag = client.basic_consume(
            REPLY_TO,
            lambda _c, m, p, b: replies.append(
                {"body": b.decode(), "exchange": m.exchange, "routing_key": m.routing_key,
                 "redelivered": m.redelivered, "delivery_tag": m.delivery_tag,
                 "properties": props_dict(p)}
            ),
            auto_ack=True,
        )  # fmt: skip
        client.confirm_delivery()
        client.basic_publish(
            "",
            "compat-q-rpc",
            b"ping",
            pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1"),
        )
        method, props, _body = server.basic_get("compat-q-rpc", auto_ack=True)
        if method is None:
            raise ProbeError("request not queued")
        reply_to = props.reply_to
        server.basic_publish(
            "", reply_to, b"pong", pika.BasicProperties(correlation_id=props.correlation_id)
        )
        deadline = time.monotonic() + TIMEOUT
        while not replies and time.monotonic() < deadline:
            client_conn.process_data_events(0.1)

        def reply(body: bytes) -> str:
            server.basic_publish("", reply_to, body)
            sync(server)
            return "ok"

        second_reply = attempt(lambda: reply(b"pong2"))
        deadline = time.monotonic() + TIMEOUT
        while len(replies) < 2 and time.monotonic() < deadline:
            client_conn.process_data_events(0.1)
        client.basic_cancel(tag)
        stale = attempt(lambda: reply(b"pong3"))
        return {
            "reply_to_seen_by_server": reply_to,
            "reply_to_prefix_ok": reply_to.startswith(REPLY_TO + "."),
            "replies": replies,
            "second_reply_publish": second_reply,
            "publish_after_cancel": stale,
        }
