"""Copying what the metrics report from the broker, on its loop, in slices.

:func:`snapshot` reads the broker's state into plain tuples and yields to the
event loop every ``SLICE`` queues (and channels), so a scrape of 10,000 queues
does not stall clients; rendering (render.py) then works on the copy, off the
loop. Nothing here is counted per message: the counters read are the ones the
protocols keep anyway (core/stats.py) plus what history.py kept of closed
objects.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from warren import __version__
from warren.core.names import shown
from warren.core.stats import COUNTERS, MessageStats
from warren.memory import resident_bytes
from warren.metrics.history import CHURN, STREAM, merge_stats, protocol_label

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["SLICE", "QueueColumns", "Snapshot", "snapshot"]

#: When this process started (what /api/nodes's uptime counts from too).
STARTED = time.time()

#: Queues (or channels) read per loop turn while taking a snapshot (a
#: millisecond or so).
SLICE = 500

#: Queue counters split by queue type in the rabbitmq_global_* families.
QUEUE_COUNTERS = ("deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver")
_QUEUE_INDEX = tuple(COUNTERS.index(name) for name in QUEUE_COUNTERS)

QUEUE_TYPES = ("rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue")


@dataclass
class QueueColumns:
    """Every queue's gauges and counters, a list per column (index i: one queue).

    Columns, not a row object per queue: appending to lists of strings and ints
    creates no object the garbage collector tracks, so reading 10,000 queues
    does not set off collections (each of which, under that many queues, can
    stall the loop for tens of milliseconds, a full one for half a second)."""

    vhost: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    unacked: list[int] = field(default_factory=list)
    #: Body bytes ready and unacked (None: a stream's, which has no byte figures).
    ready_bytes: list[int | None] = field(default_factory=list)
    unacked_bytes: list[int | None] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    #: messages_persistent and message_bytes_persistent (None: a stream's).
    persistent: list[int | None] = field(default_factory=list)
    persistent_bytes: list[int | None] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    #: Stream queues' segment files (None: not a stream, or not known).
    segments: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.name)

    def indexes(self, vhosts: set[str]) -> list[int]:
        """The indexes of the queues of those vhosts."""
        return [i for i, vhost in enumerate(self.vhost) if vhost in vhosts]

    def select(self, keep: list[int]) -> QueueColumns:
        """The queues at those indexes only."""
        out = QueueColumns()
        for column in fields(self):
            values = getattr(self, column.name)
            setattr(out, column.name, [values[i] for i in keep])
        return out


class ChannelRow(NamedTuple):
    """One channel (an AMQP channel, an MQTT session) as channels_info() has it."""

    name: str
    vhost: str
    protocol: str
    consumers: int
    unacked: int
    unconfirmed: int
    uncommitted: int
    acks_uncommitted: int
    prefetch: int
    global_prefetch: int
    confirm: bool
    #: COUNTERS' values.
    stats: tuple[int, ...]


class ConnectionRow(NamedTuple):
    name: str
    protocol: str
    recv_oct: int
    send_oct: int
    recv_cnt: int
    send_cnt: int
    pending: int
    channels: int


@dataclass
class Snapshot:
    """What the metrics report, copied from the broker at one moment."""

    node: str
    cluster: str
    cluster_id: str
    version: str = __version__
    vhosts: list[str] = field(default_factory=list)
    churn: dict[str, int] = field(default_factory=dict)
    connections_opened: int = 0
    connections_closed: int = 0
    queues: QueueColumns = field(default_factory=QueueColumns)
    channels: list[ChannelRow] = field(default_factory=list)
    #: AMQP channels' counts by exchange: (channel, vhost, exchange, (publish,
    #: confirm, return_unroutable, drop_unroutable)).
    channel_exchanges: list[tuple[str, str, str, tuple[int, ...]]] = field(default_factory=list)
    #: By queue: (channel, vhost, queue, (get, get_no_ack, deliver,
    #: deliver_no_ack, redeliver, ack, get_empty)).
    channel_queues: list[tuple[str, str, str, tuple[int, ...]]] = field(default_factory=list)
    #: Publishes by queue and exchange: (channel, vhost, queue, exchange, n).
    channel_routed: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    connections: list[ConnectionRow] = field(default_factory=list)
    #: (vhost, name, type, bindings from it) of every exchange but the default
    #: and the internal ones.
    exchanges: list[tuple[str, str, str, int]] = field(default_factory=list)
    #: Closed connections' [recv_oct, send_oct, recv_cnt, send_cnt].
    retired_octets: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    #: Message counters (COUNTERS) per protocol label, closed channels included.
    by_protocol: dict[str, tuple[int, ...]] = field(default_factory=dict)
    received_confirm: dict[str, int] = field(default_factory=dict)
    #: Queue counters (QUEUE_COUNTERS) of non-classic queue types, deleted queues included.
    by_queue_type: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dead_lettered: dict[tuple[str, str, str], int] = field(default_factory=dict)
    auth: dict[str, list[int]] = field(default_factory=dict)
    #: core/rate_limits.py's counts: connections refused, publishers paused,
    #: subscriptions refused, management connections refused.
    rate_limited: tuple[int, int, int, int] = (0, 0, 0, 0)
    protocols: list[str] = field(default_factory=list)
    consumers: int = 0
    #: Stream protocol publishers and subscriptions (they have no channels).
    stream_publishers: int = 0
    stream_consumers: int = 0
    disk_alarm: bool = False
    mem_alarm: bool = False
    fd_alarm: bool = False
    disk_free: int = 0
    disk_limit: int = 0
    mem_used: int = 0
    mem_limit: int = 0
    open_fds: int = 0
    max_fds: int = 0
    max_sockets: int = 0
    #: /proc/self/io: read syscalls, bytes read, write syscalls, bytes written.
    io: tuple[int, int, int, int] = (0, 0, 0, 0)
    unreachable_peers: int = 0
    #: Federation links by status (running, starting, error, ...).
    federation_links: dict[str, int] = field(default_factory=dict)
    #: In a cluster, the cluster's state (ClusterNode.status); None on a single node.
    cluster_status: dict[str, Any] | None = None
    #: The webhook targets' status (warren.webhooks); empty without webhooks.
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    taken_at: float = 0.0
    #: Seconds since the process started.
    uptime: float = 0.0


async def snapshot(node: Node) -> Snapshot:
    """Copy what the metrics need, yielding to the loop every SLICE queues."""
    snap = Snapshot(node=_node_name(), cluster=node.cluster_name, cluster_id=node.cluster_id)
    snap.taken_at = time.time()
    snap.uptime = round(snap.taken_at - STARTED, 3)
    retired = node.retired
    snap.connections_opened = node.connections_opened
    snap.connections_closed = node.connections_closed
    snap.churn = dict(retired.churn)
    snap.vhosts = [shown(name) for name in node.vhosts]
    snap.retired_octets = list(retired.octets)
    snap.auth = {p: list(c) for p, c in node.auth_attempts.by_protocol.items()}
    limited = node.rate_limits.counts
    snap.rate_limited = (
        limited.connections_refused,
        limited.publishers_paused,
        limited.subscriptions_refused,
        limited.http_connections_refused,
    )
    snap.dead_lettered = dict(retired.dead_lettered)
    amqp = MessageStats()
    amqp.add(retired.vhost_stats)
    received_confirm = {"amqp091": retired.received_confirm}
    queue_stats: dict[str, MessageStats] = {}
    merge_stats(queue_stats, retired.queue_stats.items())
    seen = 0  # queues and channels read: the loop is given back every SLICE
    cols = snap.queues
    for vhost in list(node.vhosts.values()):
        for key in CHURN:
            snap.churn[key] += getattr(vhost, key)
        amqp.add(vhost.base_stats)
        received_confirm["amqp091"] += vhost.received_confirm
        merge_stats(queue_stats, vhost.deleted_queue_stats.items())
        for dl_key, n in vhost.dead_letters.counts.items():
            snap.dead_lettered[dl_key] = snap.dead_lettered.get(dl_key, 0) + n
        for ex in list(vhost.exchanges.values()):
            if ex.name and not getattr(ex, "internal", False):
                snap.exchanges.append(
                    (shown(vhost.name), shown(ex.name), ex.type, len(getattr(ex, "bindings", ())))
                )
        vhost_name = shown(vhost.name)  # labels must be UTF-8 (core/names.py)
        for queue in list(vhost.queues.values()):
            qtype = queue.queue_module  # RabbitMQ's queue_type label
            if qtype != "rabbit_classic_queue":
                merge_stats(queue_stats, [(qtype, queue.stats)])
            segments = getattr(getattr(queue, "stream", None), "segment_count", None)
            cols.vhost.append(vhost_name)
            cols.name.append(shown(queue.name))
            cols.ready.append(queue.message_count)
            cols.unacked.append(max(0, queue.unacked))
            persistent = queue.persistent_counts()  # None: a stream, as RabbitMQ's
            if persistent is None:
                cols.ready_bytes.append(None)
                cols.unacked_bytes.append(None)
                cols.persistent.append(None)
                cols.persistent_bytes.append(None)
            else:
                cols.ready_bytes.append(queue.store.ready_bytes)
                cols.unacked_bytes.append(max(0, queue.unacked_bytes))
                cols.persistent.append(persistent[0])
                cols.persistent_bytes.append(persistent[1])
            cols.consumers.append(queue.consumer_count)
            cols.published.append(queue.stats.publish)
            cols.segments.append(segments if isinstance(segments, int) else None)
            seen += 1
            if seen % SLICE == 0:
                await asyncio.sleep(0)
    by_protocol: dict[str, MessageStats] = {"amqp091": amqp}
    for label, stats in retired.sessions.items():
        by_protocol.setdefault(label, MessageStats()).add(stats)
    for conn in list(node.connections):
        info = conn.info()
        if not info:
            continue
        label = protocol_label(info.get("protocol", ""))
        snap.connections.append(
            ConnectionRow(
                shown(info.get("name", "")),
                label,
                info.get("recv_oct", 0),
                info.get("send_oct", 0),
                info.get("recv_cnt", 0),
                info.get("send_cnt", 0),
                info.get("send_pend", 0) or 0,
                info.get("channels", 0),
            )
        )
        totals = by_protocol.setdefault(label, MessageStats())
        if label == STREAM:
            # No channels: the connection's own counters (its channel_stats).
            for _vhost, live in conn.channel_stats():
                totals.add(live)
            snap.stream_publishers += info.get("publishers", 0)
            snap.stream_consumers += info.get("subscriptions", 0)
        for ch_name, vhost_name, counts in conn.channel_counts():
            ch_name, vhost_name = shown(ch_name), shown(vhost_name)
            by_exchange, by_queue, routed = counts.rows()
            snap.channel_exchanges += [
                (ch_name, vhost_name, shown(ex), values) for ex, values in by_exchange
            ]
            snap.channel_queues += [
                (ch_name, vhost_name, shown(q), values) for q, values in by_queue
            ]
            snap.channel_routed += [
                (ch_name, vhost_name, shown(q), shown(ex), n) for q, ex, n in routed
            ]
        for ch in conn.channels_info():
            shown_stats: dict[str, Any] = ch.get("message_stats") or {}
            values = tuple(int(shown_stats.get(c, 0)) for c in COUNTERS)
            row = ChannelRow(
                shown(ch.get("name", "")),
                shown(ch.get("vhost", "")),
                label,
                ch.get("consumer_count", 0),
                ch.get("messages_unacknowledged", 0),
                ch.get("messages_unconfirmed", 0),
                ch.get("messages_uncommitted", 0),
                ch.get("acks_uncommitted", 0),
                ch.get("prefetch_count", 0) or 0,
                ch.get("global_prefetch_count", 0) or 0,
                bool(ch.get("confirm")),
                values,
            )
            snap.channels.append(row)
            for name, value in zip(COUNTERS, values, strict=True):
                setattr(totals, name, getattr(totals, name) + value)
            if row.confirm:
                received_confirm[label] = received_confirm.get(label, 0) + values[0]
            snap.consumers += row.consumers
            seen += 1
            if seen % SLICE == 0:
                await asyncio.sleep(0)
    snap.by_protocol = {label: stats.values() for label, stats in by_protocol.items()}
    # Every stream protocol publish expects a confirm (RabbitMQ counts both alike).
    received_confirm[STREAM] = by_protocol.get(STREAM, MessageStats()).publish
    snap.consumers += snap.stream_consumers
    snap.received_confirm = received_confirm
    for label, stats in queue_stats.items():
        values = stats.values()
        mine = tuple(values[i] for i in _QUEUE_INDEX)
        prior = snap.by_queue_type.get(label, (0,) * len(QUEUE_COUNTERS))
        snap.by_queue_type[label] = tuple(a + b for a, b in zip(prior, mine, strict=True))
    config = node.config
    snap.protocols = (
        ["amqp091"]
        + (["mqtt310", "mqtt311", "mqtt50"] if config.mqtt_port >= 0 else [])
        + (["coap"] if config.coap_enabled else [])
    )
    snap.disk_alarm = node.disk_alarm
    snap.mem_alarm = node.mem_alarm
    snap.disk_limit = config.free_disk_min
    snap.mem_limit = node.mem_limit
    snap.mem_used = resident_bytes()
    snap.open_fds = _open_fds()
    snap.max_fds = _max_fds()
    snap.fd_alarm = bool(snap.max_fds) and snap.open_fds >= snap.max_fds
    snap.max_sockets = config.max_connections or snap.max_fds
    snap.io = _proc_io()
    if node.webhook_status is not None:
        snap.webhooks = node.webhook_status()
    federation = node.parameter_components.get("federation-upstream")
    if federation is not None:
        for link in federation.status():
            status = str(link.get("status", ""))
            snap.federation_links[status] = snap.federation_links.get(status, 0) + 1
    if node.cluster_status is not None:
        snap.cluster_status = node.cluster_status()
        followers = snap.cluster_status.get("followers", [])
        snap.unreachable_peers = sum(1 for f in followers if not f.get("connected", True))
    try:
        snap.disk_free = shutil.disk_usage(config.data_dir).free
    except OSError:
        snap.disk_free = 0
    return snap


def _node_name() -> str:
    from warren.node import node_name

    return node_name()


def _max_fds() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 0


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _proc_io() -> tuple[int, int, int, int]:
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return (0, 0, 0, 0)

    def get(key: str) -> int:
        return int(fields.get(key, "0").strip() or 0)

    return (get("syscr"), get("read_bytes"), get("syscw"), get("write_bytes"))
