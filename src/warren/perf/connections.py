"""``warren perf connection-count``: open many connections and see what the broker pays for them.

Each connection opens ``--channels`` channels; on each channel ``--consumers``
server-named exclusive queues are declared, each with one consumer. Requests
on one connection are pipelined (all channel.open + queue.declare in one
write, then all basic.consume in another), connections are opened one after
the other. The broker's memory is read from /proc/<pid>/status, which is why
``--pid`` must name the broker process (the same machine is assumed).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from warren.amqp import spec
from warren.amqp.frames import method_frame
from warren.client import AMQPError, Client
from warren.perf.limits import raise_fd_limit
from warren.perf.report import format_count, pid_note, print_result, print_rss_change, read_rss

__all__ = ["ConnectionParams", "open_connection", "run"]


#: Seconds to wait for the broker's close-ok to every connection, all together.
CLOSE_WAIT = 10.0


@dataclass(frozen=True)
class ConnectionParams:
    uri: str = "amqp://guest:guest@127.0.0.1:5672/"
    connections: int = 100
    channels: int = 1
    consumers: int = 0
    pid: int | None = None
    settle: float = 1.0
    hold: float = 0.0


def open_connection(uri: str, index: int, channels: int, consumers: int) -> Client:
    """One connection with its channels, exclusive queues and consumers, pipelined."""
    client = Client(uri, name=f"warren-perf connection {index}").connect()
    try:
        if channels:
            first = b"".join(
                method_frame(ch, spec.ChannelOpen())
                + method_frame(ch, spec.QueueDeclare(queue="", exclusive=True)) * consumers
                for ch in range(1, channels + 1)
            )
            client.send(first)
            replies = client.collect({ch: 1 + consumers for ch in range(1, channels + 1)})
            if consumers:
                second = []
                for ch, methods in replies.items():
                    for ok in methods[1:]:
                        assert isinstance(ok, spec.QueueDeclareOk)
                        second.append(
                            method_frame(ch, spec.BasicConsume(queue=ok.queue, no_ack=True))
                        )
                client.send(b"".join(second))
                client.collect({ch: consumers for ch in range(1, channels + 1)})
    except BaseException:
        client.abort()
        raise
    return client


def run(p: ConnectionParams, as_json: bool = False, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    limit = raise_fd_limit()
    if p.connections + 16 > limit:
        print(
            f"warren perf connection-count: {p.connections} connections need more than the "
            f"open-file limit of {limit}",
            file=sys.stderr,
        )
        return 2
    note = pid_note(p.pid)
    rss_before = read_rss(p.pid) if p.pid is not None else None
    clients: list[Client] = []
    status = 0
    error = None
    start = time.perf_counter()
    try:
        for i in range(p.connections):
            clients.append(open_connection(p.uri, i, p.channels, p.consumers))
    except (OSError, AMQPError, EOFError) as exc:
        error = f"connection {len(clients) + 1} failed: {type(exc).__name__}: {exc}"
        status = 1
    except KeyboardInterrupt:
        error = "interrupted"
        status = 130
    open_s = time.perf_counter() - start
    opened = len(clients)
    if not as_json:
        print(
            f"opened {format_count(opened)} connections, {format_count(opened * p.channels)} "
            f"channels, {format_count(opened * p.channels * p.consumers)} consumers "
            f"in {open_s:.2f} s ({opened / open_s if open_s else 0:,.0f} connections/s)",
            file=out,
            flush=True,
        )
    try:
        if status == 0 and p.settle > 0:
            time.sleep(p.settle)
        rss = read_rss(p.pid) if p.pid is not None else None
        if not as_json:
            _print_rss(p.pid, rss_before, rss, opened, note, out)
        if status == 0 and p.hold > 0:
            if not as_json:
                print(f"holding them for {p.hold:g} s", file=out, flush=True)
            time.sleep(p.hold)
    except KeyboardInterrupt:
        status = 130
        rss = None
    start = time.perf_counter()
    for c in clients:
        c.close_begin()
    # One wait for all of them: a broker that stops answering costs CLOSE_WAIT
    # seconds, not so many per connection.
    deadline = time.monotonic() + CLOSE_WAIT
    unanswered = sum(
        not c.close_end(timeout=max(deadline - time.monotonic(), 0.0)) for c in clients
    )
    close_s = time.perf_counter() - start
    result: dict[str, Any] = {
        "connections": opened,
        "channels": opened * p.channels,
        "consumers": opened * p.channels * p.consumers,
        "open_s": round(open_s, 3),
        "close_s": round(close_s, 3),
        "close_unanswered": unanswered,
        "pid": p.pid,
        "rss_kib_before": rss_before,
        "rss_kib": rss,
        "params": {
            "uri": p.uri,
            "connections": p.connections,
            "channels": p.channels,
            "consumers": p.consumers,
        },
    }
    if error:
        result["error"] = error
        print(f"warren perf connection-count: {error}", file=sys.stderr)
    closed = f"closed them in {close_s:.2f} s"
    if unanswered:
        closed += f" ({unanswered} without the broker's close-ok, dropped)"
    print_result(result, as_json, out, closed, note)
    return status


def _print_rss(
    pid: int | None,
    before: dict[str, int] | None,
    after: dict[str, int] | None,
    opened: int,
    note: str | None,
    out: TextIO,
) -> None:
    if pid is None or note:
        return
    print_rss_change(out, pid, before, after, opened, "connection", digits=1)
    out.flush()
