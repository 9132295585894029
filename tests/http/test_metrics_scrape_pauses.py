"""A scrape of 10,000 queues does not hold the broker's clients up: the
snapshot is read in slices, the text written in chunks of at most CHUNK
queues' samples and each sent as it is made, the loop running other work in
between (bench/metrics_scrape.py measures it end to end: docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import gc
import http.client
import time

from conftest import BrokerThread
from metricshelp import prometheus_port

from warren import metrics

QUEUES = 10_000


def _declare(broker: BrokerThread, n: int) -> None:
    def declare_many() -> None:
        v = broker.broker.vhosts["/"]
        for i in range(n):
            v.declare_queue(f"many-{i:05d}", durable=False)

    broker.call(declare_many)


def test_chunks_hold_at_most_chunk_queues_samples(broker: BrokerThread) -> None:
    """Every chunk of the per-object and detailed text carries at most CHUNK
    queues' samples, and the HTTP answer comes in chunks, each sent as it is
    made."""
    from warren.metrics.render import CHUNK

    n = 2 * CHUNK + 7
    _declare(broker, n)
    snap = broker.run(metrics.snapshot(broker.broker))
    for chunks in (
        broker.call(lambda: list(metrics.render_chunks(snap, True))),
        broker.call(lambda: list(metrics.detailed_chunks(snap, {"queue_metrics"}, None))),
    ):
        sizes = [c.count('queue="many-') for c in chunks]
        assert max(sizes) <= CHUNK and sum(sizes) >= 16 * n, max(sizes)
    conn = http.client.HTTPConnection("127.0.0.1", prometheus_port(broker), timeout=30)
    conn.request("GET", "/metrics/detailed?family=queue_coarse_metrics")
    resp = conn.getresponse()
    assert resp.getheader("Transfer-Encoding") == "chunked"
    text = resp.read().decode()
    conn.close()
    assert text.count("rabbitmq_detailed_queue_messages_ready{") == n
    assert text.endswith("\n") and "rabbitmq_identity_info{" in text


def test_a_scrape_gives_the_loop_back_while_it_is_made(broker: BrokerThread) -> None:
    """A task on the broker's loop keeps running during a scrape of 10,000
    queues: the longest stretch of loop-thread CPU between two of its turns is
    a small part of the loop's CPU during the scrape (CPU time: another process
    taking the core away is not a pause). Made in one go, the text would be
    most of it."""
    _declare(broker, QUEUES)
    gaps: list[tuple[float, float]] = []  # (when, loop-thread CPU since the last turn)
    running = [True]

    async def ticker() -> None:
        last = time.thread_time()
        while running[0]:
            await asyncio.sleep(0)
            now = time.thread_time()
            gaps.append((time.monotonic(), now - last))
            last = now

    gc.disable()  # a full collection pauses everything, slices or not
    try:
        ticking = asyncio.run_coroutine_threadsafe(ticker(), broker.loop)
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", prometheus_port(broker), timeout=60)
        conn.request("GET", "/metrics/per-object")
        text = conn.getresponse().read().decode()
        conn.close()
        elapsed = time.monotonic() - started
        running[0] = False
        ticking.result(10)
    finally:
        gc.enable()
    assert text.count('queue="many-') >= QUEUES
    during = [cpu for when, cpu in gaps if started <= when <= started + elapsed]
    assert max(during) < sum(during) * 0.25, (max(during), sum(during))
