"""Prometheus metrics as RabbitMQ's ``rabbitmq_prometheus`` plugin serves them.

RabbitMQ's family names, types, labels and help texts (families.py), on its
three endpoints: ``/metrics`` (aggregated), ``/metrics/per-object`` and
``/metrics/detailed?family=...&vhost=...`` (render.py), served by the
management listener and the ``[prometheus]`` listener (http/prometheus.py), so
RabbitMQ's Grafana dashboards and alerts read Warren (docs/metrics.md).

The broker is copied on its loop in slices (snapshot.py); the text is written
from the copy in chunks, each sent as it is made, the loop given back in
between (render.py). Counters only grow over the broker's life: what
closed channels, connections and deleted queues counted is kept (history.py).
"""

from __future__ import annotations

from warren.metrics.exposition import CONTENT_TYPE
from warren.metrics.render import detailed_chunks, render, render_chunks, render_detailed
from warren.metrics.snapshot import SLICE, Snapshot, snapshot

__all__ = [
    "CONTENT_TYPE",
    "SLICE",
    "Snapshot",
    "detailed_chunks",
    "render",
    "render_chunks",
    "render_detailed",
    "snapshot",
]
