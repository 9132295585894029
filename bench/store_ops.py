"""Per-message cost of the segment store's hot path, and the speed of scan_ready().

Hot path: --count messages (16-byte bodies, persistent; --mode transient or
mixed: delivery-mode 1, or every other one, what a durable queue's transient
counts cost) through one SegmentStore, best of --repeat runs, in CPU time
(process_time: less sensitive than wall time to other load on the machine) and
wall time:

- interleaved: append, shift, ack one message at a time (the reader always catches
  up with the writer, so every shift maps the write segment afresh)
- batch:       append all, then shift+ack all
- batch1k:     append 1,000, shift+ack 1,000, repeated
- shifted:     append_shifted+ack (a consumer waiting: the direct-delivery path)

scan: --scan-count messages appended, the store closed and reopened (recovery),
then one full scan_ready() timed; the store's files stay in the page cache.

    PYTHONPATH=src .venv/bin/python bench/store_ops.py [--count 200000] [--scan-count 1000000]
        [--mode persistent|transient|mixed]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from warren.core.message import Message
from warren.store.segment_store import SegmentStore

PERSISTENT = b"\x10\x00\x02"
TRANSIENT = b"\x10\x00\x01"
MODES = {
    "persistent": (PERSISTENT,),
    "transient": (TRANSIENT,),
    "mixed": (PERSISTENT, TRANSIENT),
}


def _interleaved(store: SegmentStore, msgs: list[Message]) -> None:
    append, shift, ack = store.append, store.shift, store.ack
    for m in msgs:
        append(m)
        item = shift()
        assert item is not None
        ack(item[0])


def _batch(store: SegmentStore, msgs: list[Message]) -> None:
    append, shift, ack = store.append, store.shift, store.ack
    for m in msgs:
        append(m)
    for _ in msgs:
        item = shift()
        assert item is not None
        ack(item[0])


def _batch1k(store: SegmentStore, msgs: list[Message]) -> None:
    append, shift, ack = store.append, store.shift, store.ack
    for i in range(0, len(msgs), 1000):
        chunk = msgs[i : i + 1000]
        for m in chunk:
            append(m)
        for _ in chunk:
            item = shift()
            assert item is not None
            ack(item[0])


def _shifted(store: SegmentStore, msgs: list[Message]) -> None:
    append_shifted, ack = store.append_shifted, store.ack
    for m in msgs:
        ack(append_shifted(m))


VARIANTS: dict[str, Callable[[SegmentStore, list[Message]], None]] = {
    "interleaved": _interleaved,
    "batch": _batch,
    "batch1k": _batch1k,
    "shifted": _shifted,
}


def hot(name: str, count: int, repeat: int, mode: str = "persistent") -> None:
    fn = VARIANTS[name]
    props = MODES[mode]
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(repeat):
        d = Path(tempfile.mkdtemp(prefix="warren-bench-"))
        store = SegmentStore(d / "q")
        msgs = [Message("ex", "rk", props[i % len(props)], b"x" * 16, 1) for i in range(count)]
        gc.collect()
        gc.disable()
        c0, w0 = time.process_time(), time.perf_counter()
        fn(store, msgs)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        gc.enable()
        store.close(sync=False)
        shutil.rmtree(d)
    c, w = min(cpu), min(wall)
    print(
        f"{name:<12} cpu {c * 1000:7.1f} ms ({c / count * 1e6:5.2f} us/msg)"
        f"   wall {w * 1000:7.1f} ms ({w / count * 1e6:5.2f} us/msg)",
        flush=True,
    )


def scan(count: int) -> None:
    d = Path(tempfile.mkdtemp(prefix="warren-bench-"))
    try:
        store = SegmentStore(d / "q")
        for i in range(count):
            store.append(Message("ex", "rk", PERSISTENT, b"x" * 16, i))
        store.close(sync=False)
        t = time.perf_counter()
        store = SegmentStore(d / "q")
        opened = time.perf_counter() - t
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            n = sum(1 for _ in store.scan_ready())
            best = min(best, time.perf_counter() - t)
            assert n == count, n
        print(
            f"scan_ready   {count:,} messages: {best:.2f} s ({best / count * 1e6:.2f} us/msg);"
            f" reopening (recovery) took {opened:.2f} s",
            flush=True,
        )
        store.close(sync=False)
    finally:
        shutil.rmtree(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scan-count", type=int, default=1_000_000, help="0 skips the scan")
    parser.add_argument("--mode", choices=sorted(MODES), default="persistent")
    parser.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    for name in args.variants:
        hot(name, args.count, args.repeat, args.mode)
    if args.scan_count and hasattr(SegmentStore, "scan_ready"):
        scan(args.scan_count)


if __name__ == "__main__":
    main()
