"""A real Celery app and worker using Warren as broker and the rpc:// result backend.

The worker runs in a thread of the test process (solo pool), consuming from the
broker over TCP exactly as a separate worker process would.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import kombu.pools
import pytest
from celery import Celery, chain, group
from celery.contrib.testing.worker import start_worker
from celery.exceptions import MaxRetriesExceededError


class Tasks:
    """The app and its tasks, built per test so each test has a fresh broker."""

    def __init__(self, url: str) -> None:
        app = Celery("warren_celery_test", broker=url, backend="rpc://", set_as_current=False)
        app.conf.update(
            task_serializer="json",
            result_serializer="json",
            accept_content=["json"],
            broker_connection_retry_on_startup=False,
            broker_connection_max_retries=1,
            worker_hijack_root_logger=False,
            worker_prefetch_multiplier=4,
            result_expires=60,
            # AMQP heartbeats every 2 s: the worker's event loop wakes for them, so it
            # notices the shutdown request promptly (and Warren's heartbeats are used).
            broker_heartbeat=2,
        )
        self.app = app
        self.attempts: Counter[str] = Counter()
        attempts = self.attempts

        @app.task(shared=False, name="t.add")
        def add(x: int, y: int) -> int:
            return x + y

        @app.task(shared=False, name="t.mul")
        def mul(x: int, y: int) -> int:
            return x * y

        @app.task(shared=False, name="t.xsum")
        def xsum(numbers: list[int]) -> int:
            return sum(numbers)

        @app.task(shared=False, name="t.fail")
        def fail(text: str) -> None:
            raise ValueError(text)

        @app.task(shared=False, name="t.flaky", bind=True, max_retries=5)
        def flaky(self: Any, key: str, succeed_on: int) -> dict[str, Any]:
            attempts[key] += 1
            if attempts[key] < succeed_on:
                raise self.retry(countdown=0.1)
            return {"attempts": attempts[key], "retries": self.request.retries}

        @app.task(shared=False, name="t.hopeless", bind=True, max_retries=2)
        def hopeless(self: Any, key: str) -> None:
            attempts[key] += 1
            raise self.retry(countdown=0.05)

        @app.task(shared=False, name="t.stamp")
        def stamp() -> float:
            return time.time()

        self.add, self.mul, self.xsum, self.fail = add, mul, xsum, fail
        self.flaky, self.hopeless, self.stamp = flaky, hopeless, stamp


@contextmanager
def running_worker(url: str, **conf: Any) -> Iterator[Tasks]:
    t = Tasks(url)
    t.app.conf.update(conf)
    # Celery's embedded worker sets up logging for the whole process: the root
    # logger's level goes to ERROR, so later tests in this process would see no
    # warnings in caplog. Put the root logger back as it was.
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    try:
        with start_worker(
            t.app, pool="solo", concurrency=1, perform_ping_check=False, shutdown_timeout=15
        ):
            yield t
    finally:
        # Close the client side's connections so the broker's shutdown does not wait
        # for connections nobody reads any more.
        result_consumer = t.app.backend.result_consumer
        if result_consumer._connection is not None:  # started by the first result.get
            result_consumer.stop()
        t.app.pool.force_close_all()
        kombu.pools.reset()  # the producer pools are global, keyed by broker URL
        t.app.close()
        root.setLevel(saved_level)
        root.handlers[:] = saved_handlers


@pytest.fixture
def tasks(broker: Any) -> Iterator[Tasks]:
    with running_worker(broker.url) as t:
        yield t


def test_add_returns_result(tasks: Tasks) -> None:
    result = tasks.add.delay(2, 3)
    assert result.get(timeout=20) == 5
    assert result.successful()
    assert result.state == "SUCCESS"
    # Several results in flight on the same reply queue, collected out of order.
    results = [tasks.add.delay(i, i) for i in range(10)]
    assert [r.get(timeout=20) for r in reversed(results)] == [2 * i for i in reversed(range(10))]


def test_chain_and_group(tasks: Tasks) -> None:
    # ((2 + 2) * 4) + 1
    workflow = chain(tasks.add.s(2, 2), tasks.mul.s(4), tasks.add.s(1))
    assert workflow.apply_async().get(timeout=20) == 17

    g = group(tasks.add.s(i, 10) for i in range(8)).apply_async()
    assert g.get(timeout=20) == [i + 10 for i in range(8)]
    assert g.successful()

    # A group's results feeding a task by hand.
    assert tasks.xsum.delay(g.get(timeout=20)).get(timeout=20) == sum(range(8)) + 80


def test_task_exception_is_raised_by_get(tasks: Tasks) -> None:
    result = tasks.fail.delay("kaboom")
    with pytest.raises(ValueError, match="kaboom"):
        result.get(timeout=20)
    assert result.failed()
    assert result.state == "FAILURE"
    assert isinstance(result.result, ValueError)
    # propagate=False hands the exception back instead of raising it.
    again = tasks.fail.delay("quiet")
    value = again.get(timeout=20, propagate=False)
    assert isinstance(value, ValueError) and "quiet" in str(value)


def test_retry_until_success(tasks: Tasks) -> None:
    result = tasks.flaky.delay("retry-ok", 3)
    assert result.get(timeout=20) == {"attempts": 3, "retries": 2}
    assert tasks.attempts["retry-ok"] == 3


def test_retry_exhausted_raises(tasks: Tasks) -> None:
    result = tasks.hopeless.delay("retry-never")
    with pytest.raises(MaxRetriesExceededError):
        result.get(timeout=20)
    assert tasks.attempts["retry-never"] == 3  # the first run plus max_retries=2


def test_countdown_and_eta(tasks: Tasks) -> None:
    sent = time.time()
    delayed = tasks.stamp.apply_async(countdown=1)
    # An ETA task is held by the worker (unacked) while other tasks keep flowing.
    assert tasks.add.delay(1, 1).get(timeout=20) == 2
    ran_at = delayed.get(timeout=20)
    assert ran_at - sent >= 0.9

    eta = time.time() + 1
    result = tasks.stamp.apply_async(eta=datetime.fromtimestamp(eta, tz=UTC))
    assert result.get(timeout=20) >= eta - 0.1


def test_remote_control_ping(tasks: Tasks) -> None:
    # Broadcast over the celery.pidbox fanout exchange; replies come back through
    # the reply.celery.pidbox direct exchange.
    replies = tasks.app.control.ping(timeout=5, limit=1)
    assert len(replies) == 1
    ((hostname, reply),) = replies[0].items()
    assert hostname.startswith("gen")  # start_worker's generated node name
    assert reply == {"ok": "pong"}


# kombu picks basic.qos(global=true) only for brokers announcing RabbitMQ >= 3.3;
# with global=false a prefetch-1 worker would stall behind a held ETA task.
def test_eta_task_does_not_block_worker_with_prefetch_one(broker: Any) -> None:
    with running_worker(broker.url, worker_prefetch_multiplier=1) as t:
        start = time.time()
        delayed = t.stamp.apply_async(countdown=2)
        assert t.add.delay(1, 1).get(timeout=20) == 2
        add_done = time.time()
        eta_ran = delayed.get(timeout=20)
        assert eta_ran - start >= 1.9
        assert add_done < eta_ran  # the plain task did not wait for the ETA task
