"""MQTT QoS 1 delivery CPU in one process, A/B between two checkouts.

    .venv/bin/python bench/mqtt_qos1_inproc.py ROUNDS BEFORE_TREE AFTER_TREE [MSGS] [BATCH]

Both trees built in place (``setup.py build_ext --inplace``) to compare compiled
code. Each round runs, once per tree (the order alternating), a subprocess with
that tree's ``src`` first on the path: a broker with no sockets (tests/harness),
a raw QoS 1 publisher and a raw QoS 1 subscriber that PUBACKs each batch, and
prints the process CPU per message delivered (broker plus two trivial clients,
the same code in both trees). In one process the result follows the broker's
code, not the client's rate, which a loaded machine makes swing by a third
across processes (``warren perf mqtt``). Prints each tree's median and spread.
"""

from __future__ import annotations

import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def one(msgs: int, batch: int) -> float:
    """Microseconds of process CPU per message delivered and acknowledged."""
    from harness.broker import Harness

    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as h:
        sub = h.mqtt_raw(level=4)
        sub.connect("bench-sub")
        sub.subscribe("bench/t", qos=1)
        pub = h.mqtt_raw(level=4)
        pub.connect("bench-pub")
        head = bytes((0x32, 4 + 5 + 2 + 16)) + b"\x00\x07bench/t"

        def publishes(first: int) -> bytes:
            return b"".join(
                head + struct.pack("!H", (first + i) % 65535 + 1) + b"x" * 16 for i in range(batch)
            )

        sub.inbox.clear()
        pub.inbox.clear()
        got = sent = 0
        t0 = time.process_time()
        while got < msgs:
            pub.feed(publishes(sent))
            sent += batch
            pub.inbox.clear()  # the publisher's PUBACKs
            data = bytes(sub.inbox)
            sub.inbox.clear()
            acks = []
            i, n = 0, len(data)
            while i < n:  # short packets only: a one-byte remaining length
                if data[i] >> 4 == 3:
                    p = i + 4 + ((data[i + 2] << 8) | data[i + 3])
                    acks.append(b"\x40\x02" + data[p : p + 2])
                    got += 1
                i += 2 + data[i + 1]
            if acks:
                sub.feed(b"".join(acks))
        h.settle()
        return (time.process_time() - t0) / got * 1e6


def main() -> None:
    if sys.argv[1] == "--one":
        print(f"{one(int(sys.argv[2]), int(sys.argv[3])):.3f}")
        return
    rounds, trees = int(sys.argv[1]), {"before": sys.argv[2], "after": sys.argv[3]}
    msgs = sys.argv[4] if len(sys.argv) > 4 else "200000"
    batch = sys.argv[5] if len(sys.argv) > 5 else "100"
    res: dict[str, list[float]] = {}
    for r in range(rounds):
        order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
        for name, tree in order:
            out = subprocess.run(
                [sys.executable, __file__, "--one", msgs, batch],
                env={"PYTHONPATH": f"{tree}/src:{TESTS}", "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                check=True,
            )
            us = float(out.stdout.split()[-1])
            res.setdefault(name, []).append(us)
            print(r, name, f"{us:.3f} us/msg", flush=True)
    for name, v in res.items():
        print(f"{name}: median {statistics.median(v):.3f} us/msg, {min(v):.3f}-{max(v):.3f}")


if __name__ == "__main__":
    main()
