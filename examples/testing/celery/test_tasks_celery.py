"""Testing a Celery application against Warren: a real worker (in a thread,
solo pool) consumes from the broker over AMQP, results come back by rpc://.

One worker serves the whole session (as celery.contrib.pytest's
celery_session_worker does), on a vhost of its own on the session's Warren:
Celery's app keeps its connections and result consumer for its lifetime, so
the app is pointed at the broker once. No Docker, no RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kombu.pools
import pytest
import tasks
from celery import chain
from celery.contrib.testing.worker import start_worker


@pytest.fixture(scope="session")
def worker(warren_broker: Any) -> Iterator[None]:
    app = tasks.app
    app.conf.update(
        broker_url=warren_broker.add_vhost("celery"),
        broker_connection_retry_on_startup=False,
        broker_heartbeat=2,  # the worker notices the end of the test promptly
        worker_hijack_root_logger=False,
    )
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=15):
            yield
    finally:
        # Close the test's own connections (result consumer, producer pool) too.
        if app.backend.result_consumer._connection is not None:
            app.backend.result_consumer.stop()
        app.pool.force_close_all()
        kombu.pools.reset()
        app.close()
        warren_broker.delete_vhost("celery")


def test_add(worker: None) -> None:
    assert tasks.add.delay(2, 3).get(timeout=20) == 5


def test_chain_and_errors(worker: None) -> None:
    assert chain(tasks.add.s(1, 2), tasks.add.s(10)).apply_async().get(timeout=20) == 13
    assert tasks.checkout.delay([10.0, 5.5], discount=0.1).get(timeout=20) == 13.95
    with pytest.raises(ValueError, match="bad discount"):
        tasks.checkout.delay([1.0], discount=2).get(timeout=20)
