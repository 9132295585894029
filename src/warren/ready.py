"""The ``ready:`` log line: the one line a script (or a person) waits for.

A single broker logs it once every listener is up; a cluster node logs it when
it takes a role it can serve clients in (leader: its own listeners; follower:
its relayed ports, once it holds the leader's data). ``warren ctl
await-startup`` is the way to wait without reading the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ready_line"]

#: How the ready line names each listener's plain and TLS ports.
_LISTENER_NAMES = {
    "amqp": ("AMQP", "AMQPS"),
    "mqtt": ("MQTT", "MQTTS"),
    "http": ("HTTP", "HTTPS"),
    "http/prometheus": ("Prometheus", "Prometheus/HTTPS"),
}


def ready_line(listeners: Sequence[Any], role: str = "") -> str:
    """``ready: AMQP 127.0.0.1:5672, ...``; with ``role`` (a cluster node's):
    ``ready: leader node1: AMQP ...``. A listener is anything with ``name``,
    ``port`` and optionally ``bind`` and ``tls_port``."""
    where = []
    for lst in listeners:
        plain, tls = _LISTENER_NAMES.get(lst.name, (lst.name, lst.name + "/TLS"))
        bind = getattr(lst, "bind", "")
        for name, port in ((plain, lst.port), (tls, getattr(lst, "tls_port", 0))):
            if port:
                where.append(f"{name} {bind}:{port}")
    ports = ", ".join(where) or "no listeners"
    return f"ready: {role}: {ports}" if role else f"ready: {ports}"
