"""Exporting the broker's definitions in RabbitMQ's JSON format.

What ``rabbitmqctl export_definitions`` and the management API's
``/api/definitions`` write, in the format of RABBITMQ_FORMAT_VERSION;
definitions_import.py reads it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren import __version__
from warren.json_tables import to_json_table

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["RABBITMQ_FORMAT_VERSION", "export_definitions"]

#: The RabbitMQ release whose export format Warren writes.
RABBITMQ_FORMAT_VERSION = "3.10.8"


def export_definitions(broker: Node) -> dict[str, Any]:
    """The broker's definitions in RabbitMQ's export format.

    As the management API exports them: exclusive queues, the default
    exchange and ``amq.*`` exchanges are left out; exchanges carry
    ``internal``; bindings to exclusive queues are left out.
    """
    users = [
        {
            "name": u.name,
            "password_hash": u.password_hash,
            "hashing_algorithm": u.hashing_algorithm,
            "tags": list(u.tags),
            "limits": dict(u.limits),
        }
        for u in sorted(broker.users.users.values(), key=lambda u: u.name)
    ]
    permissions = [
        {"user": u.name, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
        for u in sorted(broker.users.users.values(), key=lambda u: u.name)
        for vhost, p in sorted(u.permissions.items())
    ]
    topic_permissions = [
        {"user": u.name, "vhost": vhost, "exchange": x, "write": p.write, "read": p.read}
        for u in sorted(broker.users.users.values(), key=lambda u: u.name)
        for vhost, table in sorted(u.topic_permissions.items())
        for x, p in sorted(table.items())
    ]
    vhosts: list[dict[str, Any]] = []
    parameters: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    for name in sorted(broker.vhosts):
        v = broker.vhosts[name]
        limits = v.limits
        metadata: dict[str, Any] = {"description": "", "tags": []}
        if v.default_queue_type is not None:
            metadata = {"default_queue_type": v.default_queue_type, **metadata}
        vhosts.append(
            {"name": name, "limits": [[k, n] for k, n in limits.items()], "metadata": metadata}
        )
        if v.has_limits:
            parameters.append(
                {"vhost": name, "component": "vhost-limits", "name": "limits", "value": limits}
            )
        for p in v.operator_policies:
            value = p.as_json()
            del value["name"]
            parameters.append(
                {"vhost": name, "component": "operator_policy", "name": p.name, "value": value}
            )
        for component, param, value in v.parameters.items():
            parameters.append(
                {"vhost": name, "component": component, "name": param, "value": value}
            )
        policies.extend({"vhost": name, **p.as_json()} for p in v.policies)
        for q in v.queues.values():
            if q.exclusive:
                continue
            queues.append(
                {
                    "name": q.name,
                    "vhost": name,
                    "durable": q.durable,
                    "auto_delete": q.auto_delete,
                    "arguments": to_json_table(q.arguments),
                    "type": q.queue_type,
                }
            )
        for ex in v.exchanges.values():
            if ex.name and not ex.name.startswith("amq."):
                exchanges.append(
                    {
                        "name": ex.name,
                        "vhost": name,
                        "type": ex.type,
                        "durable": ex.durable,
                        "auto_delete": ex.auto_delete,
                        "internal": ex.internal,
                        "arguments": to_json_table(ex.arguments),
                    }
                )
            for b in ex.bindings.values():
                dest = b.destination
                if getattr(dest, "exclusive", False):
                    continue
                bindings.append(
                    {
                        "source": ex.name,
                        "vhost": name,
                        "destination": dest.name,
                        "destination_type": b.destination_kind,
                        "routing_key": b.routing_key,
                        "arguments": to_json_table(b.arguments),
                    }
                )
    data: dict[str, Any] = {
        "rabbit_version": RABBITMQ_FORMAT_VERSION,
        "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
        "product_name": "Warren",
        "product_version": __version__,
        "users": users,
        "vhosts": vhosts,
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        "parameters": parameters,
        "global_parameters": [],
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }
    hooks = broker.webhooks
    if hooks is not None and hooks.managed():  # Warren's own: the API's targets
        from warren.webhooks.targets import target_document  # with webhooks only

        data["webhooks"] = [target_document(t) for t in hooks.managed()]
    return data
