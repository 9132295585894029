#!/usr/bin/env python3
"""Run aio-pika's own test suite against Warren's pytest fixture (or any broker).

aio-pika's suite starts a RabbitMQ Docker container per session: its
``tests/conftest.py`` refuses to run without Docker (``pytest_configure``
raises a UsageError) and builds the broker URLs from the container's mapped
ports, with no variable to point it elsewhere. This script (the shared parts
are in ``tools/client_suites.py``):

* downloads the sdist of the *installed* aio-pika version with ``pip download
  --no-deps --no-binary aio-pika`` into a cache directory (default
  ``.cache/aio-pika-sdist``; later runs need no network) and extracts only
  ``tests/`` and ``pyproject.toml`` (its pytest settings), leaving out the
  sdist's ``aio_pika/`` so that the tests import the installed aio-pika.
  (``--no-binary :all:`` would also refuse the wheels of the sdist's build
  backend, uv_build, which then cannot be built offline.)
* appends to the extracted ``tests/conftest.py`` a block that replaces the
  Docker parts, without touching a test: ``pytest_configure`` (the Docker
  check) does nothing; ``amqp_direct_url``, the session fixture every plain
  connection comes from, and ``rabbitmq_container``, whose
  ``ports["5671/tcp"]`` ``tests/test_amqps.py`` connects to with amqps, are
  built from Warren's ``warren_broker`` fixture, or from
  ``--host``/``--port``/``--tls-port`` for another broker (RabbitMQ); ``docker``
  skips the few tests that restart a container of their own.
* starts that fixture's Warren with a TLS listener (``--warren-config``, an INI
  in the cache: a free port, like the suite's container ``verify_peer`` with
  ``fail_if_no_peer_cert = false``). The sdist ships no certificates (the
  container's image has them), so a CA and a server certificate for
  localhost/127.0.0.1 are generated with trustme into ``<cache>/certs``;
  ``test_amqps.py`` does not verify the server's certificate.
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
    .venv/bin/python tools/aio_pika_suite.py --host 127.0.0.1 --port 5672 --tls-port 5671
    .venv/bin/python tools/aio_pika_suite.py -- -k robust -x          # pytest args

docs/testing.md records the results against Warren and RabbitMQ.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

REPO = cs.REPO
DEFAULT_CACHE_DIR = cs.CACHE / "aio-pika-sdist"
#: What is extracted from the sdist: the tests and the file with pytest's settings.
EXTRACTED = ("tests", "pyproject.toml")
#: aio-pika's test-only dependencies that Warren's venv does not have.
TEST_DEPS = (
    "aiomisc", "aiomisc-pytest", "aiothreads", "colorlog", "logging-journald",
    "shortuuid", "timeout-decorator",
)  # fmt: skip
#: Exit status when the sdist or the test dependencies cannot be had.
EXIT_SDIST_UNAVAILABLE = cs.EXIT_UNAVAILABLE
#: Marks the block appended to the suite's conftest.py (appended once).
MARKER = "# --- appended by Warren's tools/aio_pika_suite.py ---"
CONFTEST_OVERRIDES = cs.docker_conftest_overrides(MARKER)
SdistUnavailable = cs.SuiteUnavailable


def installed_version() -> str:
    return cs.installed_version("aio-pika")


def fetch_suite(version: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The directory holding ``tests/`` (patched) and ``pyproject.toml`` of aio-pika
    ``version``'s sdist; downloads and extracts it once."""
    suite = cache_dir / f"aio_pika-{version}"
    conftest = suite / "tests" / "conftest.py"
    if not (conftest.is_file() and MARKER in conftest.read_text(encoding="utf-8")):
        tarball = cs.download_sdist("aio-pika", version, cache_dir)
        cs.extract(tarball, suite, EXTRACTED, required=("tests/conftest.py",))
        cs.append_once(conftest, MARKER, CONFTEST_OVERRIDES)
    return suite


def fetch_deps(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """A directory with aio-pika's test-only dependencies (``pip install --target``)."""
    return cs.install_deps(cache_dir / "deps", TEST_DEPS, "aiomisc_pytest.py")


def warren_config(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The INI for the ``warren_broker`` fixture: a TLS listener on a free port with
    trustme certificates (generated once into ``<cache>/certs``)."""
    tls = cs.make_certs(cache_dir / "certs")
    return cs.warren_ini(cache_dir / "warren-tls.ini", tls, tls_port=0, verify_peer=True)


def pytest_command(
    suite: Path,
    pytest_args: Sequence[str] = (),
    test_timeout: float = 60,
    config: Path | None = None,
) -> list[str]:
    options = ["-o", "log_cli=false", "-W", "ignore::DeprecationWarning", "-rfEs"]
    if config is not None:
        options += ["--warren-config", str(config)]
    return cs.pytest_command(
        ["tests"], suite, suite / "pyproject.toml",
        # Warren's plugin by module (blocking its entry point name avoids a double load).
        plugins=("no:xdist", "no:warren", "warren.pytest_plugin"),
        options=options, test_timeout=test_timeout, pytest_args=pytest_args,
    )  # fmt: skip


def run_suite(
    suite: Path,
    deps: Path,
    host: str | None = None,
    port: int | None = None,
    pytest_args: Sequence[str] = (),
    *,
    tls_port: int | None = None,
    test_timeout: float = 60,
    config: Path | None = None,
) -> int:
    """Run the suite against Warren's fixture (configured by ``config``), or
    ``host:port`` (and ``tls_port``); pytest's exit status."""
    cs.refuse_shadowing(suite, "aio_pika")
    cmd = pytest_command(suite, pytest_args, test_timeout, config if host is None else None)
    env = cs.docker_suite_env(host, port, tls_port)
    return cs.run_pytest(cmd, suite, env=env, pythonpath=[deps])


def main(argv: Sequence[str] | None = None) -> int:
    ours, pytest_args = cs.split_argv(argv)
    parser = cs.suite_parser(
        "Run aio-pika's test suite (from the sdist of the installed aio-pika), plain and "
        "over TLS, against Warren's pytest fixture, or an AMQP broker at "
        "--host/--port/--tls-port.",
        DEFAULT_CACHE_DIR,
        host_help="test this broker instead of Warren's fixture",
        tls_port=None,
        tls_port_help="with --host: its amqps port; without it tests/test_amqps.py is skipped",
    )
    opts = parser.parse_args(ours)
    version = installed_version()
    try:
        suite = fetch_suite(version, opts.cache_dir)
        deps = fetch_deps(opts.cache_dir)
    except SdistUnavailable as exc:
        print(f"aio_pika_suite: {exc}", file=sys.stderr)
        return EXIT_SDIST_UNAVAILABLE
    config = None if opts.host else warren_config(opts.cache_dir)
    if opts.host:
        tls = f", amqps {opts.tls_port}" if opts.tls_port else ", no amqps (--tls-port)"
        target = f"{opts.host}:{opts.port}{tls}"
    else:
        target = f"Warren (warren_broker fixture, TLS per {config})"
    print(f"aio-pika {version}: {suite / 'tests'}; broker: {target}", flush=True)
    return run_suite(
        suite, deps, opts.host, opts.port if opts.host else None, pytest_args,
        tls_port=opts.tls_port, test_timeout=opts.test_timeout, config=config,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
