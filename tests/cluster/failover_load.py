"""Publishers with confirms and consumers with acks running against a cluster
while it fails over (tests/cluster/test_failover.py and bench/cluster.py).

Each client is a thread with its own pika BlockingConnection, as an
application would run it: a publisher publishes numbered persistent messages
and waits for each confirm; a consumer acks every delivery. When a connection
breaks, the client connects again to the next node's port in turn (any node
reaches the leader) after a short backoff, and a publisher publishes the
message it was not sure of again: at-least-once, as RabbitMQ's reliability
guide asks of applications. What a publisher saw confirmed must be delivered
at least once afterwards; what it never saw confirmed may or may not be.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pika
import pika.exceptions

PERSISTENT = pika.BasicProperties(delivery_mode=2)

#: Between two connection attempts of one client (a client's backoff, not a wait
#: for anything in the test).
BACKOFF = 0.1


@dataclass
class LoadStats:
    """What the clients saw, under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Message body -> monotonic time its confirm arrived.
    confirmed: dict[bytes, float] = field(default_factory=dict)
    #: Every body a publisher sent at least once.
    sent: set[bytes] = field(default_factory=set)
    #: Publishes whose connection broke before the confirm (then published again).
    in_doubt: int = 0
    delivered: Counter[bytes] = field(default_factory=Counter)
    redelivered_flags: int = 0
    #: Client connections made after the first one of each client.
    reconnects: int = 0
    #: Monotonic times of failed connects and broken connections.
    errors: list[float] = field(default_factory=list)

    def confirmed_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.confirmed.values() if start <= t < end)

    def missing(self) -> set[bytes]:
        """Confirmed but never delivered."""
        with self.lock:
            return {body for body in self.confirmed if body not in self.delivered}


class FailoverLoad:
    """``publishers`` publishers and ``consumers`` consumers on the durable queue
    ``queue``, connecting through ``addresses`` (every node's AMQP host and port).
    ``heartbeat``: the clients' AMQP heartbeat, how soon they notice a peer that
    went silent (a partition sends no reset)."""

    def __init__(
        self,
        addresses: list[tuple[str, int]],
        queue: str = "load",
        publishers: int = 2,
        consumers: int = 2,
        prefetch: int = 50,
        heartbeat: int = 10,
    ) -> None:
        self.addresses = addresses
        self.heartbeat = heartbeat
        self.queue = queue
        self.prefetch = prefetch
        self.stats = LoadStats()
        self._publishing = threading.Event()
        self._consuming = threading.Event()
        self._publishers = [
            threading.Thread(target=self._publisher, args=(i,), daemon=True)
            for i in range(publishers)
        ]
        self._threads = self._publishers + [
            threading.Thread(target=self._consumer, args=(i,), daemon=True)
            for i in range(consumers)
        ]
        self.failures: list[BaseException] = []
        self._progress = threading.Condition()

    def start(self) -> FailoverLoad:
        self._publishing.set()
        self._consuming.set()
        for thread in self._threads:
            thread.start()
        return self

    def stop_publishing(self) -> None:
        """Stop the publishers and wait for them: a publish under way when this is
        called may still be confirmed, and must be counted before the caller
        checks that every confirmed message was delivered."""
        self._publishing.clear()
        for thread in self._publishers:
            thread.join(30)
            if thread.is_alive():
                raise AssertionError(f"a publisher did not stop: {self.summary()}")

    def stop(self) -> None:
        self._publishing.clear()
        self._consuming.clear()
        for thread in self._threads:
            thread.join(30)
        if self.failures:
            raise self.failures[0]

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Block until ``predicate()`` holds, checked whenever the clients progress."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.failures:
                raise self.failures[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.summary()}")
            with self._progress:
                self._progress.wait(0.2)

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def summary(self) -> dict[str, int]:
        s = self.stats
        with s.lock:
            return {
                "sent": len(s.sent),
                "confirmed": len(s.confirmed),
                "in_doubt": s.in_doubt,
                "delivered": len(s.delivered),
                "duplicates": sum(n - 1 for n in s.delivered.values()),
                "redelivered_flags": s.redelivered_flags,
                "reconnects": s.reconnects,
            }

    # -- clients ----------------------------------------------------------------------
    def _connect(
        self, turn: int, running: threading.Event
    ) -> tuple[pika.BlockingConnection | None, int]:
        """Connect to the next address that accepts, starting at ``turn``; None
        once ``running`` is cleared."""
        while running.is_set():
            host, port = self.addresses[turn % len(self.addresses)]
            turn += 1
            try:
                params = pika.ConnectionParameters(
                    host,
                    port,
                    connection_attempts=1,
                    socket_timeout=2,
                    blocked_connection_timeout=30,
                    heartbeat=self.heartbeat,
                )
                conn = pika.BlockingConnection(params)
                conn.channel().queue_declare(self.queue, durable=True)
                return conn, turn
            except (pika.exceptions.AMQPError, OSError):
                with self.stats.lock:
                    self.stats.errors.append(time.monotonic())
                time.sleep(BACKOFF)
        return None, turn

    def _publisher(self, index: int) -> None:
        try:
            n = 0
            turn = index
            first = True
            while self._publishing.is_set():
                conn, turn = self._connect(turn, self._publishing)
                if conn is None:
                    break
                if not first:
                    with self.stats.lock:
                        self.stats.reconnects += 1
                first = False
                try:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while self._publishing.is_set():
                        body = b"p%d-%d" % (index, n)
                        with self.stats.lock:
                            self.stats.sent.add(body)
                        ch.basic_publish("", self.queue, body, PERSISTENT)
                        with self.stats.lock:
                            self.stats.confirmed[body] = time.monotonic()
                        n += 1
                        if n % 50 == 0:
                            self._notify()
                    conn.close()
                except (pika.exceptions.AMQPError, OSError):
                    with self.stats.lock:
                        self.stats.in_doubt += 1  # body n goes out again
                        self.stats.errors.append(time.monotonic())
                    _close(conn)
        except BaseException as exc:  # reported by stop()
            self.failures.append(exc)

    def _consumer(self, index: int) -> None:
        try:
            turn = len(self.addresses) - 1 - index
            first = True
            while self._consuming.is_set():
                conn, turn = self._connect(turn, self._consuming)
                if conn is None:
                    break
                if not first:
                    with self.stats.lock:
                        self.stats.reconnects += 1
                first = False
                try:
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=self.prefetch)

                    def on_message(
                        ch: pika.adapters.blocking_connection.BlockingChannel,
                        method: pika.spec.Basic.Deliver,
                        _props: pika.BasicProperties,
                        body: bytes,
                    ) -> None:
                        with self.stats.lock:
                            self.stats.delivered[body] += 1
                            self.stats.redelivered_flags += bool(method.redelivered)
                        ch.basic_ack(method.delivery_tag)

                    ch.basic_consume(self.queue, on_message)
                    while self._consuming.is_set():
                        conn.process_data_events(time_limit=0.1)
                        self._notify()
                    conn.close()
                except (pika.exceptions.AMQPError, OSError):
                    with self.stats.lock:
                        self.stats.errors.append(time.monotonic())
                    _close(conn)
        except BaseException as exc:
            self.failures.append(exc)


def _close(conn: pika.BlockingConnection) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        if conn.is_open:
            conn.close()
