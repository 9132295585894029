"""RAM and throughput of the segment store alone: does RSS stay flat as a queue grows?

Appends --count messages with 16-byte bodies (persistent: raw properties
b"\\x10\\x00\\x02" = flags word with only delivery-mode set, then delivery-mode 2)
to one SegmentStore in a temporary directory, reopens it (recovery), shifts and
acks them all, then runs a steady-state phase (append a batch, shift+ack it). RssAnon, from
/proc/self/status, is what the broker's heap costs; the page cache and mapped
segment files (RssFile) belong to the kernel and are reported only for reference.

    .venv/bin/python bench/store_memory.py --count 10000000
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from pathlib import Path

from warren.core.message import Message
from warren.core.properties import BasicProperties
from warren.store.segment_store import SegmentStore

PERSISTENT = b"\x10\x00\x02"


def status() -> dict[str, int]:
    """Memory fields of /proc/self/status, in kB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
    return out


def mb(kb: int) -> str:
    return f"{kb / 1024:8.1f} MB"


def disk_usage(d: Path) -> tuple[int, int]:
    files = [p for p in d.iterdir() if p.name.startswith("msgs.")]
    return len(files), sum(p.stat().st_size for p in d.iterdir())


def report(
    label: str, base: dict[str, int], n: int | None = None, secs: float | None = None
) -> None:
    now = status()
    rate = f"  {n / secs:12,.0f} msg/s ({secs:6.1f} s)" if n and secs else ""
    print(
        f"{label:<22} RssAnon {mb(now['RssAnon'])} (+{mb(now['RssAnon'] - base['RssAnon'])})"
        f"  RssFile {mb(now['RssFile'])}{rate}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--segment-size", type=int, default=8 * 1024 * 1024)
    ap.add_argument("--body-size", type=int, default=16)
    ap.add_argument("--steady", type=int, default=1_000_000, help="messages in the steady phase")
    ap.add_argument("--batch", type=int, default=256, help="steady phase batch size")
    ap.add_argument("--dir", type=Path, default=None, help="parent directory for the store")
    ap.add_argument("--no-reopen", action="store_true", help="skip the recovery phase")
    args = ap.parse_args()
    assert BasicProperties(delivery_mode=2).encode() == PERSISTENT

    parent = Path(tempfile.mkdtemp(prefix="warren-bench-", dir=args.dir))
    try:
        msg = Message("", "bench.queue", PERSISTENT, b"x" * args.body_size)
        gc.collect()
        base = status()
        report("start", base)
        store = SegmentStore(parent / "q", segment_size=args.segment_size)
        append = store.append
        t = time.perf_counter()
        for _ in range(args.count):
            append(msg)
        store.flush()
        secs = time.perf_counter() - t
        files, size = disk_usage(parent / "q")
        report(f"appended {args.count:,}", base, args.count, secs)
        print(
            f"{'':<22} ready {store.ready_count:,}, {store.ready_bytes:,} body bytes,"
            f" {files} segments, {size / 2**20:,.0f} MiB on disk"
        )

        if not args.no_reopen:
            # A restart: recovery scans (and CRC-checks) every record, keeping counters only.
            store.close(sync=False)
            t = time.perf_counter()
            store = SegmentStore(parent / "q", segment_size=args.segment_size)
            secs = time.perf_counter() - t
            assert store.ready_count == args.count
            report("reopened (recovery)", base, args.count, secs)
            append = store.append

        shift = store.shift
        ack = store.ack
        t = time.perf_counter()
        n = 0
        while (item := shift()) is not None:
            ack(item[0])
            n += 1
        store.flush()
        secs = time.perf_counter() - t
        assert n == args.count, n
        report("shifted+acked all", base, n, secs)
        files, size = disk_usage(parent / "q")
        print(f"{'':<22} {files} segment left, {size / 2**20:,.1f} MiB on disk")

        batch = args.batch
        rounds = max(1, args.steady // batch)
        t = time.perf_counter()
        for _ in range(rounds):
            for _ in range(batch):
                append(msg)
            for _ in range(batch):
                item = shift()
                assert item is not None
                ack(item[0])
        store.flush()
        secs = time.perf_counter() - t
        report(f"steady (batch {batch})", base, rounds * batch, secs)
        store.close(sync=False)
        print(f"{'':<22} peak RSS (VmHWM) {mb(status()['VmHWM'])}")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
