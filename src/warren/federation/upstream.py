"""Federation upstreams and upstream sets, checked as RabbitMQ checks them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warren.core.runtime_parameters import ValidationFailed, is_int, json_p
from warren.links import Timeouts

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
_KNOWN = {
    "uri", "prefetch-count", "reconnect-delay", "ack-mode", "trust-user-id", "exchange",
    "queue", "max-hops", "expires", "message-ttl", "ha-policy", "consumer-tag",
    "queue-type", "bind-nowait", "resource-cleanup-mode", "channel-use-mode",
}  # fmt: skip


@dataclass(frozen=True)
class Upstream:
    name: str
    uris: tuple[str, ...]
    exchange: str | None = None  # the upstream exchange's name (None: the same)
    queue: str | None = None  # the upstream queue's name, for a federated queue
    prefetch_count: int = 1000
    reconnect_delay: float = 5.0
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None


def validate_upstream(name: str, value: Any) -> Upstream:
    if not isinstance(value, dict):
        raise ValidationFailed(
            [f"upstream definition should be a JSON object, got {json_p(value)}"]
        )
    errors: list[str] = []
    unknown = sorted(set(value) - _KNOWN)
    if unknown:
        errors.append("Unrecognised terms " + ", ".join(repr(k) for k in unknown))
    raw = value.get("uri")
    uris = [raw] if isinstance(raw, str) else raw
    if raw is None:
        errors.append('Key "uri" not found in federation-upstream')
        uris = []
    elif not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        errors.append(f"uri should be a URI string or a non-empty list of them, got {json_p(raw)}")
        uris = []
    for uri in uris:
        if not uri.startswith(("amqp://", "amqps://")):
            errors.append(f"uri: {uri!r} is not an amqp:// or amqps:// URI")
            continue
        try:
            Timeouts.of(uri)
        except ValueError as exc:  # refused when saved, not when the link first connects
            errors.append(f"uri: {exc}")

    def number(key: str, default: Any, low: int) -> Any:
        v = value.get(key, default)
        if v is default:
            return v
        if not is_int(v) or v < low:
            errors.append(f"{key} should be an integer >= {low}, got {json_p(v)}")
            return default
        return v

    prefetch = number("prefetch-count", 1000, 0)
    max_hops = number("max-hops", 1, 1)
    expires = number("expires", None, 1)
    ttl = number("message-ttl", None, 0)
    delay = value.get("reconnect-delay", 5)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        errors.append(f"reconnect-delay should be a number >= 0, got {json_p(delay)}")
        delay = 5
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        errors.append(f"ack-mode should be one of {', '.join(ACK_MODES)}, got {json_p(ack_mode)}")
    trust = value.get("trust-user-id", False)
    if not isinstance(trust, bool):
        errors.append(f"trust-user-id should be boolean, actually was {json_p(trust)}")
    exchange = value.get("exchange")
    if exchange is not None and not isinstance(exchange, str):
        errors.append(f"exchange should be a string, actually was {json_p(exchange)}")
    queue = value.get("queue")
    if queue is not None and not isinstance(queue, str):
        errors.append(f"queue should be a string, actually was {json_p(queue)}")
    if errors:
        raise ValidationFailed(errors)
    return Upstream(
        name=name,
        uris=tuple(uris),
        exchange=exchange,
        queue=queue,
        prefetch_count=prefetch,
        reconnect_delay=float(delay),
        ack_mode=ack_mode,
        trust_user_id=bool(trust),
        max_hops=max_hops,
        expires=expires,
        message_ttl=ttl,
    )


def validate_set(value: Any) -> list[dict[str, Any]]:
    """An upstream set: a list of {"upstream": name, ...overrides}."""
    if not isinstance(value, list) or not all(
        isinstance(e, dict) and isinstance(e.get("upstream"), str) for e in value
    ):
        raise ValidationFailed(
            [
                f'upstream set should be a list of objects with an "upstream" name, got {json_p(value)}'
            ]
        )
    return value


def add_hop(props: Any, upstream: Upstream, own_cluster: str, hop: dict[str, Any]) -> bool:
    """Record one more federation hop in the message's ``x-received-from`` header
    (``hop``: where it came from) and drop a user-id the local broker would
    refuse; False when the message must not cross: it already crossed
    ``max-hops`` links, or it came from this cluster before (a loop)."""
    headers = dict(props.headers or {})
    hops = headers.get("x-received-from")
    hops = list(hops) if isinstance(hops, list) else []
    if len(hops) >= upstream.max_hops or any(
        isinstance(h, dict) and h.get("cluster-name") == own_cluster for h in hops
    ):
        return False
    headers["x-received-from"] = [*hops, hop]
    props.headers = headers
    if not upstream.trust_user_id:
        props.user_id = None
    return True
