"""The statistics' retention policies (RabbitMQ's ``sample_retention_policies``).

Apart from core.stats_history, which keeps the samples, so that reading the
configuration (``warren ctl --help`` included) does not import the core.
"""

from __future__ import annotations

from typing import Final

#: (max age, interval) pairs in seconds, by max age: one retention policy.
Retention = tuple[tuple[int, int], ...]

#: RabbitMQ's defaults (rabbitmq_management_agent's sample_retention_policies).
DEFAULT_POLICIES: Final[dict[str, Retention]] = {
    "global": ((605, 5), (3660, 60), (29400, 600), (86400, 1800)),
    "basic": ((605, 5), (3600, 60)),
    "detailed": ((605, 5),),
}
