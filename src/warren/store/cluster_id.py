"""The cluster's permanent id: ``<data_dir>/cluster_id.json``.

RabbitMQ keeps a random id, ``rabbitmq-cluster-id-<base64url of 16 bytes>``, as
the global runtime parameter ``internal_cluster_id``, made once when the
cluster is formed; ``rabbitmq_identity_info``'s ``rabbitmq_cluster_permanent_id``
label and ``/api/global-parameters`` show it. Warren makes it at the first
start of a data directory and writes it with the directory's other metadata
(write_json_atomically: checksummed, fsynced, reported to the directory's
mirror). So a cluster's followers hold the leader's file, a follower that is
elected reports the same id, and a directory moved elsewhere keeps it.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from pathlib import Path

from warren.store import damage
from warren.store.layout import read_json_checked, write_json_atomically
from warren.store.mirror import FileMirror

__all__ = ["PREFIX", "load_or_create", "new_id"]

log = logging.getLogger("warren.store")

#: RabbitMQ's prefix (rabbit_nodes:seed_internal_cluster_id).
PREFIX = "rabbitmq-cluster-id-"
_KEY = "internal_cluster_id"
_VALID = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_-]{1,200}")


def new_id() -> str:
    """A fresh id: the prefix and 16 random bytes in unpadded base64url, as RabbitMQ's."""
    return PREFIX + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


def load_or_create(
    path: Path, on_damage: str = damage.REFUSE, mirror: FileMirror | None = None
) -> str:
    """The id kept in ``path``, made and stored there if there is none (``mirror``,
    the data directory's, is told). A damaged file refuses the start, or
    (set-aside) is kept aside and a new id made: the id names the cluster to
    monitoring, it holds no data."""
    try:
        data = read_json_checked(path, (_KEY,))
        value = data.get(_KEY)
        if not isinstance(value, str) or not _VALID.fullmatch(value):
            raise ValueError(f"{_KEY} is not an id: {value!r:.80}")
        return value
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        damage.handle(path, f"unreadable ({exc}); a new cluster id is made", on_damage)
    cluster_id = new_id()
    write_json_atomically(path, {_KEY: cluster_id}, mirror)
    log.info("initialising the cluster id to '%s' (%s)", cluster_id, path)
    return cluster_id
