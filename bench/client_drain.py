"""A real client library drains a backlog: msg/s a pika, aio-pika or kombu consumer gets.

    .venv/bin/python bench/client_drain.py --client pika --port 5672 --count 200000

The queue (``--queue``) must already hold ``--count`` messages (bench/compare.py
``--only backlog-clients`` fills it with bench/raw_amqp.py and runs this once
per client and broker). The consumer is what an application writes with each
library: a callback (pika's ``BlockingConnection`` + ``basic_consume``,
aio-pika's ``queue.consume``, kombu's ``Consumer`` + ``drain_events``) that
acknowledges every message singly, prefetch ``--prefetch``. Prints one JSON
line: messages, seconds from the consume to the last ack, msg/s and the
client's own CPU share (1.0 = one core busy: the client is the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Any


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drain_pika(port: int, queue: str, count: int, prefetch: int) -> float:
    import pika

    params = pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=0)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got = 0

    def on_message(chan: Any, method: Any, _props: Any, _body: bytes) -> None:
        nonlocal got
        chan.basic_ack(delivery_tag=method.delivery_tag)
        got += 1
        if got >= count:
            chan.stop_consuming()

    started = time.perf_counter()
    ch.basic_consume(queue=queue, on_message_callback=on_message)
    ch.start_consuming()
    seconds = time.perf_counter() - started
    conn.close()
    return seconds


def drain_aio_pika(port: int, queue: str, count: int, prefetch: int) -> float:
    import aio_pika

    async def run() -> float:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=prefetch)
        q = await ch.get_queue(queue)
        done = asyncio.get_running_loop().create_future()
        got = 0

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal got
            await message.ack()
            got += 1
            if got >= count and not done.done():
                done.set_result(None)

        started = time.perf_counter()
        await q.consume(on_message)
        await done
        seconds = time.perf_counter() - started
        await conn.close()
        return seconds

    return asyncio.run(run())


def drain_kombu(port: int, queue: str, count: int, prefetch: int) -> float:
    import kombu

    got = 0

    def on_message(_body: Any, message: Any) -> None:
        nonlocal got
        message.ack()
        got += 1

    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{port}//", heartbeat=0) as conn:
        q = kombu.Queue(queue, no_declare=True)
        with conn.Consumer(q, callbacks=[on_message], accept=None, prefetch_count=prefetch):
            started = time.perf_counter()
            while got < count:
                conn.drain_events(timeout=60)
            return time.perf_counter() - started


DRAINS = {"pika": drain_pika, "aio-pika": drain_aio_pika, "kombu": drain_kombu}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", choices=sorted(DRAINS), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--queue", default="backlog-bench")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--prefetch", type=int, default=1000)
    args = p.parse_args(argv)
    cpu0, wall0 = _cpu(), time.perf_counter()
    seconds = DRAINS[args.client](args.port, args.queue, args.count, args.prefetch)
    cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    print(
        json.dumps(
            {
                "client": args.client,
                "messages": args.count,
                "seconds": round(seconds, 3),
                "rate": round(args.count / seconds, 1),
                "client_cpu": round(cpu / wall, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
