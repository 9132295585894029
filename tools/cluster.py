"""`make cluster`: etcd and three clustered Warren nodes on this machine.

    .venv/bin/python tools/cluster.py [--dir ./cluster-data]

Node i (1-3) serves AMQP on 5671+i, HTTP on 15671+i, MQTT on 1882+i and
replicates on 5678+i; whichever is elected leader serves, the others pass
clients through to it. Each node's log lines come out prefixed with its
name. Ctrl-C stops everything (the data stays in --dir for the next run).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ETCD_CLIENT = 2379
ETCD_PEER = 2380


def _prefix(name: str, stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(f"{name:>5} | {line}")
        sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="cluster-data", help="where data and configs go")
    args = parser.parse_args()
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    etcd = shutil.which("etcd")
    if etcd is None:
        print("tools/cluster.py: etcd is not installed (make etcd)", file=sys.stderr)
        return 1
    procs: list[subprocess.Popen[str]] = []
    url = f"http://127.0.0.1:{ETCD_CLIENT}"
    procs.append(
        subprocess.Popen(
            [
                etcd,
                "--name",
                "warren-etcd",
                "--data-dir",
                str(base / "etcd"),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{ETCD_PEER}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{ETCD_PEER}",
                "--initial-cluster",
                f"warren-etcd=http://127.0.0.1:{ETCD_PEER}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    )
    threading.Thread(target=_prefix, args=("etcd", procs[0].stdout), daemon=True).start()
    for i in (1, 2, 3):
        name = f"node{i}"
        config = base / f"{name}.ini"
        config.write_text(
            f"[main]\ndata_dir = {base / name}\n"
            f"[amqp]\nport = {5671 + i}\n"
            f"[mgmt]\nport = {15671 + i}\n"
            f"[mqtt]\nport = {1882 + i}\n"
            f"[prometheus]\nport = {15692 + i}\n"
            "[clustering]\nenabled = true\n"
            f"etcd_endpoints = 127.0.0.1:{ETCD_CLIENT}\n"
            f"port = {5678 + i}\n"
            f"stream_read_port = {5681 + i}\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "warren", "-c", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Ctrl-C reaches this script alone, which stops the nodes once each.
            start_new_session=True,
        )
        procs.append(proc)
        threading.Thread(target=_prefix, args=(name, proc.stdout), daemon=True).start()
    print(
        f"cluster: etcd at {url}; nodes on AMQP 5672-5674, HTTP 15672-15674, stream reads (followers) 5682-5684. Ctrl-C stops."
    )
    # A flag, not a threading.Event: a handler calling Event.set() while the main
    # thread waits on that Event deadlocks on the Event's own lock.
    stopping: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: stopping.append(signum))
    try:
        while not stopping:
            if procs[0].poll() is not None:
                print("cluster: etcd exited", file=sys.stderr)
                break
            time.sleep(0.2)  # polls the flag and etcd (nothing else to wait on)
    finally:
        # The nodes first (they give up their etcd lease as they stop), then etcd.
        for group in (procs[1:], procs[:1]):
            for proc in group:
                proc.terminate()
            for proc in group:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
