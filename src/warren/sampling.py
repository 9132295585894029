"""The broker's rates and lengths sampling, every collect_statistics_interval of its
clock (core/clock.py).

Each round sums every vhost's channel counters, sets the queues', vhosts' and
the node's figures, and samples every queue, exchange, channel, connection,
vhost and the broker (core/stats.py): their rates since the last round and
their history (core/stats_history.py), RabbitMQ's ``basic`` retention policy
for the first, ``global`` for vhosts, the overview and the node. Counters
only: nothing is done per message.

Recording an hour of history costs a busy object a few microseconds a round
(an encoded record, an older one moved to a coarser tier), so with 10,000
busy queues a round is tens of milliseconds: the broker's own rounds
(:func:`sample_in_slices`) give the event loop back every :data:`SLICE`
objects. :func:`sample_now` does a round at once, at a time the caller gives
(tests that choose every sample's time).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from warren import node_stats
from warren.core.stats import GaugeStats, MessageStats, OctetStats, RateSampler
from warren.node import Node

__all__ = ["SLICE", "sample_in_slices", "sample_now"]

#: Objects sampled between two yields to the event loop.
SLICE = 1000

Sampled = list[MessageStats | OctetStats | GaugeStats]


class Broker(Node, Protocol):
    """The broker as sampling sees it: a Node with its sampler."""

    rate_sampler: RateSampler


def collect(broker: Broker) -> tuple[Sampled, Sampled]:
    """Set the summed and gauge figures; the objects to sample under the basic
    policy and under the global one."""
    channels: dict[str, list[MessageStats]] = {name: [] for name in broker.vhosts}
    octets: dict[str, list[int]] = {name: [0, 0] for name in broker.vhosts}
    for conn in broker.connections:
        for vhost_name, stats in conn.channel_stats():
            channels.setdefault(vhost_name, []).append(stats)
        # The vhost a connection opened (AMQP's and MQTT's keep it as .vhost).
        info_vhost = getattr(getattr(conn, "vhost", None), "name", None)
        if isinstance(info_vhost, str) and info_vhost in octets:
            octets[info_vhost][0] += conn.octets.recv_oct
            octets[info_vhost][1] += conn.octets.send_oct
    every: Sampled = [conn.octets for conn in broker.connections]
    overall: Sampled = []
    totals = [0, 0, 0]
    for vhost in broker.vhosts.values():
        live = channels[vhost.name]
        vhost.stats.set_sum([vhost.base_stats, vhost.session_stats, *live])
        every.extend(live)
        overall.append(vhost.stats)
        ready = unacked = 0
        for q in vhost.queues.values():
            r, u = q.message_count, max(0, q.unacked)
            q.lengths.values = (r + u, r, u)
            ready += r
            unacked += u
            every.append(q.stats)
            every.append(q.lengths)
        vhost.lengths.values = (ready + unacked, ready, unacked, *octets[vhost.name])
        overall.append(vhost.lengths)
        totals[1] += ready
        totals[2] += unacked
        every.extend(e.stats for e in vhost.exchanges.values())
    broker.stats.set_sum(v.stats for v in broker.vhosts.values())
    broker.queue_totals.values = (totals[1] + totals[2], totals[1], totals[2])
    broker.node_figures.values = node_stats.read_values(broker)
    overall += (broker.stats, broker.queue_totals, broker.node_figures)
    return every, overall


def sample_now(broker: Broker, now_s: float) -> int:
    """A whole round at ``now_s`` (seconds since the epoch); how many were sampled."""
    every, overall = collect(broker)
    return broker.rate_sampler.sample(every, now_s, overall)


async def sample_in_slices(broker: Broker, now_s: float) -> int:
    """A round at ``now_s``, giving the loop back every SLICE objects (the gauges and
    sums are set first; each object's counters are read as it is sampled, all
    within the round's few milliseconds)."""
    every, overall = collect(broker)
    sampler = broker.rate_sampler
    elapsed = sampler.start(now_s)
    for i in range(0, len(every), SLICE):
        sampler.sample_slice(every[i : i + SLICE], now_s, elapsed, sampler.basic)
        await asyncio.sleep(0)
    # The broker's own figures last: their time is where every history answer ends.
    sampler.sample_slice(overall, now_s, elapsed, sampler.global_)
    return len(every) + len(overall)
