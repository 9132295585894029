"""`make cluster`: etcd and three clustered Warren nodes on this machine.

    .venv/bin/python tools/cluster.py [--dir ./cluster-data] [--port 20000]

Every port comes from the base port (``make cluster PORT=...``): etcd's client
and peer ports are base and base+1; node *i* (1-3) serves AMQP on base+10*i,
HTTP on +1, MQTT on +2, Prometheus on +3, replicates on +4, while it follows
serves stream reads on +5, and the stream protocol on +6. The default base,
20000, stays clear of a `make run` broker's ports (5672, 15672, 1883, 15692,
5552) and of an etcd on 2379.
The nodes are named node1 to node3 ([clustering] node_name); whichever is
elected leader serves, the others pass clients through to it. Each node's log
lines come out prefixed with its name. Ctrl-C stops everything (the data stays
in --dir for the next run).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_BASE = 20000
NODES = (1, 2, 3)
#: Each node's ports: (name, offset from base + 10*i).
PORTS = (
    ("amqp", 0),
    ("http", 1),
    ("mqtt", 2),
    ("prometheus", 3),
    ("replication", 4),
    ("stream reads", 5),
    ("stream", 6),
)


def node_ports(base: int, i: int) -> dict[str, int]:
    """Node ``i``'s ports for the base port ``base``."""
    return {name: base + 10 * i + offset for name, offset in PORTS}


def all_ports(base: int) -> dict[str, int]:
    """Every port the cluster uses, by what uses it ("etcd client", "node1 amqp", ...)."""
    ports = {"etcd client": base, "etcd peer": base + 1}
    for i in NODES:
        ports.update({f"node{i} {name}": port for name, port in node_ports(base, i).items()})
    return ports


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def table(base: int) -> str:
    """The node name -> ports table printed at start-up."""
    names = [name for name, _ in PORTS]
    rows = [["node", *names]]
    rows += [[f"node{i}", *map(str, node_ports(base, i).values())] for i in NODES]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# One writer at a time: etcd's and the nodes' lines come from threads, and a
# line (or the port table) written while another thread flushes could be cut.
_OUTPUT = threading.Lock()


def _prefix(name: str, stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        with _OUTPUT:
            sys.stdout.write(f"{name:>5} | {line}")
            sys.stdout.flush()


def _node_name(data_dir: Path, name: str) -> str:
    """``name``, unless the node already has another id from an earlier run (a
    cluster-data made before nodes had names): renamed, no node would be in the
    stored in-sync replica set, and none could lead."""
    try:
        kept = (data_dir / ".node_id").read_text().strip()
    except FileNotFoundError:
        return name
    return kept or name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="cluster-data", help="where data and configs go")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_BASE,
        help=f"base port every other is derived from (default {DEFAULT_BASE})",
    )
    args = parser.parse_args()
    base_port: int = args.port
    ports = all_ports(base_port)
    if base_port < 1024 or max(ports.values()) > 65535:
        print(
            f"tools/cluster.py: the base port must be 1024-{65535 - max(ports.values()) + base_port}",
            file=sys.stderr,
        )
        return 2
    busy = [f"{port} ({what})" for what, port in ports.items() if port_in_use(port)]
    if busy:
        print(
            f"tools/cluster.py: in use: {', '.join(busy)}; choose another base port "
            "(make cluster PORT=...)",
            file=sys.stderr,
        )
        return 1
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    etcd = shutil.which("etcd")
    if etcd is None:
        print("tools/cluster.py: etcd is not installed (make etcd)", file=sys.stderr)
        return 1
    procs: list[subprocess.Popen[str]] = []
    url = f"http://127.0.0.1:{ports['etcd client']}"
    peer = f"http://127.0.0.1:{ports['etcd peer']}"
    procs.append(
        subprocess.Popen(
            [
                etcd,
                "--name",
                "warren-etcd",
                "--data-dir",
                # (A single member restarts on its data with other ports too.)
                str(base / "etcd"),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"warren-etcd={peer}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    )
    threading.Thread(target=_prefix, args=("etcd", procs[0].stdout), daemon=True).start()
    for i in NODES:
        name = f"node{i}"
        node = node_ports(base_port, i)
        config = base / f"{name}.ini"
        config.write_text(
            f"[main]\ndata_dir = {base / name}\n"
            f"[amqp]\nport = {node['amqp']}\n"
            f"[mgmt]\nport = {node['http']}\n"
            f"[mqtt]\nport = {node['mqtt']}\n"
            f"[prometheus]\nport = {node['prometheus']}\n"
            f"[stream]\nport = {node['stream']}\n"
            "[clustering]\nenabled = true\n"
            f"node_name = {_node_name(base / name, name)}\n"
            f"etcd_endpoints = {url}\n"
            f"port = {node['replication']}\n"
            f"stream_read_port = {node['stream reads']}\n"
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
    with _OUTPUT:
        print(
            f"cluster: etcd at {url}, data in {base}; the leader serves, the others pass "
            f"clients through to it. Ctrl-C stops.\n{table(base_port)}",
            flush=True,
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
