"""The open-file limit of the perf tools, which hold many connections."""

from __future__ import annotations

import resource

__all__ = ["raise_fd_limit", "raise_nofile"]


def raise_nofile(needed: int) -> int:
    """Lift RLIMIT_NOFILE to at least ``needed`` if allowed (the hard limit too as root,
    up to /proc/sys/fs/nr_open); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
                nr_open = int(f.read())
        except (OSError, ValueError):
            nr_open = needed
        target = min(needed, nr_open)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))  # needs root
            return target
        except (ValueError, OSError):
            pass
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return int(target)
    except (ValueError, OSError):
        return soft


def raise_fd_limit() -> int:
    """Lift the soft open-file limit to the hard one (2**20 when that is unlimited);
    returns the new soft limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return raise_nofile(hard if hard != resource.RLIM_INFINITY else 1 << 20)
