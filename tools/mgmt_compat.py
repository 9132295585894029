"""The management API's changes, refusals and health checks, asked of a broker.

Every case is one request (with the requests that set it up, which are not
recorded, and GETs after it, which are: a refused request must change
nothing), and what AMQP clients get when vhost and user limits are reached
(limit_refusals). Run against a private RabbitMQ (tests/rabbitmq_proc.py) it records
RabbitMQ's answers; tests/http/test_mgmt_compat.py runs the same cases against
Warren and compares:

    PYTHONPATH=src python tools/mgmt_compat.py --json tests/http/rabbitmq_mgmt_answers.json
    python tools/mgmt_compat.py --url http://127.0.0.1:15672 --amqp-port 5672  # printed

Everything happens in the vhost ``compat`` (made first, deleted last) and to the
users ``compat-*``, so a broker's other objects are left alone.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

V = "compat"
Q = f"/api/queues/{V}"
E = f"/api/exchanges/{V}"
B = f"/api/bindings/{V}"
NOTHING = object()  # no body at all (not even "{}")


@dataclass
class Req:
    method: str
    path: str
    body: Any = NOTHING  # a JSON value, raw ``bytes``, or NOTHING
    headers: dict[str, str] = field(default_factory=dict)
    anonymous: bool = False  # sent without an Authorization header


@dataclass
class Case:
    """``req`` after ``setup``; ``then``: GETs whose answers show what it changed.
    ``compare``: ``exact`` (status and body), ``keys`` (status, and the body's keys
    and ``status``/``reason`` values: for bodies naming ports or nodes), ``status``."""

    req: Req
    setup: list[Req] = field(default_factory=list)
    then: list[str] = field(default_factory=list)
    compare: str = "exact"


def _put(path: str, body: Any = NOTHING) -> Req:
    return Req("PUT", path, body)


def _cases() -> dict[str, Case]:  # noqa: PLR0915 - one table
    c: dict[str, Case] = {}
    cols = "?columns=durable,auto_delete,internal,type,arguments"
    # -- queues: defaults and booleans (RabbitMQ's parse_bool: true/false/"true"/"false")
    c["queue.put.no-body"] = Case(_put(f"{Q}/nobody"), then=[f"{Q}/nobody{cols}"])
    c["queue.put.empty-object"] = Case(_put(f"{Q}/empty", {}), then=[f"{Q}/empty{cols}"])
    c["queue.put.durable-string-true"] = Case(
        _put(f"{Q}/strtrue", {"durable": "true", "auto_delete": "false"}),
        then=[f"{Q}/strtrue{cols}"],
    )
    for label, value in (("yes", "yes"), ("null", None), ("zero", 0), ("True", "True")):
        c[f"queue.put.durable-{label}"] = Case(
            _put(f"{Q}/d{label}", {"durable": value}), then=[f"{Q}/d{label}"]
        )
    c["queue.put.auto_delete-one"] = Case(
        _put(f"{Q}/ad1", {"auto_delete": 1}), then=[f"{Q}/ad1"]
    )
    c["queue.put.not-json"] = Case(_put(f"{Q}/nj", b"notjson"), then=[f"{Q}/nj"])
    c["queue.put.array"] = Case(_put(f"{Q}/arr", [1]), then=[f"{Q}/arr"])
    c["queue.put.arg-type"] = Case(
        _put(f"{Q}/argt", {"arguments": {"x-max-length": "a"}}), then=[f"{Q}/argt"]
    )
    c["queue.put.arg-negative"] = Case(
        _put(f"{Q}/argn", {"arguments": {"x-max-length": -1}}), then=[f"{Q}/argn"]
    )
    c["queue.put.unknown-key"] = Case(_put(f"{Q}/uk", {"foo": 1}), then=[f"{Q}/uk{cols}"])
    c["queue.put.inequivalent"] = Case(
        _put(f"{Q}/ineq", {"durable": True}),
        setup=[_put(f"{Q}/ineq", {"durable": False})],
        then=[f"{Q}/ineq{cols}"],
    )
    c["queue.put.again"] = Case(
        _put(f"{Q}/again", {"durable": True}), setup=[_put(f"{Q}/again", {"durable": True})]
    )
    c["queue.put.no-vhost"] = Case(_put("/api/queues/compat-none/q", {}))
    c["queue.put.long-name"] = Case(_put(f"{Q}/{'x' * 256}", {}))
    c["queue.put.amq-name"] = Case(_put(f"{Q}/amq.q", {}), then=[f"{Q}/amq.q"])
    c["queue.get.missing"] = Case(Req("GET", f"{Q}/none"))
    c["queue.delete.missing"] = Case(Req("DELETE", f"{Q}/none"))
    c["queue.delete.if-empty"] = Case(
        Req("DELETE", f"{Q}/full?if-empty=true"),
        setup=[
            _put(f"{Q}/full", {}),
            Req(
                "POST",
                f"{E}/amq.default/publish",
                {"properties": {}, "routing_key": "full", "payload": "x", "payload_encoding": "string"},
            ),
        ],
        then=[f"{Q}/full?columns=name,messages"],
        compare="status",
    )
    c["queue.purge.missing"] = Case(Req("DELETE", f"{Q}/none/contents"))
    get_q = [_put(f"{Q}/getq", {})]
    get_body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    c["queue.get.missing-keys"] = Case(Req("POST", f"{Q}/getq/get", {}), setup=get_q)
    c["queue.get.bad-ackmode"] = Case(
        Req("POST", f"{Q}/getq/get", {**get_body, "ackmode": "bogus"}), setup=get_q
    )
    c["queue.get.bad-encoding"] = Case(
        Req("POST", f"{Q}/getq/get", {**get_body, "encoding": "bogus"}), setup=get_q
    )
    c["queue.get.empty"] = Case(Req("POST", f"{Q}/getq/get", get_body), setup=get_q)
    c["queue.put.body-type-bogus"] = Case(
        _put(f"{Q}/tb", {"type": "bogus"}), then=[f"{Q}/tb?columns=type,arguments"]
    )
    c["queue.put.arg-type-bogus"] = Case(
        _put(f"{Q}/ab", {"arguments": {"x-queue-type": "bogus"}}), then=[f"{Q}/ab"]
    )
    c["queue.put.stream-no-durable"] = Case(
        _put(f"{Q}/snd", {"arguments": {"x-queue-type": "stream"}}), then=[f"{Q}/snd"]
    )
    c["queue.put.stream-durable"] = Case(
        _put(f"{Q}/sd", {"durable": True, "arguments": {"x-queue-type": "stream"}}),
        then=[f"{Q}/sd?columns=type,durable,arguments"],
    )
    c["queue.get.count-string"] = Case(
        Req("POST", f"{Q}/getq/get", {**get_body, "count": "x"}), setup=get_q
    )
    c["queue.get.truncate-string"] = Case(
        Req("POST", f"{Q}/getq/get", {**get_body, "truncate": "x"}), setup=get_q
    )
    # -- exchanges
    c["exchange.put.no-body"] = Case(_put(f"{E}/nobody"), then=[f"{E}/nobody{cols}"])
    c["exchange.put.bad-type"] = Case(_put(f"{E}/bt", {"type": "bogus"}), then=[f"{E}/bt"])
    c["exchange.put.durable-yes"] = Case(
        _put(f"{E}/dy", {"type": "fanout", "durable": "yes"}), then=[f"{E}/dy"]
    )
    c["exchange.put.internal-x"] = Case(
        _put(f"{E}/ix", {"type": "fanout", "internal": "x"}), then=[f"{E}/ix"]
    )
    c["exchange.put.amq-prefix"] = Case(_put(f"{E}/amq.foo", {"type": "direct"}))
    c["exchange.put.inequivalent"] = Case(
        _put(f"{E}/eq", {"type": "topic"}),
        setup=[_put(f"{E}/eq", {"type": "fanout"})],
        then=[f"{E}/eq?columns=type"],
    )
    c["exchange.delete.amq-direct"] = Case(Req("DELETE", f"{E}/amq.direct"))
    c["exchange.delete.missing"] = Case(Req("DELETE", f"{E}/none"))
    pub = {"properties": {}, "routing_key": "k", "payload": "x", "payload_encoding": "string"}
    c["exchange.publish.missing-keys"] = Case(Req("POST", f"{E}/amq.direct/publish", {}))
    c["exchange.publish.bad-encoding"] = Case(
        Req("POST", f"{E}/amq.direct/publish", {**pub, "payload_encoding": "hex"})
    )
    c["exchange.publish.no-exchange"] = Case(Req("POST", f"{E}/none/publish", pub))
    c["exchange.publish.unroutable"] = Case(Req("POST", f"{E}/amq.direct/publish", pub))
    for label, change in (
        ("delivery_mode-string", {"properties": {"delivery_mode": "x"}}),
        ("priority-string", {"properties": {"priority": "x"}}),
        ("unknown-property", {"properties": {"bogus": 1}}),
        ("headers-empty-list", {"properties": {"headers": []}}),
        ("payload-int", {"payload": 1}),
        ("bad-base64", {"payload": "!!", "payload_encoding": "base64"}),
    ):
        c[f"exchange.publish.{label}"] = Case(Req("POST", f"{E}/amq.direct/publish", {**pub, **change}))
    c["exchange.put.delayed-without-plugin"] = Case(_put(f"{E}/dl", {"type": "x-delayed-message"}))
    c["exchange.delete.if-unused"] = Case(
        Req("DELETE", f"{E}/used?if-unused=true"),
        setup=[_put(f"{E}/used", {"type": "direct"}), _put(f"{Q}/uq", {}),
               Req("POST", f"{B}/e/used/q/uq", {"routing_key": "k"})],
        then=[f"{E}/used?columns=name"],
    )
    # -- bindings
    c["binding.post.no-queue"] = Case(Req("POST", f"{B}/e/amq.direct/q/none", {}))
    c["binding.post.no-exchange"] = Case(
        Req("POST", f"{B}/e/none/q/bq", {}), setup=[_put(f"{Q}/bq", {})]
    )
    c["binding.post.empty-arguments-list"] = Case(
        Req("POST", f"{B}/e/amq.direct/q/bq", {"arguments": []}), setup=[_put(f"{Q}/bq", {})],
        then=[f"{B}/e/amq.direct/q/bq"],
    )
    c["binding.delete.missing"] = Case(
        Req("DELETE", f"{B}/e/amq.direct/q/bq/nokey"), setup=[_put(f"{Q}/bq", {})]
    )
    # -- vhosts, users, permissions
    c["vhost.delete.missing"] = Case(Req("DELETE", "/api/vhosts/compat-none"))
    c["user.put.no-password"] = Case(_put("/api/users/compat-u1", {}), then=["/api/users/compat-u1"])
    c["user.put.password-int"] = Case(
        _put("/api/users/compat-u2", {"password": 1}), then=["/api/users/compat-u2"]
    )
    c["user.put.hash-no-tags"] = Case(
        _put("/api/users/compat-u3", {"password_hash": "abc"}), then=["/api/users/compat-u3"]
    )
    c["vhost.put.description-int"] = Case(
        _put("/api/vhosts/compat-v1", {"description": 1}), then=["/api/vhosts/compat-v1?columns=name,description,tags"]
    )
    c["vhost.put.tags-list"] = Case(
        _put("/api/vhosts/compat-v2", {"tags": ["a", "b"]}), then=["/api/vhosts/compat-v2?columns=name,tags"]
    )
    c["vhost.put.tags-string"] = Case(
        _put("/api/vhosts/compat-v3", {"tags": "a, b"}), then=["/api/vhosts/compat-v3?columns=name,tags"]
    )
    c["vhost.put.again"] = Case(_put(f"/api/vhosts/{V}", {}))
    c["vhost.put.long-name"] = Case(_put(f"/api/vhosts/{'v' * 256}", {}))
    c["user.put.tags-list"] = Case(
        _put("/api/users/compat-u1", {"password": "x", "tags": ["management", "monitoring"]}),
        then=["/api/users/compat-u1?columns=name,tags"],
    )
    c["user.put.tags-empty"] = Case(
        _put("/api/users/compat-u2", {"password": "x", "tags": ""}), then=["/api/users/compat-u2?columns=name,tags"]
    )
    c["user.put.bad-algorithm"] = Case(
        _put("/api/users/compat-u3", {"password_hash": "abc", "hashing_algorithm": "md5", "tags": ""}),
        then=["/api/users/compat-u3?columns=name"],
    )
    c["user.put.bad-hash"] = Case(
        _put("/api/users/compat-u3", {"password_hash": "!!!", "tags": ""}),
        then=["/api/users/compat-u3?columns=name"],
    )
    c["user.bulk-delete.missing-key"] = Case(Req("POST", "/api/users/bulk-delete", {}))
    c["topic-permission.put.missing-keys"] = Case(
        _put(f"/api/topic-permissions/{V}/guest", {"exchange": "amq.topic"}),
        then=[f"/api/topic-permissions/{V}/guest"],
    )
    c["topic-permission.put.bad-regex"] = Case(
        _put(f"/api/topic-permissions/{V}/guest", {"exchange": "amq.topic", "write": "(", "read": ".*"}),
        then=[f"/api/topic-permissions/{V}/guest"],
    )
    c["permission.put.bad-regex"] = Case(
        _put(f"/api/permissions/{V}/guest", {"configure": "(", "write": ".*", "read": ".*"}),
        then=[f"/api/permissions/{V}/guest"],
    )
    c["user.delete.missing"] = Case(Req("DELETE", "/api/users/compat-none"))
    c["permission.put.missing-keys"] = Case(
        _put(f"/api/permissions/{V}/guest", {"configure": ".*"}),
    )
    c["permission.put.no-user"] = Case(
        _put(f"/api/permissions/{V}/compat-none", {"configure": ".*", "write": ".*", "read": ".*"})
    )
    c["permission.put.no-vhost"] = Case(
        _put("/api/permissions/compat-none/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    )
    c["permission.delete.missing"] = Case(Req("DELETE", "/api/permissions/compat-none/guest"))
    # -- policies
    pol = f"/api/policies/{V}/p1"
    c["policy.put.missing-keys"] = Case(_put(pol, {"pattern": ".*"}), then=[f"/api/policies/{V}"])
    c["policy.put.unknown-key"] = Case(
        _put(pol, {"pattern": ".*", "definition": {"bogus": 1}}), then=[f"/api/policies/{V}"]
    )
    c["policy.put.bad-value"] = Case(
        _put(pol, {"pattern": ".*", "definition": {"max-length": "x"}}),
        then=[f"/api/policies/{V}"],
    )
    c["policy.put.bad-apply-to"] = Case(
        _put(pol, {"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "bogus"}),
        then=[f"/api/policies/{V}"],
    )
    c["policy.put.priority-string"] = Case(
        _put(pol, {"pattern": ".*", "definition": {"max-length": 1}, "priority": "x"}),
        then=[f"/api/policies/{V}"],
    )
    c["policy.put.bad-pattern"] = Case(
        _put(pol, {"pattern": "(", "definition": {"max-length": 1}}), then=[f"/api/policies/{V}"]
    )
    c["policy.put.definition-list"] = Case(
        _put(pol, {"pattern": ".*", "definition": []}), then=[f"/api/policies/{V}"]
    )
    c["policy.put.ok"] = Case(
        _put(pol, {"pattern": ".*", "definition": {"max-length": 1}}),
        then=[f"/api/policies/{V}/p1"],
    )
    c["operator-policy.put.unknown-key"] = Case(
        _put(f"/api/operator-policies/{V}/op", {"pattern": ".*", "definition": {"ha-mode": "all"}}),
        then=[f"/api/operator-policies/{V}"],
    )
    c["global-parameter.put.no-value"] = Case(
        _put("/api/global-parameters/compat-g", {}), then=["/api/global-parameters/compat-g"]
    )
    c["cluster-name.put.missing"] = Case(_put("/api/cluster-name", {}))
    c["cluster-name.put.int"] = Case(_put("/api/cluster-name", {"name": 1}))
    c["policy.delete.missing"] = Case(Req("DELETE", f"/api/policies/{V}/none"))
    # -- limits
    vl = f"/api/vhost-limits/{V}"
    c["vhost-limit.put.string"] = Case(_put(f"{vl}/max-connections", {"value": "x"}), then=[vl])
    c["vhost-limit.put.unknown"] = Case(_put(f"{vl}/max-bogus", {"value": 1}), then=[vl])
    c["vhost-limit.put.no-value"] = Case(_put(f"{vl}/max-queues", {}), then=[vl])
    c["vhost-limit.put.float"] = Case(_put(f"{vl}/max-queues", {"value": 1.5}), then=[vl])
    c["vhost-limit.put.no-vhost"] = Case(_put("/api/vhost-limits/compat-none/max-queues", {"value": 1}))
    c["vhost-limit.put.ok"] = Case(_put(f"{vl}/max-queues", {"value": 2}), then=[vl])
    c["vhost-limit.queue-refused"] = Case(
        _put(f"{Q}/lim3", {}),
        setup=[_put(f"{vl}/max-queues", {"value": 2}), _put(f"{Q}/lim1", {}), _put(f"{Q}/lim2", {})],
        then=[f"{Q}/lim3"],
    )
    c["vhost-limit.delete.absent"] = Case(Req("DELETE", f"{vl}/max-channels"))
    ul = "/api/user-limits/compat-lu"
    lu = [_put("/api/users/compat-lu", {"password": "x", "tags": ""})]
    c["user-limit.put.string"] = Case(_put(f"{ul}/max-connections", {"value": "x"}), setup=lu, then=[ul])
    c["user-limit.put.unknown"] = Case(_put(f"{ul}/max-queues", {"value": 1}), setup=lu, then=[ul])
    c["user-limit.put.no-value"] = Case(_put(f"{ul}/max-channels", {}), setup=lu, then=[ul])
    c["user-limit.put.no-user"] = Case(_put("/api/user-limits/compat-none/max-channels", {"value": 1}))
    c["user-limit.put.ok"] = Case(_put(f"{ul}/max-channels", {"value": 3}), setup=lu, then=[ul])
    c["user-limit.delete.absent"] = Case(Req("DELETE", f"{ul}/max-connections"), setup=lu)
    # -- parameters
    c["parameter.put.unknown-component"] = Case(
        _put(f"/api/parameters/bogus/{V}/p", {"value": 1}), then=[f"/api/parameters/bogus/{V}"]
    )
    # -- definitions import (into the compat vhost only, so nothing else changes)
    d = f"/api/definitions/{V}"
    c["definitions.post.not-json"] = Case(Req("POST", d, b"notjson"))
    c["definitions.post.array"] = Case(Req("POST", d, []))
    c["definitions.post.bad-queue"] = Case(
        Req("POST", d, {"queues": [{"name": "dq", "durable": "yes"}]}), then=[f"{Q}/dq"]
    )
    c["definitions.post.ok"] = Case(
        Req("POST", d, {"queues": [{"name": "dq", "durable": True, "auto_delete": False,
                                    "arguments": {}}]}),
        then=[f"{Q}/dq?columns=name,durable"],
    )
    # -- paths and methods
    c["path.unknown"] = Case(Req("GET", "/api/nope"))
    c["path.vhost-missing"] = Case(Req("GET", "/api/queues/compat-none"))
    c["method.post-overview"] = Case(Req("POST", "/api/overview", {}))
    c["method.delete-overview"] = Case(Req("DELETE", "/api/overview"))
    c["method.post-queue"] = Case(Req("POST", f"{Q}/nobody", {}))
    c["connection.delete.missing"] = Case(Req("DELETE", "/api/connections/nope"))
    # -- health checks (3.10 and 3.13 serve the same set)
    h = "/api/health/checks"
    for name in ("alarms", "local-alarms", "virtual-hosts", "node-is-quorum-critical",
                 "node-is-mirror-sync-critical"):
        c[f"health.{name}"] = Case(Req("GET", f"{h}/{name}"))
    c["health.certificate-expiration.weeks"] = Case(Req("GET", f"{h}/certificate-expiration/1/weeks"))
    c["health.certificate-expiration.bad-unit"] = Case(
        Req("GET", f"{h}/certificate-expiration/1/fortnights")
    )
    c["health.certificate-expiration.bad-value"] = Case(
        Req("GET", f"{h}/certificate-expiration/x/days")
    )
    c["health.port-listener.missing"] = Case(Req("GET", f"{h}/port-listener/1"), compare="keys")
    c["health.port-listener.bad"] = Case(Req("GET", f"{h}/port-listener/abc"))
    for proto in ("amqp", "amqp091", "AMQP", "http"):
        c[f"health.protocol-listener.{proto}"] = Case(Req("GET", f"{h}/protocol-listener/{proto}"))
    c["health.protocol-listener.missing"] = Case(
        Req("GET", f"{h}/protocol-listener/bogus"), compare="keys"
    )
    c["health.unknown"] = Case(Req("GET", f"{h}/bogus"))
    c["health.old-node"] = Case(Req("GET", "/api/healthchecks/node"))
    c["health.old-node.other"] = Case(Req("GET", "/api/healthchecks/node/compat@nohost"))
    c["health.aliveness"] = Case(Req("GET", f"/api/aliveness-test/{V}"))
    _ui_cases(c)
    return c


#: A dynamic shovel (the recorder enables rabbitmq_shovel and
#: rabbitmq_shovel_management) from a broker that is not there (port 1): it never
#: connects, so it declares nothing that could outlive its case.
SHOVEL = {"src-uri": "amqp://127.0.0.1:1", "src-queue": "shovel-src",
          "dest-uri": "amqp://127.0.0.1:1", "dest-queue": "shovel-dest"}


def _ui_cases(c: dict[str, Case]) -> None:
    """What RabbitMQ's own management UI reads besides the objects, and its
    "Delete this shovel" button."""
    for label, header in (
        ("no-header", None),
        ("wrong-password", "Basic " + base64.b64encode(b"guest:wrong").decode()),
        ("not-base64", "Basic !!!"),
        ("not-basic", "Bearer abc"),
    ):
        c[f"auth.{label}"] = Case(Req(
            "GET", "/api/overview", headers={"Authorization": header} if header else {},
            anonymous=True,
        ))
    c["ui.auth"] = Case(Req("GET", "/api/auth"))
    c["ui.auth.anonymous"] = Case(Req("GET", "/api/auth", anonymous=True))
    c["ui.auth.bad-credentials"] = Case(
        Req("GET", "/api/auth", headers={"Authorization": "Basic " + base64.b64encode(
            b"guest:wrong").decode()}, anonymous=True)
    )
    c["ui.extensions"] = Case(Req("GET", "/api/extensions"))
    c["ui.extensions.anonymous"] = Case(Req("GET", "/api/extensions", anonymous=True))
    c["ui.feature-flags"] = Case(Req("GET", "/api/feature-flags"))
    c["ui.feature-flags.anonymous"] = Case(Req("GET", "/api/feature-flags", anonymous=True))
    c["ui.feature-flags.as-monitoring"] = Case(
        Req("GET", "/api/feature-flags", headers={"Authorization": "Basic " + base64.b64encode(
            b"compat-u1:x").decode()}, anonymous=True),
        setup=[_put("/api/users/compat-u1", {"password": "x", "tags": "monitoring"})],
    )
    c["ui.feature-flags.enable"] = Case(_put("/api/feature-flags/quorum_queue/enable", {}))
    c["ui.feature-flags.enable-unknown"] = Case(_put("/api/feature-flags/compat_none/enable", {}))
    made = [_put(f"/api/parameters/shovel/{V}/sh", {"value": SHOVEL})]
    after = [f"/api/parameters/shovel/{V}/sh", f"/api/shovels/{V}"]
    c["shovel.delete"] = Case(Req("DELETE", f"/api/shovels/vhost/{V}/sh"), setup=made, then=after)
    c["shovel.delete.missing"] = Case(Req("DELETE", f"/api/shovels/vhost/{V}/none"), then=after)
    c["shovel.delete.no-vhost"] = Case(Req("DELETE", "/api/shovels/vhost/compat-none/sh"))
    c["shovel.delete.parameter"] = Case(
        Req("DELETE", f"/api/parameters/shovel/{V}/sh"), setup=made, then=after
    )
    c["shovel.delete.parameter-missing"] = Case(Req("DELETE", f"/api/parameters/shovel/{V}/none"))
    c["shovel.delete.anonymous"] = Case(
        Req("DELETE", f"/api/shovels/vhost/{V}/sh", anonymous=True), setup=made,
        then=[f"/api/parameters/shovel/{V}/sh?columns=name,component,vhost"],
    )


CASES = _cases()

#: The plugins of the recorded RabbitMQ: the UI's extensions are those of the
#: plugins Warren has built in (federation and shovel, with their UI pages).
PLUGINS = ["rabbitmq_management", "rabbitmq_prometheus", "rabbitmq_shovel",
           "rabbitmq_shovel_management", "rabbitmq_federation", "rabbitmq_federation_management"]

#: The recording's key for what AMQP clients see of the limits (limit_refusals).
LIMITS_KEY = "amqp-limits"


def _refusal(fn: Any) -> Any:
    """``"ok"``, or the [code, text] of the close that refused ``fn``."""
    import pika.exceptions  # noqa: PLC0415 - only this part needs a client library

    try:
        fn()
    except (pika.exceptions.ConnectionClosedByBroker, pika.exceptions.ChannelClosedByBroker) as e:
        return [e.reply_code, e.reply_text]
    except pika.exceptions.ProbableAccessDeniedError as e:
        found = re.search(r"\((\d+)\) [\"'](.*)[\"']", str(e.args[0]))
        return [int(found.group(1)), found.group(2)] if found else str(e)
    return "ok"


def limit_refusals(url: str, amqp_port: int) -> dict[str, Any]:
    """What AMQP clients (pika) get when vhost and user limits are reached."""
    import pika  # noqa: PLC0415

    client = Client(url)
    out: dict[str, Any] = {}
    _fresh(client)
    client.send(_put("/api/users/compat-lu", {"password": "pw", "tags": ""}))
    client.send(_put(f"/api/permissions/{V}/compat-lu", {"configure": ".*", "write": ".*", "read": ".*"}))

    def conn(user: str = "guest", password: str = "guest") -> Any:
        return pika.BlockingConnection(
            pika.URLParameters(f"amqp://{user}:{password}@127.0.0.1:{amqp_port}/{V}")
        )

    vl, ul = f"/api/vhost-limits/{V}", "/api/user-limits/compat-lu"
    for value in (1, 0):
        client.send(_put(f"{vl}/max-connections", {"value": value}))
        first = conn() if value else None
        out[f"vhost max-connections {value}"] = _refusal(conn)
        if first is not None:
            first.close()
    client.send(Req("DELETE", f"{vl}/max-connections"))
    client.send(_put(f"{vl}/max-queues", {"value": 1}))
    c = conn()
    ch = c.channel()
    ch.queue_declare("a")
    out["vhost max-queues"] = _refusal(lambda: ch.queue_declare("b"))
    out["vhost max-queues, the connection after"] = _refusal(lambda: c.channel().queue_declare("a"))
    c.close()
    client.send(Req("DELETE", f"{vl}/max-queues"))
    client.send(_put(f"{ul}/max-connections", {"value": 1}))
    first = conn("compat-lu", "pw")
    out["user max-connections"] = _refusal(lambda: conn("compat-lu", "pw"))
    first.close()
    client.send(Req("DELETE", f"{ul}/max-connections"))
    client.send(_put(f"{ul}/max-channels", {"value": 1}))
    c = conn("compat-lu", "pw")
    c.channel()
    out["user max-channels"] = _refusal(c.channel)
    if c.is_open:
        c.close()
    _fresh(client)
    return out


class Client:
    """Blocking requests to one management API (urllib: no dependencies)."""

    def __init__(self, url: str, user: str = "guest", password: str = "guest") -> None:
        self.url = url.rstrip("/")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def send(self, req: Req) -> tuple[int, Any]:
        data: bytes | None
        if req.body is NOTHING:
            data = None
        elif isinstance(req.body, bytes):
            data = req.body
        else:
            data = json.dumps(req.body).encode()
        request = urllib.request.Request(self.url + req.path, data=data, method=req.method)
        if not req.anonymous:
            request.add_header("Authorization", self.auth)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for key, value in req.headers.items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")


def _fresh(client: Client) -> None:
    client.send(Req("DELETE", f"/api/vhosts/{V}"))
    for user in ("compat-u1", "compat-u2", "compat-u3", "compat-lu"):
        client.send(Req("DELETE", f"/api/users/{user}"))
    for vhost in ("compat-v1", "compat-v2", "compat-v3"):
        client.send(Req("DELETE", f"/api/vhosts/{vhost}"))
    client.send(_put(f"/api/vhosts/{V}", {}))
    client.send(_put(f"/api/permissions/{V}/guest", {"configure": ".*", "write": ".*", "read": ".*"}))


def run_case(client: Client, case: Case) -> dict[str, Any]:
    """One case on a fresh ``compat`` vhost: its answer and the ``then`` answers."""
    _fresh(client)
    for req in case.setup:
        client.send(req)
    status, body = client.send(case.req)
    out: dict[str, Any] = {"status": status, "body": body}
    if case.then:
        out["then"] = [list(client.send(Req("GET", path))) for path in case.then]
    return out


#: The recording's key for the definitions exports (definitions_export).
DEFINITIONS_KEY = "definitions"


def populate(client: Client) -> None:
    """One object of every kind the definitions hold, in the ``compat`` vhost."""
    _fresh(client)
    for req in (
        _put("/api/users/compat-du", {"password": "pw", "tags": "management"}),
        _put(f"/api/permissions/{V}/compat-du", {"configure": ".*", "write": "w", "read": "r"}),
        _put(f"/api/topic-permissions/{V}/compat-du", {"exchange": "amq.topic", "write": ".*", "read": "r"}),
        _put(f"{Q}/dq", {"durable": True, "arguments": {"x-max-length": 10}}),
        _put(f"{E}/dx", {"type": "topic", "durable": True}),
        Req("POST", f"{B}/e/dx/q/dq", {"routing_key": "k", "arguments": {"a": 1}}),
        _put(f"/api/policies/{V}/pol", {"pattern": "^d", "definition": {"max-length": 5}, "priority": 1, "apply-to": "queues"}),
        _put(f"/api/operator-policies/{V}/opol", {"pattern": "^d", "definition": {"max-length": 7}, "priority": 0, "apply-to": "queues"}),
        _put(f"/api/vhost-limits/{V}/max-queues", {"value": 10}),
        _put("/api/user-limits/compat-du/max-channels", {"value": 3}),
    ):
        status, body = client.send(req)
        assert status in (201, 204), (req, status, body)


def _mine(data: dict[str, Any]) -> dict[str, Any]:
    """The parts of a full export about ``compat`` and ``compat-du`` (password hashes
    are salted: replaced), key order kept."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(value, list):
            out[key] = "<" + type(value).__name__ + ">"
            continue
        out[key] = [
            {k: "<hash>" if k == "password_hash" else v for k, v in item.items()}
            for item in value
            if V in (item.get("vhost"), item.get("name")) or item.get("name") == "compat-du"
            or item.get("user") == "compat-du"
        ]
    return out


def definitions(url: str) -> dict[str, str]:
    """``GET /api/definitions/compat`` as sent, and the compat parts of ``GET
    /api/definitions``, as JSON text (key order is what is compared)."""
    client = Client(url)
    populate(client)
    request = urllib.request.Request(f"{client.url}/api/definitions/{V}")
    request.add_header("Authorization", client.auth)
    with urllib.request.urlopen(request, timeout=30) as resp:
        per_vhost = resp.read().decode()
    _, full = client.send(Req("GET", "/api/definitions"))
    _fresh(client)
    client.send(Req("DELETE", "/api/users/compat-du"))
    return {"vhost": per_vhost, "full": json.dumps(_mine(full), separators=(",", ":"))}


def run(url: str, amqp_port: int) -> dict[str, Any]:
    client = Client(url)
    try:
        answers = {name: run_case(client, case) for name, case in CASES.items()}
        answers[LIMITS_KEY] = limit_refusals(url, amqp_port)
        answers[DEFINITIONS_KEY] = definitions(url)
        return answers
    finally:
        _fresh(client)
        client.send(Req("DELETE", f"/api/vhosts/{V}"))
        client.send(Req("DELETE", "/api/users/compat-lu"))


def _record(path: Path | None, url: str | None, amqp_port: int) -> None:
    if url is not None:
        answers = run(url, amqp_port)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from rabbitmq_proc import RabbitMQ  # noqa: PLC0415 - tests/ is not a package here

        with tempfile.TemporaryDirectory() as tmp:
            server = RabbitMQ(Path(tmp), plugins=PLUGINS)
            try:
                answers = run(f"http://127.0.0.1:{server.http_port}", server.port)
            finally:
                server.stop()
    text = json.dumps(answers, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the answers here (default: stdout)")
    parser.add_argument("--url", help="a running broker's management API (default: a private RabbitMQ)")
    parser.add_argument("--amqp-port", type=int, default=5672, help="with --url: its AMQP port")
    args = parser.parse_args()
    _record(args.json, args.url, args.amqp_port)


if __name__ == "__main__":
    main()
