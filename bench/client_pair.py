"""The process harness of the stream protocol load generators that share no code
with Warren (stream_rstream.py, stream_rbfly.py): a consumer and a producer, each
an asyncio coroutine in a process of its own (multiprocessing, 'spawn'), their
results collected over a queue. Nothing here imports Warren or a client library.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Coroutine
from typing import Any

Main = Callable[..., Coroutine[Any, Any, dict[str, Any]]]


def _run(out: Any, role: str, main: Main, *args: Any) -> None:
    out.put((role, asyncio.run(main(*args))))


def run_pair(
    name: str,
    consume: Main,
    consume_args: tuple[Any, ...],
    produce: Main,
    produce_args: tuple[Any, ...],
    seconds: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``consume(*consume_args, ready)`` started first, ``produce(*produce_args)`` once
    it has set ``ready``; both are module-level coroutine functions (spawn imports
    them). Returns their results, the producer's first."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Event()
    consumer = ctx.Process(target=_run, args=(out, "con", consume, *consume_args, ready))
    consumer.start()
    if not ready.wait(30):
        consumer.terminate()
        raise RuntimeError(f"the {name} consumer did not start within 30 s")
    producer = ctx.Process(target=_run, args=(out, "pub", produce, *produce_args))
    producer.start()
    results = dict(out.get(timeout=seconds + 90) for _ in range(2))
    for p in (producer, consumer):
        p.join(30)
        if p.is_alive():
            p.terminate()
    return results["pub"], results["con"]


def rates(pub: dict[str, Any], con: dict[str, Any], seconds: float, **extra: Any) -> dict[str, Any]:
    """A run's result: msg/s both ways, the confirmed count, ``extra``, CPU shares."""
    return {
        "publish_rate": round(pub["sent"] / seconds, 1),
        "consume_rate": round(con["received"] / seconds, 1),
        "confirmed": pub["confirmed"],
        **extra,
        "client_cpu": {"producer": round(pub["cpu"], 3), "consumer": round(con["cpu"], 3)},
    }
