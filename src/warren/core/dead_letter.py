"""Dead-lettering: the message a queue republishes to its dead-letter exchange.

RabbitMQ records each death in the ``x-death`` header, an array of tables,
most recent first. A death for the same queue and reason as an earlier one
increments that entry's ``count`` and moves it to the front instead of adding
a new entry, so the array stays bounded however often a message cycles. The
``x-first-death-*`` headers are set once; the ``x-last-death-*`` headers
(RabbitMQ 3.13) follow every death. The per-message ``expiration`` is removed
(it would expire the copy at once) and kept as ``original-expiration``.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from warren.core.message import Message

log = logging.getLogger("warren.dead_letter")

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"

_UTC = datetime.UTC


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return None


def header_keys(value: Any) -> list[str]:
    """CC/BCC values as routing keys: an array of strings (others are ignored, as in
    RabbitMQ, which only honours a longstr array)."""
    if not isinstance(value, list):
        return []
    return [k for k in (_text(v) for v in value) if k is not None]


def routing_keys(msg: Message) -> list[str]:
    """The keys a message was routed with: its routing key, then its CC header."""
    keys = [msg.routing_key]
    headers = msg.headers
    if headers and "CC" in headers:
        keys.extend(header_keys(headers["CC"]))
    return keys


def is_cycle(target_queue: str, headers: dict[str, Any] | None) -> bool:
    """Whether dead-lettering to ``target_queue`` would close a fully automatic cycle.

    As RabbitMQ: walking the deaths from the most recent, if the target queue is
    reached before any death with reason ``rejected``, nothing but expiry or limits
    moved the message around the loop, and it would circle for ever: drop it.
    A rejection anywhere on the loop means a client is involved, so it may go on.
    """
    if not headers:
        return False
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return False
    for death in deaths:
        if not isinstance(death, dict):
            continue
        if _text(death.get("reason")) == REJECTED:
            return False
        if _text(death.get("queue")) == target_queue:
            return True
    return False


def dead_letter(
    msg: Message,
    queue: str,
    reason: str,
    dlx: str,
    dl_routing_key: str | None,
    now_ms: int,
) -> tuple[Message, list[str]]:
    """The copy to publish to ``dlx``, and the routing keys to publish it with.

    Without a dead-letter routing key the copy goes out with the keys the original
    was routed with (routing key and CC); with one, it goes out with that key only
    and the CC header is dropped, as RabbitMQ does.
    """
    props = msg.decoded_properties()
    headers = dict(props.headers) if props.headers else {}
    keys = routing_keys(msg)
    death: dict[str, Any] = {
        "count": 1,
        "reason": reason,
        "queue": queue,
        "time": datetime.datetime.fromtimestamp(now_ms // 1000, _UTC),
        "exchange": msg.exchange,
        "routing-keys": keys,
    }
    if props.expiration is not None:
        death["original-expiration"] = props.expiration
        props.expiration = None
    deaths = headers.get("x-death")
    others: list[Any] = []
    if isinstance(deaths, list):
        for entry in deaths:
            if (
                isinstance(entry, dict)
                and _text(entry.get("queue")) == queue
                and _text(entry.get("reason")) == reason
                and death["count"] == 1
            ):
                # The same queue and reason again: RabbitMQ keeps the first such
                # death's details and only counts it, moving it to the front.
                count = entry.get("count")
                death = dict(entry)
                death["count"] = (count if isinstance(count, int) else 0) + 1
            else:
                others.append(entry)
    headers["x-death"] = [dict(sorted(death.items())), *others]
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue
        headers["x-first-death-exchange"] = msg.exchange
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = msg.exchange
    if dl_routing_key is not None:
        headers.pop("CC", None)
        keys = [dl_routing_key]
    props.headers = headers
    copy = Message(dlx, keys[0], props.encode(), msg.body, now_ms)
    return copy, keys
