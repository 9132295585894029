"""The three endpoints' families, rendered from a Snapshot in chunks.

- ``/metrics``: RabbitMQ's aggregated endpoint: every family, values summed;
- ``/metrics/per-object``: one sample per queue, channel, connection;
- ``/metrics/detailed?family=...&vhost=...``: only the groups asked for
  (families.py), per object, prefixed ``rabbitmq_detailed_`` (``rabbitmq_cluster_``
  for the cluster-wide groups), queue groups limited to the vhosts asked for.

Each endpoint is a generator of text chunks (up to CHUNK queues' samples of
one family, or the small families between them): the endpoint sends each as
it comes and gives the loop back in between (http/prometheus.py), so that no
client waits for a whole scrape.
"""

from __future__ import annotations

import platform
from collections.abc import Collection, Iterator, Sequence

from warren.core.stats import COUNTERS
from warren.metrics.exposition import LabelCache, Text, labels
from warren.metrics.families import (
    CLUSTER_GROUPS,
    CORE_GROUPS,
    GLOBAL,
    GLOBAL_STREAM_ERRORS,
    TOTALS,
)
from warren.metrics.history import STREAM
from warren.metrics.snapshot import QUEUE_COUNTERS, QUEUE_TYPES, QueueColumns, Snapshot

__all__ = ["CHUNK", "detailed_chunks", "render", "render_chunks", "render_detailed"]

#: Queues whose samples of one family make a chunk at most (a millisecond or so).
CHUNK = 5000
#: Queues whose label texts are looked up (or made, the first time) per chunk.
LABELS = 1000

#: Every queue's label text, kept between scrapes.
_QUEUE_LABELS = LabelCache()

_C = {name: i for i, name in enumerate(COUNTERS)}
_Q = {name: i for i, name in enumerate(QUEUE_COUNTERS)}

#: Core groups emitted on /metrics and /metrics/per-object (queue_consumer_count
#: is the subset of queue_metrics RabbitMQ sends only without it; the detailed
#: auth attempts only per object).
_DEFAULT_GROUPS = [g for g in CORE_GROUPS if g != "queue_consumer_count"]

#: Channel counter families -> their index in a channel's counts by exchange
#: (Snapshot.channel_exchanges) or by queue (Snapshot.channel_queues).
_BY_EXCHANGE = {
    "channel_messages_published_total": 0,
    "channel_messages_confirmed_total": 1,
    "channel_messages_unroutable_returned_total": 2,
    "channel_messages_unroutable_dropped_total": 3,
}
_BY_QUEUE = {
    "channel_get_ack_total": 0,
    "channel_get_total": 1,
    "channel_messages_delivered_ack_total": 2,
    "channel_messages_delivered_total": 3,
    "channel_messages_redelivered_total": 4,
    "channel_messages_acked_total": 5,
    "channel_get_empty_total": 6,
}

#: Channel counter families -> MessageStats counter (the aggregated sums).
_CHANNEL_COUNTER = {
    "channel_messages_published_total": "publish",
    "channel_messages_confirmed_total": "confirm",
    "channel_messages_unroutable_returned_total": "return_unroutable",
    "channel_messages_unroutable_dropped_total": "drop_unroutable",
    "channel_get_ack_total": "get",
    "channel_get_total": "get_no_ack",
    "channel_messages_delivered_ack_total": "deliver",
    "channel_messages_delivered_total": "deliver_no_ack",
    "channel_messages_redelivered_total": "redeliver",
    "channel_messages_acked_total": "ack",
    "channel_get_empty_total": "get_empty",
}

#: Dead-letter label sets RabbitMQ initialises: (queue_type, strategy) -> reasons.
_DEAD_LETTER_ROWS = (
    ("rabbit_classic_queue", "disabled", ("maxlen", "expired", "rejected")),
    ("rabbit_classic_queue", "at_most_once", ("maxlen", "expired", "rejected")),
    ("rabbit_quorum_queue", "disabled", ("maxlen", "expired", "rejected", "delivery_limit")),
    ("rabbit_quorum_queue", "at_most_once", ("maxlen", "expired", "rejected", "delivery_limit")),
    (
        "rabbit_quorum_queue",
        "at_least_once",
        ("confirmed", "expired", "rejected", "delivery_limit"),
    ),
)


def render(snap: Snapshot, per_object: bool = False) -> bytes:
    """``/metrics`` (aggregated) or ``/metrics/per-object``, whole."""
    return "".join(render_chunks(snap, per_object)).encode("utf-8")


def render_detailed(
    snap: Snapshot, families: Collection[str], vhosts: Collection[str] | None
) -> bytes:
    """``/metrics/detailed``, whole."""
    return "".join(detailed_chunks(snap, families, vhosts)).encode("utf-8")


def render_chunks(snap: Snapshot, per_object: bool = False) -> Iterator[str]:
    """``/metrics`` (aggregated) or ``/metrics/per-object``, in chunks."""
    out = Text()
    groups = (
        _DEFAULT_GROUPS
        if per_object
        else [g for g in _DEFAULT_GROUPS if g != "auth_attempt_detailed_metrics"]
    )
    yield from _core(out, snap, "rabbitmq_", groups, per_object, None)
    _totals(out, snap)
    _identity(out, snap, "per-object" if per_object else "aggregated")
    _alarms(out, snap)
    _global(out, snap)
    out.family(
        "rabbitmq_unreachable_cluster_peers_count",
        "gauge",
        "Number of peers in the cluster the current node cannot reach.",
        [("", snap.unreachable_peers)],
    )
    out.family(
        "rabbitmq_federation_links",
        "gauge",
        "Current number of federation links.",
        [(labels(status=s), n) for s, n in sorted(snap.federation_links.items())],
    )
    _warren_rate_limits(out, snap)
    if snap.cluster_status is not None:
        _warren_cluster(out, snap)
    if snap.webhooks:
        _warren_webhooks(out, snap)
    yield out.take()


def detailed_chunks(
    snap: Snapshot, families: Collection[str], vhosts: Collection[str] | None
) -> Iterator[str]:
    """``/metrics/detailed``: the groups named in ``families`` (others ignored, as
    RabbitMQ does), queue groups limited to ``vhosts`` when given; in chunks."""
    out = Text()
    core = [g for g in CORE_GROUPS if g in families]
    if "queue_metrics" in core and "queue_consumer_count" in core:
        core.remove("queue_consumer_count")
    yield from _core(out, snap, "rabbitmq_detailed_", core, True, set(vhosts) if vhosts else None)
    for group, fams in CLUSTER_GROUPS.items():
        if group in families:
            for name, mtype, help_text in fams:
                out.family(f"rabbitmq_cluster_{name}", mtype, help_text, _cluster(snap, name))
    _identity(out, snap, "detailed")
    yield out.take()


def _core(
    out: Text,
    snap: Snapshot,
    prefix: str,
    groups: list[str],
    per_object: bool,
    vhosts: set[str] | None,
) -> Iterator[str]:
    """The core collector's groups, a chunk per CHUNK queues' samples of a family."""
    queues = snap.queues
    prefixes: list[str] = []
    if per_object and any(g.startswith("queue_") for g in groups):
        # Every queue's label text (cached; made for new queues at LABELS a
        # turn); then those asked for.
        for lo in range(0, len(queues), LABELS):
            hi = lo + LABELS
            prefixes += _QUEUE_LABELS.queues(queues.vhost[lo:hi], queues.name[lo:hi])
            yield out.take()
        _QUEUE_LABELS.done()
        if vhosts is not None:
            keep = queues.indexes(vhosts)
            queues = queues.select(keep)
            prefixes = [prefixes[i] for i in keep]
    elif vhosts is not None:
        queues = queues.select(queues.indexes(vhosts))
    for group in groups:
        for name, mtype, help_text in CORE_GROUPS[group]:
            if group == "channel_queue_exchange_metrics" and per_object:
                # Per channel, queue and exchange; RabbitMQ filters no vhost here.
                out.family(prefix + name, mtype, help_text, _routed(snap))
            elif not group.startswith("queue_") and group != "channel_queue_exchange_metrics":
                samples = _node_samples(snap, group, name, per_object)
                out.family(prefix + name, mtype, help_text, samples)
            elif per_object:
                out.head(prefix + name, mtype, help_text)
                values = _queue_column(name, queues)
                for lo in range(0, len(values), CHUNK):
                    out.series(prefix + name, prefixes[lo : lo + CHUNK], values[lo : lo + CHUNK])
                    yield out.take()
            else:
                out.family(prefix + name, mtype, help_text, _queue_total(name, queues))
                if len(queues) >= LABELS:  # a sum over many queues: the loop's turn
                    yield out.take()
            if out.pending >= CHUNK:  # many channels or connections
                yield out.take()


def _routed(snap: Snapshot) -> list[tuple[str, float]]:
    """``queue_messages_published_total`` per channel, queue and exchange."""
    return [
        (labels(channel=ch, queue_vhost=v, queue=q, exchange_vhost=v, exchange=ex), n)
        for ch, v, q, ex, n in snap.channel_routed
    ]


def _queue_column(name: str, q: QueueColumns) -> Sequence[float | None]:
    """A queue family's value for every queue (None: no sample). The families not
    named (messages in RAM or paged out, disk reads and writes) are not kept
    apart by Warren's stores and read 0."""
    if name == "queue_messages_ready":
        return q.ready
    if name == "queue_messages_unacked":
        return q.unacked
    if name == "queue_messages":
        return [r + u for r, u in zip(q.ready, q.unacked, strict=True)]
    if name == "queue_consumers":
        return q.consumers
    if name in ("queue_consumer_capacity", "queue_consumer_utilisation"):
        return [1.0 if c else 0.0 for c in q.consumers]
    if name == "queue_messages_bytes":
        return [
            None if r is None or u is None else r + u
            for r, u in zip(q.ready_bytes, q.unacked_bytes, strict=True)
        ]
    if name == "queue_messages_ready_bytes":
        return q.ready_bytes
    if name == "queue_messages_unacked_bytes":
        return q.unacked_bytes
    if name == "queue_messages_persistent":
        return q.persistent
    if name == "queue_messages_persistent_bytes":
        return q.persistent_bytes
    if name == "queue_head_message_timestamp":
        return [None] * len(q)  # not kept
    if name == "stream_segments":
        return q.segments
    if name == "queue_messages_published_total":
        return q.published
    return [0] * len(q)


def _queue_total(name: str, queues: QueueColumns) -> list[tuple[str, float]]:
    present = [v for v in _queue_column(name, queues) if v is not None]
    if name in ("queue_head_message_timestamp", "stream_segments") and not present:
        return []
    return [("", sum(present))]


def _node_samples(
    snap: Snapshot, group: str, name: str, per_object: bool
) -> list[tuple[str, float]]:
    if group == "connection_churn_metrics":
        if name.startswith("connections_"):
            value = snap.connections_opened if "opened" in name else snap.connections_closed
        else:
            value = snap.churn.get(name.removesuffix("_total"), 0)
        return [("", value)]
    if group in ("node_coarse_metrics", "node_metrics", "node_persister_metrics"):
        return [("", _node_value(snap, name))]
    if group == "auth_attempt_metrics":
        column = {"auth_attempts_total": 0, "auth_attempts_succeeded_total": 1}.get(name, 2)
        return [(labels(protocol=p), c[column]) for p, c in sorted(snap.auth.items())]
    if group == "auth_attempt_detailed_metrics":
        return []  # source tracking is off, as RabbitMQ's default
    if group.startswith("channel_"):
        return _channel_samples(snap, name, per_object)
    if group.startswith("connection_"):
        return _connection_samples(snap, name, per_object)
    return []


def _node_value(snap: Snapshot, name: str) -> float:
    io_reads, io_read_bytes, io_writes, io_write_bytes = snap.io
    return {
        "process_open_fds": snap.open_fds,
        "process_open_tcp_sockets": len(snap.connections),
        "process_resident_memory_bytes": snap.mem_used,
        "disk_space_available_bytes": snap.disk_free,
        "process_max_fds": snap.max_fds,
        "process_max_tcp_sockets": snap.max_sockets,
        "resident_memory_limit_bytes": snap.mem_limit,
        "disk_space_available_limit_bytes": snap.disk_limit,
        "erlang_uptime_seconds": snap.uptime,
        "io_read_ops_total": io_reads,
        "io_read_bytes_total": io_read_bytes,
        "io_write_ops_total": io_writes,
        "io_write_bytes_total": io_write_bytes,
    }.get(name, 0)


_CHANNEL_GAUGE = {
    "channel_consumers": "consumers",
    "channel_messages_unacked": "unacked",
    "channel_messages_unconfirmed": "unconfirmed",
    "channel_messages_uncommitted": "uncommitted",
    "channel_acks_uncommitted": "acks_uncommitted",
    "consumer_prefetch": "prefetch",
    "channel_prefetch": "global_prefetch",
}


def _channel_samples(snap: Snapshot, name: str, per_object: bool) -> list[tuple[str, float]]:
    gauge = _CHANNEL_GAUGE.get(name)
    if gauge is not None:
        if per_object:
            return [(labels(channel=ch.name), getattr(ch, gauge)) for ch in snap.channels]
        return [("", sum(getattr(ch, gauge) for ch in snap.channels))]
    if per_object:
        if name in _BY_EXCHANGE:
            i = _BY_EXCHANGE[name]
            return [
                (labels(channel=ch, vhost=vhost, exchange=ex), values[i])
                for ch, vhost, ex, values in snap.channel_exchanges
            ]
        i = _BY_QUEUE[name]
        return [
            (labels(channel=ch, vhost=vhost, queue=q), values[i])
            for ch, vhost, q, values in snap.channel_queues
        ]
    index = _C[_CHANNEL_COUNTER[name]]
    # Closed channels included: the counter never goes back (RabbitMQ's does).
    # The stream protocol has no channels (nor channel counters in RabbitMQ).
    return [("", sum(v[index] for p, v in snap.by_protocol.items() if p != STREAM))]


def _connection_samples(snap: Snapshot, name: str, per_object: bool) -> list[tuple[str, float]]:
    column, retired = {
        "connection_incoming_bytes_total": ("recv_oct", 0),
        "connection_outgoing_bytes_total": ("send_oct", 1),
        "connection_incoming_packets_total": ("recv_cnt", 2),
        "connection_outgoing_packets_total": ("send_cnt", 3),
        "connection_pending_packets": ("pending", -1),
        "connection_channels": ("channels", -1),
    }[name]
    if per_object:  # RabbitMQ labels a connection's samples "channel" too
        return [(labels(channel=c.name), getattr(c, column)) for c in snap.connections]
    total = sum(getattr(c, column) for c in snap.connections)
    if retired >= 0:
        total += snap.retired_octets[retired]
    return [("", total)]


def _cluster(snap: Snapshot, name: str) -> Iterator[tuple[str, float]]:
    if name == "vhost_status":
        for vhost in snap.vhosts:
            yield labels(vhost=vhost), 1
        return
    for vhost, exchange, etype, bindings in snap.exchanges:
        yield (
            labels(vhost=vhost, exchange=exchange, type=etype),
            bindings if name == "exchange_bindings" else 1,
        )


def _totals(out: Text, snap: Snapshot) -> None:
    values = {
        "connections": len(snap.connections),
        "channels": sum(1 for ch in snap.channels if ch.protocol == "amqp091"),
        "consumers": snap.consumers,
        "queues": len(snap.queues),
    }
    for name, mtype, help_text in TOTALS:
        out.family(f"rabbitmq_{name}", mtype, help_text, [("", values[name])])


def _identity(out: Text, snap: Snapshot, endpoint: str) -> None:
    """build_info and identity_info; ``endpoint`` is RabbitMQ 4.1's
    ``rabbitmq_endpoint`` label (aggregated, per-object, detailed), which its
    dashboards select on."""
    out.family(
        "rabbitmq_build_info",
        "untyped",
        "RabbitMQ & Erlang/OTP version info",
        [
            (
                labels(
                    product_name="Warren",
                    product_version=snap.version,
                    rabbitmq_version=f"warren-{snap.version}",
                    prometheus_plugin_version=snap.version,
                    prometheus_client_version=snap.version,  # exposition.py's
                    erlang_version=f"python-{platform.python_version()}",
                ),
                1,
            )
        ],
    )
    out.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node & cluster identity info",
        [
            (
                labels(
                    rabbitmq_node=snap.node,
                    rabbitmq_cluster=snap.cluster,
                    rabbitmq_cluster_permanent_id=snap.cluster_id,
                    rabbitmq_endpoint=endpoint,
                ),
                1,
            )
        ],
    )


def _alarms(out: Text, snap: Snapshot) -> None:
    for name, help_text, raised in (
        ("file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", snap.fd_alarm),
        ("free_disk_space_watermark", "is 1 if free disk space watermark alarm is in effect", snap.disk_alarm),
        ("memory_used_watermark", "is 1 if VM memory watermark alarm is in effect", snap.mem_alarm),
    ):  # fmt: skip
        out.family(f"rabbitmq_alarms_{name}", "untyped", help_text, [("", int(raised))])


def _global(out: Text, snap: Snapshot) -> None:
    protocols = [*snap.protocols, STREAM]
    publishers: dict[str, int] = {STREAM: snap.stream_publishers}
    consumers: dict[str, int] = {STREAM: snap.stream_consumers}
    for ch in snap.channels:
        if ch.stats[_C["publish"]]:
            publishers[ch.protocol] = publishers.get(ch.protocol, 0) + 1
        consumers[ch.protocol] = consumers.get(ch.protocol, 0) + ch.consumers
    zero = (0,) * len(COUNTERS)
    for name, mtype, help_text, kind in GLOBAL:
        samples: list[tuple[str, float]] = []
        if kind == "p":
            for p in protocols:
                stats = snap.by_protocol.get(p, zero)
                value = {
                    "messages_received_total": stats[_C["publish"]],
                    "messages_received_confirm_total": snap.received_confirm.get(p, 0),
                    "messages_routed_total": max(
                        0,
                        stats[_C["publish"]]
                        - stats[_C["return_unroutable"]]
                        - stats[_C["drop_unroutable"]],
                    ),
                    "messages_unroutable_dropped_total": stats[_C["drop_unroutable"]],
                    "messages_unroutable_returned_total": stats[_C["return_unroutable"]],
                    "messages_confirmed_total": stats[_C["confirm"]],
                    "publishers": publishers.get(p, 0),
                    "consumers": consumers.get(p, 0),
                }[name]
                samples.append((labels(protocol=p), value))
        elif kind == "pq":
            for p in protocols:
                for qtype, counts in _by_queue_type(snap, p).items():
                    samples.append(
                        (labels(protocol=p, queue_type=qtype), _delivery_value(name, counts))
                    )
        else:
            reason = name.removeprefix("messages_dead_lettered_").removesuffix("_total")
            for qtype, strategy, reasons in _DEAD_LETTER_ROWS:
                if reason in reasons:
                    value = sum(
                        n
                        for (cls, strat, why), n in snap.dead_lettered.items()
                        if why == reason and strat == strategy and cls == qtype
                    )
                    samples.append((labels(queue_type=qtype, dead_letter_strategy=strategy), value))
        out.family(f"rabbitmq_global_{name}", mtype, help_text, samples)
    for name, help_text in GLOBAL_STREAM_ERRORS:
        out.family(
            f"rabbitmq_global_{name}", "counter", help_text, [(labels(protocol="stream"), 0)]
        )


def _by_queue_type(snap: Snapshot, protocol: str) -> dict[str, tuple[int, ...]]:
    """Delivery counters (QUEUE_COUNTERS) of ``protocol`` per queue type: the
    non-classic queues' own counters (reached over AMQP 0-9-1 only), the rest
    classic. The stream protocol reads streams only, and RabbitMQ counts its
    deliveries alone (its consumers settle nothing)."""
    stats = snap.by_protocol.get(protocol, (0,) * len(COUNTERS))
    if protocol == STREAM:
        delivered = tuple(stats[_C["deliver"]] if c == "deliver" else 0 for c in QUEUE_COUNTERS)
        return {QUEUE_TYPES[2]: delivered}
    total = tuple(stats[_C[c]] for c in QUEUE_COUNTERS)
    out: dict[str, tuple[int, ...]] = {}
    other = [0] * len(QUEUE_COUNTERS)
    for qtype in QUEUE_TYPES[1:]:
        counts = snap.by_queue_type.get(qtype) if protocol == "amqp091" else None
        counts = counts or (0,) * len(QUEUE_COUNTERS)
        if qtype == QUEUE_TYPES[2] and protocol == "amqp091":
            counts = _without_stream_acks(snap, counts)
        out[qtype] = counts
        other = [a + b for a, b in zip(other, counts, strict=True)]
    classic = tuple(max(0, t - o) for t, o in zip(total, other, strict=True))
    return {QUEUE_TYPES[0]: classic, **out}


def _without_stream_acks(snap: Snapshot, counts: tuple[int, ...]) -> tuple[int, ...]:
    """A stream queue's counters less the stream protocol's settlements (its
    subscriptions settle each read at once; the queue counts those acks)."""
    acked = snap.by_protocol.get(STREAM, (0,) * len(COUNTERS))[_C["ack"]]
    i = QUEUE_COUNTERS.index("ack")
    return (*counts[:i], max(0, counts[i] - acked), *counts[i + 1 :])


def _delivery_value(name: str, counts: tuple[int, ...]) -> int:
    q = dict(zip(QUEUE_COUNTERS, counts, strict=True))
    return {
        "messages_delivered_total": q["deliver"] + q["deliver_no_ack"] + q["get"] + q["get_no_ack"],
        "messages_delivered_consume_manual_ack_total": q["deliver"],
        "messages_delivered_consume_auto_ack_total": q["deliver_no_ack"],
        "messages_delivered_get_manual_ack_total": q["get"],
        "messages_delivered_get_auto_ack_total": q["get_no_ack"],
        "messages_get_empty_total": q["get_empty"],
        "messages_redelivered_total": q["redeliver"],
        "messages_acknowledged_total": q["ack"],
    }[name]


#: Warren's webhook families (docs/webhooks.md): (name, type, help, status key).
WEBHOOK_FAMILIES = (
    ("events_delivered_total", "counter", "Events a webhook target took (2xx)", "delivered"),
    ("events_failed_total", "counter", "Events given up after every retry", "failed"),
    ("events_dropped_total", "counter", "Events dropped: the target's buffer was full", "dropped"),
    ("retries_total", "counter", "POSTs tried again after a failure", "retries"),
    ("events_queued", "gauge", "Events waiting for the target", "queued"),
)


def _warren_webhooks(out: Text, snap: Snapshot) -> None:
    """Warren's own webhook counters, by target."""
    for name, mtype, help_text, key in WEBHOOK_FAMILIES:
        samples = [(labels(target=t["name"]), int(t[key])) for t in snap.webhooks]
        out.family(f"warren_webhook_{name}", mtype, help_text, samples)


def _warren_rate_limits(out: Text, snap: Snapshot) -> None:
    """Warren's rate limits (core/rate_limits.py, docs/security.md)."""
    refused, paused, subscriptions, http_refused = snap.rate_limited
    for name, help_text, value in (
        ("connections_refused", "Connections refused by connection_rate_limit", refused),
        ("publishers_paused", "Times a publisher's reading paused by publish_rate_limit", paused),
        (
            "subscriptions_refused",
            "Subscriptions refused by max_subscriptions_per_client",
            subscriptions,
        ),
        (
            "http_connections_refused",
            "Management (HTTP) connections refused by connection_rate_limit",
            http_refused,
        ),
    ):
        out.family(f"warren_rate_limit_{name}_total", "counter", help_text, [("", value)])


def _warren_cluster(out: Text, snap: Snapshot) -> None:
    """Warren's own clustering gauges (docs/clustering.md)."""
    cluster = snap.cluster_status or {}
    out.family(
        "warren_cluster_leader",
        "gauge",
        "1 when this node leads the cluster",
        [("", int(cluster.get("role") == "leader"))],
    )
    out.family(
        "warren_cluster_replication_position",
        "gauge",
        "Actions the leader has replicated so far (on a follower: held on disk)",
        [("", cluster.get("position", 0))],
    )
    out.family(
        "warren_cluster_in_sync_replicas",
        "gauge",
        "Nodes in the in-sync replica set, the leader included",
        [("", len(cluster.get("in_sync_replicas", [])))],
    )
    out.family(
        "warren_cluster_follower_lag_actions",
        "gauge",
        "Actions a connected follower has not acknowledged yet",
        [
            (labels(follower=f["node"]), f["lag_actions"])
            for f in cluster.get("followers", [])
            if f.get("lag_actions") is not None
        ],
    )
