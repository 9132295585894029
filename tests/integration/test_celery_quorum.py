"""A real Celery worker set up for quorum queues, as RabbitMQ 4 users run it:
``task_default_queue_type = "quorum"`` and ``worker_detect_quorum_queues``.

The worker (solo pool, in a thread of the test process, as tests/integration/test_celery.py
runs it) declares its task queue as a quorum queue, turns its global prefetch
off (quorum queues refuse it), and sends retries with a countdown through
kombu's native delayed delivery: 28 levels of quorum queues with TTLs,
``x-dead-letter-strategy: at-least-once`` and ``x-overflow: reject-publish``,
chained by dead-lettering. A task that keeps rejecting its message is a
poison message: dead-lettered after the queue's delivery limit.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kombu
import kombu.pools
import pika
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Reject
from conftest import BrokerThread
from pikahelp import wait_until

#: The poison queue's limit (RabbitMQ's default is 20: a smaller one keeps it short).
LIMIT = 3


class QuorumTasks:
    def __init__(self, url: str) -> None:
        app = Celery("warren_celery_quorum", broker=url, backend="rpc://", set_as_current=False)
        app.conf.update(
            task_serializer="json",
            result_serializer="json",
            accept_content=["json"],
            broker_connection_retry_on_startup=False,
            broker_connection_max_retries=1,
            worker_hijack_root_logger=False,
            broker_heartbeat=2,
            task_default_queue_type="quorum",
            worker_detect_quorum_queues=True,
            # Native delayed delivery needs topic (or fanout) exchanges.
            task_default_exchange_type="topic",
            task_queues=[
                kombu.Queue(
                    "celery",
                    kombu.Exchange("celery", type="topic"),
                    routing_key="celery",
                    queue_arguments={"x-queue-type": "quorum"},
                ),
                kombu.Queue(
                    "poison",
                    kombu.Exchange("celery", type="topic"),
                    routing_key="poison",
                    queue_arguments={
                        "x-queue-type": "quorum",
                        "x-delivery-limit": LIMIT,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": "poison.dead",
                    },
                ),
            ],
            task_routes={"q.poison": {"queue": "poison", "routing_key": "poison"}},
        )
        self.app = app
        self.attempts: Counter[str] = Counter()
        attempts = self.attempts

        @app.task(shared=False, name="q.add")
        def add(x: int, y: int) -> int:
            return x + y

        @app.task(shared=False, name="q.flaky", bind=True, max_retries=3)
        def flaky(self: Any, key: str, succeed_on: int) -> dict[str, Any]:
            attempts[key] += 1
            if attempts[key] < succeed_on:
                raise self.retry(countdown=1)
            return {"attempts": attempts[key], "retries": self.request.retries}

        @app.task(shared=False, name="q.poison", bind=True, acks_late=True)
        def poison(self: Any, key: str) -> None:
            attempts[key] += 1
            raise Reject("cannot handle it", requeue=True)

        self.add, self.flaky, self.poison = add, flaky, poison


@contextmanager
def quorum_worker(url: str) -> Iterator[QuorumTasks]:
    t = QuorumTasks(url)
    # Celery's embedded worker sets the root logger up for the whole process: put
    # it back afterwards, as tests/integration/test_celery.py does.
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    try:
        with start_worker(
            t.app,
            pool="solo",
            concurrency=1,
            perform_ping_check=False,
            shutdown_timeout=15,
            queues=["celery", "poison"],
        ):
            yield t
    finally:
        result_consumer = t.app.backend.result_consumer
        if result_consumer._connection is not None:
            result_consumer.stop()
        t.app.pool.force_close_all()
        kombu.pools.reset()
        t.app.close()
        root.setLevel(saved_level)
        root.handlers[:] = saved_handlers


@pytest.fixture
def quorum_tasks(broker: BrokerThread) -> Iterator[QuorumTasks]:
    with quorum_worker(broker.url) as t:
        yield t


def test_worker_runs_tasks_from_a_quorum_queue(
    broker: BrokerThread, quorum_tasks: QuorumTasks
) -> None:
    results = [quorum_tasks.add.delay(i, i) for i in range(10)]
    assert [r.get(timeout=20) for r in results] == [2 * i for i in range(10)]
    vhost = broker.broker.vhosts["/"]
    assert vhost.queues["celery"].queue_type == "quorum"
    # Native delayed delivery's levels are quorum queues with at-least-once
    # dead-lettering: declared as kombu declares them, nothing refused.
    level = vhost.queues["celery_delayed_0"]
    assert level.queue_type == "quorum"
    assert level.dead_letter_strategy == "at-least-once"


def test_retry_with_countdown_goes_through_native_delayed_delivery(
    broker: BrokerThread, quorum_tasks: QuorumTasks
) -> None:
    result = quorum_tasks.flaky.delay("retry-ok", 3)
    assert result.get(timeout=30) == {"attempts": 3, "retries": 2}
    # Both retries (countdown 1 s: bit 0) waited in level 0's queue, whose TTL
    # dead-lettered them, at least once, to the delivery exchange and the task queue.
    level = broker.broker.vhosts["/"].queues["celery_delayed_0"]
    assert level.stats.publish == 2
    assert level.message_count == 0


def test_poison_task_is_dead_lettered_after_the_delivery_limit(
    broker: BrokerThread, quorum_tasks: QuorumTasks
) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    ch = conn.channel()
    ch.queue_declare("poison.dead", durable=True)
    quorum_tasks.poison.delay("bad")
    dead: list[Any] = []

    def landed() -> bool:
        method, props, body = ch.basic_get("poison.dead", auto_ack=True)
        if method is not None:
            dead.append((props, body))
        return bool(dead)

    wait_until(conn, landed, timeout=30)
    props, _body = dead[0]
    assert props.headers["id"]  # Celery's task message, headers and all
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert props.headers["x-death"][0]["queue"] == "poison"
    assert quorum_tasks.attempts["bad"] == LIMIT + 1  # the first run and LIMIT returns
    assert ch.queue_declare("poison", passive=True).method.message_count == 0
    conn.close()
