"""Record what the management API's GET endpoints answer, as shapes and facts.

One scenario (a vhost; queues with ready, unacknowledged, persistent and
transient messages, an exclusive queue and a stream; consumers; exchanges and
bindings, one with arguments; two named connections; a monitoring user and a
management user with permissions, a topic permission, a user limit; a policy
and a vhost limit) is set up over AMQP (pika) and HTTP, then every GET
endpoint Warren serves is read (with list options, history ranges and their
refusals; some as the management user) and reduced to:

- its status, and for an error its JSON body;
- its *shape*: key sets and value types, recursively (``int``, ``float``,
  ``str``, ``bool``, ``null``; a list is the merged shape of its items); a
  listing keeps one shape per item, by a label that is the same on both
  brokers (queue name, ``consumer_tag``, the connection's ``connection_name``);
- its *facts*: the values of the keys in :data:`FACT_KEYS` where they are
  deterministic (message counts, bytes, flags, arguments, counters).

Record RabbitMQ's answers (a private node, tests/rabbitmq_proc.py)::

    python tools/mgmt_shapes.py --json tests/http/rabbitmq_mgmt_shapes.json

tests/http/test_http_shapes.py runs the same :func:`record` against an
embedded Warren and compares the two with :func:`compare`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika

VHOST = "shapes"
USER, PASSWORD = "shapes-user", "shapes-pw"
#: A user tagged management only: what such a user is shown differs.
MGMT_USER = "shapes-mgmt"
Q_READY, Q_UNACKED, Q_CONSUMED, Q_GOT = "q.ready", "q.unacked", "q.consumed", "q.got"
Q_EXCLUSIVE, Q_STREAM, Q_SAC = "q.exclusive", "q.stream", "q.sac"
X_DIRECT, X_TOPIC, X_FANOUT = "shapes.direct", "shapes.topic", "shapes.fanout"
PERSISTENT, TRANSIENT = pika.BasicProperties(delivery_mode=2), pika.BasicProperties(delivery_mode=1)
BODY_P, BODY_T = b"p" * 10, b"t" * 20  # persistent and transient bodies: bytes tell them apart

#: Keys whose values are facts of the scenario, compared where both brokers have them.
FACT_KEYS = frozenset(
    {
        "messages",
        "messages_ready",
        "messages_unacknowledged",
        "messages_persistent",
        "messages_ram",
        "messages_ready_ram",
        "messages_unacknowledged_ram",
        "message_bytes",
        "message_bytes_ready",
        "message_bytes_unacknowledged",
        "message_bytes_persistent",
        "message_bytes_ram",
        "consumers",
        "durable",
        "auto_delete",
        "exclusive",
        "internal",
        "type",
        "arguments",
        "routing_key",
        "source",
        "destination",
        "destination_type",
        "publish",
        "publish_in",
        "publish_out",
        "deliver",
        "deliver_no_ack",
        "deliver_get",
        "get",
        "get_no_ack",
        "ack",
        "redeliver",
        "confirm",
        "prefetch_count",
        "ack_required",
        "consumer_tag",
        "active",
        "activity_status",
        "single_active_consumer_tag",
        "exclusive_consumer_tag",
        "channels",
        "connections",
        "queues",
        "exchanges",
        "configure",
        "write",
        "read",
        "user",
        "tags",
        "state",
        "number",
        "transactional",
        "messages_unconfirmed",
        "messages_uncommitted",
        "acks_uncommitted",
        "global_prefetch_count",
        "protocol",
        "auth_mechanism",
        "filtered_count",
        "item_count",
        "page",
        "page_count",
        "page_size",
        "total_count",
        "error",
        "reason",
        "status",
        "order",
    }
)

#: Query strings tried on listings: pagination, columns, sorting, rate history.
AGES = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5"


def endpoints(names: dict[str, str]) -> list[str]:
    """Every GET path recorded; ``names`` maps the scenario's connection and channel
    labels, and ``node``, to the broker's own names."""
    vh = quote(VHOST, safe="")
    conn = quote(names["shapes-consumer"], safe="")
    chan = quote(names["shapes-consumer (1)"], safe="")
    node = quote(names["node"], safe="")
    return [
        "/api/overview",
        f"/api/overview?{AGES}",
        "/api/overview?disable_stats=true&enable_queue_totals=true",
        "/api/whoami",
        "/api/nodes",
        f"/api/nodes/{node}",
        f"/api/nodes/{node}/memory",
        f"/api/nodes/{node}/memory/relative",
        "/api/extensions",
        "/api/cluster-name",
        "/api/connections",
        f"/api/connections/{conn}",
        f"/api/connections/{conn}/channels",
        f"/api/vhosts/{vh}/connections",
        "/api/channels",
        f"/api/channels/{chan}",
        f"/api/vhosts/{vh}/channels",
        "/api/consumers",
        f"/api/consumers/{vh}",
        "/api/exchanges",
        f"/api/exchanges/{vh}",
        f"/api/exchanges/{vh}/{X_DIRECT}",
        f"/api/exchanges/{vh}/{X_DIRECT}?{AGES}",
        f"/api/exchanges/{vh}/amq.default",
        f"/api/exchanges/{vh}/{X_DIRECT}/bindings/source",
        f"/api/exchanges/{vh}/{X_TOPIC}/bindings/destination",
        "/api/queues",
        f"/api/queues/{vh}",
        f"/api/queues/{vh}/{Q_READY}",
        f"/api/queues/{vh}/{Q_UNACKED}",
        f"/api/queues/{vh}/{Q_CONSUMED}",
        f"/api/queues/{vh}/{Q_EXCLUSIVE}",
        f"/api/queues/{vh}/{Q_STREAM}",
        f"/api/queues/{vh}/{Q_SAC}",
        f"/api/queues/{vh}/{Q_READY}?{AGES}",
        f"/api/queues/{vh}?{AGES}",
        f"/api/queues/{vh}?disable_stats=true&enable_queue_totals=true",
        f"/api/queues/{vh}/{Q_READY}/bindings",
        "/api/bindings",
        f"/api/bindings/{vh}",
        f"/api/bindings/{vh}/e/{X_DIRECT}/q/{Q_READY}",
        f"/api/bindings/{vh}/e/{X_DIRECT}/q/{Q_READY}/rk.ready",
        f"/api/bindings/{vh}/e/{X_DIRECT}/e/{X_TOPIC}",
        "/api/vhosts",
        f"/api/vhosts/{vh}",
        f"/api/vhosts/{vh}/permissions",
        f"/api/vhosts/{vh}/topic-permissions",
        "/api/users",
        f"/api/users/{USER}",
        f"/api/users/{USER}/permissions",
        f"/api/users/{USER}/topic-permissions",
        "/api/users/without-permissions",
        "/api/permissions",
        f"/api/permissions/{vh}/{USER}",
        "/api/topic-permissions",
        "/api/policies",
        f"/api/policies/{vh}",
        f"/api/policies/{vh}/shapes-policy",
        f"/api/vhost-limits/{vh}",
        f"/api/user-limits/{USER}",
        f"/api/topic-permissions/{vh}/{USER}",
        "/api/operator-policies",
        "/api/vhost-limits",
        "/api/user-limits",
        "/api/parameters",
        "/api/global-parameters",
        # List options: pagination, filters, columns, sorting, and refused pages.
        f"/api/queues/{vh}?page=1&page_size=2",
        f"/api/queues/{vh}?page=2&page_size=3",
        f"/api/queues/{vh}?page=1&page_size=100&name=ready",
        f"/api/queues/{vh}?page=1&name=%5Eq%5C.(ready%7Cgot)%24&use_regex=true",
        f"/api/queues/{vh}?page=1&pagination=true",
        "/api/exchanges?page=1&page_size=5&name=shapes",
        f"/api/queues/{vh}?columns=name,messages,message_stats.publish,arguments.x-max-length",
        f"/api/queues/{vh}/{Q_READY}?columns=name,messages_details.rate,message_stats",
        # Sorting, on keys that differ (RabbitMQ orders ties by Erlang term order).
        f"/api/queues/{vh}?page=1&name=%5Eq%5C.(ready%7Cunacked%7Cgot%7Cstream)%24"
        "&use_regex=true&sort=messages&sort_reverse=true&columns=name,messages",
        f"/api/queues/{vh}?page=1&name=%5Eq%5C.(ready%7Cunacked%7Cgot%7Cconsumed)%24"
        "&use_regex=true&sort=message_stats.publish&columns=name",
        "/api/vhosts?columns=name,messages",
        f"/api/queues/{vh}?page=0",
        f"/api/queues/{vh}?page=9&page_size=2",
        f"/api/queues/{vh}?page=1&page_size=501",
        f"/api/queues/{vh}?page=abc",
        f"/api/queues/{vh}?page=1&page_size=0",
        f"/api/queues/{vh}?page=1&name=(&use_regex=true",
        # History ranges: both halves needed, each positive, at most 500 samples.
        f"/api/queues/{vh}/{Q_READY}?lengths_age=60",
        f"/api/queues/{vh}/{Q_READY}?lengths_age=0&lengths_incr=5",
        f"/api/queues/{vh}/{Q_READY}?msg_rates_age=60&msg_rates_incr=0",
        f"/api/queues/{vh}/{Q_READY}?lengths_age=1000&lengths_incr=1",
        f"/api/queues/{vh}/{Q_READY}?lengths_age=abc&lengths_incr=5",
        "/api/overview?msg_rates_age=-5&msg_rates_incr=5",
        f"/api/nodes/{node}?node_stats_age=60&node_stats_incr=5",
        f"/api/vhosts/{vh}?data_rates_age=60&data_rates_incr=5",
        f"/api/connections/{conn}?data_rates_age=60&data_rates_incr=5",
    ]


#: What a management-only user reads (its own vhosts, no node figures).
MGMT_ENDPOINTS = [
    "/api/overview",
    "/api/whoami",
    f"/api/queues/{VHOST}",
    "/api/vhosts",
    "/api/connections",
    "/api/channels",
    "/api/exchanges",
    "/api/nodes",
]


# -- talking to a broker ----------------------------------------------------------------------


class Http:
    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.base = f"http://127.0.0.1:{port}"
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer


class Scenario:
    """The objects every recording sees; its connections stay open until close()."""

    def __init__(self, amqp_port: int, http_port: int) -> None:
        self.amqp_port = amqp_port
        self.http = Http(http_port)
        self.connections: list[pika.BlockingConnection] = []

    def _connect(self, name: str) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            host="127.0.0.1",
            port=self.amqp_port,
            virtual_host=VHOST,
            credentials=pika.PlainCredentials("guest", "guest"),
            heartbeat=0,  # nobody services the connections while the API is read
            client_properties={"connection_name": name},
        )
        conn = pika.BlockingConnection(params)
        self.connections.append(conn)
        return conn

    def setup(self) -> None:
        http, vh = self.http, quote(VHOST, safe="")
        http.ok("PUT", f"/api/vhosts/{vh}", {"description": "shapes", "tags": "a,b"})
        http.ok("PUT", f"/api/users/{USER}", {"password": PASSWORD, "tags": "monitoring"})
        every = {"configure": ".*", "write": ".*", "read": ".*"}
        http.ok("PUT", f"/api/permissions/{vh}/{USER}", every)
        http.ok("PUT", f"/api/permissions/{vh}/guest", every)
        http.ok("PUT", f"/api/users/{MGMT_USER}", {"password": PASSWORD, "tags": "management"})
        http.ok("PUT", f"/api/permissions/{vh}/{MGMT_USER}", every)
        topic = {"exchange": X_TOPIC, "write": "^a\\.", "read": ".*"}
        http.ok("PUT", f"/api/topic-permissions/{vh}/{USER}", topic)
        policy = {
            "pattern": "^q\\.ready$",
            "definition": {"max-length": 1000, "message-ttl": 3600000},
            "apply-to": "queues",
            "priority": 1,
        }
        http.ok("PUT", f"/api/policies/{vh}/shapes-policy", policy)
        http.ok("PUT", f"/api/vhost-limits/{vh}/max-queues", {"value": 100})
        http.ok("PUT", f"/api/user-limits/{USER}/max-connections", {"value": 10})
        pub = self._connect("shapes-publisher").channel()
        pub.confirm_delivery()
        pub.exchange_declare(X_DIRECT, "direct", durable=True)
        pub.exchange_declare(X_TOPIC, "topic", durable=True)
        pub.exchange_declare(X_FANOUT, "fanout", durable=False, auto_delete=False)
        pub.queue_declare(Q_READY, durable=True, arguments={"x-max-length": 100})
        pub.queue_declare(Q_UNACKED, durable=True)
        pub.queue_declare(Q_CONSUMED, durable=False)
        pub.queue_declare(Q_GOT, durable=True)
        pub.queue_declare(Q_STREAM, durable=True, arguments={"x-queue-type": "stream"})
        pub.queue_declare(Q_SAC, durable=True, arguments={"x-single-active-consumer": True})
        pub.queue_bind(Q_READY, X_DIRECT, "rk.ready")
        pub.queue_bind(Q_READY, X_TOPIC, "a.#")
        pub.exchange_bind(X_TOPIC, X_DIRECT, "e2e")
        pub.queue_bind(Q_UNACKED, X_FANOUT, "", arguments={"k": "v"})
        for props, body in ((PERSISTENT, BODY_P),) * 3 + ((TRANSIENT, BODY_T),) * 2:
            pub.basic_publish(X_DIRECT, "rk.ready", body, props)
        for props, body in ((PERSISTENT, BODY_P),) * 2 + ((TRANSIENT, BODY_T),):
            pub.basic_publish(X_FANOUT, "", body, props)
        for props, body in ((PERSISTENT, BODY_P), (TRANSIENT, BODY_T)):
            pub.basic_publish("", Q_GOT, body, props)
            pub.basic_publish("", Q_STREAM, body, props)
        con = self._connect("shapes-consumer").channel()
        con.basic_qos(prefetch_count=2)
        con.basic_consume(Q_UNACKED, lambda *a: None, consumer_tag="ctag.unacked")
        con.basic_consume(Q_CONSUMED, lambda *a: None, auto_ack=True, consumer_tag="ctag.auto")
        con.queue_declare(Q_EXCLUSIVE, exclusive=True)
        for tag in ("ctag.sac1", "ctag.sac2"):  # one active, one waiting
            con.basic_consume(Q_SAC, lambda *a: None, consumer_tag=tag, arguments={"x-priority": 5})
        for _ in range(4):
            pub.basic_publish("", Q_CONSUMED, BODY_T, TRANSIENT)
        method, _, _ = con.basic_get(Q_GOT, auto_ack=False)
        assert method is not None
        con.basic_ack(method.delivery_tag)
        con.connection.process_data_events(0)

    def names(self) -> dict[str, str]:
        """The brokers' names of the scenario's connections and channels, and the node's."""
        out = {"node": self.http.ok("GET", "/api/overview")["node"]}
        for info in self.http.ok("GET", "/api/connections"):
            label = (info.get("client_properties") or {}).get("connection_name")
            if label:
                out[label] = info["name"]
                out[f"{label} (1)"] = f"{info['name']} (1)"
        return out

    def close(self) -> None:
        for conn in self.connections:
            with contextlib.suppress(Exception):  # a recording ends whatever happened
                conn.close()


def settled(http: Http) -> bool:
    """Whether the broker's statistics show the whole scenario (RabbitMQ's come
    every 5 s; Warren's counts at once, its rates when sampled)."""
    try:
        queues = {q["name"]: q for q in http.ok("GET", f"/api/queues/{quote(VHOST, safe='')}")}
        channels = http.ok("GET", "/api/channels")
        exchange = http.ok("GET", f"/api/exchanges/{VHOST}/{X_DIRECT}")
        overview = http.ok("GET", "/api/overview")
    except RuntimeError:
        return False
    ready, unacked, got = queues.get(Q_READY, {}), queues.get(Q_UNACKED, {}), queues.get(Q_GOT, {})
    return (
        ready.get("messages") == 5
        and ready.get("message_stats", {}).get("publish") == 5
        and unacked.get("messages_unacknowledged") == 2
        and unacked.get("message_stats", {}).get("deliver") == 2
        and got.get("message_stats", {}).get("ack") == 1
        and queues.get(Q_CONSUMED, {}).get("message_stats", {}).get("deliver_no_ack") == 4
        and exchange.get("message_stats", {}).get("publish_in") == 5
        and len(channels) == 2
        and all(c.get("message_stats") for c in channels)
        and overview.get("message_stats", {}).get("publish", 0) >= 12
        and overview.get("object_totals", {}).get("consumers", 0) >= 2
    )


# -- shapes and facts -------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """The key sets and types of ``value``, recursively."""
    if isinstance(value, dict):
        return {key: shape(v) for key, v in sorted(value.items())}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            merged = _merge(merged, shape(item))
        return [] if merged is None else [merged]
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def _merge(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) for k in sorted(set(a) | set(b))}
    if isinstance(a, list) and isinstance(b, list):
        return [_merge(a[0] if a else None, b[0] if b else None)] if a or b else []
    if a == b:
        return a
    kinds = set(str(a).split("|")) | set(str(b).split("|"))
    return "|".join(sorted(kinds))


def facts(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted.path: value}`` of every fact key in ``value``."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, v in value.items():
            path = f"{prefix}{key}"
            if key in FACT_KEYS and not isinstance(v, dict | list) or key in ("arguments", "tags"):
                out[path] = v
            elif isinstance(v, dict):
                out.update(facts(v, path + "."))
    return out


def label(item: Any, names: dict[str, str]) -> str:
    """The same name for the same item on either broker."""
    if not isinstance(item, dict):
        return json.dumps(item)
    by_name = {v: k for k, v in names.items()}
    if item.get("name") == names["node"]:
        return "node"
    if "consumer_tag" in item and "channel_details" in item:
        return f"consumer {item['consumer_tag']}"
    if "destination_type" in item:
        return f"binding {item['source']}->{item['destination']}:{item['routing_key']}"
    if "connection_details" in item:
        conn = by_name.get(item["connection_details"].get("name"), "?")
        return f"channel {conn} ({item.get('number')})"
    if "client_properties" in item:
        return f"connection {(item['client_properties'] or {}).get('connection_name')}"
    if "configure" in item:
        return f"permission {item['user']}@{item['vhost']}"
    if "name" in item:
        vhost = item.get("vhost")
        return f"{vhost}/{item['name']}" if isinstance(vhost, str) else str(item["name"])
    return "?"


def _renamed(value: Any, node: str) -> Any:
    """``value`` with keys that are the node's name written ``{node}``."""
    if isinstance(value, dict):
        return {("{node}" if k == node else k): _renamed(v, node) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, node) for v in value]
    return value


def describe(status: int, answer: Any, names: dict[str, str]) -> dict[str, Any]:
    """One answer as recorded: status, shape, facts (a listing's per item)."""
    out: dict[str, Any] = {"status": status}
    answer = _renamed(answer, names["node"])
    if status >= 400:
        out["body"] = answer
        return out
    items = answer["items"] if isinstance(answer, dict) and "items" in answer else answer
    if isinstance(answer, dict) and "items" in answer:
        out["page"] = {k: v for k, v in answer.items() if k != "items"}
    if isinstance(items, list):
        order = [label(i, names) for i in items]
        # Connections (and their channels) are sorted by name, which holds a port
        # number picked by the OS: their order says nothing.
        # RabbitMQ lists consumers in no order of their own.
        if not any(o.startswith(("connection ", "channel ", "consumer ")) for o in order):
            out["order"] = order
        out["items"] = {label(i, names): {"shape": shape(i), "facts": facts(i)} for i in items}
    else:
        out["shape"] = shape(answer)
        out["facts"] = facts(answer)
    return out


def record(
    amqp_port: int,
    http_port: int,
    settle: Callable[[Http], None],
    raw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Set up the scenario, let ``settle`` wait for (or make) the statistics, read
    every endpoint; ``{path with labels: description}`` (and the answers
    themselves into ``raw``, when given)."""
    scenario = Scenario(amqp_port, http_port)
    try:
        scenario.setup()
        settle(scenario.http)
        names = scenario.names()
        out: dict[str, Any] = {}
        as_mgmt = Http(http_port, MGMT_USER, PASSWORD)
        paths = [(scenario.http, p, "") for p in endpoints(names)]
        paths += [(as_mgmt, p, f"[{MGMT_USER}] ") for p in MGMT_ENDPOINTS]
        # Last: it declares a queue of its own (aliveness-test).
        paths.append((scenario.http, f"/api/aliveness-test/{quote(VHOST, safe='')}", ""))
        for http, path, prefix in paths:
            status, answer = http.call("GET", path)
            key = prefix + path
            for label_, real in names.items():
                key = key.replace(quote(real, safe=""), "{" + label_ + "}")
            out[key] = describe(status, answer, names)
            if raw is not None:
                raw[key] = answer
        return out
    finally:
        scenario.close()


# -- comparing --------------------------------------------------------------------------------


def shape_diffs(where: str, expected: Any, actual: Any) -> list[str]:
    """Differences between two shapes, one line each."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key in sorted(set(expected) | set(actual)):
            path = f"{where}.{key}"
            if key not in actual:
                out.append(f"{path}: missing")
            elif key not in expected:
                out.append(f"{path}: extra")
            else:
                out.extend(shape_diffs(path, expected[key], actual[key]))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if expected and actual:
            return shape_diffs(where + "[]", expected[0], actual[0])
        return []  # an empty list on either side says nothing of its items
    if expected != actual:
        return [f"{where}: type {_kind(expected)} != {_kind(actual)}"]
    return []


def _kind(shape_: Any) -> str:
    return "object" if isinstance(shape_, dict) else "list" if isinstance(shape_, list) else shape_


def compare(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Every difference between two recordings, as ``path: what`` lines."""
    out = []
    for path, exp in expected.items():
        act = actual.get(path)
        if act is None:
            out.append(f"{path}: not recorded")
            continue
        if exp["status"] != act["status"]:
            out.append(f"{path}: status {exp['status']} != {act['status']}")
            continue
        if "body" in exp:
            if exp["body"] != act.get("body"):
                out.append(f"{path}: body {exp['body']!r} != {act.get('body')!r}")
            continue
        for key, value in exp.get("page", {}).items():
            if act.get("page", {}).get(key) != value:
                out.append(f"{path}: page.{key} {value!r} != {act.get('page', {}).get(key)!r}")
        if "items" in exp:
            exp_items, act_items = exp["items"], act.get("items", {})
            for item in sorted(set(exp_items) | set(act_items)):
                if item not in act_items:
                    out.append(f"{path} {item}: missing")
                elif item not in exp_items:
                    out.append(f"{path} {item}: extra")
                else:
                    out.extend(_item_diffs(f"{path} {item}", exp_items[item], act_items[item]))
            if "order" in exp:
                common = [i for i in exp["order"] if i in act_items]
                if [i for i in act.get("order", []) if i in exp_items] != common:
                    out.append(f"{path}: order {common} != {act.get('order')}")
        else:
            out.extend(_item_diffs(path, exp, act))
    return out


def _item_diffs(where: str, exp: dict[str, Any], act: dict[str, Any]) -> list[str]:
    out = shape_diffs(where, exp["shape"], act["shape"])
    for key, value in exp["facts"].items():
        if key in act["facts"] and act["facts"][key] != value:
            out.append(f"{where}.{key}: {value!r} != {act['facts'][key]!r}")
    return out


# -- recording RabbitMQ -----------------------------------------------------------------------


def wait_settled(http: Http, timeout: float = 90.0) -> None:
    """Poll until RabbitMQ's statistics show the scenario, then one more emission
    so rates and totals are all from the same round."""
    deadline = time.monotonic() + timeout
    while not settled(http):
        if time.monotonic() > deadline:
            raise RuntimeError("the broker's statistics never showed the scenario")
        time.sleep(0.5)
    time.sleep(6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the recording")
    parser.add_argument("--raw", type=Path, help="also write the raw answers here")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tempfile

    from rabbitmq_proc import RabbitMQ

    with tempfile.TemporaryDirectory() as tmp:
        server = RabbitMQ(Path(tmp) / "rabbitmq", plugins=["rabbitmq_management"])
        try:
            raw: dict[str, Any] = {}
            recording = record(server.port, server.http_port, wait_settled, raw)
            if args.raw:
                args.raw.write_text(json.dumps(raw, indent=1))
            version = Http(server.http_port).ok("GET", "/api/overview")["rabbitmq_version"]
        finally:
            server.stop()
    document = {"rabbitmq_version": version, "endpoints": recording}
    args.json.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
