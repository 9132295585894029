"""AMQP 1.0's broker CPU per message, in memory: no sockets, no load generator.

    WARREN_PURE_PYTHON=1 PYTHONPATH=src .venv/bin/python bench/amqp1_cpu.py
    WARREN_PURE_PYTHON=1 PYTHONPATH=src .venv/bin/python bench/amqp1_cpu.py --messages 100000 --json

One AMQP1Connection on an in-memory broker (tests/harness, the system clock):
a sending link and a receiving link on one queue, one session. The transfers
(``--size``-byte Data bodies), the receiver's flows and (unsettled) its
accepted dispositions, one range per read, are encoded before the clock
starts; then each read of ``--read`` transfers is fed to the connection, the
broker's loop runs and its output is taken, as a socket would. The number is
the process CPU time per message (time.process_time), which a loaded machine
disturbs far less than a rate over the wire: compare two checkouts with it
(docs/benchmarks.md, "AMQP 1.0").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from harness import Harness  # noqa: E402
from harness.amqp1 import MemoryAMQP1  # noqa: E402

from warren.amqp1 import performatives as p  # noqa: E402
from warren.amqp1.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, encode_frame  # noqa: E402
from warren.amqp1.message import AmqpMessage, Data, encode_message  # noqa: E402
from warren.amqp1.types import Symbol  # noqa: E402

BIG = 1 << 30


def reads(n: int, per_read: int, size: int, settled: bool) -> list[bytes]:
    """The client's bytes, read by read: a flow giving the receiver credit for
    the read, the transfers, and (unsettled) the previous read's disposition."""
    body = encode_message(AmqpMessage(body=[Data(b"x" * size)]))
    out = []
    for sent in range(0, n, per_read):
        k = min(per_read, n - sent)
        flow = p.Flow(
            next_incoming_id=sent,
            incoming_window=BIG,
            next_outgoing_id=sent,
            outgoing_window=BIG,
            handle=1,
            delivery_count=sent,
            link_credit=2 * per_read,
        )
        frames = [encode_frame(0, flow)]
        for i in range(sent, sent + k):
            transfer = p.Transfer(
                handle=0,
                delivery_id=i,
                delivery_tag=i.to_bytes(8, "big"),
                message_format=0,
                settled=settled,
            )
            frames.append(encode_frame(0, transfer, body))
        if not settled and sent:
            frames.append(
                encode_frame(
                    0,
                    p.Disposition(
                        role=p.RECEIVER,
                        first=sent - per_read,
                        last=sent - 1,
                        settled=True,
                        state=p.Accepted(),
                    ),
                )
            )
        out.append(b"".join(frames))
    return out


def run(n: int, per_read: int, size: int, settled: bool) -> float:
    """Broker CPU µs per message for one fresh broker."""
    with (
        tempfile.TemporaryDirectory(prefix="amqp1-cpu-") as tmp,
        Harness(Path(tmp) / "data") as harness,
    ):
        harness.call(lambda: harness.broker.vhosts["/"].declare_queue("q"))
        conn = MemoryAMQP1(harness)
        conn.exchange(SASL_HEADER)
        init = p.SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"\x00guest\x00guest")
        conn.exchange(encode_frame(0, init, b"", TYPE_SASL))
        conn.exchange(AMQP_HEADER)
        conn.exchange(encode_frame(0, p.Open(container_id="cpu", max_frame_size=1 << 20)))
        begin = p.Begin(next_outgoing_id=0, incoming_window=BIG, outgoing_window=BIG)
        conn.exchange(encode_frame(0, begin))
        mode = p.SND_SETTLED if settled else p.SND_UNSETTLED
        target = p.Target(address="/queues/q")
        source = p.Source(address="/queues/q")
        conn.exchange(
            encode_frame(
                0,
                p.Attach(name="s", handle=0, role=p.SENDER, snd_settle_mode=mode, target=target),
            )
        )
        conn.exchange(
            encode_frame(
                0,
                p.Attach(name="r", handle=1, role=p.RECEIVER, snd_settle_mode=mode, source=source),
            )
        )
        data = reads(n, per_read, size, settled)
        start = time.process_time()
        for chunk in data:
            conn.exchange(chunk)
        spent = time.process_time() - start
        if conn.lost or harness.broker.vhosts["/"].queues["q"].message_count:
            raise SystemExit("the connection failed or messages were left in the queue")
        return spent / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--read", type=int, default=64, help="transfers per read (default 64)")
    parser.add_argument("--size", type=int, default=16, help="body bytes (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh brokers per mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {}
    for name, settled in (("pre-settled", True), ("unsettled", False)):
        runs = [run(args.messages, args.read, args.size, settled) for _ in range(args.repeat)]
        result[name] = {"us_per_msg": runs, "median": statistics.median(runs)}
    if args.json:
        print(json.dumps(result))
        return
    for name, r in result.items():
        shown = " / ".join(f"{v:.2f}" for v in r["us_per_msg"])
        print(f"{name}: {r['median']:.2f} µs of broker CPU per message (runs: {shown})")


if __name__ == "__main__":
    main()
