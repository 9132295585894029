"""The broker's memory use and the machine's (or container's) memory size, for the
memory alarm (RabbitMQ's vm_memory_high_watermark) and the metrics."""

from __future__ import annotations

import os
import resource

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set size (/proc/self/statm: cheap to read once a second)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        # Peak, not current, but the best there is without /proc.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _meminfo_total() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * _PAGE_SIZE
    except (AttributeError, OSError, ValueError):
        return 0


def _cgroup_limit() -> int:
    """The cgroup's memory limit in bytes (v2 memory.max, v1 limit_in_bytes); 0: none."""
    for path in (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return 0


def total_bytes() -> int:
    """The RAM the broker may use: the machine's, or the cgroup limit when smaller."""
    total = _meminfo_total()
    limit = _cgroup_limit()
    if limit and (not total or limit < total):
        return limit
    return total
