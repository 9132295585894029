"""Super streams (RabbitMQ 3.11+): a direct exchange whose partitions are streams.

A super stream is no object of its own, as in RabbitMQ: its exchange is a
durable direct exchange declared with ``x-super-stream: true``, and each
partition is a stream queue bound to it with its binding key and the binding
argument ``x-stream-partition-order`` (its index). So one made over AMQP 0-9-1
(exchange.declare, queue.declare, queue.bind, as RabbitMQ's Java client and
``rabbitmq-streams add_super_stream`` make it), by the stream protocol, the
HTTP API or ``warren ctl`` is the same thing, seen alike by every door, and a
restart keeps it as it keeps any exchange, queue and binding.

Routing a message to a partition is the client's job: by routing key
(:func:`route`, the streams the exchange routes the key to) or by hashing a
key over :func:`partitions` (rstream and the Java client use murmur3). A
message published over AMQP 0-9-1 to the exchange is routed by its routing
key, as by any direct exchange.

Names, checks and their order follow RabbitMQ's rabbit_stream_manager and
rabbit_stream_utils; the protocol packages map the errors to their codes
(:class:`AlreadyExists` is the stream protocol's STREAM_ALREADY_EXISTS).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from warren.core.errors import BrokerError, NotFound, PreconditionFailed
from warren.core.exchange import Binding, Exchange
from warren.core.message import Message
from warren.core.properties import EMPTY_PROPERTIES
from warren.core.queue_arguments import validate_stream_declaration
from warren.core.stream_queue import StreamQueue

if TYPE_CHECKING:
    from warren.core.vhost import VHost

__all__ = [
    "MAX_PARTITIONS",
    "PARTITION_ORDER",
    "SUPER_STREAM",
    "AlreadyExists",
    "correct_name",
    "create",
    "delete",
    "parse_binding_keys",
    "partition_index",
    "partitions",
    "route",
    "stream_arguments",
    "streams_for_keys",
    "streams_for_partitions",
]

log = logging.getLogger("warren.super_stream")

#: The exchange argument that marks a super stream's exchange.
SUPER_STREAM: Final = "x-super-stream"
#: The binding argument that orders a super stream's partitions.
PARTITION_ORDER: Final = "x-stream-partition-order"
#: RabbitMQ's max_super_stream_partitions default.
MAX_PARTITIONS: Final = 1000

#: A permission check: (configure|write|read, "exchange"|"queue", name); it
#: raises (AccessRefused, or the HTTP API's refusal) when not allowed.
Check = Callable[[str, str, str], None]

#: RabbitMQ's stream manager's argument names (a queue argument without its
#: ``x-``): numbers, and strings. Others are ignored, as RabbitMQ ignores them;
#: stream-filter-size-bytes too (Warren's filter is exact, it has no bloom
#: filter to size).
_INT_ARGUMENTS: Final = frozenset(
    {"max-length-bytes", "stream-max-segment-size-bytes", "initial-cluster-size"}
)
_STR_ARGUMENTS: Final = frozenset({"max-age", "queue-leader-locator"})


class AlreadyExists(PreconditionFailed):
    """The super stream's exchange, or a queue named as one of its partitions,
    exists already."""


def stream_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The stream manager's arguments (``max-age``...: the stream protocol's
    Create, a super stream's) as a stream queue's declaration takes them
    (``x-max-age``...); PreconditionFailed when a number is not one."""
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key in _INT_ARGUMENTS:
            try:
                if isinstance(value, bool):
                    raise ValueError(value)
                out["x-" + key] = int(value)
            except (TypeError, ValueError):
                raise PreconditionFailed(f"invalid {key}: {value!r}") from None
        elif key in _STR_ARGUMENTS:
            if not isinstance(value, str):
                raise PreconditionFailed(f"invalid {key}: {value!r}")
            out["x-" + key] = value
    return out


def correct_name(name: str) -> str | None:
    """RabbitMQ's rule for a new stream's or super stream's name: CR and LF
    dropped, then not empty and not under ``amq.`` (and, as every name, at
    most 255 bytes); None when refused."""
    name = name.replace("\n", "").replace("\r", "")
    if not name or name.startswith("amq.") or len(name.encode("utf-8")) > 255:
        return None
    return name


def streams_for_partitions(name: str, count: int) -> tuple[list[str], list[str]]:
    """``--partitions N``: the streams ``name-0`` ... and their binding keys ``0`` ..."""
    keys = [str(i) for i in range(count)]
    return [f"{name}-{k}" for k in keys], keys


def streams_for_keys(name: str, keys: Sequence[str]) -> list[str]:
    """``--binding-keys a,b``: the streams ``name-a``, ``name-b``."""
    return [f"{name}-{k}" for k in keys]


def parse_binding_keys(text: str) -> list[str]:
    """A comma-separated list of binding keys, each trimmed, the empty ones dropped."""
    return [k for k in (part.strip() for part in text.split(",")) if k]


def check_management(check: Check, name: str, streams: Sequence[str]) -> None:
    """What making or deleting a super stream needs, in RabbitMQ's order:
    configure on the exchange and on every stream, read on the exchange
    (binding from it) and write on every stream (binding to them)."""
    check("configure", "exchange", name)
    for stream in streams:
        check("configure", "queue", stream)
    check("read", "exchange", name)
    for stream in streams:
        check("write", "queue", stream)


def create(
    vhost: VHost,
    name: str,
    streams: Sequence[str],
    binding_keys: Sequence[str],
    arguments: Mapping[str, Any],
    check: Check,
) -> list[str]:
    """Make super stream ``name``: its exchange, its partition streams (with
    ``arguments``, the stream manager's names) and their bindings, as one
    change: what was made is taken back when a later step fails. The names of
    the partitions made; the caller answers once the change is durable.

    Raises PreconditionFailed (a bad name, argument or count), the check's
    refusal, AlreadyExists, or another BrokerError (a store that failed)."""
    exchange_name = correct_name(name)
    if exchange_name is None:
        raise PreconditionFailed(f"{name!r} is not a correct name for a super stream")
    check_management(check, exchange_name, streams)
    queue_arguments = _validated(vhost, exchange_name, streams, binding_keys, arguments)
    partitions_ = [correct_name(s) or s for s in streams]
    ex = vhost.declare_exchange(exchange_name, "direct", arguments={SUPER_STREAM: True})
    made: list[str] = []
    try:
        queues = []
        for stream in partitions_:
            queues.append(vhost.declare_queue(stream, durable=True, arguments=queue_arguments))
            made.append(stream)
        for order, (q, key) in enumerate(zip(queues, binding_keys, strict=True)):
            vhost.bind(ex, q, key, {PARTITION_ORDER: order})
    except BrokerError:
        _take_back(vhost, exchange_name, made)
        raise
    log.info(
        "vhost '%s': super stream '%s' created with %d partition(s)",
        vhost.name,
        exchange_name,
        len(made),
    )
    return made


def _validated(
    vhost: VHost,
    name: str,
    streams: Sequence[str],
    binding_keys: Sequence[str],
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """RabbitMQ's checks before a super stream is made, in its order; the
    partitions' queue arguments."""
    if len(streams) != len(binding_keys):
        raise PreconditionFailed("There must be the same number of partitions and binding keys")
    if len(set(streams)) != len(streams):
        raise PreconditionFailed(f"Duplicate partition names found {', '.join(streams)}")
    wrong = [s for s in streams if correct_name(s) is None]
    if wrong:
        raise PreconditionFailed(f"{', '.join(wrong)} is not a correct partition names")
    if len(streams) > MAX_PARTITIONS:
        raise PreconditionFailed(f"The partition number must not exceed {MAX_PARTITIONS}")
    cap = vhost.limits.get("max-queues")
    if cap is not None and cap >= 0 and len(vhost.queues) + len(streams) > cap:
        raise PreconditionFailed(
            f"Cannot declare super stream '{name}' with {len(streams)} partition(s) "
            f"because queue limit {cap} in vhost '{vhost.name}' is reached"
        )
    if name in vhost.exchanges:
        raise AlreadyExists(f"there is already an exchange named {name}")
    for stream in streams:
        if (correct_name(stream) or stream) in vhost.queues:
            raise AlreadyExists(f"there is already a queue named {stream}")
    # A partition's arguments as RabbitMQ gives them: leader locator 'balanced'
    # unless told otherwise; checked once here, before anything is made.
    given = dict(arguments)
    given.setdefault("queue-leader-locator", "balanced")
    queue_arguments = stream_arguments(given)
    if streams:
        validate_stream_declaration(streams[0], vhost.name, True, False, False, queue_arguments)
    return queue_arguments


def _take_back(vhost: VHost, name: str, streams: Sequence[str]) -> None:
    """Undo a super stream made in part (RabbitMQ's rollback operations)."""
    for stream in streams:
        try:
            vhost.delete_queue(stream)
        except BrokerError as exc:
            log.warning("vhost '%s': partition '%s' not taken back: %s", vhost.name, stream, exc)
    try:
        vhost.delete_exchange(name)
    except BrokerError as exc:
        log.warning("vhost '%s': super stream '%s' not taken back: %s", vhost.name, name, exc)


def _exchange(vhost: VHost, name: str) -> Exchange:
    ex = vhost.exchanges.get(name)
    if ex is None or name == "":
        raise NotFound(f"no super stream '{name}' in vhost '{vhost.name}'")
    return ex


def _order(binding: Binding) -> int | None:
    """A binding's partition order (RabbitMQ coerces a number or its text)."""
    value = binding.arguments.get(PARTITION_ORDER)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _is_stream(dest: object) -> bool:
    return isinstance(dest, StreamQueue) and not dest.deleted


def _ordered(bindings: Sequence[Binding]) -> list[Binding]:
    """Bindings by partition order, those without one after them in their order
    (rabbit_stream_utils:sort_partitions)."""
    ranked = [(_order(b), i, b) for i, b in enumerate(bindings)]
    ranked.sort(key=lambda r: (r[0] is None, r[0] or 0, r[1]))
    return [b for _, _, b in ranked]


def partitions(vhost: VHost, name: str) -> list[str]:
    """The super stream's partitions in order: the streams bound to its
    exchange (one entry per binding, as RabbitMQ lists them); NotFound when
    there is no such exchange."""
    ex = _exchange(vhost, name)
    bindings = [b for b in ex.bindings.values() if _is_stream(b.destination)]
    return [b.destination.name for b in _ordered(bindings)]


def partition_index(vhost: VHost, name: str, stream: str) -> int:
    """``stream``'s index in super stream ``name`` (what a single active
    consumer of a partition is chosen by): its binding's order, else the
    number after the last ``-`` of its name, else -1; NotFound when there is
    no such exchange or ``stream`` is not one of its partitions
    (rabbit_stream_manager:partition_index)."""
    ex = _exchange(vhost, name)
    bindings = [
        b
        for b in ex.bindings.values()
        if _is_stream(b.destination) and b.destination.name == stream
    ]
    if not bindings:
        raise NotFound(f"no partition '{stream}' in super stream '{name}'")
    order = _order(_ordered(bindings)[0])
    if order is not None:
        return order
    _, dash, suffix = stream.rpartition("-")
    if dash and suffix.isascii() and suffix.isdigit():
        return int(suffix)
    return -1


def route(vhost: VHost, name: str, routing_key: str) -> list[str]:
    """The streams the exchange routes ``routing_key`` to (exchange-to-exchange
    bindings and alternate exchanges followed, as for a published message),
    by partition order; NotFound when there is no such exchange."""
    ex = _exchange(vhost, name)
    probe = Message(name, routing_key, EMPTY_PROPERTIES, b"", timestamp=0)
    queues = [q for q in vhost.router.route(ex, probe) if _is_stream(q)]
    rank: dict[int, int] = {}
    for binding in ex.bindings.values():
        order = _order(binding)
        if order is not None:
            key = id(binding.destination)
            rank[key] = min(order, rank.get(key, order))
    queues.sort(key=lambda q: (id(q) not in rank, rank.get(id(q), 0)))
    return [q.name for q in queues]


def delete(vhost: VHost, name: str, check: Check) -> list[str]:
    """Delete super stream ``name``: its exchange and its partition streams
    (what else is bound to it stays). The partitions deleted; the caller
    answers once the change is durable.

    Raises the check's refusal, or NotFound when there is no such super
    stream. A step that fails is logged and the others go on, as in RabbitMQ."""
    check("configure", "exchange", name)
    if correct_name(name) != name:
        # No super stream has such a name (amq.*, the default exchange): never
        # delete what is bound to a reserved exchange.
        raise NotFound(f"no super stream '{name}' in vhost '{vhost.name}'")
    streams = partitions(vhost, name)
    check_management(check, name, streams)
    try:
        vhost.delete_exchange(name)
    except BrokerError as exc:
        log.warning("vhost '%s': super stream exchange '%s' not deleted: %s", vhost.name, name, exc)
    deleted: list[str] = []
    for stream in dict.fromkeys(streams):
        if not _is_stream(vhost.queues.get(stream)):
            continue
        try:
            vhost.delete_queue(stream)
        except BrokerError as exc:
            log.warning(
                "vhost '%s': partition '%s' of super stream '%s' not deleted: %s",
                vhost.name,
                stream,
                name,
                exc,
            )
            continue
        deleted.append(stream)
    log.info("vhost '%s': super stream '%s' deleted", vhost.name, name)
    return deleted
