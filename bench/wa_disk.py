"""The disk side of bench/write_amplification.py: an ext4 file system in a loop
device with the kernel's counters for it, the brokers with their data dir on
one, and what one sync round costs the file system by how the file was made.

Imported by write_amplification.py, which puts bench/ on sys.path first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from amqp_brokers import ROOT, LavinMQ, Warren, log, perf_env, port_open  # bench/amqp_brokers.py

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a.get(k, 0) for k in b}


def fmt_size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.2f}×" if x < 10 else f"{x:,.0f}×"


# =====================================================================================
# The file system under the broker and what the kernel counts
# =====================================================================================


class LoopFS:
    """An ext4 file system in a loop device, mounted on ``mount``."""

    def __init__(self, root: Path, name: str, size: str) -> None:
        self.image = root / f"{name}.img"
        self.mount = root / name
        self.size = size
        self.device = ""

    def __enter__(self) -> LoopFS:
        self.mount.mkdir(parents=True, exist_ok=True)
        subprocess.run(["truncate", "-s", self.size, str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mount)], check=True)
        src = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(self.mount)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.device = os.path.basename(src)
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(10):
            if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode == 0:
                break
            time.sleep(1)
        with contextlib.suppress(OSError):
            self.image.unlink()

    def syncfs(self) -> None:
        subprocess.run(["sync", "-f", str(self.mount)], check=True)

    def counters(self) -> dict[str, int]:
        """Sectors and requests written, cache flushes; journal transactions and the
        blocks they logged (the kernel keeps averages: totals are approximate)."""
        fields = Path(f"/sys/block/{self.device}/stat").read_text().split()
        out = {
            "write_ios": int(fields[4]),
            "write_bytes": int(fields[6]) * 512,
            "flushes": int(fields[15]) if len(fields) > 15 else 0,
        }
        info = Path(f"/proc/fs/jbd2/{self.device}-8/info")
        with contextlib.suppress(OSError):
            text = info.read_text()
            tx = re.search(r"^(\d+) transactions", text, re.M)
            logged = re.search(r"(\d+) logged blocks per transaction", text)
            if tx:
                out["journal_tx"] = int(tx.group(1))
                out["journal_blocks"] = int(tx.group(1)) * (int(logged.group(1)) if logged else 0)
        return out


def proc_io(pid: int | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if pid is None:
        return out
    with contextlib.suppress(OSError), open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = int(value)
    return out


# =====================================================================================
# Brokers with their data directory on a LoopFS
# =====================================================================================


class DiskBroker:
    """A broker child process whose data dir is on ``fs``; its log and config are not."""

    name = ""

    def __init__(self, fs: LoopFS) -> None:
        self.fs = fs
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix=f"wa-{self.name.lower()}-"))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        raise NotImplementedError

    def start(self) -> None:
        cmd, env = self.command()
        with open(self.tmp / "broker.log", "wb") as logf:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 120
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.tmp / "broker.log").read_text(errors="replace")[-1500:]
                self.stop()
                raise RuntimeError(f"{self.name} did not start: {tail}")
            time.sleep(0.3)
        log(f"{self.name} up on port {self.port}, pid {self.pid}, data on {self.fs.mount}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    def version(self) -> str:
        return ""


class WarrenDisk(DiskBroker):
    name = "Warren"
    #: Run the broker from this ``src`` directory instead of this checkout's
    #: (--warren-src: a prototype of a store change, say).
    src: Path | None = None

    def env(self) -> dict[str, str]:
        env = perf_env()
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src) + os.pathsep + env["PYTHONPATH"]
        return env

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        w = Warren(self.port)
        w.data_dir = self.fs.mount / "warren"
        return w.command(self.tmp), self.env()

    def version(self) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "warren", "--version"],
            capture_output=True,
            text=True,
            env=self.env(),
        ).stdout.strip()
        src = self.src or ROOT / "src"
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        where = f"git {commit}" if commit else f"from {src}"
        return f"{out} ({where})"


class LavinMQDisk(DiskBroker):
    name = "LavinMQ"

    def __init__(self, fs: LoopFS, binary: str) -> None:
        super().__init__(fs)
        self.binary = binary

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        lav = LavinMQ(self.binary, self.port)
        lav.data_dir = self.fs.mount / "lavinmq"
        return lav.command(self.tmp), None

    def version(self) -> str:
        return LavinMQ(self.binary).versions().get("LavinMQ", "unknown")


class RabbitMQDisk(DiskBroker):
    """A RabbitMQ node of its own (its own node name, ports and epmd), so a node
    someone else runs on this machine is left alone; mnesia (message store, queue
    indices, streams) on the loop file system, logs elsewhere."""

    name = "RabbitMQ"

    def __init__(self, fs: LoopFS) -> None:
        super().__init__(fs)
        self.node = f"warrenwa{os.getpid()}@localhost"
        self.epmd_port = free_port()
        self._beam: int | None = None

    def env(self) -> dict[str, str]:
        (self.tmp / "enabled_plugins").write_text("[].\n")
        return dict(
            os.environ,
            HOME=str(self.tmp),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_MNESIA_BASE=str(self.fs.mount / "rabbitmq"),
            RABBITMQ_LOG_BASE=str(self.tmp / "log"),
            RABBITMQ_LOGS=str(self.tmp / "rabbit.log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.tmp / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(self.tmp / "rabbitmq"),
        )

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        return [str(RABBITMQ_BIN / "rabbitmq-server")], self.env()

    @property
    def pid(self) -> int | None:
        """The beam.smp of this node (the script's child is a shell)."""
        if self._beam is None and self.proc is not None:
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                with contextlib.suppress(OSError):
                    cmdline = (d / "cmdline").read_bytes()
                    if b"beam.smp" in cmdline and str(self.tmp).encode() in cmdline:
                        self._beam = int(d.name)
                        break
        return self._beam

    def start(self) -> None:
        super().start()
        ctl = [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, "await_startup"]
        subprocess.run(ctl, env=self.env(), capture_output=True, timeout=120)

    def stop(self) -> None:
        if self.proc is not None:
            ctl = [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, "shutdown"]
            subprocess.run(ctl, env=self.env(), capture_output=True, timeout=180)
        # The epmd this node started (on its own port) goes with it.
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{self.epmd_port}"], capture_output=True, text=True
        )
        for pid in {int(p) for p in re.findall(r"pid=(\d+)", out.stdout)}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        self._beam = None
        super().stop()

    def version(self) -> str:
        pkg = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"rabbitmq-server {pkg} (Debian), classic queues v1 (the default)"


# =====================================================================================
# The file system alone: what one sync round costs, by how the file was made
# =====================================================================================

SEGMENT = 8 * 1024 * 1024  # Warren's default segment_size
_libc: Any = None


def sync_file_range_write(fd: int) -> None:
    """Start writeback of the whole file (SYNC_FILE_RANGE_WRITE); os has no binding."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.sync_file_range.argtypes = [
            ctypes.c_int,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_uint,
        ]
    if _libc.sync_file_range(fd, 0, 0, 2) != 0:
        raise OSError("sync_file_range failed")


#: (key, how each file is made, how a round is synced, files, bytes per file per round)
FS_MODEL = [
    *[(f"{make}-{size}", make, "each", 1, size)
      for size in (16, 1024, 16384, 262144) for make in ("append", "fallocate", "zeroed")],
    *[(f"{make}-{sync}-{files}x1024", make, sync, files, 1024)
      for files in (10, 100) for make, sync in (("append", "each"), ("append", "two-phase"),
                                                 ("append", "syncfs"), ("zeroed", "each"),
                                                 ("zeroed", "two-phase"))],
]  # fmt: skip


def fs_round(fs: LoopFS, key: str, make: str, sync: str, files: int, size: int) -> dict[str, Any]:
    """``rounds`` of: ``size`` bytes written to each of ``files`` files, then made durable
    (fdatasync each file, or sync_file_range every file first, or one syncfs).
    ``append``: a new file grown by O_APPEND writes (Warren's segments today);
    ``fallocate``: posix_fallocate'd to 8 MiB first (unwritten extents), written in
    place; ``zeroed``: 8 MiB of zeros written and synced first (a pre-zeroed or a
    recycled segment), written in place. Setup is not counted."""
    d = fs.mount / key
    d.mkdir()
    fds = []
    for i in range(files):
        path = d / f"msgs.{i:010d}"
        if make == "append":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            if make == "fallocate":
                os.posix_fallocate(fd, 0, SEGMENT)
            else:
                os.pwrite(fd, bytes(SEGMENT), 0)
            os.fsync(fd)
        fds.append(fd)
    rounds = max(20, min(300, (SEGMENT // 2) // size, 3000 // files))
    payload = b"m" * size
    fs.syncfs()
    before = fs.counters()
    start = time.monotonic()
    for r in range(rounds):
        for fd in fds:
            if make == "append":
                os.write(fd, payload)
            else:
                os.pwrite(fd, payload, r * size)
        if sync == "syncfs":
            os.syncfs(fds[0]) if hasattr(os, "syncfs") else fs.syncfs()
            continue
        if sync == "two-phase":
            for fd in fds:
                sync_file_range_write(fd)
        for fd in fds:
            os.fdatasync(fd)
    took = time.monotonic() - start
    for fd in fds:
        os.close(fd)
    fs.syncfs()
    c = diff(before, fs.counters())
    shutil.rmtree(d)
    return {
        "key": key,
        "rounds": rounds,
        "bytes": size * files,
        "per_round": c["write_bytes"] / rounds,
        "journal_per_round": c.get("journal_blocks", 0) * 4096 / rounds,
        "tx_per_round": c.get("journal_tx", 0) / rounds,
        "flushes_per_round": c.get("flushes", 0) / rounds,
        "ms_per_round": took * 1000 / rounds,
        "make": make,
        "sync": sync,
        "files": files,
        "size": size,
    }


def fs_model_report(rows: list[dict[str, Any]]) -> str:
    out = [
        "#### One sync round on ext4, by how the segment file was made (no broker)",
        "",
        "Rounds of *bytes* written to each of *files* files, each round then made durable. "
        "File: *append*, a new file grown with O_APPEND (Warren's segments today); "
        "*fallocate*, posix_fallocate'd to 8 MiB first and written in place; *zeroed*, "
        "8 MiB of zeros written and synced first (a recycled segment), written in place. "
        "Sync: *each*, fdatasync every file; *two-phase*, sync_file_range(WRITE) on every "
        "file first, then fdatasync each; *syncfs*, one syncfs. Setup is not counted.",
        "",
    ]
    out.append("| files × bytes per round | file | sync | written per round | of it journal | "
               "journal commits | flushes | written / data | ms per round |")  # fmt: skip
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        out.append(
            f"| {r['files']} × {fmt_size(r['size'])} | {r['make']} | {r['sync']} | "
            f"{r['per_round'] / 1024:,.1f} KiB | {r['journal_per_round'] / 1024:,.1f} KiB | "
            f"{r['tx_per_round']:.2f} | {r['flushes_per_round']:.1f} | "
            f"{fmt_ratio(r['per_round'] / r['bytes'])} | {r['ms_per_round']:.2f} |"
        )
    return "\n".join(out) + "\n\n"
