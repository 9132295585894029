"""Settings of the node's edges: the HTTP bridge's limits, the PROXY protocol
on the Prometheus listener and the followers' read ports, and the management
listener's connection rate (docs/http-bridge.md, docs/security.md).

Kept here so that config.py stays short: :class:`EdgeSettings` is a base of
config.Config (its fields are Config's), and :data:`EDGE_INI_KEYS` are entered
in config.py's ini table; config_checks.py checks the values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EDGE_INI_KEYS", "EdgeSettings"]


@dataclass
class EdgeSettings:
    """The fields (config.Config has them): each with its ini key in EDGE_INI_KEYS."""

    #: Seconds a bridge long-poll (``GET .../messages?wait=N``) may wait at most;
    #: a longer ``wait`` is refused (400). [mgmt] bridge_max_wait.
    http_bridge_max_wait: int = 60
    #: Seconds a bridge message handed out may stay unsettled when its consumer
    #: does not say (``visibility_timeout``), and the most it may say.
    http_bridge_visibility_timeout: int = 30
    http_bridge_max_visibility_timeout: int = 3600
    #: Bridge consumers a user has at once (429 beyond); 0: no limit.
    http_bridge_max_consumers_per_user: int = 100
    #: Connections per source address per second on the management listener
    #: (HTTP and HTTPS; core/rate_limits.py). None: [main] connection_rate_limit.
    http_connection_rate_limit: int | None = None
    #: The PROXY protocol on the Prometheus listener and on a follower's read
    #: ports ([clustering] stream_read_port, stream_protocol_read_port), as on
    #: the others (config.Config.proxy_protocol_for). None: [main]'s.
    prometheus_proxy_protocol: bool | None = None
    clustering_proxy_protocol: bool | None = None


#: (section, key) -> (field, type): config.py parses ``int`` and ``bool`` values.
EDGE_INI_KEYS: dict[tuple[str, str], tuple[str, type]] = {
    ("mgmt", "bridge_max_wait"): ("http_bridge_max_wait", int),
    ("mgmt", "bridge_visibility_timeout"): ("http_bridge_visibility_timeout", int),
    ("mgmt", "bridge_max_visibility_timeout"): ("http_bridge_max_visibility_timeout", int),
    ("mgmt", "bridge_max_consumers_per_user"): ("http_bridge_max_consumers_per_user", int),
    ("mgmt", "connection_rate_limit"): ("http_connection_rate_limit", int),
    ("prometheus", "proxy_protocol"): ("prometheus_proxy_protocol", bool),
    ("clustering", "proxy_protocol"): ("clustering_proxy_protocol", bool),
}
