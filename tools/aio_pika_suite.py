#!/usr/bin/env python3
"""Run aio-pika's own test suite against Warren's pytest fixture (or any broker).

aio-pika's suite starts a RabbitMQ Docker container per session: its
``tests/conftest.py`` refuses to run without Docker (``pytest_configure``
raises a UsageError) and builds the broker URL from the container's mapped
port, with no variable to point it elsewhere. This script, following
``tools/kombu_integration.py``:

* downloads the sdist of the *installed* aio-pika version with ``pip download
  --no-deps --no-binary aio-pika`` into a cache directory (default
  ``.cache/aio-pika-sdist``; later runs need no network) and extracts only
  ``tests/`` and ``pyproject.toml`` (its pytest settings), leaving out the
  sdist's ``aio_pika/`` so that the tests import the installed aio-pika.
  (``--no-binary :all:`` would also refuse the wheels of the sdist's build
  backend, uv_build, which then cannot be built offline.)
* appends to the extracted ``tests/conftest.py`` a block that replaces the
  Docker parts, without touching a test: ``pytest_configure`` (the Docker
  check) does nothing; ``amqp_direct_url``, the session fixture every test's
  connection comes from, is built from Warren's ``warren_broker`` fixture, or
  from ``--host``/``--port`` for another broker (RabbitMQ); ``docker`` and
  ``rabbitmq_container`` skip the few tests that need a container of their
  own (restarting it, its TLS port 5671).
* installs aio-pika's test-only dependencies (aiomisc, aiomisc-pytest, which
  provides the suite's ``event_loop`` fixture and runs its async tests;
  shortuuid, timeout-decorator) with ``pip install --target`` into
  ``<cache>/deps``, put on ``PYTHONPATH`` for the suite only, so they never
  load into Warren's own test runs.
* runs pytest with the sdist's configuration (``-p no:asyncio``: aiomisc runs
  the async tests) plus Warren's plugin (``-p warren.pytest_plugin``) and,
  with pytest-timeout, ``--test-timeout`` seconds per test.

Usage (the exit status is pytest's; 6 when the sdist or the dependencies cannot
be had)::

    .venv/bin/python tools/aio_pika_suite.py                         # Warren, in-process
    .venv/bin/python tools/aio_pika_suite.py --host 127.0.0.1 --port 5672   # e.g. RabbitMQ
    .venv/bin/python tools/aio_pika_suite.py -- -k robust -x          # pytest args

docs/testing.md records the results against Warren and RabbitMQ.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE_DIR = REPO / ".cache" / "aio-pika-sdist"
#: What is extracted from the sdist: the tests and the file with pytest's settings.
EXTRACTED = (PurePosixPath("tests"), PurePosixPath("pyproject.toml"))
#: aio-pika's test-only dependencies that Warren's venv does not have.
TEST_DEPS = (
    "aiomisc", "aiomisc-pytest", "aiothreads", "colorlog", "logging-journald",
    "shortuuid", "timeout-decorator",
)  # fmt: skip
#: Exit status when the sdist or the test dependencies cannot be had.
EXIT_SDIST_UNAVAILABLE = 6
#: Marks the block appended to the suite's conftest.py (appended once).
MARKER = "# --- appended by Warren's tools/aio_pika_suite.py ---"

CONFTEST_OVERRIDES = f"""

{MARKER}
# Later definitions replace the Docker-based ones above (same module names).
import os as _warren_os


def pytest_configure(config):  # noqa: F811 - replaces the Docker availability check
    pass


@pytest.fixture(scope="session")
def docker():  # noqa: F811
    pytest.skip("needs a Docker container of its own (restarted by the test)")


@pytest.fixture(scope="session")
def rabbitmq_container():  # noqa: F811
    pytest.skip("needs the Docker container's TLS port (5671)")


@pytest.fixture(scope="session")
def amqp_direct_url(request) -> URL:  # noqa: F811
    host = _warren_os.environ.get("AIO_PIKA_SUITE_HOST")
    if host:
        port = int(_warren_os.environ["AIO_PIKA_SUITE_PORT"])
    else:
        broker = request.getfixturevalue("warren_broker")
        host, port = broker.host, broker.amqp_port
    return URL.build(
        scheme="amqp", user="guest", password="guest", path="//", host=host, port=port
    )
"""


class SdistUnavailable(RuntimeError):
    """The aio-pika sdist or its test dependencies could not be downloaded."""


def installed_version() -> str:
    return importlib.metadata.version("aio-pika")


def _pip(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check",
         "--retries", "1"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SdistUnavailable(
            f"pip {args[0]} failed (status {proc.returncode}): " + " / ".join(detail)
        )


def fetch_suite(version: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The directory holding ``tests/`` (patched) and ``pyproject.toml`` of aio-pika
    ``version``'s sdist; downloads and extracts it once."""
    suite = cache_dir / f"aio_pika-{version}"
    conftest = suite / "tests" / "conftest.py"
    if conftest.is_file() and MARKER in conftest.read_text():
        return suite
    tarball = cache_dir / f"aio_pika-{version}.tar.gz"
    if not tarball.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        _pip("download", "--no-deps", "--no-binary", "aio-pika", f"aio-pika=={version}",
             "--dest", str(cache_dir))  # fmt: skip
        if not tarball.is_file():
            raise SdistUnavailable(f"pip download gave no {tarball.name}")
    _extract(tarball, suite)
    with open(suite / "tests" / "conftest.py", "a", encoding="utf-8") as f:
        f.write(CONFTEST_OVERRIDES)
    return suite


def fetch_deps(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """A directory with aio-pika's test-only dependencies (``pip install --target``)."""
    deps = cache_dir / "deps"
    if not (deps / "aiomisc_pytest.py").is_file():
        _pip("install", "--no-deps", "--target", str(deps), *TEST_DEPS)
    return deps


def _extract(tarball: Path, dest: Path) -> None:
    """Extract the ``EXTRACTED`` paths of the sdist's top directory into ``dest``."""
    top = dest.name
    with tarfile.open(tarball) as tar:
        members = []
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if len(parts) < 2 or parts[0] != top or ".." in parts:
                continue
            rel = PurePosixPath(*parts[1:])
            if any(rel == p or p in rel.parents for p in EXTRACTED):
                members.append(member)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            tar.extractall(tmp, members=members, filter="data")
            if not (Path(tmp) / top / "tests" / "conftest.py").is_file():
                raise SdistUnavailable(f"{tarball.name} has no tests/conftest.py")
            shutil.rmtree(dest, ignore_errors=True)
            (Path(tmp) / top).rename(dest)


def pytest_command(
    suite: Path, pytest_args: Sequence[str] = (), test_timeout: float = 60
) -> list[str]:
    cmd = [
        sys.executable, "-m", "pytest", "tests",
        "-c", str(suite / "pyproject.toml"), "--rootdir", str(suite), "--confcutdir", str(suite),
        "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "log_cli=false",
        # Warren's plugin by module (blocking its entry point name avoids a double load).
        "-p", "no:warren", "-p", "warren.pytest_plugin",
        "-W", "ignore::DeprecationWarning", "-rfEs",
    ]  # fmt: skip
    if test_timeout > 0 and importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={test_timeout:g}")
    return [*cmd, *pytest_args]


def run_suite(
    suite: Path,
    deps: Path,
    host: str | None = None,
    port: int | None = None,
    pytest_args: Sequence[str] = (),
    *,
    test_timeout: float = 60,
) -> int:
    """Run the suite against Warren's fixture, or ``host:port``; pytest's exit status."""
    if (suite / "aio_pika").exists():  # would shadow the installed aio-pika
        raise RuntimeError(f"{suite / 'aio_pika'} must not exist")
    path = [str(deps), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.pop("AIO_PIKA_SUITE_HOST", None)
    if host is not None:
        env.update(AIO_PIKA_SUITE_HOST=host, AIO_PIKA_SUITE_PORT=str(port))
    cmd = pytest_command(suite, pytest_args, test_timeout)
    return subprocess.run(cmd, cwd=suite, env=env).returncode


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = argv, []
    if "--" in argv:
        ours, pytest_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        description="Run aio-pika's test suite (from the sdist of the installed aio-pika) "
        "against Warren's pytest fixture, or an AMQP broker at --host/--port. "
        "Arguments after -- go to pytest.",
        allow_abbrev=False,
    )
    parser.add_argument("--host", help="test this broker instead of Warren's fixture")
    parser.add_argument("--port", type=int, default=5672, help="with --host (default: %(default)s)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="where the sdist and the test dependencies go (default: %(default)s)",
    )
    parser.add_argument(
        "--test-timeout",
        type=float,
        default=60,
        help="seconds each test may take, with pytest-timeout; 0 disables (default: %(default)s)",
    )
    opts = parser.parse_args(ours)
    version = installed_version()
    try:
        suite = fetch_suite(version, opts.cache_dir)
        deps = fetch_deps(opts.cache_dir)
    except SdistUnavailable as exc:
        print(f"aio_pika_suite: {exc}", file=sys.stderr)
        return EXIT_SDIST_UNAVAILABLE
    target = f"{opts.host}:{opts.port}" if opts.host else "Warren (warren_broker fixture)"
    print(f"aio-pika {version}: {suite / 'tests'}; broker: {target}", flush=True)
    return run_suite(
        suite, deps, opts.host, opts.port if opts.host else None, pytest_args,
        test_timeout=opts.test_timeout,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
