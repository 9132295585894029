"""A tiny Celery application. The broker URL comes from the environment in
production; tests point the app at Warren instead (see test_tasks_celery.py)."""

from __future__ import annotations

import os

from celery import Celery

app = Celery(
    "shop",
    broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@localhost:5672//"),
    backend="rpc://",
)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def checkout(prices: list[float], discount: float = 0.0) -> float:
    if not 0 <= discount < 1:
        raise ValueError(f"bad discount {discount}")
    return round(sum(prices) * (1 - discount), 2)
