"""Warren's MQTT listener against mosquitto, with `warren perf mqtt`.

    .venv/bin/python bench/mqtt_compare.py                    # 10 s runs, 3 each, both brokers
    .venv/bin/python bench/mqtt_compare.py --seconds 5 --runs 1 --brokers mosquitto

Each broker is started fresh on a free loopback port (mosquitto: Debian's
/usr/sbin/mosquitto with a generated config, see bench/mqtt_brokers.py; Warren:
``python -m warren --mqtt-port <port> --amqp-port 0 --http-port -1 --ephemeral``).
A broker that does not start is skipped with the reason. For every scenario (1
publisher, 1 subscriber, 16-byte payloads, MQTT 3.1.1; QoS 0 and QoS 1) the same
``warren perf mqtt --time N --json`` runs ``--runs`` times per broker, the brokers
alternating, and the table shows the median received msg/s and the ratio.
``--ceiling`` adds the perf client's own limits, measured against a stand-in
broker in this process that does no work (CONNACK, SUBACK, then it only
discards, or only streams pre-built PUBLISH packets).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import mqtt_brokers as brokers  # noqa: E402
import side_by_side  # noqa: E402

from warren.perf.mqtt_client import packet_end  # noqa: E402

#: (label, extra `warren perf mqtt` arguments)
SCENARIOS: list[tuple[str, list[str]]] = [
    ("QoS 0, 1 publisher, 1 subscriber, 16 B", ["--qos", "0"]),
    ("QoS 1, 1 publisher, 1 subscriber, 16 B", ["--qos", "1"]),
]


class StandIn(side_by_side.StandIn):
    """A stand-in MQTT broker for the client's ceiling: CONNACK for every CONNECT, then
    either a SUBACK and an endless stream of pre-built QoS 0 PUBLISH packets (a
    subscriber) or discarding everything unread (a publisher). No broker is faster."""

    def __init__(self, topic: str = "perf/test", size: int = 16) -> None:
        super().__init__()
        body = struct.pack(">H", len(topic)) + topic.encode() + b"\x00" * size
        self.block4 = (b"\x30" + bytes((len(body),)) + body) * (65536 // (len(body) + 2))
        body5 = struct.pack(">H", len(topic)) + topic.encode() + b"\x00" + b"\x00" * size
        self.block5 = (b"\x30" + bytes((len(body5),)) + body5) * (65536 // (len(body5) + 2))
        self.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            buf = b""
            while not (end := packet_end(buf, 0)):
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
            v5 = _connect_level(buf) == 5
            conn.sendall(b"\x20\x03\x00\x00\x00" if v5 else b"\x20\x02\x00\x00")
            data = buf[end:] or conn.recv(1 << 20)
            if data[:1] == b"\x82":  # a subscriber (publishers start with PUBLISH)
                pid = data[2:4] if data[1] < 0x80 else data[3:5]
                conn.sendall(b"\x90\x04" + pid + b"\x00\x00" if v5 else b"\x90\x03" + pid + b"\x00")
                block = self.block5 if v5 else self.block4
                while True:
                    conn.sendall(block)
            while data:  # a publisher: discard
                data = conn.recv(1 << 20)


def _connect_level(connect: bytes) -> int:
    """The protocol level of a CONNECT: after the fixed header and the name "MQTT"."""
    at = 2
    while connect[at - 1] & 0x80:
        at += 1
    return connect[at + 6]


def ceiling(seconds: float) -> list[tuple[str, dict[str, Any]]]:
    """The perf client's own limits against the stand-in: a publisher, a subscriber."""
    stand_in = StandIn()
    try:
        return [
            ("publisher → stand-in sink", run_perf(stand_in.port, seconds, ["-y", "0"])),
            (
                "subscriber ← stand-in source",
                run_perf(stand_in.port, seconds, ["-x", "0", "-y", "1"]),
            ),
        ]
    finally:
        stand_in.close()


def run_perf(port: int, seconds: float, extra: list[str]) -> dict[str, Any]:
    cmd = brokers.perf_command(
        "mqtt", "--port", str(port), "--time", str(seconds), "--size", "16", "--json", *extra
    )
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=brokers.perf_env(), timeout=seconds + 120
    )
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-1000:]}")
    result: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    brokers.add_common_arguments(ap)
    ap.add_argument("--seconds", type=float, default=10.0, help="per run (default 10)")
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario and broker (median)")
    ap.add_argument("--json", action="store_true", help="also print every run as JSON lines")
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="also measure the perf client against a stand-in broker that does no work",
    )
    args = ap.parse_args(argv)
    names = brokers.parse_brokers(args.brokers)
    load_start = os.getloadavg()
    # results[scenario][broker] = [receive_rate, ...]
    results: dict[str, dict[str, list[float]]] = {label: {} for label, _ in SCENARIOS}
    skipped: dict[str, str] = {}
    for label, extra in SCENARIOS:
        for run in range(args.runs):
            order = names if run % 2 == 0 else list(reversed(names))
            for name in order:
                s = brokers.on_broker(
                    name,
                    args.warren_src,
                    skipped,
                    lambda _pid, port, extra=extra: run_perf(port, args.seconds, extra),
                )
                if s is None:
                    continue
                rate = float(s["receive_rate"])
                results[label].setdefault(name, []).append(rate)
                print(
                    f"{label} | {name} run {run + 1}: received {rate:,.0f} msg/s "
                    f"(published {s['publish_rate']:,.0f} msg/s)",
                    file=sys.stderr,
                    flush=True,
                )
                if args.json:
                    print(json.dumps({"scenario": label, "broker": name, "result": s}))
    shown = [n for n in names if n not in skipped]
    print()
    print(
        f"MQTT 3.1.1, `warren perf mqtt --time {args.seconds:g}`, median of {args.runs} "
        f"run(s), received msg/s"
    )
    print()
    header = "| Scenario | " + " | ".join(
        f"{n} {brokers.version(n, args.warren_src)}" for n in shown
    )
    both = "warren" in shown and "mosquitto" in shown
    print(header + (" | Warren / mosquitto |" if both else " |"))
    print("|---|" + "---:|" * (len(shown) + (1 if both else 0)))
    for label, _ in SCENARIOS:
        med = {n: statistics.median(results[label][n]) for n in shown if results[label].get(n)}
        cells = [f"{med[n]:,.0f}" if n in med else "-" for n in shown]
        if both:
            ratio = (
                f"{med['warren'] / med['mosquitto']:.2f}×"
                if med.get("warren") and med.get("mosquitto")
                else "-"
            )
            cells.append(ratio)
        print(f"| {label} | " + " | ".join(cells) + " |")
    load_end = os.getloadavg()
    print(
        "\nLoad average (1/5/15 min) at the start: "
        + " ".join(f"{x:.2f}" for x in load_start)
        + ", at the end: "
        + " ".join(f"{x:.2f}" for x in load_end)
        + f" ({os.cpu_count()} CPUs)"
    )
    brokers.print_skipped(skipped)
    if args.ceiling:
        print("\n| The client's ceiling (QoS 0, 16 B) | msg/s | client CPU |")
        print("|---|---:|---:|")
        for label, s in ceiling(args.seconds):
            rate = s["publish_rate"] if "publisher" in label else s["receive_rate"]
            cpu = s["client_cpu"]["publishers"] + s["client_cpu"]["subscribers"]
            print(f"| {label} | {rate:,.0f} | {cpu[0]:.0%} |")
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
