"""Spark deployed as users deploy it (docs/spark.md, "Deployment"): Warren's
pure-Python wheel, a Python without Warren for the nodes, Spark processes of
their own (a standalone master and workers, a Spark Connect server) and jobs run
with spark-submit.

Every process runs in its own process group, logs to a file under the test's
temporary directory and is killed at teardown; a wait is for a line in a log
or an answering port, never for time to pass.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyspark
import pytest

from .cds import BASE_OPTS, archive_opts

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
#: Small JVMs that start fast: the processes share two busy cores. (The tests'
#: SparkSession and the docs' example run with them too: 31 s of CPU and 44 s
#: instead of 45 s and 56 s for three of the modules, at load 2.5; C2's
#: compiling does not pay back in jobs of a few seconds.)
#: With make test's class-data sharing archive, when there is one (cds.py: the
#: classes Spark loads mapped in, not loaded and verified again by every JVM).
JAVA_OPTS = BASE_OPTS + archive_opts()
#: How long a Spark process may take to come up on a busy machine.
START_TIMEOUT = 180.0


def java_missing() -> str | None:
    """Why Spark cannot run here, or None."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs Java (no java on PATH, JAVA_HOME unset)"
    return None


def base_env(**extra: str) -> dict[str, str]:
    """This environment without what would lead a Spark process to this checkout's
    Warren: nodes find Warren only the way the test deploys it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WARREN_PURE_PYTHON")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(SPARK_HOME))
    env.update(extra)
    return env


def build_pure_wheel(out: Path) -> Path:
    """Warren's wheel built with WARREN_PURE_PYTHON=1 (nothing compiled: it imports
    from a zip), from a copy of this checkout so the build leaves nothing in it."""
    tree = out / "source"
    shutil.copytree(
        REPO / "src" / "warren",
        tree / "src" / "warren",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.c", "*.h"),
    )
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    wheels = out / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(wheels), str(tree)],
        env=dict(os.environ, WARREN_PURE_PYTHON="1"),
    )
    (wheel,) = wheels.glob("warren_broker-*.whl")
    return wheel


def shared_pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build_pure_wheel once per test run: the two deploy tests, on two
    pytest-xdist workers as a rule, take the same wheel (a pip build of a
    second or more of CPU each) from the run's common temporary directory,
    under a lock. Each test copies or installs it; none changes it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's, shared by its workers
    out = base / "warren-pure-wheel"
    with (base / "warren-pure-wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted((out / "dist").glob("warren_broker-*.whl"))
        if built:
            return built[0]
        shutil.rmtree(out, ignore_errors=True)
        return build_pure_wheel(out)


def python_without_warren(venv: Path) -> Path:
    """A virtualenv standing for a node's Python: pyspark, pyarrow and the rest of
    this environment's packages (its site-packages, added by a .pth file), but not
    Warren, whose editable install is a .pth of that site-packages that a path
    added this way does not run. Returns its interpreter."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    Path(site.strip(), "spark-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run(
        [str(python), "-c", "import pyspark, pyarrow, warren"],
        env=base_env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'warren'" in check.stderr, check.stderr or "warren was importable"
    return python


#: The start of a script that runs a Python without Spark's pyspark.zip and py4j's
#: zip on its PYTHONPATH: pyspark then comes from site-packages with its bytecode
#: instead of compiled from the zip at each start (0.4 s of CPU a process; why
#: that matters: conftest.py's WORKER_PYTHON).
WITHOUT_SPARK_ZIPS = """#!/bin/sh
set -f
IFS=:
kept=
for entry in $PYTHONPATH; do
    case $entry in
        */pyspark.zip | */py4j-*-src.zip) ;;
        *) kept=${kept:+$kept:}$entry ;;
    esac
done
PYTHONPATH=$kept
export PYTHONPATH
"""


def without_spark_zips(python: Path, script: Path) -> Path:
    """A script that runs ``python`` as Spark would, less Spark's zips: the rest of
    PYTHONPATH (Warren's wheel from --py-files among it) is kept."""
    script.write_text(WITHOUT_SPARK_ZIPS + f'exec {shlex.quote(str(python))} "$@"\n')
    script.chmod(0o755)
    return script


def install_wheel(python: Path, wheel: Path) -> None:
    """``pip install`` the wheel into that interpreter's environment, as on a node.
    (--ignore-installed: that pip also sees this environment's editable Warren.)"""
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    run([*pip, "--no-deps", "--ignore-installed", str(wheel)], env=base_env())
    where = run([str(python), "-c", "import warren; print(warren.__file__)"], env=base_env())
    assert where.startswith(str(python.parent.parent)), where


def run(args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(list(args), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{args[:4]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


class Process:
    """A Spark process (spark-class or spark-submit) logging to a file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path, env: Mapping[str, str]):
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.log} (last {lines} lines)\n" + "\n".join(
            self.text().splitlines()[-lines:]
        )

    def wait_for(self, needle: str, timeout: float = START_TIMEOUT) -> None:
        """Until the log holds needle; fails at once if the process exits first."""
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode})\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {needle!r} in {timeout:.0f} s\n{self.tail()}"
                )
            time.sleep(0.1)

    def wait_for_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode})\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: port {port} closed after {timeout:.0f} s\n" + self.tail()
                )
            time.sleep(0.1)

    def finish(self, timeout: float) -> int:
        """Wait for the process to exit by itself; its status."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} still running after {timeout:.0f} s\n" + self.tail()
            ) from None

    def kill(self) -> None:
        """The whole process group: a worker's executors and Python workers too."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def spark_class(cls: str, *args: str) -> list[str]:
    return [str(SPARK_HOME / "bin" / "spark-class"), cls, *args]


def spark_submit(conf: Mapping[str, str], *args: str) -> list[str]:
    """spark-submit with ``--conf key=value`` for each of conf, then args."""
    confs = [a for key, value in conf.items() for a in ("--conf", f"{key}={value}")]
    return [str(SPARK_HOME / "bin" / "spark-submit"), *confs, *args]


#: What every job and server of these tests sets: loopback only, no UI, small JVMs.
LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": JAVA_OPTS,
    "spark.executor.extraJavaOptions": JAVA_OPTS,
}


class StandaloneCluster:
    """A standalone master and workers of 1 core each on 127.0.0.1, each with its own
    work and local directories. Executors inherit the worker's environment, which
    has no PYTHONPATH."""

    def __init__(self, root: Path, master_port: int, workers: int = 2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.url = f"spark://127.0.0.1:{master_port}"
        self.processes: list[Process] = []
        self.work_dirs = [root / f"worker-{i}" for i in range(workers)]
        env = base_env(SPARK_DAEMON_MEMORY="256m", SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS)
        try:
            master = self._start(
                "master",
                spark_class(
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(master_port),
                    "--webui-port",
                    "0",
                ),
                env,
            )
            master.wait_for_port(master_port)
            started = []
            for i, work in enumerate(self.work_dirs):
                local = root / f"local-{i}"
                work.mkdir()
                local.mkdir()
                started.append(
                    self._start(
                        f"worker-{i}",
                        spark_class(
                            "org.apache.spark.deploy.worker.Worker",
                            "--host",
                            "127.0.0.1",
                            "--port",
                            "0",
                            "--webui-port",
                            "0",
                            "--cores",
                            "1",
                            "--memory",
                            "1g",
                            "--work-dir",
                            str(work),
                            self.url,
                        ),
                        dict(env, SPARK_LOCAL_DIRS=str(local)),
                    )
                )
            for worker in started:
                worker.wait_for("Successfully registered with master")
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: list[str], env: Mapping[str, str]) -> Process:
        self.processes.append(Process(name, args, self.root, env))
        return self.processes[-1]

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes)

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.kill()


@contextlib.contextmanager
def standalone_cluster(
    root: Path, master_port: int, workers: int = 2
) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(root, master_port, workers)
    try:
        yield cluster
    finally:
        cluster.stop()
