#!/usr/bin/env python3
"""Run aiormq's own test suite (plain and TLS) against Warren's pytest fixture.

aiormq's tests connect through four URLs, the ``amqp_url`` fixture's
parameters ``amqp``, ``amqp-named``, ``amqps`` and ``amqps-client`` (TLS with
the suite's CA, and also with its client certificate), built from the fixtures
``amqp_direct_url`` and ``rabbitmq_container`` (``.ports["5671/tcp"]``), which
its sdist's ``tests/conftest.py`` uses but does not define (its CI provides
them with a Docker container of the image in ``tests/certs/Dockerfile``).
This script (the shared parts are in ``tools/client_suites.py``), like
``tools/aio_pika_suite.py``:

* downloads the sdist of the *installed* aiormq with ``pip download --no-deps
  --no-binary aiormq`` into ``.cache/aiormq`` (``--no-binary :all:`` fails:
  the build backend, poetry-core, would have to be built from source) and
  extracts ``tests/`` and ``pyproject.toml``, never ``aiormq/``;
* appends to the extracted ``tests/conftest.py`` the fixtures
  ``amqp_direct_url`` and ``rabbitmq_container`` built from Warren's
  ``warren_broker`` fixture (or ``--host``/``--port``/``--tls-port``), and a
  ``docker`` fixture that skips; no test is touched;
* gives that Warren the TLS setup of the suite's image
  (``tests/certs/rabbitmq.conf``): a TLS listener with the suite's
  ``server.pem``/``server.key``, client certificates verified against its
  ``ca.pem`` (``verify_peer``) but not required (``fail_if_no_peer_cert =
  false``), ``max_message_size`` 128 MiB;
* installs the test-only dependencies (aiomisc, aiomisc-pytest: the
  ``event_loop``, ``tcp_proxy`` and ``localhost`` fixtures) with ``pip install
  --target`` into ``.cache/aiormq/deps``.

Usage (the exit status is pytest's; 6 when the sdist or the dependencies cannot
be had)::

    .venv/bin/python tools/aiormq_suite.py                                   # Warren, in-process
    .venv/bin/python tools/aiormq_suite.py --host 127.0.0.1 --port 5672 --tls-port 5671
    .venv/bin/python tools/aiormq_suite.py -- -k "amqps and not client" -x   # pytest args

Another broker must serve the suite's ``tests/certs/server.pem`` on its TLS
port, as the Docker image does. docs/testing.md records the results.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

DEFAULT_CACHE_DIR = cs.CACHE / "aiormq"
EXTRACTED = ("tests", "pyproject.toml")
REQUIRED = ("tests/conftest.py", "tests/certs/ca.pem", "tests/certs/server.pem",
            "tests/certs/server.key", "tests/certs/client.pem", "tests/certs/client.key")  # fmt: skip
#: aiormq's test-only dependencies that Warren's venv does not have.
TEST_DEPS = ("aiomisc", "aiomisc-pytest", "aiothreads", "colorlog", "logging-journald")
MARKER = "# --- appended by Warren's tools/aiormq_suite.py ---"
#: The suite's image: "max_message_size = 134217728" (it publishes above 16 MiB).
MAX_MESSAGE_SIZE = 128 * 1024 * 1024


def fetch_suite(version: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    suite = cache_dir / f"aiormq-{version}"
    conftest = suite / "tests" / "conftest.py"
    if not (conftest.is_file() and MARKER in conftest.read_text(encoding="utf-8")):
        tarball = cs.download_sdist("aiormq", version, cache_dir)
        cs.extract(tarball, suite, EXTRACTED, required=REQUIRED)
        cs.append_once(conftest, MARKER, cs.docker_conftest_overrides(MARKER))
    return suite


def warren_config(suite: Path, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """tests/certs/rabbitmq.conf as a Warren INI (the TLS listener on a free port)."""
    certs = suite / "tests" / "certs"
    tls = cs.TLSFiles(certs / "ca.pem", certs / "server.pem", certs / "server.key")
    return cs.warren_ini(
        cache_dir / "warren-tls.ini", tls, tls_port=0, verify_peer=True,
        fail_if_no_peer_cert=False, max_message_size=MAX_MESSAGE_SIZE,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ours, pytest_args = cs.split_argv(argv)
    parser = cs.suite_parser(
        "Run aiormq's test suite (from the sdist of the installed aiormq), plain and over "
        "TLS, against Warren's pytest fixture, or an AMQP broker at --host/--port/--tls-port.",
        DEFAULT_CACHE_DIR,
        host_help="test this broker instead of Warren's fixture",
    )
    opts = parser.parse_args(ours)
    version = cs.installed_version("aiormq")
    try:
        suite = fetch_suite(version, opts.cache_dir)
        deps = cs.install_deps(opts.cache_dir / "deps", TEST_DEPS, "aiomisc_pytest.py")
    except cs.SuiteUnavailable as exc:
        print(f"aiormq_suite: {exc}", file=sys.stderr)
        return cs.EXIT_UNAVAILABLE
    cs.refuse_shadowing(suite, "aiormq")
    options = ["-W", "ignore::DeprecationWarning", "-rfEs"]
    if opts.host:
        target = f"{opts.host}:{opts.port}, amqps {opts.tls_port}"
        env = cs.docker_suite_env(opts.host, opts.port, opts.tls_port)
    else:
        config = warren_config(suite, opts.cache_dir)
        target = f"Warren (warren_broker fixture, TLS per {config})"
        env = cs.docker_suite_env(None, None, None)
        options += ["--warren-config", str(config)]
    print(f"aiormq {version}: {suite / 'tests'}; broker: {target}", flush=True)
    cmd = cs.pytest_command(
        ["tests"], suite, suite / "pyproject.toml",
        plugins=("no:xdist", "no:warren", "warren.pytest_plugin"),
        options=options, test_timeout=opts.test_timeout, pytest_args=pytest_args,
    )  # fmt: skip
    return cs.run_pytest(cmd, suite, env=env, pythonpath=[deps])


if __name__ == "__main__":
    sys.exit(main())
