"""Core objects as RabbitMQ 3.10's management API writes them in JSON.

Object counts come from core state (messages, messages_ready,
messages_unacknowledged, consumers, message_bytes_*); rate statistics
(``message_stats``) come from core/stats.py: counters and the last sampled rates.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus

from warren.core.names import to_bytes
from warren.core.stats import EXCHANGE_GROUPS, NO_AGES, QUEUE_GROUPS, VHOST_GROUPS, Ages
from warren.core.stream_queue import StreamQueue
from warren.json_tables import to_json_table
from warren.node import node_name
from warren.queue_replicas import quorum_members, replicas
from warren.store.quorum_store import QuorumPriorityStore

if TYPE_CHECKING:
    from warren.core.exchange import Binding, Exchange
    from warren.core.policies import Policy
    from warren.core.queue import Queue
    from warren.core.users import User
    from warren.core.vhost import VHost


#: (name, description) of every exchange type Warren has (/api/overview).
EXCHANGE_TYPES = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    ("x-consistent-hash", "Consistent Hashing Exchange"),
    ("x-delayed-message", "Delayed Message Exchange"),
    ("x-message-deduplication", "Message Deduplication Exchange"),
)


def queue_type(q: Queue) -> str:
    return q.queue_type


def queue_counts(q: Queue) -> tuple[int, int]:
    """(ready, unacknowledged) messages."""
    return q.message_count, max(0, q.unacked)


#: What a queue shows with ``disable_stats=true``, as RabbitMQ 3.10.
_BASIC_QUEUE_KEYS = frozenset(
    {
        "arguments",
        "auto_delete",
        "durable",
        "exclusive",
        "messages",
        "messages_ready",
        "messages_unacknowledged",
        "name",
        "node",
        "state",
        "type",
        "vhost",
        "leader",
        "members",
        "online",
    }
)
_LENGTHS = ("messages", "messages_ready", "messages_unacknowledged")
_NOT_FOR_STREAMS = (
    "consumer_capacity",
    "consumer_utilisation",
    "exclusive_consumer_tag",
    "head_message_timestamp",
    "idle_since",
    "message_bytes",
    "message_bytes_paged_out",
    "message_bytes_persistent",
    "message_bytes_ram",
    "message_bytes_ready",
    "message_bytes_unacknowledged",
    "messages_paged_out",
    "messages_persistent",
    "messages_ram",
    "messages_ready_ram",
    "messages_unacknowledged_ram",
    "recoverable_slaves",
    "single_active_consumer_tag",
)


def timestamp(ms: int) -> str:
    """RabbitMQ 3.10's ``idle_since``: ``2026-11-28T19:39:16.765+00:00``."""
    return f"{_second(ms // 1000)}.{ms % 1000:03d}+00:00"


@functools.lru_cache(maxsize=1024)
def _second(seconds: int) -> str:
    """A second's date and time (many queues share one: a listing formats each once)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def idle_since_ms(q: Queue) -> int | None:
    """RabbitMQ's ``idle_since`` (ms), given only while the queue is idle: None
    when its counters or lengths changed at the last statistics sample (it moved
    messages in the last interval); else since that change or its last use
    (declared, consumed from, read), whichever came later. Sample times are
    compared to the millisecond, as the history keeps them."""
    changed = max(q.stats.history.changed_s(), q.lengths.history.changed_s())
    if changed and changed >= q.stats.history.last_s - 0.001:
        return None
    return max(q.last_used_ms, round(changed * 1000))


def queue_info(
    q: Queue,
    ages: Ages = NO_AGES,
    stats: bool = True,
    replica_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A queue as RabbitMQ lists it; ``stats`` False: ``disable_stats=true``'s
    few keys; ``replica_info``: what :func:`replicas` says of the node (a quorum
    queue's leader and members; None: a single node's)."""
    ready, unacked = queue_counts(q)
    ready_bytes = q.store.ready_bytes
    held_bytes = max(0, q.unacked_bytes)
    persistent, persistent_bytes = q.persistent_counts() or (0, 0)
    active = q.active_consumer
    single = q.arguments.get("x-single-active-consumer") is True
    exclusive_tag = next((c.tag for c in q.consumers if c.exclusive), None)
    # Ready messages of a disk-backed queue are in its segment files, not the
    # process's memory; delivered ones are held until acknowledged.
    on_disk = hasattr(q.store, "directory")
    ready_ram, ready_ram_bytes = (0, 0) if on_disk else (ready, ready_bytes)
    info: dict[str, Any] = {
        "arguments": to_json_table(q.arguments),
        "auto_delete": q.auto_delete,
        "consumer_capacity": 1.0 if q.consumers else 0,
        "consumer_utilisation": 1.0 if q.consumers else 0,
        "consumers": len(q.consumers),
        "durable": q.durable,
        "effective_policy_definition": _effective(q),
        "exclusive": q.exclusive,
        "exclusive_consumer_tag": exclusive_tag,
        "head_message_timestamp": None,
        "idle_since": "",
        "message_bytes": ready_bytes + held_bytes,
        "message_bytes_paged_out": ready_bytes - ready_ram_bytes,
        "message_bytes_persistent": persistent_bytes,
        "message_bytes_ram": ready_ram_bytes + held_bytes,
        "message_bytes_ready": ready_bytes,
        "message_bytes_unacknowledged": held_bytes,
        "messages": ready + unacked,
        "messages_paged_out": ready - ready_ram,
        "messages_persistent": persistent,
        "messages_ram": ready_ram + unacked,
        "messages_ready": ready,
        "messages_ready_ram": ready_ram,
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_ram": unacked,
        "name": q.name,
        "node": node_name(),
        "operator_policy": q.operator_policy.name if q.operator_policy else None,
        "policy": q.policy.name if q.policy else None,
        "recoverable_slaves": None,
        "single_active_consumer_tag": active.tag if single and active is not None else None,
        "state": "running",
        "type": queue_type(q),
        "vhost": q.vhost.name,
    }
    for i, key in enumerate(_LENGTHS):
        info[f"{key}_details"] = q.lengths.details(i, ages.len_age, ages.len_incr, ages.end_s)
    idle = idle_since_ms(q)
    if idle is None:  # as RabbitMQ: no key while the queue works (the UI: "running")
        del info["idle_since"]
    else:
        info["idle_since"] = timestamp(idle)
    if isinstance(q, StreamQueue):
        info["members"] = [node_name()]
        info["leader"] = node_name()  # RabbitMQ 3.10's API leaves it out; 3.13 lists it
        # A stream has no classic queue's byte, RAM and consumer figures.
        for key in _NOT_FOR_STREAMS:
            info.pop(key, None)
        info["online"] = [node_name()]
        info["readers"] = {node_name(): len(q.consumers)}
    elif q.queue_type == "quorum":
        info.update(quorum_members(q, replica_info or replicas(None)))
        # RabbitMQ's at-least-once dead-letter backlog: the copies held (0 for a
        # store that holds none, so the UI's "Dead-lettered" column has a number).
        store = q.store
        if isinstance(store, QuorumPriorityStore):
            held, held_dlx_bytes = store.held_count, store.held_bytes
        else:
            held, held_dlx_bytes = 0, 0
        info["messages_dlx"] = held
        info["message_bytes_dlx"] = held_dlx_bytes
        info["messages"] += held
        info.pop("idle_since", None)  # as RabbitMQ 3.10's: a Raft member is never idle
    if not stats:
        basic = {k: v for k, v in info.items() if k in _BASIC_QUEUE_KEYS}
        if info["policy"] is not None:  # as RabbitMQ: there when there is one
            basic["policy"] = info["policy"]
        return basic
    message_stats = q.stats.as_dict(QUEUE_GROUPS, ages)
    if message_stats:
        info["message_stats"] = message_stats
    return info


def _effective(q: Queue) -> dict[str, Any]:
    """The policy keys in force (policy and operator policy merged, lower limit wins)."""
    out: dict[str, Any] = {}
    if q.policy is not None:
        out.update(q.policy.definition)
    if q.operator_policy is not None:
        for key, value in q.operator_policy.definition.items():
            mine = out.get(key)
            out[key] = (
                min(mine, value) if isinstance(mine, int) and isinstance(value, int) else value
            )
    return out


def exchange_info(ex: Exchange, ages: Ages = NO_AGES) -> dict[str, Any]:
    info: dict[str, Any] = {
        "arguments": to_json_table(ex.arguments),
        "auto_delete": ex.auto_delete,
        "durable": ex.durable,
        "internal": ex.internal,
        "name": ex.name,
        "type": ex.type,
        "user_who_performed_action": "rmq-internal",
        "vhost": ex.vhost_name,
    }
    if ex.policy is not None:
        info["policy"] = ex.policy.name
    stats = ex.stats.as_dict(EXCHANGE_GROUPS, ages)
    if stats:
        info["message_stats"] = stats
    return info


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding identifier in URLs: the routing key quoted (``~`` as %7E),
    ``~`` for an empty key, and ``~`` plus a hash of the arguments when there are any.
    RabbitMQ hashes the Erlang term (phash2); Warren hashes the JSON, so the
    identifier has the same shape but another value: clients take it from a listing."""
    key = quote_plus(to_bytes(routing_key)).replace("~", "%7E")  # bytes: as they came
    if not arguments:
        return key or "~"
    canonical = json.dumps(to_json_table(arguments), sort_keys=True, default=str).encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()[:4]).rstrip(b"=")
    return f"{key}~{digest.decode()}"


def binding_info(b: Binding, vhost: str) -> dict[str, Any]:
    return {
        "source": b.source.name,
        "vhost": vhost,
        "destination": b.destination.name,
        "destination_type": b.destination_kind,
        "routing_key": b.routing_key,
        "arguments": to_json_table(b.arguments),
        "properties_key": properties_key(b.routing_key, b.arguments),
    }


def default_binding_info(q: Queue) -> dict[str, Any]:
    """The default exchange's implicit binding to every queue, as RabbitMQ lists it."""
    return implicit_binding_info(q.vhost.name, q.name)


def implicit_binding_info(vhost: str, queue: str) -> dict[str, Any]:
    """The default exchange's binding to the queue named ``queue``, which
    RabbitMQ lists whether or not the queue exists (rabbit_binding's
    implicit_for_destination)."""
    return {
        "source": "",
        "vhost": vhost,
        "destination": queue,
        "destination_type": "queue",
        "routing_key": queue,
        "arguments": {},
        "properties_key": properties_key(queue, {}),
    }


def vhost_info(v: VHost, metadata: dict[str, Any] | None, ages: Ages = NO_AGES) -> dict[str, Any]:
    """A vhost as RabbitMQ lists it: message counts (with rates) once it has
    queues, bytes (with rates) once it had connections, message_stats once any
    moved."""
    meta = metadata or {"description": "", "tags": []}
    if v.name == "/" and metadata is None:
        meta = {"description": "Default virtual host", "tags": []}
    info: dict[str, Any] = {
        "name": v.name,
        "description": meta["description"],
        "tags": list(meta["tags"]),
        # RabbitMQ 3.13: "undefined" when not set; in the metadata only when set.
        "default_queue_type": v.default_queue_type or "undefined",
        "metadata": vhost_metadata(v, meta),
        "tracing": False,
        "cluster_state": {node_name(): "running"},
    }
    lengths = v.lengths
    if v.queues:
        ready = unacked = 0
        for q in v.queues.values():
            r, u = queue_counts(q)
            ready += r
            unacked += u
        for i, (key, value) in enumerate(
            zip(_LENGTHS, (ready + unacked, ready, unacked), strict=True)
        ):
            info[key] = value
            info[f"{key}_details"] = lengths.details(i, ages.len_age, ages.len_incr, ages.end_s)
    if lengths.values[3] or lengths.values[4]:
        for i, key in ((3, "recv_oct"), (4, "send_oct")):
            info[key] = lengths.values[i]
            info[f"{key}_details"] = lengths.details(i, ages.data_age, ages.data_incr, ages.end_s)
    stats = v.stats.as_dict(VHOST_GROUPS, ages)
    if stats:
        info["message_stats"] = stats
    return info


def vhost_metadata(v: VHost, meta: dict[str, Any]) -> dict[str, Any]:
    """A vhost's ``metadata`` as RabbitMQ 3.13 writes it (an Erlang map: its keys
    sorted), ``default_queue_type`` only when set."""
    out: dict[str, Any] = {}
    if v.default_queue_type is not None:
        out["default_queue_type"] = v.default_queue_type
    out["description"] = meta["description"]
    out["tags"] = list(meta["tags"])
    return out


def user_info(u: User) -> dict[str, Any]:
    return {
        "name": u.name,
        "password_hash": u.password_hash,
        "hashing_algorithm": u.hashing_algorithm,
        "tags": list(u.tags),
        "limits": dict(u.limits),
    }


def permission_info(user: str, vhost: str, configure: str, write: str, read: str) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read}


def policy_info(vhost: str, p: Policy) -> dict[str, Any]:
    return {"vhost": vhost, **p.as_json()}
