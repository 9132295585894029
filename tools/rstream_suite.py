#!/usr/bin/env python3
"""Run rstream's own test suite against Warren's stream listener (or any broker).

rstream's maintainers run ``tests/`` against a RabbitMQ with the stream
plugin on ``localhost:5552`` and its management API on 15672. The sdist has
no tests, so, as ``tools/pika_suite.py`` does, this script takes them from
the repository at the tag of the *installed* rstream
(``https://codeload.github.com/rabbitmq-community/rstream/tar.gz/refs/tags/v<version>``,
or ``--source`` a checkout or such a tarball) into ``.cache/rstream-tests/``
once: ``tests/`` only, never ``rstream/`` (the tests import the installed
client). Adapted, without touching a test:

* the broker's stream port is the suite's own ``--rmq-port`` option; the
  management API port, a default argument (15672) of the helpers in
  ``tests/http_requests.py`` and ``tests/util.py``, comes from
  ``RSTREAM_SUITE_HTTP_PORT`` (15672 without it);
* pytest runs with an empty ``pytest.ini`` of the suite's own (rstream's
  ``pyproject.toml`` has no pytest settings): without it pytest would take
  the first configuration above the cache, Warren's;
* ``tests/test_cluster.py`` is left out: it needs a three-node cluster behind
  a load balancer (``--rmq-cluster-*``, ports 5553 and 15673);
* pytest-rerunfailures is blocked (the suite marks a few tests ``flaky``):
  each test gets one chance.

Some tests build their own client on ``localhost:5552`` whatever the options
(:data:`ON_5552`): the broker must listen there for them. rstream's CI starts
RabbitMQ with ``advertised_host localhost`` (Metadata's answer, which
``test_query_leader`` compares with the host the client reached): Warren's
``[stream] advertised_host`` does the same.

Usage (the exit status is pytest's; 6 when the suite cannot be had)::

    .venv/bin/python tools/rstream_suite.py --port 5552 --http-port 15672   # a running broker
    .venv/bin/python tools/rstream_suite.py --source ~/src/rstream -- -k offset
    .venv/bin/python tools/rstream_suite.py --source rstream-v1.1.1.tar.gz --fetch-only

``tests/integration/test_rstream_suite.py`` runs it against an embedded
Warren, with the results it expects.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

DEFAULT_CACHE_DIR = cs.CACHE / "rstream-tests"
URL = "https://codeload.github.com/rabbitmq-community/rstream/tar.gz/refs/tags/v{version}"
EXTRACTED = ("tests",)
REQUIRED = ("tests/conftest.py", "tests/http_requests.py", "tests/util.py")
#: Left out: needs a cluster of three behind a load balancer.
LEFT_OUT = ("tests/test_cluster.py",)
#: Tests that connect to localhost:5552 themselves, whatever ``--rmq-port`` says.
ON_5552 = (
    "tests/test_consumer.py::test_consumer_connection_broke_with_recovery_disabled",
    "tests/test_consumer.py::test_consumer_metadata_update",
    "tests/test_consumer.py::test_consumer_connection_broke_with_recovery_enabled",
    "tests/test_consumer.py::test_consume_with_sac_update_listener_should_be_called_after_kill",
    "tests/test_consumer.py::test_super_stream_consumer_connection_broke_with_recovery_disabled",
    "tests/test_consumer.py::test_super_stream_consumer_connection_broke_recovery_disabled",
    "tests/test_consumer.py::test_super_stream_consumer_connection_broke_with_recovery_enabled",
    "tests/test_producer.py::test_producer_connection_broke",
)
HTTP_PORT_ENV = "RSTREAM_SUITE_HTTP_PORT"
#: Marks the adapted helper modules (adapted once).
MARKER = "# --- adapted by Warren's tools/rstream_suite.py ---"
_DEFAULT_HTTP_PORT = "port: int = 15672"
_ADAPTED_HTTP_PORT = "port: int = _WARREN_HTTP_PORT"
SuiteUnavailable = cs.SuiteUnavailable


def installed_version() -> str:
    return cs.installed_version("rstream")


def adapt(suite: Path) -> None:
    """The management API's port from :data:`HTTP_PORT_ENV` in the helpers'
    default arguments (a line after the module's imports, so it is defined
    before the functions that use it); the suite's empty pytest.ini."""
    (suite / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    for name in ("http_requests.py", "util.py"):
        path = suite / "tests" / name
        text = path.read_text(encoding="utf-8")
        if MARKER in text:
            continue
        if _DEFAULT_HTTP_PORT not in text:
            raise SuiteUnavailable(f"{path}: no {_DEFAULT_HTTP_PORT!r} to adapt")
        lines = text.splitlines(keepends=True)
        first_def = next(
            i for i, line in enumerate(lines) if line.startswith(("def ", "async def "))
        )
        lines.insert(
            first_def,
            f"{MARKER}\nimport os as _warren_os\n\n"
            f'_WARREN_HTTP_PORT = int(_warren_os.environ.get("{HTTP_PORT_ENV}", "15672"))\n\n\n',
        )
        path.write_text("".join(lines).replace(_DEFAULT_HTTP_PORT, _ADAPTED_HTTP_PORT), "utf-8")


def fetch_suite(
    version: str, cache_dir: Path = DEFAULT_CACHE_DIR, source: Path | None = None
) -> Path:
    """The directory holding rstream ``version``'s ``tests/``, adapted; from
    ``source`` (a checkout or a tarball) or the tag's tarball, once."""
    suite = cache_dir / f"rstream-{version}"
    if not (suite / "tests" / "util.py").is_file() or source is not None:
        if source is not None and source.is_dir():
            cs.copy_subset(source, suite, EXTRACTED, required=REQUIRED)
        else:
            tarball = source or cs.download_url(
                URL.format(version=version), cache_dir / f"rstream-{version}.tar.gz"
            )
            cs.extract(tarball, suite, EXTRACTED, required=REQUIRED)
    adapt(suite)
    return suite


def pytest_command(
    suite: Path,
    port: int,
    host: str = "localhost",
    pytest_args: Sequence[str] = (),
    test_timeout: float = 60,
    deselect: Sequence[str] = (),
) -> list[str]:
    options = [
        f"--rmq-host={host}",
        f"--rmq-port={port}",
        "-rfEs",
        "-W",
        "ignore::DeprecationWarning",
    ]
    options += [f"--ignore={path}" for path in LEFT_OUT]
    options += [f"--deselect={node}" for node in deselect]
    return cs.pytest_command(
        ["tests"], suite, suite / "pytest.ini",
        plugins=("no:rerunfailures", "no:xdist", "no:warren", "no:randomly"),
        options=options, test_timeout=test_timeout, pytest_args=pytest_args,
    )  # fmt: skip


def run_suite(
    suite: Path,
    port: int,
    http_port: int,
    pytest_args: Sequence[str] = (),
    *,
    host: str = "localhost",
    test_timeout: float = 60,
    deselect: Sequence[str] = (),
    timeout: float | None = None,
) -> int:
    """Run the suite against the broker's stream ``port`` and management API
    ``http_port``; pytest's exit status."""
    cs.refuse_shadowing(suite, "rstream")
    cmd = pytest_command(suite, port, host, pytest_args, test_timeout, deselect)
    env = {HTTP_PORT_ENV: str(http_port), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return cs.run_pytest(cmd, suite, env=env, timeout=timeout)


def main(argv: Sequence[str] | None = None) -> int:
    own, pytest_args = cs.split_argv(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--host", default="localhost", help="the broker (default: %(default)s)")
    parser.add_argument(
        "--port", type=int, default=5552, help="its stream port (default: %(default)s)"
    )
    parser.add_argument("--http-port", type=int, default=15672,
                        help="its management API (default: %(default)s)")  # fmt: skip
    parser.add_argument("--source", type=Path, help="an rstream checkout or tag tarball")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--test-timeout", type=float, default=60)
    parser.add_argument("--fetch-only", action="store_true",
                        help="fill the cache (e.g. from --source) and run nothing")  # fmt: skip
    args = parser.parse_args(own)
    try:
        suite = fetch_suite(installed_version(), args.cache_dir, args.source)
    except SuiteUnavailable as exc:
        print(f"rstream's tests cannot be had: {exc}", file=sys.stderr)
        return cs.EXIT_UNAVAILABLE
    if args.fetch_only:
        print(suite)
        return 0
    deselect = () if args.port == 5552 else ON_5552
    return run_suite(
        suite, args.port, args.http_port, pytest_args,
        host=args.host, test_timeout=args.test_timeout, deselect=deselect,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
