"""Prometheus metrics with the family names of RabbitMQ's prometheus plugin.

``/metrics`` gives broker-wide totals and ``/metrics/per-object`` one sample per
queue (labels ``vhost``, ``queue``) as RabbitMQ's two endpoints do, so the
Grafana dashboards made for RabbitMQ read Warren. Built with prometheus-client.

The broker's state is read on its event loop in slices (:func:`snapshot`
yields every ``SLICE`` queues, so 10,000 queues do not stall publishers);
the text is then rendered from that copy off the loop (:func:`render`).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from warren import __version__
from warren.core.names import shown
from warren.core.stats import COUNTERS, MessageStats
from warren.memory import resident_bytes

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["CONTENT_TYPE", "SLICE", "Snapshot", "render", "snapshot"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Queues read per loop turn while taking a snapshot.
SLICE = 500

#: Channel counters as RabbitMQ's plugin names them (without the _total suffix
#: prometheus-client adds): (family, help, MessageStats counter).
_CHANNEL_COUNTERS = (
    ("rabbitmq_channel_messages_published", "Total number of messages published into an exchange on a channel", "publish"),
    ("rabbitmq_channel_messages_confirmed", "Total number of messages published into an exchange and confirmed on the channel", "confirm"),
    ("rabbitmq_channel_messages_unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", "return_unroutable"),
    ("rabbitmq_channel_messages_unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", "drop_unroutable"),
    ("rabbitmq_channel_messages_delivered_ack", "Total number of messages delivered to consumers in manual acknowledgement mode", "deliver"),
    ("rabbitmq_channel_messages_delivered", "Total number of messages delivered to consumers in automatic acknowledgement mode", "deliver_no_ack"),
    ("rabbitmq_channel_get_ack", "Total number of messages fetched with basic.get in manual acknowledgement mode", "get"),
    ("rabbitmq_channel_get", "Total number of messages fetched with basic.get in automatic acknowledgement mode", "get_no_ack"),
    ("rabbitmq_channel_get_empty", "Total number of times basic.get operations fetched no message", "get_empty"),
    ("rabbitmq_channel_messages_acked", "Total number of messages acknowledged by consumers", "ack"),
    ("rabbitmq_channel_messages_redelivered", "Total number of messages redelivered to consumers", "redeliver"),
)  # fmt: skip

#: VHost churn counters -> (family without _total, help).
_CHURN = {
    "channels_opened": "Total number of channels opened",
    "channels_closed": "Total number of channels closed",
    "queues_declared": "Total number of queues declared",
    "queues_created": "Total number of queues created",
    "queues_deleted": "Total number of queues deleted",
}

_QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
)


@dataclass
class Snapshot:
    """What the metrics report, copied from the broker at one moment."""

    node: str
    connections: int = 0
    channels: int = 0
    connections_opened: int = 0
    connections_closed: int = 0
    #: Churn summed over vhosts: channels opened/closed, queues declared/created/deleted.
    churn: dict[str, int] = field(default_factory=dict)
    exchanges: int = 0
    consumers: int = 0
    disk_alarm: bool = False
    disk_free: int = 0
    disk_limit: int = 0
    mem_alarm: bool = False
    mem_limit: int = 0
    #: The broker's message counters (live and closed channels of every vhost).
    totals: tuple[int, ...] = (0,) * len(COUNTERS)
    #: (vhost, queue, ready, unacked, ready bytes, consumers, published)
    queues: list[tuple[str, str, int, int, int, int, int]] = field(default_factory=list)
    #: In a cluster, the cluster's state (ClusterNode.status); None on a single node.
    cluster: dict[str, Any] | None = None


async def snapshot(node: Node) -> Snapshot:
    """Copy what the metrics need, yielding to the loop every SLICE queues."""
    snap = Snapshot(node=node.cluster_name)
    snap.connections = len(node.connections)
    snap.channels = sum(len(conn.channel_stats()) for conn in node.connections)
    snap.connections_opened = node.connections_opened
    snap.connections_closed = node.connections_closed
    snap.disk_alarm = node.disk_alarm
    snap.disk_limit = node.config.free_disk_min
    snap.mem_alarm = node.mem_alarm
    snap.mem_limit = node.mem_limit
    for key in _CHURN:
        snap.churn[key] = sum(getattr(v, key) for v in node.vhosts.values())
    totals = MessageStats()
    totals.set_sum(
        [v.base_stats for v in node.vhosts.values()]
        + [stats for conn in node.connections for _, stats in conn.channel_stats()]
    )
    snap.totals = totals.values()
    n = 0
    for vhost in list(node.vhosts.values()):
        snap.exchanges += len(vhost.exchanges)
        for queue in list(vhost.queues.values()):
            consumers = queue.consumer_count
            snap.consumers += consumers
            snap.queues.append(
                (
                    shown(vhost.name),  # labels must be UTF-8 (core/names.py)
                    shown(queue.name),
                    queue.message_count,
                    queue.unacked,
                    queue.store.ready_bytes,
                    consumers,
                    queue.stats.publish,
                )
            )
            n += 1
            if n % SLICE == 0:
                await asyncio.sleep(0)
    if node.cluster_status is not None:
        snap.cluster = node.cluster_status()
    try:
        snap.disk_free = shutil.disk_usage(node.config.data_dir).free
    except OSError:
        snap.disk_free = 0
    return snap


def _families(snap: Snapshot, per_object: bool) -> Iterator[Metric]:
    identity = GaugeMetricFamily(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        labels=["rabbitmq_node", "rabbitmq_cluster"],
    )
    identity.add_metric([snap.node, snap.node], 1)
    yield identity
    build = GaugeMetricFamily(
        "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info", labels=["rabbitmq_version"]
    )
    build.add_metric([f"warren-{__version__}"], 1)
    yield build
    yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open", snap.connections)
    yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", snap.channels)
    yield GaugeMetricFamily("rabbitmq_queues", "Queues available", len(snap.queues))
    yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected", snap.consumers)
    yield CounterMetricFamily(
        "rabbitmq_connections_opened", "Total number of connections opened", snap.connections_opened
    )
    yield CounterMetricFamily(
        "rabbitmq_connections_closed",
        "Total number of connections closed or terminated",
        snap.connections_closed,
    )
    yield GaugeMetricFamily(
        "rabbitmq_disk_space_available_bytes", "Disk space available in bytes", snap.disk_free
    )
    yield GaugeMetricFamily(
        "rabbitmq_disk_space_available_limit_bytes",
        "Free disk space low watermark in bytes",
        snap.disk_limit,
    )
    yield GaugeMetricFamily(
        "rabbitmq_alarms_free_disk_space_watermark",
        "is 1 if free disk space watermark alarm is in effect",
        1 if snap.disk_alarm else 0,
    )
    yield GaugeMetricFamily(
        "rabbitmq_alarms_memory_used_watermark",
        "is 1 if VM memory watermark alarm is in effect",
        1 if snap.mem_alarm else 0,
    )
    yield GaugeMetricFamily(
        "rabbitmq_resident_memory_limit_bytes",
        "Memory high watermark in bytes",
        snap.mem_limit,
    )
    yield GaugeMetricFamily(
        "rabbitmq_process_resident_memory_bytes", "Memory used in bytes", resident_bytes()
    )
    yield GaugeMetricFamily("rabbitmq_process_open_fds", "Open file descriptors", _open_fds())
    for key, help_text in _CHURN.items():
        yield CounterMetricFamily(f"rabbitmq_{key}", help_text, snap.churn.get(key, 0))
    yield GaugeMetricFamily("rabbitmq_process_max_fds", "Open file descriptors limit", _max_fds())
    values = dict(zip(COUNTERS, snap.totals, strict=True))
    for name, help_text, counter in _CHANNEL_COUNTERS:
        yield CounterMetricFamily(name, help_text, values[counter])
    yield from _queue_families(snap, per_object)
    if snap.cluster is not None:
        yield from _cluster_families(snap.cluster)


def _cluster_families(cluster: dict[str, Any]) -> Iterator[Metric]:
    """Warren's own clustering gauges (docs/clustering.md)."""
    yield GaugeMetricFamily(
        "warren_cluster_leader", "1 when this node leads the cluster", int(cluster["role"] == "leader")
    )
    yield GaugeMetricFamily(
        "warren_cluster_replication_position",
        "Actions the leader has replicated so far (on a follower: held on disk)",
        cluster.get("position", 0),
    )
    yield GaugeMetricFamily(
        "warren_cluster_in_sync_replicas",
        "Nodes in the in-sync replica set, the leader included",
        len(cluster.get("in_sync_replicas", [])),
    )
    lag = GaugeMetricFamily(
        "warren_cluster_follower_lag_actions",
        "Actions a connected follower has not acknowledged yet",
        labels=["follower"],
    )
    for follower in cluster.get("followers", []):
        if follower.get("lag_actions") is not None:
            lag.add_metric([follower["node"]], follower["lag_actions"])
    yield lag


def _queue_families(snap: Snapshot, per_object: bool) -> Iterable[Metric]:
    columns = list(zip(*snap.queues, strict=True)) if snap.queues else [()] * 7
    ready, unacked, ready_bytes, consumers, published = (columns[i] for i in range(2, 7))
    data = (
        ready,
        unacked,
        tuple(r + u for r, u in zip(ready, unacked, strict=True)),
        ready_bytes,
        consumers,
    )
    out: list[Metric] = []
    labels = ["vhost", "queue"]
    for (name, help_text), series in zip(_QUEUE_GAUGES, data, strict=True):
        if per_object:
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for (vhost, queue, *_), value in zip(snap.queues, series, strict=True):
                family.add_metric([vhost, queue], value)
        else:
            family = GaugeMetricFamily(name, help_text, value=sum(series))
        out.append(family)
    help_text = "Total number of messages published to queues"
    if per_object:
        counter = CounterMetricFamily("rabbitmq_queue_messages_published", help_text, labels=labels)
        for (vhost, queue, *_), value in zip(snap.queues, published, strict=True):
            counter.add_metric([vhost, queue], value)
    else:
        counter = CounterMetricFamily(
            "rabbitmq_queue_messages_published", help_text, value=sum(published)
        )
    out.append(counter)
    return out


def _max_fds() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 0


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class _SnapshotCollector(Collector):
    def __init__(self, snap: Snapshot, per_object: bool) -> None:
        self.snap = snap
        self.per_object = per_object

    def collect(self) -> Iterable[Metric]:
        return _families(self.snap, self.per_object)


def render(snap: Snapshot, per_object: bool = False) -> bytes:
    """The exposition text (Prometheus 0.0.4 format); touches no broker state, so it
    may run in a thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, per_object))
    return generate_latest(registry)
