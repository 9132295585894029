"""What a broker answers about the management API's later additions, asked of a broker.

Four scenarios, each returning what a client observes (tests/http/test_mgmt_gaps.py
and tests/cluster/test_cluster_id.py compare Warren with RabbitMQ's recorded answers):

- ``cluster_id``: the ``internal_cluster_id`` global parameter (its format);
- ``retention``: the overview's ``sample_retention_policies`` and, for each range
  the management UI offers (a minute to a day), the number of samples and their
  spacing in a queue's and the overview's ``*_details``;
- ``mqtt_max_queues``: MQTT clients (paho, 3.1.1) subscribing while the vhost's
  ``max-queues`` is reached: the SUBACK, whether the connection is closed,
  whether a persistent session's reconnect and its subscriptions and another
  connection are affected;
- ``default_queue_type``: a vhost PUT with ``default_queue_type`` and what a
  queue declared there without ``x-queue-type`` becomes (RabbitMQ 3.10 has no
  such setting; 3.11 added it, docs/http-api.md says what Warren follows).

Record RabbitMQ's answers (a private node, tests/rabbitmq_proc.py, with the
management and MQTT plugins)::

    PYTHONPATH=src python tools/mgmt_gaps.py --json tests/http/rabbitmq_gap_answers.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgmt_compat import Client, Req

V = "compat-gaps"
#: The ranges the management UI offers (its chart ranges): (age, incr) in seconds.
RANGES = ((60, 5), (600, 5), (3600, 60), (28800, 600), (86400, 1800))


def _wait(cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _fresh(client: Client) -> None:
    client.send(Req("DELETE", f"/api/vhosts/{V}"))
    client.send(Req("PUT", f"/api/vhosts/{V}", {}))
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    client.send(Req("PUT", f"/api/permissions/{V}/guest", perms))


# -- the cluster's id -----------------------------------------------------------------------


def cluster_id(client: Client) -> dict[str, Any]:
    _, body = client.send(Req("GET", "/api/global-parameters/internal_cluster_id"))
    return {"internal_cluster_id": body["value"]}


# -- history ranges -------------------------------------------------------------------------


def _range_shape(details: Any) -> dict[str, Any]:
    """How many samples a ``*_details`` object holds, how far apart, and its keys."""
    if not isinstance(details, dict):
        return {"missing": True}
    samples = details.get("samples", [])
    stamps = [s["timestamp"] for s in samples]
    return {
        "keys": sorted(details),
        "samples": len(samples),
        "step_ms": sorted({a - b for a, b in zip(stamps, stamps[1:], strict=False)}),
    }


def retention(client: Client, amqp_port: int) -> dict[str, Any]:
    """The retention policies and the shape of every UI range's history."""
    import pika  # noqa: PLC0415 - only this part needs a client library

    _fresh(client)
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp_port}/{V}"))
    ch = conn.channel()
    ch.queue_declare("rq")
    ch.basic_publish("", "rq", b"x")
    conn.close()
    q = f"/api/queues/{V}/rq"
    # RabbitMQ samples every 5 s: wait for the queue's and the overview's rates.
    _wait(lambda: "message_stats" in client.send(Req("GET", q))[1])
    _wait(lambda: "publish" in client.send(Req("GET", "/api/overview"))[1]["message_stats"])
    out: dict[str, Any] = {}
    _, overview = client.send(Req("GET", "/api/overview"))
    out["sample_retention_policies"] = overview["sample_retention_policies"]
    for age, incr in RANGES:
        query = (
            f"?lengths_age={age}&lengths_incr={incr}&msg_rates_age={age}&msg_rates_incr={incr}"
        )
        _, queue = client.send(Req("GET", q + query))
        _, overview = client.send(Req("GET", "/api/overview" + query))
        out[f"{age}/{incr}"] = {
            "queue messages_details": _range_shape(queue.get("messages_details")),
            "queue publish_details": _range_shape(
                queue.get("message_stats", {}).get("publish_details")
            ),
            "overview queue_totals.messages_details": _range_shape(
                overview.get("queue_totals", {}).get("messages_details")
            ),
            "overview publish_details": _range_shape(
                overview.get("message_stats", {}).get("publish_details")
            ),
        }
    client.send(Req("DELETE", f"/api/vhosts/{V}"))
    return out


# -- MQTT subscriptions against max-queues ----------------------------------------------------


class MqttClient:
    """A paho client that records its SUBACKs, messages and disconnection (no reconnects)."""

    def __init__(self, port: int, client_id: str, clean: bool, v5: bool = False) -> None:
        import paho.mqtt.client as mqtt  # noqa: PLC0415
        from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

        self.subacks: list[list[int]] = []
        self.messages: list[str] = []
        self.connack: list[Any] | None = None  # [code, session present]
        self.closed = threading.Event()
        kwargs: dict[str, Any] = {} if v5 else {"clean_session": clean}
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            reconnect_on_failure=False,
            **kwargs,
        )
        self.client.username_pw_set(f"{V}:guest", "guest")
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, msg: self.messages.append(msg.payload.decode())
        self.client.on_disconnect = lambda *_args: self.closed.set()
        if v5:
            from paho.mqtt.packettypes import PacketTypes  # noqa: PLC0415
            from paho.mqtt.properties import Properties  # noqa: PLC0415

            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0 if clean else 3600
            self.client.connect("127.0.0.1", port, clean_start=clean, properties=props)
        else:
            self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        _wait(lambda: self.connack is not None or self.closed.is_set(), 10)

    def _on_connect(self, _c: Any, _u: Any, flags: Any, code: Any, _props: Any) -> None:
        self.connack = [int(code.value), bool(flags.session_present)]

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, codes: list[Any], _props: Any) -> None:
        self.subacks.append([int(c.value) for c in codes])

    def subscribe(self, *topics: str) -> dict[str, Any]:
        """SUBSCRIBE (QoS 1): the SUBACK's codes (None: none came) and whether the
        broker closed the connection."""
        before = len(self.subacks)
        self.client.subscribe([(t, 1) for t in topics])
        _wait(lambda: len(self.subacks) > before or self.closed.is_set(), 10)
        got = self.subacks[before] if len(self.subacks) > before else None
        if got is None or any(code >= 0x80 for code in got):
            closed = self.closed.wait(10)  # a broker that refuses closes right after
        else:
            closed = not self._round_trip()
        return {"suback": got, "closed": closed}

    def _round_trip(self) -> bool:
        """A QoS 1 publish answered: the connection outlived what came before it
        (a condition, where waiting a second for no close was a guess)."""
        info = self.client.publish("mgmt-gaps/ping", "", qos=1)
        try:
            info.wait_for_publish(10)
        except RuntimeError:  # the connection went
            return False
        return info.is_published() and not self.closed.is_set()

    def publish(self, topic: str, payload: str) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(10)

    def stop(self) -> None:
        if not self.closed.is_set():
            self.client.disconnect()
            self.closed.wait(5)
        self.client.loop_stop()


def mqtt_max_queues(client: Client, mqtt_port: int, v5: bool = False) -> dict[str, Any]:
    """Subscriptions while the vhost's max-queues is reached (QoS 1 throughout:
    RabbitMQ 3.10 makes one queue per session and QoS)."""
    _fresh(client)
    tag = uuid.uuid4().hex[:6]
    limit = f"/api/vhost-limits/{V}/max-queues"
    client.send(Req("PUT", limit, {"value": 1}))
    out: dict[str, Any] = {}
    kept = MqttClient(mqtt_port, f"kept-{tag}", clean=False, v5=v5)
    out["persistent session subscribes"] = kept.subscribe("t/kept")
    kept.stop()
    kept = MqttClient(mqtt_port, f"kept-{tag}", clean=False, v5=v5)
    out["persistent session reconnects"] = {"connack": kept.connack}
    out["persistent session subscribes again"] = kept.subscribe("t/kept2")
    refused = MqttClient(mqtt_port, f"new-{tag}", clean=True, v5=v5)
    out["a new session subscribes beyond the limit"] = refused.subscribe("t/new", "t/new2")
    refused.stop()
    publisher = MqttClient(mqtt_port, f"pub-{tag}", clean=True, v5=v5)
    for topic in ("t/kept", "t/kept2", "t/new"):
        publisher.publish(topic, topic)
    publisher.stop()
    _wait(lambda: len(kept.messages) >= 2, 10)
    out["the persistent session after"] = {
        "connected": not kept.closed.is_set(),
        "messages": sorted(kept.messages),
    }
    kept.stop()
    _, queues = client.send(Req("GET", f"/api/queues/{V}?columns=name,durable"))
    out["queues"] = sorted(
        [q["durable"], q["name"].replace(tag, "TAG")] for q in queues  # type: ignore[union-attr]
    )
    client.send(Req("PUT", limit, {"value": 2}))
    clean = MqttClient(mqtt_port, f"clean-{tag}", clean=True, v5=v5)
    out["a clean session within the limit"] = clean.subscribe("t/clean")
    clean.stop()
    _wait(lambda: len(client.send(Req("GET", f"/api/queues/{V}"))[1]) == 1, 10)
    clean = MqttClient(mqtt_port, f"clean2-{tag}", clean=True, v5=v5)
    out["another clean session after the first one's queue went"] = clean.subscribe("t/c2")
    clean.stop()
    client.send(Req("DELETE", f"/api/vhosts/{V}"))
    return out


# -- a vhost's default queue type ---------------------------------------------------------------


#: A vhost of its own: RabbitMQ keeps a deleted vhost's statistics for a while, and
#: would list the others' message counts under the name.
DQT_VHOST = "compat-dqt"


def default_queue_type(client: Client, amqp_port: int) -> dict[str, Any]:
    import pika  # noqa: PLC0415

    v = DQT_VHOST
    client.send(Req("DELETE", f"/api/vhosts/{v}"))
    out: dict[str, Any] = {}
    status, _ = client.send(Req("PUT", f"/api/vhosts/{v}", {"default_queue_type": "quorum"}))
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    client.send(Req("PUT", f"/api/permissions/{v}/guest", perms))
    out["vhost put"] = status
    _, vhost = client.send(Req("GET", f"/api/vhosts/{v}"))
    out["vhost keys"] = sorted(vhost)
    out["vhost default_queue_type"] = vhost.get("default_queue_type", "<missing>")
    client.send(Req("PUT", f"/api/queues/{v}/http-durable", {"durable": True}))
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp_port}/{v}"))
    ch = conn.channel()
    ch.queue_declare("amqp-durable", durable=True)
    ch.queue_declare("amqp-transient", durable=False)
    ch.queue_declare("amqp-exclusive", exclusive=True)
    cols = "?columns=name,type,durable,exclusive,auto_delete,arguments"
    _, queues = client.send(Req("GET", f"/api/queues/{v}{cols}"))
    out["queues"] = queues
    conn.close()
    _, defs = client.send(Req("GET", "/api/definitions"))
    out["definitions vhost"] = next(x for x in defs["vhosts"] if x["name"] == v)
    client.send(Req("DELETE", f"/api/vhosts/{v}"))
    return out


def run(url: str, amqp_port: int, mqtt_port: int) -> dict[str, Any]:
    client = Client(url)
    try:
        return {
            "cluster_id": cluster_id(client),
            "retention": retention(client, amqp_port),
            "mqtt_max_queues": mqtt_max_queues(client, mqtt_port),
            "default_queue_type": default_queue_type(client, amqp_port),
        }
    finally:
        client.send(Req("DELETE", f"/api/vhosts/{V}"))


def _record(path: Path | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from rabbitmq_proc import RabbitMQ  # noqa: PLC0415 - tests/ is not a package here

    with tempfile.TemporaryDirectory() as tmp:
        server = RabbitMQ(Path(tmp), plugins=["rabbitmq_management", "rabbitmq_mqtt"])
        try:
            answers = run(f"http://127.0.0.1:{server.http_port}", server.port, server.mqtt_port)
        finally:
            server.stop()
    answers["source"] = "RabbitMQ 3.10.8 (Debian) with rabbitmq_management, rabbitmq_mqtt"
    text = json.dumps(answers, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the answers here (default: stdout)")
    _record(parser.parse_args().json)


if __name__ == "__main__":
    main()
