"""CPU time per test, for making `make test` shorter (docs/testing.md, "The two
passes"): with WARREN_TEST_CPU=<dir>, each pytest process writes
<dir>/<pass>-<worker>.json (the pass: WARREN_TEST_PASS, which make test sets
for tests/spark's pytest, else compiled or pure): every test's CPU seconds (this process's threads,
the broker's among them, plus the child processes it waited for), when it
ended (seconds since the epoch: which tests make the tail), and what the
process and its children used in all. Processes a test starts but does not
wait for itself add their CPU through ``EXTERNAL`` (brokers and nodes
forked and reaped by tests/forkserver.py). What no test accounts for is
long-lived children: Spark's JVMs, Chromium. ``python tests/cputime.py <dir>``
sums it up by file and lists the last tests to end."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ENV = "WARREN_TEST_CPU"


#: CPU seconds so far of processes a test started but does not wait for itself
#: (tests/forkserver.py's server and the children it forks and reaps).
EXTERNAL: list[Callable[[], float]] = []


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + sum(f() for f in EXTERNAL)


class CpuAccount:
    """Per-test CPU seconds of one pytest process."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.tests: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    @staticmethod
    def before() -> float:
        return _cpu()

    def measure(self, nodeid: str, before: float) -> None:
        self.tests[nodeid] = self.tests.get(nodeid, 0.0) + _cpu() - before
        self.ended[nodeid] = time.time()

    def write(self) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", f"main{os.getpid()}")
        name = os.environ.get(
            "WARREN_TEST_PASS", "pure" if os.environ.get("WARREN_PURE_PYTHON") == "1" else "compiled"
        )
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {"tests": self.tests, "ended": self.ended, "total": _cpu()}
        (self.out / f"{name}-{worker}.json").write_text(json.dumps(doc))


def account() -> CpuAccount | None:
    where = os.environ.get(ENV)
    return CpuAccount(Path(where)) if where else None


def report(where: Path) -> None:
    """Prints CPU seconds per pass and test file, largest first."""
    for name in ("compiled", "pure", "spark"):
        by_file: dict[str, float] = defaultdict(float)
        total = accounted = 0.0
        for f in where.glob(f"{name}-*.json"):
            doc = json.loads(f.read_text())
            if not doc["tests"]:
                continue  # an xdist controller: its total is its workers'
            total += doc["total"]
            for nodeid, cpu in doc["tests"].items():
                by_file[nodeid.split("::")[0]] += cpu
                accounted += cpu
        print(f"== {name}: {total:.0f} s CPU, {accounted:.0f} s in tests")
        for path, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:40]:
            print(f"{cpu:8.1f}  {path}")
    ended = {
        (name.split("-")[0], nodeid): at
        for name in (f.stem for f in where.glob("*.json"))
        for nodeid, at in json.loads((where / f"{name}.json").read_text()).get("ended", {}).items()
    }
    if ended:
        last = max(ended.values())
        print("== the last tests to end (seconds before the end, pass, test)")
        for (name, nodeid), at in sorted(ended.items(), key=lambda kv: -kv[1])[:15]:
            print(f"{last - at:8.1f}  {name:8}  {nodeid}")


if __name__ == "__main__":
    report(Path(sys.argv[1]))
