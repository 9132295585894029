"""A shovel's definition, checked as RabbitMQ's shovel plugin checks it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warren.core.runtime_parameters import ValidationFailed, json_p
from warren.links import Timeouts

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
_KNOWN = {
    "src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count",
    "src-delete-after", "delete-after", "src-protocol", "src-consumer-args",
    "dest-uri", "dest-queue", "dest-exchange", "dest-exchange-key", "dest-protocol",
    "dest-add-forward-headers", "add-forward-headers", "dest-add-timestamp-header",
    "add-timestamp-header", "dest-publish-properties", "publish-properties",
    "ack-mode", "reconnect-delay",
    "dest-max-attempts", "dest-dead-letter-exchange", "dest-dead-letter-routing-key",
}  # fmt: skip
#: Warren's own keys, for an HTTP destination only.
_HTTP_ONLY = ("dest-max-attempts", "dest-dead-letter-exchange", "dest-dead-letter-routing-key")


@dataclass(frozen=True)
class ShovelSpec:
    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = "#"
    prefetch_count: int = 1000
    #: "never", "queue-length" (what the queue holds when the shovel starts) or a count.
    delete_after: str | int = "never"
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    ack_mode: str = "on-confirm"
    reconnect_delay: float = 5.0
    #: HTTP destination: POSTs of one message (retried with backoff in the
    #: session) before it fails; then it is dead-lettered, or the session fails.
    max_attempts: int = 1
    #: HTTP destination: where a message that failed every attempt is published
    #: (at the source), with this routing key (None: the message's own).
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None

    @property
    def http_destination(self) -> bool:
        return self.dest_uris[0].startswith(("http://", "https://"))


def _uris(value: Any, key: str, schemes: tuple[str, ...], errors: list[str]) -> tuple[str, ...]:
    uris = [value] if isinstance(value, str) else value
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        errors.append(
            f"{key} should be a URI string or a non-empty list of them, got {json_p(value)}"
        )
        return ()
    for uri in uris:
        if not uri.startswith(schemes):
            errors.append(f"{key}: {uri!r} is not a {' or '.join(schemes)} URI")
            continue
        try:
            Timeouts.of(uri)
        except ValueError as exc:  # refused when saved, not when the link first connects
            errors.append(f"{key}: {exc}")
    return tuple(uris)


def _str(value: dict[str, Any], key: str, errors: list[str]) -> str | None:
    raw = value.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str):
        errors.append(f"{key} should be a string, actually was {json_p(raw)}")
        return None
    return raw


def _bool(value: dict[str, Any], keys: tuple[str, ...], errors: list[str]) -> bool:
    for key in keys:
        if key in value:
            if not isinstance(value[key], bool):
                errors.append(f"{key} should be boolean, actually was {json_p(value[key])}")
                return False
            return bool(value[key])
    return False


def validate(value: Any) -> ShovelSpec:
    """The shovel ``value`` describes, or ValidationFailed listing what is wrong."""
    if not isinstance(value, dict):
        raise ValidationFailed([f"shovel definition should be a JSON object, got {json_p(value)}"])
    errors: list[str] = []
    unknown = sorted(set(value) - _KNOWN)
    if unknown:
        errors.append("Unrecognised terms " + ", ".join(repr(k) for k in unknown))
    for key in ("src-uri", "dest-uri"):
        if key not in value:
            errors.append(f'Key "{key}" not found in shovel')
    src_uris = _uris(value.get("src-uri", "amqp://"), "src-uri", ("amqp://", "amqps://"), errors)
    dest_uris = _uris(
        value.get("dest-uri", "amqp://"), "dest-uri",
        ("amqp://", "amqps://", "http://", "https://"), errors,
    )  # fmt: skip
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key, "amqp091") != "amqp091":
            errors.append(f"{key}: only amqp091 is supported, got {json_p(value[key])}")
    src_queue = _str(value, "src-queue", errors)
    src_exchange = _str(value, "src-exchange", errors)
    if (src_queue is None) == (src_exchange is None):
        errors.append("Must specify exactly one of src-queue or src-exchange")
    dest_queue = _str(value, "dest-queue", errors)
    dest_exchange = _str(value, "dest-exchange", errors)
    if dest_queue is not None and dest_exchange is not None:
        errors.append("Cannot specify both dest-queue and dest-exchange")
    prefetch = value.get("src-prefetch-count", 1000)
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= 65535:
        errors.append(f"src-prefetch-count should be an integer 0-65535, got {json_p(prefetch)}")
        prefetch = 1000
    delete_after = value.get("src-delete-after", value.get("delete-after", "never"))
    if not (
        delete_after in ("never", "queue-length")
        or (
            isinstance(delete_after, int)
            and not isinstance(delete_after, bool)
            and delete_after >= 0
        )
    ):
        errors.append(
            f'src-delete-after should be "never", "queue-length" or an integer, '
            f"got {json_p(delete_after)}"
        )
        delete_after = "never"
    if delete_after == "queue-length" and src_queue is None:
        errors.append('src-delete-after "queue-length" needs a src-queue')
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        errors.append(f"ack-mode should be one of {', '.join(ACK_MODES)}, got {json_p(ack_mode)}")
        ack_mode = "on-confirm"
    delay = value.get("reconnect-delay", 5)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        errors.append(f"reconnect-delay should be a number >= 0, got {json_p(delay)}")
        delay = 5
    props = value.get("dest-publish-properties", value.get("publish-properties", {}))
    if not isinstance(props, dict):
        errors.append(f"dest-publish-properties should be an object, got {json_p(props)}")
        props = {}
    src_key = _str(value, "src-exchange-key", errors)
    dest_key = _str(value, "dest-exchange-key", errors)
    forward = _bool(value, ("dest-add-forward-headers", "add-forward-headers"), errors)
    timestamp = _bool(value, ("dest-add-timestamp-header", "add-timestamp-header"), errors)
    attempts = value.get("dest-max-attempts", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        errors.append(f"dest-max-attempts should be a positive integer, got {json_p(attempts)}")
        attempts = 1
    dlx = _str(value, "dest-dead-letter-exchange", errors)
    dlx_key = _str(value, "dest-dead-letter-routing-key", errors)
    if dest_uris and not dest_uris[0].startswith(("http://", "https://")):
        errors += [
            f"{key} needs an http:// or https:// dest-uri" for key in _HTTP_ONLY if key in value
        ]
    if errors:
        raise ValidationFailed(errors)
    return ShovelSpec(
        src_uris=src_uris,
        dest_uris=dest_uris,
        src_queue=src_queue,
        src_exchange=src_exchange,
        src_exchange_key=src_key if src_key is not None else "#",
        prefetch_count=prefetch,
        delete_after=delete_after,
        dest_queue=dest_queue,
        dest_exchange=dest_exchange,
        dest_exchange_key=dest_key,
        add_forward_headers=forward,
        add_timestamp_header=timestamp,
        publish_properties=props,
        ack_mode=ack_mode,
        reconnect_delay=float(delay),
        max_attempts=attempts,
        dead_letter_exchange=dlx,
        dead_letter_routing_key=dlx_key,
    )
