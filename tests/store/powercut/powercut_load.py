"""Workloads for the power-cut tests: real clients against a real `warren` process.

Each workload publishes with confirms (AMQP) or QoS 1/2 (MQTT) from threads of
its own, records what the broker confirmed and what its consumers acknowledged,
and after a power cut and a restart checks what came back: every confirmed
message that was not acknowledged is there (0 confirmed lost); one that was
acknowledged may come back, only as a redelivery.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forkserver
import paho.mqtt.client as mqtt
import pika
import pika.exceptions

SRC = Path(__file__).resolve().parents[3] / "src"
#: What a client sees when the broker dies under it.
GONE = (pika.exceptions.AMQPError, OSError, AssertionError, ValueError)


class WarrenProcess:
    """`python -m warren` on a data directory, forked by the tests' fork server
    (tests/forkserver.py); its log kept for a failure's report."""

    def __init__(self, data_dir: Path, *args: str, http: bool = False) -> None:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        self.proc = forkserver.spawn(
            ["-D", str(data_dir), "--amqp-port", "0", "--mqtt-port", "0", "--stream-port", "0",
             "--prometheus-port", "0", "--http-port", "0" if http else "-1", *args],
            env=env, stdout=forkserver.PIPE, stderr=forkserver.STDOUT,
        )
        self.lines: list[str] = []
        self.amqp_port = 0
        self.mqtt_port = 0
        self.http_port = 0
        self._http = http
        self._listening = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._listening.wait(60) or not (self.amqp_port and self.mqtt_port):
            self.kill()
            raise RuntimeError("warren did not start:\n" + self.log_tail())

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            # The management listener, not the [prometheus] one ("HTTP (Prometheus
            # metrics)"), is the HTTP port.
            m = re.search(r"listening on (AMQP|MQTT|HTTP) [^:(]*(?:\(management API\) )?[^:(]+:(\d+)$", line.strip())
            if m:
                setattr(self, f"{m.group(1).lower()}_port", int(m.group(2)))
                if self.amqp_port and self.mqtt_port and (self.http_port or not self._http):
                    self._listening.set()
        self._listening.set()  # it ended

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def warnings(self) -> list[str]:
        return [line for line in self.lines if " WARNING " in line or " ERROR " in line]

    def kill(self) -> None:
        """kill -9: the power went, nothing of the process outlives it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM: a clean stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A management API request as guest: the HTTP status and the JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}", data=data, method=method,
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                     "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return int(response.status), json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return int(exc.code), None

    def amqp(self, vhost: str = "/") -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", self.amqp_port, vhost, connection_attempts=1)
        )


#: Bodies carry padding so that a few hundred messages fill a 64 KiB segment.
PADDING = b" " + b"." * 300


def body_of(mid: str) -> bytes:
    return mid.encode() + PADDING


def message_id(body: bytes) -> str:
    return body.split(b" ", 1)[0].decode()


class Ledger:
    """What one destination was sent, confirmed, acknowledged: the truth to check against."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.published: set[str] = set()
        self.confirmed: set[str] = set()
        self.acked: set[str] = set()  # a consumer sent basic.ack (it may not have arrived)
        self.redelivered_after_ack = 0  # acked ones that came back after a cut

    def check(self, got: list[tuple[str, bool]], republished: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """``got``: (message id, redelivered) of everything the queue holds now;
        ``republished``: ids published again after a cut, which may be there twice."""
        ids = [m for m, _ in got]
        twice = {m for m in ids if ids.count(m) > 1} - republished
        assert not twice, f"{self.name}: stored twice: {sorted(twice)[:5]}"
        unknown = set(ids) - self.published
        assert not unknown, f"{self.name}: messages never published: {sorted(unknown)[:5]}"
        lost = self.confirmed - self.acked - set(ids)
        assert not lost, (
            f"{self.name}: {len(lost)} confirmed messages lost of {len(self.confirmed)}: "
            f"{sorted(lost)[:10]}"
        )
        for mid, redelivered in got:
            if mid in self.acked:
                assert redelivered, f"{self.name}: acked {mid} came back, not as a redelivery"
                self.redelivered_after_ack += 1


# -- AMQP --------------------------------------------------------------------------------------


class Publisher(threading.Thread):
    """Publishes persistent messages with confirms until told to stop or the broker dies."""

    def __init__(
        self,
        broker: WarrenProcess,
        ledger: Ledger,
        exchange: str,
        routing_key: str,
        prefix: str,
        properties: Callable[[int], pika.BasicProperties] | None = None,
        ids: list[str] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.ledger = ledger
        self.exchange = exchange
        self.routing_key = routing_key
        self.prefix = prefix
        self.properties = properties or (lambda i: pika.BasicProperties(delivery_mode=2))
        self.ids = ids  # publish these (again) first
        self.stopping = threading.Event()
        self.current = ""  # the id being published

    def run(self) -> None:
        try:
            conn = self.broker.amqp()
            ch = conn.channel()
            ch.confirm_delivery()
            todo = list(self.ids or [])
            i = 0
            while not self.stopping.is_set():
                if todo:
                    mid = todo.pop(0)
                else:
                    mid = f"{self.prefix}-{i}"
                    i += 1
                with self.ledger.lock:
                    self.ledger.published.add(mid)
                self.current = mid
                ch.basic_publish(
                    self.exchange, self.routing_key, body_of(mid), self.properties(i)
                )
                with self.ledger.lock:
                    self.ledger.confirmed.add(mid)  # returned: the broker confirmed it
            conn.close()
        except GONE:
            pass


class Consumer(threading.Thread):
    """Consumes with manual acks (each one sent at once) until stopped or cut off."""

    def __init__(self, broker: WarrenProcess, ledger: Ledger, queue: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.ledger = ledger
        self.queue = queue
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            conn = self.broker.amqp()
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)

            def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
                with self.ledger.lock:
                    self.ledger.acked.add(message_id(body))
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume(self.queue, on_message)
            while not self.stopping.is_set():
                conn.process_data_events(time_limit=0.05)
            conn.close()
        except GONE:
            pass


def drain(broker: WarrenProcess, queue: str) -> list[tuple[str, bool, int]]:
    """Everything ready in ``queue``: (id, redelivered, priority), acknowledged."""
    conn = broker.amqp()
    try:
        ch = conn.channel()
        count = ch.queue_declare(queue, passive=True).method.message_count
        got = []
        last = 0
        for _ in range(count):
            method, props, body = ch.basic_get(queue)
            assert method is not None, f"{queue}: fewer messages than its count {count}"
            got.append((message_id(body), bool(method.redelivered), props.priority or 0))
            last = method.delivery_tag
        if last:
            ch.basic_ack(last, multiple=True)
        ch.queue_declare(queue, passive=True)  # a round trip: the acks were taken
        return got
    finally:
        conn.close()


class ClassicQueues:
    """Confirmed publishes to a classic durable queue, a priority queue, and a queue a
    consumer acknowledges from meanwhile; drained (and acked) at every check."""

    name = "classic"

    def __init__(self) -> None:
        self.queues = {"pc.classic": {}, "pc.priority": {"x-max-priority": 5}, "pc.work": {}}
        self.ledgers = {q: Ledger(q) for q in self.queues}
        self.threads: list[threading.Thread] = []
        self.round = 0

    def setup(self, broker: WarrenProcess) -> None:
        conn = broker.amqp()
        ch = conn.channel()
        for queue, arguments in self.queues.items():
            ch.queue_declare(queue, durable=True, arguments=arguments)
        conn.close()

    def start(self, broker: WarrenProcess, rng: random.Random) -> None:
        self.round += 1
        seed = rng.random()

        def priority(i: int) -> pika.BasicProperties:
            return pika.BasicProperties(delivery_mode=2, priority=int((seed * 7919 + i) % 6))

        for queue in self.queues:
            props = priority if queue == "pc.priority" else None
            self.threads.append(
                Publisher(broker, self.ledgers[queue], "", queue, f"r{self.round}", props)
            )
        self.threads.append(Consumer(broker, self.ledgers["pc.work"], "pc.work"))
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for t in self.threads:
            t.stopping.set()  # type: ignore[attr-defined]
        for t in self.threads:
            t.join(30)
        self.threads = []

    def verify(self, broker: WarrenProcess) -> None:
        for queue, ledger in self.ledgers.items():
            got = drain(broker, queue)
            ledger.check([(m, r) for m, r, _ in got])
            if queue == "pc.priority":
                priorities = [p for _, _, p in got]
                assert priorities == sorted(priorities, reverse=True), "priority order broken"
            with ledger.lock:
                ledger.acked.update(m for m, _, _ in got)

    def confirmed(self) -> int:
        return sum(len(ledger.confirmed) for ledger in self.ledgers.values())


# -- MQTT --------------------------------------------------------------------------------------


def mqtt_client(broker: WarrenProcess, client_id: str, **callbacks: Any) -> mqtt.Client:
    """A connected paho client with a persistent session (clean_session False),
    its network loop on a thread of its own; ``session_present`` set from CONNACK."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
    for name, fn in callbacks.items():
        setattr(client, name, fn)
    connect_mqtt(client, broker)
    return client


def connect_mqtt(client: mqtt.Client, broker: WarrenProcess) -> None:
    """(Re)connect ``client`` to ``broker``: paho then resends what was in flight."""
    connected = threading.Event()
    client.session_present = False  # type: ignore[attr-defined]

    def on_connect(c: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        client.session_present = flags.session_present  # type: ignore[attr-defined]
        connected.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", broker.mqtt_port, keepalive=60)
    client.loop_start()
    if not connected.wait(10):
        client.loop_stop()
        raise RuntimeError(f"MQTT client {client._client_id!r} did not connect")


class MQTTPublisher(threading.Thread):
    """Publishes at one QoS, one message at a time; confirmed = PUBACK (QoS 1) or
    PUBCOMP (QoS 2) received. The same client object in every round, as a
    well-behaved client keeps its session state: reconnected, it resends the
    PUBLISH or PUBREL in flight when the power went, which the previous round
    left in ``pending``."""

    def __init__(
        self,
        broker: WarrenProcess,
        client: mqtt.Client,
        ledger: Ledger,
        qos: int,
        topic: str,
        prefix: str,
        pending: list[tuple[Any, str]],
    ) -> None:
        super().__init__(daemon=True)
        self.broker, self.client, self.ledger = broker, client, ledger
        self.qos, self.topic, self.prefix, self.pending = qos, topic, prefix, pending
        self.stopping = threading.Event()

    def _wait(self, info: Any, mid: str) -> bool:
        """Wait for the message's PUBACK/PUBCOMP; False when told to stop first."""
        while not info.is_published():
            if self.stopping.is_set():
                return False
            info.wait_for_publish(0.1)
        with self.ledger.lock:
            self.ledger.confirmed.add(mid)
        return True

    def run(self) -> None:
        client = self.client
        try:
            connect_mqtt(client, self.broker)
            while self.pending:
                info, mid = self.pending[0]
                if not self._wait(info, mid):
                    return
                self.pending.pop(0)
            i = 0
            while not self.stopping.is_set() and client.is_connected():
                mid = f"{self.prefix}-{i}"
                i += 1
                with self.ledger.lock:
                    self.ledger.published.add(mid)
                info = client.publish(self.topic, body_of(mid), qos=self.qos)
                self.pending.append((info, mid))
                if not self._wait(info, mid):
                    return
                self.pending.pop()
        except (OSError, RuntimeError, ValueError):
            pass
        finally:
            client.loop_stop()


class MQTTSessions:
    """QoS 1 and QoS 2 publishers, each to a persistent subscriber of that QoS.
    Every confirmed message reaches its subscriber, before or after the cut
    (duplicates allowed: an acknowledgement lost to the cut means a resend)."""

    name = "mqtt"

    def __init__(self) -> None:
        self.ledgers = {qos: Ledger(f"mqtt-qos{qos}") for qos in (1, 2)}
        self.received: dict[int, set[str]] = {1: set(), 2: set()}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.subscribers: list[mqtt.Client] = []
        self.publishers: list[MQTTPublisher] = []
        self.pub_clients = {
            qos: mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pc-pub-{qos}", clean_session=False)
            for qos in (1, 2)
        }
        self.pending: dict[int, list[tuple[Any, str]]] = {1: [], 2: []}
        self.sub_clients: dict[int, mqtt.Client] = {}
        self.subscribed = False
        self.round = 0

    def _on_message(self, qos: int) -> Callable[..., None]:
        def on_message(client: Any, userdata: Any, msg: Any) -> None:
            with self.changed:
                self.received[qos].add(message_id(msg.payload))
                self.changed.notify_all()

        return on_message

    def _connect_subscribers(self, broker: WarrenProcess) -> None:
        # The same client objects in every round: a QoS 2 message the client holds
        # until the broker's PUBREL is delivered once the broker resends it.
        for qos in (1, 2):
            client = self.sub_clients.get(qos)
            if client is None:
                client = self.sub_clients[qos] = mqtt_client(
                    broker, f"pc-sub-{qos}", on_message=self._on_message(qos)
                )
            else:
                connect_mqtt(client, broker)
            if self.subscribed:
                assert client.session_present, f"subscriber {qos}: its session was lost"
            else:
                info = threading.Event()
                client.on_subscribe = lambda *a, e=info: e.set()
                client.subscribe(f"pc/q{qos}/#", qos=qos)
                assert info.wait(10), "no SUBACK"
            self.subscribers.append(client)
        self.subscribed = True

    def setup(self, broker: WarrenProcess) -> None:
        if not self.subscribers:
            self._connect_subscribers(broker)

    def start(self, broker: WarrenProcess, rng: random.Random) -> None:
        self.round += 1
        for qos in (1, 2):
            publisher = MQTTPublisher(
                broker, self.pub_clients[qos], self.ledgers[qos], qos, f"pc/q{qos}/x",
                f"r{self.round}q{qos}", self.pending[qos],
            )
            self.publishers.append(publisher)
            publisher.start()

    def stop(self) -> None:
        for p in self.publishers:
            p.stopping.set()
        for p in self.publishers:
            p.join(30)
        self.publishers = []
        for client in self.subscribers:
            client.loop_stop()
        self.subscribers = []

    def verify(self, broker: WarrenProcess) -> None:
        self._connect_subscribers(broker)
        for qos, ledger in self.ledgers.items():
            with self.changed:
                done = self.changed.wait_for(lambda q=qos, lg=ledger: lg.confirmed <= self.received[q], 30)
                missing = ledger.confirmed - self.received[qos]
            assert done, (
                f"{ledger.name}: {len(missing)} confirmed messages never delivered of "
                f"{len(ledger.confirmed)}: {sorted(missing)[:10]}"
            )
            unknown = self.received[qos] - ledger.published
            assert not unknown, f"{ledger.name}: never published: {sorted(unknown)[:5]}"

    def confirmed(self) -> int:
        return sum(len(ledger.confirmed) for ledger in self.ledgers.values())


# -- streams and deduplication -----------------------------------------------------------------


def read_stream(broker: WarrenProcess, queue: str) -> list[tuple[int, str]]:
    """(offset, id) of every message in the stream, read from its first offset."""
    conn = broker.amqp()
    try:
        ch = conn.channel()
        count = ch.queue_declare(queue, passive=True).method.message_count
        ch.basic_qos(prefetch_count=200)
        got: list[tuple[int, str]] = []

        def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
            got.append(((props.headers or {})["x-stream-offset"], message_id(body)))
            c.basic_ack(method.delivery_tag)

        ch.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
        deadline = 30.0
        while len(got) < count and deadline > 0:
            conn.process_data_events(time_limit=0.5)
            deadline -= 0.5
        assert len(got) == count, f"{queue}: read {len(got)} of {count} messages"
        return got
    finally:
        conn.close()


class Stream:
    """Confirmed publishes to a stream queue, read back by offset from the first."""

    name = "stream"

    def __init__(self) -> None:
        self.queue = "pc.stream"
        self.ledger = Ledger(self.queue)
        self.threads: list[Publisher] = []
        self.round = 0

    def setup(self, broker: WarrenProcess) -> None:
        conn = broker.amqp()
        conn.channel().queue_declare(self.queue, durable=True, arguments={"x-queue-type": "stream"})
        conn.close()

    def start(self, broker: WarrenProcess, rng: random.Random) -> None:
        self.round += 1
        self.threads = [Publisher(broker, self.ledger, "", self.queue, f"r{self.round}")]
        self.threads[0].start()

    def stop(self) -> None:
        for t in self.threads:
            t.stopping.set()
            t.join(30)
        self.threads = []

    def verify(self, broker: WarrenProcess) -> None:
        got = read_stream(broker, self.queue)
        offsets = [o for o, _ in got]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if got else True, (
            f"{self.queue}: offsets not consecutive: {offsets[:20]}"
        )
        self.ledger.check([(m, False) for _, m in got])

    def confirmed(self) -> int:
        return len(self.ledger.confirmed)


class Deduplication:
    """Confirmed publishes through a deduplicating exchange and to a deduplicating
    queue, each message with its id as the deduplication key. After a cut the
    publishers first publish again, under the same keys, what they had published
    without a confirm: none of it, and nothing confirmed, may be missing (the
    caches are in memory: a restart forgets them)."""

    name = "dedup"

    def __init__(self) -> None:
        self.targets = {"pc.dedup.x": ("pc.dedup.x", ""), "pc.dedup.q": ("", "pc.dedup.q")}
        self.ledgers = {q: Ledger(q) for q in self.targets}
        self.republished: dict[str, set[str]] = {q: set() for q in self.targets}
        self.threads: list[Publisher] = []
        self.round = 0

    def setup(self, broker: WarrenProcess) -> None:
        conn = broker.amqp()
        ch = conn.channel()
        ch.exchange_declare("pc.dedup.x", "fanout", durable=True, arguments={"x-message-deduplication": True})
        ch.queue_declare("pc.dedup.x", durable=True)
        ch.queue_bind("pc.dedup.x", "pc.dedup.x")
        ch.queue_declare("pc.dedup.q", durable=True, arguments={"x-message-deduplication": True})
        conn.close()

    def start(self, broker: WarrenProcess, rng: random.Random) -> None:
        self.round += 1
        for queue, (exchange, routing_key) in self.targets.items():
            ledger = self.ledgers[queue]
            with ledger.lock:
                again = sorted(ledger.published - ledger.confirmed)
            self.republished[queue].update(again)
            publisher = Publisher(broker, ledger, exchange, routing_key, f"r{self.round}", ids=again)

            def properties(i: int, p: Publisher = publisher) -> pika.BasicProperties:
                return pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": p.current})

            publisher.properties = properties
            self.threads.append(publisher)
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for t in self.threads:
            t.stopping.set()
        for t in self.threads:
            t.join(30)
        self.threads = []

    def verify(self, broker: WarrenProcess) -> None:
        for queue, ledger in self.ledgers.items():
            got = drain(broker, queue)
            # A message stored but not confirmed when the power went is published
            # again after the restart, whose caches are empty: it may be there twice
            # (at least once, as any publisher that republishes what had no confirm).
            ledger.check([(m, r) for m, r, _ in got], self.republished[queue])
            with ledger.lock:
                ledger.acked.update(m for m, _, _ in got)

    def confirmed(self) -> int:
        return sum(len(ledger.confirmed) for ledger in self.ledgers.values())
