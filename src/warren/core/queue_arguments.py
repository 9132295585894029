"""Declaration arguments: RabbitMQ 3.10's validation and equivalence rules, with its texts.

A new queue's ``x-`` arguments are validated as RabbitMQ validates a classic
queue's (``x-max-length`` must be a non-negative integer, ``x-overflow`` one of
three modes, and so on), and refused with the same 406 texts, which embed
Erlang terms such as ``{value_negative,-1}``. This is validation only: what
the arguments do is the queue's business.

On redeclaration RabbitMQ compares only the arguments the queue (or exchange)
type knows; :func:`assert_args_equivalent` applies its rules and texts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from warren.core.erlang_format import Binary, field_type, string_p, term_p
from warren.core.errors import PreconditionFailed, QueueTypeRefused
from warren.core.table_tags import wire_type

__all__ = [
    "CLASSIC_QUEUE_ARGUMENTS",
    "EXCHANGE_ARGUMENTS",
    "QUORUM_QUEUE_ARGUMENTS",
    "STREAM_QUEUE_ARGUMENTS",
    "assert_args_equivalent",
    "is_quorum",
    "is_stream",
    "max_priority",
    "validate_queue_arguments",
    "validate_quorum_declaration",
    "validate_stream_declaration",
    "with_default_type",
]

#: The arguments of a classic queue, in the order RabbitMQ compares them on redeclaration.
CLASSIC_QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
)

#: The arguments of a stream, in the order RabbitMQ compares them on redeclaration
#: (x-max-length is Warren's and LavinMQ's, not RabbitMQ's).
STREAM_QUEUE_ARGUMENTS = (
    "x-max-length-bytes",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
    "x-queue-type",
    "x-max-length",
)

#: The arguments of a quorum queue, in the order RabbitMQ compares them on
#: redeclaration (rabbit_quorum_queue:capabilities/0); x-quorum-target-group-size
#: is not among them.
QUORUM_QUEUE_ARGUMENTS = (
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-overflow",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-message-ttl",
    "x-queue-leader-locator",
)

#: The only exchange argument RabbitMQ compares on redeclaration.
EXCHANGE_ARGUMENTS = ("alternate-exchange",)

#: Arguments only quorum queues or streams take: refused on a classic queue.
_OTHER_TYPES_ONLY = frozenset(
    {
        "x-dead-letter-strategy",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-quorum-initial-group-size",
        "x-queue-leader-locator",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
    }
)

_KNOWN_QUEUE_TYPES = (b"classic", b"quorum", b"stream")
_OVERFLOW_MODES = (b"drop-head", b"reject-publish", b"reject-publish-dlx")
_QUEUE_MODES = (b"default", b"lazy")
_MAX_PRIORITY = 255
_MAX_EXPIRY = 315_360_000_000  # ten years in milliseconds

# A check returns None when the value is fine, else the Erlang error term as text.
_Check = Callable[[Any, dict[str, Any]], str | None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str | bytes)


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _unacceptable(value: Any) -> str:
    return f"{{unacceptable_type,{field_type(value)}}}"


def _int(value: Any, args: dict[str, Any]) -> str | None:
    if _is_int(value):
        return None
    return string_p(f"expected integer, got {field_type(value)}")


def _non_neg_int(value: Any, args: dict[str, Any]) -> str | None:
    error = _int(value, args)
    if error is None and value < 0:
        return f"{{value_negative,{value}}}"
    return error


def _positive_int(value: Any, args: dict[str, Any]) -> str | None:
    error = _int(value, args)
    if error is None and value <= 0:
        return f"{{value_zero_or_less,{value}}}"
    return error


def _expiry(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > _MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return None


def _expires(value: Any, args: dict[str, Any]) -> str | None:
    error = _int(value, args)
    if error is not None:
        return error
    return "{value_zero,0}" if value == 0 else _expiry(value)


def _message_ttl(value: Any, args: dict[str, Any]) -> str | None:
    return _int(value, args) or _expiry(value)


def _max_priority(value: Any, args: dict[str, Any]) -> str | None:
    error = _non_neg_int(value, args)
    if error is None and value > _MAX_PRIORITY:
        return f"{{max_value_exceeded,{value}}}"
    return error


def max_priority(arguments: dict[str, Any]) -> int:
    """The queue's x-max-priority (any AMQP integer type), 0 when it has none.

    0 means "not a priority queue"; a value validation would refuse counts as 0.
    """
    value = arguments.get("x-max-priority", 0)
    return value if _is_int(value) and 0 <= value <= _MAX_PRIORITY else 0


def _dlx_name(value: Any, args: dict[str, Any]) -> str | None:
    return None if _is_str(value) else _unacceptable(value)


def _dlx_routing_key(value: Any, args: dict[str, Any]) -> str | None:
    if not _is_str(value):
        return _unacceptable(value)
    return None if "x-dead-letter-exchange" in args else "routing_key_but_no_dlx_defined"


def _one_of(
    choices: tuple[bytes, ...], error: Callable[[bytes], str]
) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(value: Any, args: dict[str, Any]) -> str | None:
        if not _is_str(value):
            return _unacceptable(value)
        raw = _raw(value)
        return None if raw in choices else error(raw)

    return check


def _queue_version(value: Any, args: dict[str, Any]) -> str | None:
    error = _non_neg_int(value, args)
    if error is None and value not in (1, 2):
        return string_p(f"unsupported queue version '{value}'")
    return error


def _bool(value: Any, args: dict[str, Any]) -> str | None:
    return None if isinstance(value, bool) else _unacceptable(value)


_queue_type = _one_of(
    _KNOWN_QUEUE_TYPES, lambda raw: string_p(b"unsupported queue type '" + raw + b"'")
)

#: A classic queue's validators, in the order RabbitMQ runs them.
_VALIDATORS: tuple[tuple[str, _Check], ...] = (
    ("x-expires", _expires),
    ("x-message-ttl", _message_ttl),
    ("x-dead-letter-exchange", _dlx_name),
    ("x-dead-letter-routing-key", _dlx_routing_key),
    ("x-max-length", _non_neg_int),
    ("x-max-length-bytes", _non_neg_int),
    ("x-max-priority", _max_priority),
    ("x-overflow", _one_of(_OVERFLOW_MODES, lambda raw: "invalid_overflow")),
    (
        "x-queue-mode",
        _one_of(_QUEUE_MODES, lambda raw: string_p(b"unsupported queue mode '" + raw + b"'")),
    ),
    ("x-queue-version", _queue_version),
    ("x-single-active-consumer", _bool),
    ("x-queue-type", _queue_type),
    # Beyond RabbitMQ's classic queues: the delivery limit of its quorum queues and
    # the consumer timeout of 3.12+ (deduplication: see validate_queue_arguments).
    ("x-delivery-limit", _non_neg_int),
    ("x-consumer-timeout", _positive_int),
)


def _invalid(key: str, what: str, error: str) -> PreconditionFailed:
    return PreconditionFailed(f"invalid arg '{key}' for {what}: {error}")


def validate_queue_arguments(name: str, vhost: str, arguments: dict[str, Any]) -> None:
    """Refuse a new classic queue's arguments as RabbitMQ would (406, its texts).

    Streams and quorum queues have their own (validate_stream_declaration,
    validate_quorum_declaration); a type Warren does not know is refused.
    """
    if not arguments:
        return
    what = f"queue '{name}' in vhost '{vhost}'"
    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not _is_str(dlx):
        # Checked by RabbitMQ's channel before the queue's own validation.
        raise PreconditionFailed(
            f"invalid type '{field_type(dlx)}' for arg 'x-dead-letter-exchange' in {what}"
        )
    if "x-queue-type" in arguments:
        qtype = arguments["x-queue-type"]
        error = _queue_type(qtype, arguments)
        if error is not None:
            raise _invalid("x-queue-type", what, error)
        if _raw(qtype) not in (b"classic", b"quorum"):
            raise _invalid(
                "x-queue-type",
                what,
                f"queue type '{_text(qtype)}' is not supported by Warren",
            )
    _check_values(arguments, what, _VALIDATORS, _OTHER_TYPES_ONLY, "rabbit_classic_queue")


def _check_values(
    arguments: dict[str, Any],
    what: str,
    validators: tuple[tuple[str, _Check], ...],
    refused: frozenset[str],
    queue_type: str,
) -> None:
    """The arguments' values (406 with RabbitMQ's texts, in its order), then
    the arguments ``queue_type`` does not take."""
    for key, check in validators:
        if key in arguments:
            value = arguments[key]
            if wire_type(arguments, key) == "binary":  # not a string to RabbitMQ
                value = Binary(value)
            error = check(value, arguments)
            if error is not None:
                raise _invalid(key, what, error)
    if "x-message-deduplication" in arguments:
        from warren.core.dedup import Deduplicator  # the plugin's rules and texts

        Deduplicator.from_arguments(arguments, what)
    for key in arguments:
        if key in refused:
            raise PreconditionFailed(f"invalid arg '{key}' for {what} of queue type {queue_type}")


# -- streams ----------------------------------------------------------------------------


def is_stream(arguments: dict[str, Any]) -> bool:
    """Whether a declaration asks for a stream queue."""
    qtype = arguments.get("x-queue-type")
    return isinstance(qtype, str | bytes) and _raw(qtype) == b"stream"


def _max_age(value: Any, args: dict[str, Any]) -> str | None:
    from warren.core.stream import parse_interval

    if not _is_str(value):
        return _unacceptable(value)
    return None if parse_interval(_text(value)) is not None else "invalid_max_age"


def _leader_locator(value: Any, args: dict[str, Any]) -> str | None:
    if not _is_str(value):
        return _unacceptable(value)
    ok = (b"client-local", b"balanced", b"random", b"least-leaders")
    return None if _raw(value) in ok else "invalid_queue_locator_arg"


def _cluster_size(value: Any, args: dict[str, Any]) -> str | None:
    error = _non_neg_int(value, args)
    return "{value_zero,0}" if error is None and value == 0 else error


#: RabbitMQ's largest x-stream-max-segment-size-bytes.
_MAX_SEGMENT_SIZE = 3_000_000_000


#: A stream's validators, in the order RabbitMQ runs them (x-max-length: Warren's).
_STREAM_VALIDATORS: tuple[tuple[str, _Check], ...] = (
    ("x-max-length-bytes", _non_neg_int),
    ("x-max-age", _max_age),
    ("x-stream-max-segment-size-bytes", _non_neg_int),
    ("x-initial-cluster-size", _cluster_size),
    ("x-queue-leader-locator", _leader_locator),
    ("x-max-length", _non_neg_int),
)

#: Arguments a stream refuses: classic- and quorum-only features.
_NOT_FOR_STREAMS = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-delivery-limit",
        "x-dead-letter-strategy",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-quorum-initial-group-size",
        "x-consumer-timeout",
    }
)


def validate_stream_declaration(
    name: str,
    vhost: str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> None:
    """Refuse a stream declaration as RabbitMQ does (406, its texts and order: the
    arguments first, then the flags: streams are durable, never exclusive or
    auto-delete). ``x-max-length`` is accepted: retention by count, as LavinMQ."""
    what = f"queue '{name}' in vhost '{vhost}'"
    for key, check in _STREAM_VALIDATORS:
        if key in arguments:
            error = check(arguments[key], arguments)
            if error is not None:
                raise _invalid(key, what, error)
    size = arguments.get("x-stream-max-segment-size-bytes")
    if isinstance(size, int) and not isinstance(size, bool) and size > _MAX_SEGMENT_SIZE:
        raise QueueTypeRefused("Exceeded max value for x-stream-max-segment-size-bytes")
    for key in arguments:
        if key in _NOT_FOR_STREAMS:
            raise PreconditionFailed(
                f"invalid arg '{key}' for {what} of queue type rabbit_stream_queue"
            )
    if "x-message-deduplication" in arguments:
        # Warren's header-keyed deduplication (docs/storage.md, "Deduplication keys").
        from warren.core.dedup import Deduplicator

        Deduplicator.from_arguments(arguments, what)
    if auto_delete:
        raise QueueTypeRefused(f"invalid property 'auto-delete' for {what}")
    if exclusive:
        raise QueueTypeRefused(f"invalid property 'exclusive-owner' for {what}")
    if not durable:
        raise QueueTypeRefused(f"invalid property 'non-durable' for {what}")


# -- quorum queues ----------------------------------------------------------------------


def with_default_type(
    default: str | None,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> dict[str, Any]:
    """The arguments of a queue.declare in a vhost whose default queue type is
    ``default``, as RabbitMQ 3.13 and 4.x augment them (rabbit_amqqueue's
    augment_declare_args): without ``x-queue-type``, it is set to the default
    when the queue can be of that type (quorum queues and streams: durable, not
    exclusive, not auto-delete), else to ``classic``."""
    if default is None or "x-queue-type" in arguments:
        return arguments
    compatible = default == "classic" or (durable and not exclusive and not auto_delete)
    return {**arguments, "x-queue-type": default if compatible else "classic"}


def is_quorum(arguments: dict[str, Any]) -> bool:
    """Whether a declaration asks for a quorum queue."""
    qtype = arguments.get("x-queue-type")
    return isinstance(qtype, str | bytes) and _raw(qtype) == b"quorum"


_DLX_STRATEGIES = (b"at-most-once", b"at-least-once")

#: A quorum queue's validators, in RabbitMQ's order (rabbit_amqqueue's declare
#: arguments, which every queue type runs). RabbitMQ 3.10 does not check
#: x-delivery-limit at all (a value that is not an integer leaves the default);
#: x-quorum-target-group-size (3.13+) is taken as it comes.
_QUORUM_VALIDATORS: tuple[tuple[str, _Check], ...] = (
    ("x-expires", _expires),
    ("x-message-ttl", _message_ttl),
    ("x-dead-letter-exchange", _dlx_name),
    ("x-dead-letter-routing-key", _dlx_routing_key),
    ("x-max-length", _non_neg_int),
    ("x-max-length-bytes", _non_neg_int),
    ("x-max-in-memory-length", _non_neg_int),
    ("x-max-in-memory-bytes", _non_neg_int),
    ("x-overflow", _one_of(_OVERFLOW_MODES, lambda raw: "invalid_overflow")),
    ("x-single-active-consumer", _bool),
    ("x-quorum-initial-group-size", _cluster_size),
    ("x-queue-leader-locator", _leader_locator),
    ("x-dead-letter-strategy", _one_of(_DLX_STRATEGIES, lambda raw: "invalid_dlx_strategy")),
    ("x-consumer-timeout", _positive_int),
)

#: Arguments a quorum queue refuses (RabbitMQ 3.10 and 4.x alike): classic- and
#: stream-only features. x-max-priority too: 4.x's quorum queues take message
#: priorities without it (two levels, docs/storage.md "Quorum queues").
_NOT_FOR_QUORUM = frozenset(
    {
        "x-max-priority",
        "x-queue-mode",
        "x-queue-version",
        "x-queue-master-locator",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
    }
)


def validate_quorum_declaration(
    name: str,
    vhost: str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> None:
    """Refuse a quorum queue declaration as RabbitMQ does (406, its texts and
    order: the arguments' values, then the arguments quorum queues do not take,
    then the flags: durable, never exclusive or auto-delete)."""
    what = f"queue '{name}' in vhost '{vhost}'"
    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not _is_str(dlx):
        raise PreconditionFailed(
            f"invalid type '{field_type(dlx)}' for arg 'x-dead-letter-exchange' in {what}"
        )
    _check_values(arguments, what, _QUORUM_VALIDATORS, _NOT_FOR_QUORUM, "rabbit_quorum_queue")
    if auto_delete:
        raise QueueTypeRefused(f"invalid property 'auto-delete' for {what}")
    if exclusive:
        raise QueueTypeRefused(f"invalid property 'exclusive-owner' for {what}")
    if not durable:
        raise QueueTypeRefused(f"invalid property 'non-durable' for {what}")


# -- equivalence on redeclaration -------------------------------------------------------

_MISSING = object()


def _type_class(value: Any) -> str:
    if _is_int(value):
        return "int"
    kind = field_type(value)
    return "float" if kind in ("float", "double") else kind


def _same(a: Any, b: Any) -> bool:
    if _type_class(a) != _type_class(b):
        return False
    if _is_str(a):
        return _raw(a) == _raw(b)
    return bool(a == b)


def _plain(value: Any) -> str:
    """RabbitMQ's rendering of a bare value: '~s' for strings, else '~p'."""
    return f"'{_text(value)}'" if _is_str(value) else f"'{term_p(value)}'"


def _typed(table: dict[str, Any], key: str) -> str:
    """RabbitMQ's rendering of ``table[key]`` with its type (the wire type it
    was declared with, table_tags), or ``none`` when it is absent."""
    value = table.get(key, _MISSING)
    if value is _MISSING:
        return "none"
    shown = _text(value) if _is_str(value) else term_p(value)
    return f"the value '{shown}' of type '{wire_type(table, key)}'"


def _is_classic(value: Any) -> bool:
    return _is_str(value) and _raw(value) == b"classic"


def assert_args_equivalent(
    what: str, current: dict[str, Any], received: dict[str, Any], keys: Iterable[str]
) -> None:
    """Compare the ``keys`` of two argument tables as RabbitMQ does on redeclaration.

    Integers of different wire types are equal when their values are; a missing
    ``x-queue-type`` is the same as ``classic``. ``what`` names the object, e.g.
    ``queue 'q' in vhost '/'``.
    """
    for key in keys:
        cur = current.get(key, _MISSING)
        new = received.get(key, _MISSING)
        if cur is _MISSING and new is _MISSING:
            continue
        if cur is not _MISSING and new is not _MISSING:
            if _same(cur, new):
                continue
            got, have = _plain(new), _plain(cur)
        else:
            present = new if cur is _MISSING else cur
            if key == "x-queue-type" and _is_classic(present):
                continue
            got, have = _typed(received, key), _typed(current, key)
        raise PreconditionFailed(
            f"inequivalent arg '{key}' for {what}: received {got} but current is {have}"
        )
