"""Rich authorization requests (RFC 9396) in access tokens, as scopes: what
RabbitMQ's rabbit_oauth2_rar reads from an ``authorization_details`` claim.

Each entry whose ``type`` is the resource server's ``resource_server_type`` and
that has ``actions`` and ``locations`` grants, per location naming this
cluster (``cluster:<wildcard of the resource server id>``), its actions as
``<id>.<action>:<vhost>/<queue or exchange>/<routing key>`` scopes (``*`` for
a part the location leaves out); the actions named as user tags
(``administrator`` ...) become ``<id>.tag:<tag>``. Unknown actions, location
attributes and entries are skipped, not refused. The scopes then go through the
scope prefix filter like the token's own (core/oauth2.py).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

CLAIM = "authorization_details"
TAG_ACTIONS = ("monitoring", "administrator", "management", "policymaker")
ACTIONS = ("read", "write", "configure", *TAG_ACTIONS)
_ATTRIBUTES = ("cluster", "vhost", "queue", "exchange", "routing-key")


def rar_scopes(
    claims: dict[str, Any], resource_server_id: str, server_type: str | None
) -> list[str]:
    """The scopes the token's authorization details grant this resource server."""
    details = claims.get(CLAIM)
    if not server_type or not isinstance(details, list):
        return []
    scopes: list[str] = []
    for entry in details:
        if not isinstance(entry, dict) or not {"type", "actions", "locations"} <= entry.keys():
            continue
        if entry["type"] != server_type:
            continue
        paths = _paths(entry["locations"], resource_server_id)
        if not paths:
            continue
        actions = entry["actions"]
        names = (
            [actions] if isinstance(actions, str) else actions if isinstance(actions, list) else []
        )
        for action in names:
            if action not in ACTIONS:
                continue
            if action in TAG_ACTIONS:
                scopes.append(f"{resource_server_id}.tag:{action}")
            else:
                scopes.extend(f"{resource_server_id}.{action}:{path}" for path in paths)
    return scopes


def _paths(locations: Any, resource_server_id: str) -> list[str]:
    """``vhost/resource/routing key`` of each location naming this cluster."""
    if isinstance(locations, str):
        locations = [locations]
    if not isinstance(locations, list):
        return []
    paths = []
    for location in locations:
        if not isinstance(location, str):
            continue
        attrs: dict[str, str] = {}
        for part in (p for p in location.split("/") if p):
            pieces = [p for p in part.split(":") if p]
            if len(pieces) >= 2 and pieces[0] in _ATTRIBUTES:
                attrs[pieces[0]] = pieces[1]
        cluster = attrs.get("cluster")
        if cluster is None or not _wildcard(cluster, resource_server_id):
            continue
        queue, exchange = attrs.get("queue"), attrs.get("exchange")
        if queue is not None and exchange is not None and queue != exchange:
            continue  # one resource per location: both named must agree
        resource = queue if queue is not None else exchange if exchange is not None else "*"
        paths.append(f"{attrs.get('vhost', '*')}/{resource}/{attrs.get('routing-key', '*')}")
    return paths


def _wildcard(pattern: str, subject: str) -> bool:
    regex = ".*".join(re.escape(unquote(part)) for part in pattern.split("*"))
    return re.fullmatch(regex, subject, re.DOTALL) is not None
