"""pika (BlockingConnection) helpers the scenarios share: connecting, recording
broker-initiated closes, draining, getting, cleaning up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import pika
import pika.exceptions
import pika.spec

from .common import TIMEOUT, Observation, jsonable
from .raw import props_dict

# --------------------------------------------------------------------------------------
# pika helpers
# --------------------------------------------------------------------------------------


def pika_params(host: str, port: int, **overrides: Any) -> pika.ConnectionParameters:
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "credentials": pika.PlainCredentials("guest", "guest"),
        "heartbeat": 0,
        "blocked_connection_timeout": 5,
        "socket_timeout": TIMEOUT,
        "stack_timeout": 10,
        "connection_attempts": 1,
        "client_properties": {"product": "compat-probe"},
    }
    settings.update(overrides)
    return pika.ConnectionParameters(**settings)


@contextmanager
def connection(host: str, port: int, **overrides: Any) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika_params(host, port, **overrides))
    try:
        yield conn
    finally:
        with suppress(Exception):
            if conn.is_open:
                conn.close()


def method_dict(result: Any) -> dict[str, Any]:
    """A pika method frame (or frame.Method wrapper) as a dict of its fields."""
    method = getattr(result, "method", result)
    out: dict[str, Any] = {"method": method.NAME}
    for key, value in vars(method).items():
        if key in ("ticket", "nowait"):
            continue
        out[key] = jsonable(value)
    return out


def attempt(fn: Callable[[], Any]) -> Observation:
    """Run one client operation; record its result or the broker's close."""
    try:
        value = fn()
    except pika.exceptions.ChannelClosedByBroker as exc:
        return {"closed": "channel", "reply_code": exc.reply_code, "reply_text": exc.reply_text}
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return {"closed": "connection", "reply_code": exc.reply_code, "reply_text": exc.reply_text}
    if value is None:
        return {"ok": None}
    if hasattr(value, "method") or hasattr(value, "NAME"):
        return {"ok": method_dict(value)}
    return {"ok": jsonable(value)}


def sync(channel: Any) -> None:
    """A round trip on ``channel``, so errors caused by earlier async methods surface."""
    channel.exchange_declare("amq.direct", passive=True)


def drain(conn: Any, seconds: float) -> None:
    """Dispatch deliveries for a full ``seconds`` (pika may return early from one call)."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        conn.process_data_events(remaining)


def get_all(channel: Any, queue: str, limit: int = 50) -> list[dict[str, Any]]:
    """basic.get until get-empty; body, redelivered and delivery_tag of each message."""
    out: list[dict[str, Any]] = []
    for _ in range(limit):
        method, _props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            break
        out.append(
            {
                "body": body.decode(),
                "redelivered": method.redelivered,
                "delivery_tag": method.delivery_tag,
                "message_count": method.message_count,
            }
        )
    return out


def get_one(channel: Any, queue: str, auto_ack: bool = False) -> dict[str, Any] | None:
    method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
    if method is None:
        return None
    return {
        **method_dict(method),
        "body": body.decode(errors="replace"),
        "properties": props_dict(props),
    }


def publish_bodies(channel: Any, queue: str, bodies: Iterable[str], exchange: str = "") -> None:
    for body in bodies:
        channel.basic_publish(exchange, queue, body.encode())


def cleanup(host: str, port: int, queues: Sequence[str], exchanges: Sequence[str]) -> None:
    """Delete what a scenario may have declared (best effort, errors ignored)."""
    if not queues and not exchanges:
        return
    with suppress(Exception), connection(host, port) as conn:
        for queue in queues:
            with suppress(
                pika.exceptions.ChannelClosedByBroker, pika.exceptions.ChannelWrongStateError
            ):
                conn.channel().queue_delete(queue)
        for exchange in exchanges:
            with suppress(
                pika.exceptions.ChannelClosedByBroker, pika.exceptions.ChannelWrongStateError
            ):
                conn.channel().exchange_delete(exchange)
