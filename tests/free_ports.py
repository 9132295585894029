"""Ports for servers a test starts as separate processes (etcd, RabbitMQ,
cluster nodes), which must be told a port before they bind it.

Asking the kernel for port 0 and closing the socket is not enough: the kernel
may hand the same port out again at once (two nodes of one cluster were given
the same one), and any process's next outgoing connection or port-0 bind may
take it before the server binds it. So ports come from below the kernel's
ephemeral range, where it never allocates on its own, each test process from its
own slice of that range (by pytest-xdist worker and by pass: the compiled
pass, the pure one and its tests/spark run at once in `make test`), and from
one process not again before the rest of its slice.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_LOW = 10000
#: Slices per pass (xdist workers gw0.. and a process without xdist).
_PER_PASS = 8
#: The passes: compiled, pure, and the pure pass's tests/spark (WARREN_TEST_PASS).
_SLOTS = 3 * _PER_PASS


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slot() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    pure = os.environ.get("WARREN_PURE_PYTHON", "") not in ("", "0")
    which = 2 if os.environ.get("WARREN_TEST_PASS") == "spark" else int(pure)
    return index % _PER_PASS + _PER_PASS * which


_width = (min(_ephemeral_low(), 32768) - _LOW) // _SLOTS
_start = _LOW + _slot() * _width
_next = random.randrange(_width) if _width > 0 else 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, in this process's slice (the kernel's
    choice when the ephemeral range leaves no room below it)."""
    global _next
    for _ in range(max(_width, 0)):
        port = _start + _next % _width
        _next += 1
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
