"""The node's own figures for /api/nodes, as RabbitMQ's management API names them.

RabbitMQ reports the Erlang VM's; Warren reports the process's analogues
(docs/http-api.md lists what each means here), read from the OS when the
broker samples rates (``collect_statistics_interval``), never per request:

- ``mem_used``: resident memory (the memory alarm's figure);
- ``fd_used``/``fd_total``: open descriptors and the soft ``RLIMIT_NOFILE``;
- ``sockets_used``/``sockets_total``: client connections, and the descriptors
  RabbitMQ would allow them (90 % of ``fd_total``);
- ``proc_used``/``proc_total``: the event loop's tasks, and Erlang's default
  process limit (a nominal ceiling: Warren has no such limit);
- ``run_queue``: callbacks ready to run on the event loop;
- ``disk_free``: free bytes where the data directory is;
- ``gc_num``: Python garbage collections; ``context_switches``: the process's,
  voluntary and not; ``io_read_count``/``io_read_bytes``/``io_write_count``/
  ``io_write_bytes``: the process's read and write calls and bytes;
- ``connection_created`` ... ``queue_deleted``: the churn counters.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import shutil
from pathlib import Path
from typing import Any, Final

#: Every sampled figure, in GaugeStats order; each gets ``<name>_details``.
NODE_GAUGES: Final = (
    "mem_used",
    "fd_used",
    "sockets_used",
    "proc_used",
    "disk_free",
    "gc_num",
    "gc_bytes_reclaimed",
    "context_switches",
    "io_read_count",
    "io_read_bytes",
    "io_write_count",
    "io_write_bytes",
    "connection_created",
    "connection_closed",
    "channel_created",
    "channel_closed",
    "queue_declared",
    "queue_created",
    "queue_deleted",
)
#: The churn counters among them (also the overview's ``churn_rates``).
CHURN: Final = NODE_GAUGES[12:]
PROC_TOTAL: Final = 1048576


def fd_total() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _proc_fields(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """``key: value`` lines of a /proc file (status, io); missing ones are 0."""
    out = dict.fromkeys(keys, 0)
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in out:
            out[key] = int(value.split()[0]) if value.split() else 0
    return out


def read_values(node: Any) -> tuple[int, ...]:
    """The figures now, in :data:`NODE_GAUGES` order."""
    try:
        disk_free = shutil.disk_usage(node.config.data_dir).free
    except OSError:
        disk_free = 0
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:
        tasks = 0
    status = _proc_fields(
        "/proc/self/status", ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
    )
    io = _proc_fields("/proc/self/io", ("syscr", "syscw", "rchar", "wchar"))
    vhosts = node.vhosts.values()
    return (
        node.mem_used,
        _fd_used(),
        len(node.connections),
        tasks,
        disk_free,
        sum(g["collections"] for g in gc.get_stats()),
        0,  # Python does not count the bytes a collection frees
        status["voluntary_ctxt_switches"] + status["nonvoluntary_ctxt_switches"],
        io["syscr"],
        io["rchar"],
        io["syscw"],
        io["wchar"],
        node.connections_opened,
        node.connections_closed,
        sum(v.channels_opened for v in vhosts),
        sum(v.channels_closed for v in vhosts),
        sum(v.queues_declared for v in vhosts),
        sum(v.queues_created for v in vhosts),
        sum(v.queues_deleted for v in vhosts),
    )


def run_queue() -> int:
    """Callbacks waiting on the running event loop (0 outside one)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return 0
    ready = getattr(loop, "_ready", None)  # asyncio's own queue of ready handles
    return len(ready) if ready is not None else 0
