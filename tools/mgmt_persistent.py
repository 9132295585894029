"""What a broker reports of persistent messages, step by step, asked of a broker.

One scenario in the vhost ``persist`` (made first, deleted last): queues of
every kind (a durable classic queue, a transient one, an exclusive durable
one, a quorum queue, a stream, a durable priority queue, and a durable queue
whose consumer is there before anything is published) each get the same mix
of persistent (delivery mode 2) and transient (1) messages, with bodies of
different sizes so that the byte counts tell which ones are counted. Then
messages are fetched and held unacknowledged, acked, rejected, requeued and
purged, more are published, and the broker is restarted on the same data.
After every step the queues' counts (``messages_persistent``,
``message_bytes_persistent`` and the message and byte counts beside them),
the Prometheus families ``rabbitmq_queue_messages_persistent``,
``..._persistent_bytes`` and the byte families beside them per queue, and the persistent keys of
``/api/overview``'s ``queue_totals`` and of the vhost object are recorded.

Record RabbitMQ's answers (a private node, tests/rabbitmq_proc.py)::

    PYTHONPATH=src python tools/mgmt_persistent.py --json tests/http/rabbitmq_persistent_counts.json

tests/http/test_mgmt_persistent.py runs :func:`run` against an embedded
Warren (restarted on its data directory) and compares.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

VHOST = "persist"
#: The queues and what they are declared with (durable, exclusive, arguments).
QUEUES: dict[str, tuple[bool, bool, dict[str, Any]]] = {
    "classic": (True, False, {}),
    "transient": (False, False, {}),
    "exclusive": (True, True, {}),
    "quorum": (True, False, {"x-queue-type": "quorum"}),
    "stream": (True, False, {"x-queue-type": "stream"}),
    "priority": (True, False, {"x-max-priority": 5}),
    "consumed": (True, False, {}),
}
#: The messages each queue gets, in order: (delivery mode, body size); the
#: priority property is the message's index (a priority queue serves the last first).
MIX = [(2, 10), (1, 21), (2, 12), (1, 23), (2, 14)]
#: What is recorded of a queue (a key the broker leaves out is left out).
COUNT_KEYS = (
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "messages_persistent",
    "message_bytes",
    "message_bytes_ready",
    "message_bytes_unacknowledged",
    "message_bytes_persistent",
)
#: The per-queue Prometheus families recorded (rabbitmq_ + these).
FAMILIES = (
    "queue_messages_persistent",
    "queue_messages_persistent_bytes",
    "queue_messages_bytes",
    "queue_messages_ready_bytes",
    "queue_messages_unacked_bytes",
)
#: Queues the main connection fetches from and settles (basic.get).
FETCHED = ("classic", "transient", "quorum", "priority")


class Broker:
    """How the scenario reaches a broker; ``restart`` stops it cleanly and starts it
    again on the same data (the ports may change: read them again after)."""

    def __init__(
        self,
        amqp_port: Callable[[], int],
        http_port: Callable[[], int],
        metrics_url: Callable[[], str],
        restart: Callable[[], None],
    ) -> None:
        self.amqp_port = amqp_port
        self.http_port = http_port
        self.metrics_url = metrics_url
        self.restart = restart

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port()}{path}", data=data, method=method
        )
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        return status, json.loads(raw) if raw else None

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                self.amqp_port(),
                VHOST,
                pika.PlainCredentials("guest", "guest"),
            )
        )


def _props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=MIX[i][0], priority=i)


def _publish(ch: Any, queue: str) -> None:
    for i, (_mode, size) in enumerate(MIX):
        ch.basic_publish("", queue, bytes([97 + i]) * size, _props(i))


def counts(broker: Broker) -> dict[str, dict[str, int] | None]:
    """Every scenario queue's counts (None: the queue does not exist)."""
    out: dict[str, dict[str, int] | None] = {}
    for name in QUEUES:
        status, body = broker.http("GET", f"/api/queues/{VHOST}/{name}")
        out[name] = {k: body[k] for k in COUNT_KEYS if k in body} if status == 200 else None
    return out


def prometheus(broker: Broker) -> dict[str, dict[str, float]]:
    """The FAMILIES' samples per scenario queue: {queue: {family: value}}."""
    with urllib.request.urlopen(broker.metrics_url(), timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        family = name.removeprefix("rabbitmq_")
        if family not in FAMILIES or f'vhost="{VHOST}"' not in rest:
            continue
        queue = rest.split('queue="', 1)[1].split('"', 1)[0]
        out.setdefault(queue, {})[family] = float(line.rsplit(" ", 1)[1])
    return {q: dict(sorted(f.items())) for q, f in sorted(out.items())}


def persistent_keys(broker: Broker) -> dict[str, list[str]]:
    """The keys naming persistent messages in queue_totals and the vhost object."""
    _, overview = broker.http("GET", "/api/overview")
    _, vhost = broker.http("GET", f"/api/vhosts/{VHOST}")
    return {
        "queue_totals": sorted(k for k in overview.get("queue_totals", {}) if "persistent" in k),
        "vhost": sorted(k for k in vhost if "persistent" in k),
    }


def settle(broker: Broker, expected: dict[str, tuple[int, int, int] | None]) -> dict[str, Any]:
    """Poll until every queue shows the step's (messages, ready, unacked) and two
    reads in a row agree (RabbitMQ's statistics arrive every few seconds;
    Warren's counts at once), then what the step records."""
    deadline = time.monotonic() + 120
    last: dict[str, Any] | None = None
    while True:
        got = counts(broker)
        lengths = {
            name: None
            if c is None
            else (c.get("messages"), c.get("messages_ready"), c.get("messages_unacknowledged"))
            for name, c in got.items()
        }
        if lengths == expected and got == last:
            return {"queues": got, "prometheus": prometheus(broker)}
        if time.monotonic() > deadline:
            raise RuntimeError(f"the counts never settled: {lengths} != {expected}")
        last = got if lengths == expected else None
        time.sleep(0.5)


class Consumer:
    """The ``consumed`` queue's consumer (prefetch 2, manual acks): its delivery
    tags, oldest first."""

    def __init__(self, conn: pika.BlockingConnection, ch: Any) -> None:
        self.conn = conn
        self.tags: list[int] = []
        ch.basic_qos(prefetch_count=2)
        ch.basic_consume("consumed", lambda _c, m, _p, _b: self.tags.append(m.delivery_tag))

    def wait(self, n: int) -> None:
        """Until it has had ``n`` deliveries in all."""
        deadline = time.monotonic() + 30
        while len(self.tags) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the consumer got {len(self.tags)} deliveries, not {n}")
            self.conn.process_data_events(time_limit=0.1)


def run(broker: Broker) -> dict[str, Any]:  # noqa: PLR0915 - one scenario, step by step
    """The scenario: each step's counts, in order."""
    broker.http("DELETE", f"/api/vhosts/{VHOST}")
    broker.http("PUT", f"/api/vhosts/{VHOST}", {})
    broker.http(
        "PUT", f"/api/permissions/{VHOST}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    steps: dict[str, Any] = {}
    every = dict.fromkeys(QUEUES, (5, 5, 0))
    conn = broker.connect()
    try:
        ch = conn.channel()
        for name, (durable, exclusive, arguments) in QUEUES.items():
            ch.queue_declare(name, durable=durable, exclusive=exclusive, arguments=arguments)
        cch = conn.channel()
        consumer = Consumer(conn, cch)
        for name in QUEUES:
            _publish(ch, name)
        consumer.wait(2)
        steps["published"] = settle(broker, {**every, "consumed": (5, 3, 2)})

        got = {name: [ch.basic_get(name)[0].delivery_tag for _ in range(2)] for name in FETCHED}
        expected = {**every, "consumed": (5, 3, 2), **dict.fromkeys(FETCHED, (5, 3, 2))}
        steps["fetched"] = settle(broker, expected)

        for name in FETCHED:  # the first fetched: persistent
            ch.basic_ack(got[name][0])
        cch.basic_ack(consumer.tags[0])
        consumer.wait(3)
        expected = {**expected, "consumed": (4, 2, 2), **dict.fromkeys(FETCHED, (4, 3, 1))}
        steps["acked"] = settle(broker, expected)

        for name in FETCHED:  # the second fetched: transient
            ch.basic_reject(got[name][1], requeue=False)
        cch.basic_reject(consumer.tags[1], requeue=False)
        consumer.wait(4)
        expected = {**expected, "consumed": (3, 1, 2), **dict.fromkeys(FETCHED, (3, 3, 0))}
        steps["rejected"] = settle(broker, expected)

        # Not the quorum queue: RabbitMQ 3.10 serves a returned message first, 4.x
        # (and Warren) after the others, so the purge below would hold another one.
        for name in ("classic", "transient", "priority"):
            ch.basic_nack(ch.basic_get(name)[0].delivery_tag, requeue=True)
        cch.basic_nack(consumer.tags[2], requeue=True)
        consumer.wait(5)
        steps["requeued"] = settle(broker, expected)

        for name in FETCHED:  # one held, the rest purged
            ch.basic_get(name)
            ch.queue_purge(name)
        cch.queue_purge("consumed")
        expected = {**expected, "consumed": (2, 0, 2), **dict.fromkeys(FETCHED, (1, 0, 1))}
        steps["purged"] = settle(broker, expected)
        steps["keys"] = persistent_keys(broker)
    finally:
        conn.close()  # what was held goes back; the exclusive queue goes

    conn = broker.connect()
    try:
        ch = conn.channel()
        for name in ("classic", "priority", "quorum"):
            _publish(ch, name)
        expected = {
            **expected,
            "exclusive": None,
            "transient": (1, 1, 0),
            "consumed": (2, 2, 0),
            **dict.fromkeys(("classic", "priority", "quorum"), (6, 6, 0)),
        }
        steps["republished"] = settle(broker, expected)
    finally:
        conn.close()

    broker.restart()
    conn = broker.connect()
    try:
        ch = conn.channel()
        for name in ("classic", "priority", "quorum", "consumed"):
            # RabbitMQ shows a recovered queue's counts once the queue is used.
            ch.basic_nack(ch.basic_get(name)[0].delivery_tag, requeue=True)
        expected = {
            **expected,
            "transient": None,
            "consumed": (1, 1, 0),
            **dict.fromkeys(("classic", "priority"), (4, 4, 0)),
        }
        steps["restarted"] = settle(broker, expected)
    finally:
        conn.close()
        broker.http("DELETE", f"/api/vhosts/{VHOST}")
    return steps


def _record(path: Path | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from rabbitmq_proc import RabbitMQ  # noqa: PLC0415 - tests/ is not a package here

    with tempfile.TemporaryDirectory() as tmp:
        server = RabbitMQ(
            Path(tmp),
            plugins=["rabbitmq_management", "rabbitmq_prometheus"],
            config="collect_statistics_interval = 500\n",
        )
        try:
            broker = Broker(
                lambda: server.port,
                lambda: server.http_port,
                lambda: f"http://127.0.0.1:{server.prometheus_port}/metrics/per-object",
                server.restart,
            )
            steps = run(broker)
            _, overview = broker.http("GET", "/api/overview")
        finally:
            server.stop()
    document = {"rabbitmq_version": overview["rabbitmq_version"], "steps": steps}
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the recording here (default: stdout)")
    _record(parser.parse_args().json)


if __name__ == "__main__":
    main()
