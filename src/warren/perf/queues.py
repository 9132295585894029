"""``warren perf queue-count``: declare many queues; report the time and the broker's memory.

Declarations go out pipelined on one channel, ``BATCH`` at a time; the time
is from the first queue.declare to the last declare-ok. Unless ``--keep`` is
given the queues are deleted again afterwards (also pipelined, also timed).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from warren.amqp import spec
from warren.amqp.frames import method_frame
from warren.client import AMQPError, Client
from warren.perf.report import format_count, pid_note, print_result, print_rss_change, read_rss

__all__ = ["BATCH", "QueueParams", "run"]

#: Requests written per round trip.
BATCH = 500


@dataclass(frozen=True)
class QueueParams:
    uri: str = "amqp://guest:guest@127.0.0.1:5672/"
    queues: int = 1000
    durable: bool = False
    prefix: str = "perf-q-"
    pid: int | None = None
    settle: float = 1.0
    keep: bool = False


def _pipelined(client: Client, methods: list[spec.Method], reply: type[spec.Method]) -> None:
    for start in range(0, len(methods), BATCH):
        chunk = methods[start : start + BATCH]
        client.send(b"".join(method_frame(1, m) for m in chunk))
        for _ in chunk:
            client.wait_method(1, reply)


def run(p: QueueParams, as_json: bool = False, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    note = pid_note(p.pid)
    names = [f"{p.prefix}{i}" for i in range(1, p.queues + 1)]
    rss_before = read_rss(p.pid) if p.pid is not None else None
    result: dict[str, Any] = {"queues": 0, "durable": p.durable, "pid": p.pid}
    try:
        client = Client(p.uri, name="warren-perf queue-count").connect()
        client.channel_open(1)
    except (OSError, AMQPError, EOFError) as exc:
        print(f"warren perf queue-count: cannot connect: {exc}", file=sys.stderr)
        return 1
    status = 0
    try:
        start = time.perf_counter()
        _pipelined(
            client,
            [spec.QueueDeclare(queue=n, durable=p.durable) for n in names],
            spec.QueueDeclareOk,
        )
        declare_s = time.perf_counter() - start
        result["queues"] = len(names)
        result["declare_s"] = round(declare_s, 3)
        result["declare_rate"] = round(len(names) / declare_s, 1) if declare_s else 0.0
        if not as_json:
            print(
                f"declared {format_count(len(names))} {'durable' if p.durable else 'transient'} "
                f"queues in {declare_s:.2f} s ({result['declare_rate']:,.0f} queues/s)",
                file=out,
                flush=True,
            )
        if p.settle > 0:
            time.sleep(p.settle)
        rss = read_rss(p.pid) if p.pid is not None else None
        result["rss_kib_before"] = rss_before
        result["rss_kib"] = rss
        if not as_json and p.pid is not None and not note:
            print_rss_change(
                out, p.pid, rss_before, rss, len(names), "queue", with_them="with the queues"
            )
        if not p.keep:
            start = time.perf_counter()
            _pipelined(client, [spec.QueueDelete(queue=n) for n in names], spec.QueueDeleteOk)
            result["delete_s"] = round(time.perf_counter() - start, 3)
            if not as_json:
                print(f"deleted them in {result['delete_s']:.2f} s", file=out)
    except (OSError, AMQPError, EOFError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"warren perf queue-count: {result['error']}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 130
    finally:
        client.close()
    result["params"] = {
        "uri": p.uri,
        "queues": p.queues,
        "durable": p.durable,
        "prefix": p.prefix,
        "keep": p.keep,
    }
    print_result(result, as_json, out, None, note)
    return status
