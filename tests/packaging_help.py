"""What the README and packaging tests share: a copy of the checkout, a
wheelhouse of the broker's runtime dependencies, the README's quick start, and
a private network namespace where the quick start's fixed ports are free.

The quick start is run as written, so it listens on 5672, 15672 ... and talks
to 127.0.0.1:5672. Run as it is on a shared machine it could meet another
broker on those ports (another test, a developer's `make run`). Inside
`unshare -rn` (a user and network namespace: its own loopback, no other
process's sockets) the ports are always free; where the kernel does not allow
unprivileged namespaces the tests skip, saying so. The namespace has no route
out, so pip installs from a wheelhouse fetched beforehand (PIP_NO_INDEX,
PIP_FIND_LINKS: the environment, not the commands, changes).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def checkout_copy(dest: Path) -> Path:
    """The checkout's files as they are on disk (tracked ones and new ones git
    does not ignore; no .venv, data or build outputs) copied to ``dest``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the files to copy are git's)")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # (a file deleted but not yet committed is listed too)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def runtime_requirements() -> list[str]:
    """pyproject's runtime dependencies and its fast extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["fast"]]


def wheelhouse(factory: pytest.TempPathFactory, *extra: str) -> Path:
    """Wheels of the runtime dependencies, ``extra`` requirements and what an
    editable install without build isolation needs (setuptools), from PyPI.
    Fetched once per pytest run: the README and packaging tests share it (under
    xdist in the run's directory above every worker's, behind a lock), as a pip
    download is some 1.5 s of CPU (issue 29)."""
    requirements = [*runtime_requirements(), *build_requirements(), *extra]
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    key = hashlib.sha1("\0".join(requirements).encode()).hexdigest()[:12]
    dest, done_mark = base / f"wheels-{key}", base / f"wheels-{key}.done"
    with open(base / "wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done_mark.exists():
            return dest
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(dest),
             *requirements],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            if "NewConnectionError" in done.stderr or "No matching distribution" in done.stderr:
                pytest.skip(f"cannot fetch the runtime dependencies from PyPI: {done.stderr[-300:]}")
            raise AssertionError(f"pip download failed:\n{done.stderr}")
        done_mark.touch()
    return dest


def build_requirements() -> list[str]:
    """pyproject's build-system requirements other than mypy (nothing is compiled)."""
    system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    return [r for r in system["requires"] if not r.startswith("mypy")]


def quick_start() -> str:
    """The README's quick start: the first ``sh`` block under ``## Quick start``."""
    readme = (ROOT / "README.md").read_text()
    m = re.search(
        r"^## Quick start\n\n(?:<!--[^\n]*-->\n)*```sh\n(.*?)^```$", readme, re.MULTILINE | re.DOTALL
    )
    assert m, "README.md has no ## Quick start with an sh block"
    return m.group(1)


def quick_start_python() -> str:
    """The Python client of the quick start (its ``<<'EOF'`` document)."""
    m = re.search(r"<<'EOF'\n(.*?)^EOF$", quick_start(), re.MULTILINE | re.DOTALL)
    assert m, "the quick start has no <<'EOF' Python document"
    return m.group(1)


def require_namespaces() -> None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a private network")
    probe = subprocess.run(
        ["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private network namespace: {probe.stderr.strip()}")


#: What a child must not inherit: this checkout's sources or virtualenv, and the
#: variables make passes to sub-makes (``make test VENV=...`` puts VENV=... in
#: MAKEFLAGS, which a child's own ``make install`` would obey).
_NOT_INHERITED = frozenset(
    {
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "WARREN_PURE_PYTHON",
        "PYTHONHOME",
        "MAKEFLAGS",
        "MAKELEVEL",
        "MAKEOVERRIDES",
        "MFLAGS",
    }
)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a child at this checkout's
    sources or virtualenv (PYTHONPATH, VIRTUAL_ENV, WARREN_PURE_PYTHON) or hand
    it the make command line the tests run under (MAKEFLAGS & co)."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env.update(extra)
    return env


def run_isolated(script: Path, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """``bash -e script`` in a private network namespace, in its own process
    group, which is ended once the script has (its background jobs with it).
    Returns the output (a file: background jobs keep a pipe open); fails with
    it when the script fails."""
    log = script.with_suffix(".log")
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec bash -e "$0"', str(script)],
            cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(proc.pid)
            raise AssertionError(
                f"{script.name} did not finish in {timeout:g}s:\n{log.read_text()}"
            ) from None
        _end_group(proc.pid)
    out = log.read_text()
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{out}"
    return out


def _end_group(pgid: int) -> None:
    """SIGTERM to the group (the brokers stop cleanly), SIGKILL what is left after 30 s."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
