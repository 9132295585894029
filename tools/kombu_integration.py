#!/usr/bin/env python3
"""Run kombu's own py-amqp integration suite against Warren (or any AMQP broker).

kombu's maintainers run ``t/integration/test_py_amqp.py`` against RabbitMQ; it
is the closest thing to an acceptance test that the kombu/Celery stack works
on a broker. The tests ship only in kombu's sdist (the wheel has none), so
this script:

* downloads the sdist of the *installed* kombu version with ``pip download
  --no-deps --no-binary :all:`` into a cache directory (default
  ``.cache/kombu-sdist``; later runs need no network) and extracts only
  ``t/`` and ``setup.cfg``. Leaving out the sdist's ``kombu/`` package is what
  makes the tests import the installed kombu: pytest's default import mode
  puts the sdist root first on ``sys.path`` (``t/`` is a package), and
  ``t/integration/__init__.py`` inserts the working directory and its parent.
  pytest runs in the extracted directory, which holds no ``kombu/``.
* runs pytest with the sdist's ``setup.cfg`` as its configuration (its
  ``python_classes = test_*`` is what collects the suite's lower-case test
  classes) and the broker in ``RABBITMQ_HOST`` / ``RABBITMQ_5672_TCP``, the
  variables the suite reads. It connects as guest/guest to vhost ``/``, so the
  broker must allow guest from this host (both RabbitMQ and Warren allow it
  from loopback only).
* blocks pytest-rerunfailures: kombu's CI reruns the tests it marks
  ``flaky`` up to 5 times; here every test gets one chance. Without the
  plugin the ``flaky`` and ``env`` marks are unknown, so their warnings are
  silenced. With pytest-timeout installed each test gets ``--test-timeout``
  seconds, so a broker that never answers fails a test instead of hanging.

Usage (the exit status is pytest's; 6 when the sdist cannot be had)::

    .venv/bin/python tools/kombu_integration.py --start-warren        # a fresh Warren subprocess
    .venv/bin/python tools/kombu_integration.py --host 127.0.0.1 --port 5672   # e.g. RabbitMQ
    .venv/bin/python tools/kombu_integration.py --start-warren -- -k Priority -x   # pytest args

``tests/integration/test_kombu_integration_suite.py`` runs the same suite against an
embedded Warren as part of Warren's own tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

REPO = cs.REPO
DEFAULT_CACHE_DIR = cs.CACHE / "kombu-sdist"
#: The suite inside the extracted sdist.
SUITE_FILE = PurePosixPath("t/integration/test_py_amqp.py")
#: What is extracted from the sdist: the tests and the file with pytest's settings.
EXTRACTED = ("t", "setup.cfg")
#: Exit status when the sdist can neither be found in the cache nor downloaded.
EXIT_SDIST_UNAVAILABLE = cs.EXIT_UNAVAILABLE
SdistUnavailable = cs.SuiteUnavailable


def installed_kombu_version() -> str:
    return cs.installed_version("kombu")


def fetch_suite(version: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The directory holding ``t/`` and ``setup.cfg`` of kombu ``version``'s sdist.

    Downloads the sdist into ``cache_dir`` unless it is there already, and
    extracts it once; raises :class:`SdistUnavailable` when pip cannot get it.
    """
    suite = cache_dir / f"kombu-{version}"
    if (suite / SUITE_FILE).is_file() and (suite / "setup.cfg").is_file():
        return suite
    tarball = cs.download_sdist("kombu", version, cache_dir, no_binary=":all:")
    cs.extract(tarball, suite, EXTRACTED, required=(str(SUITE_FILE),))
    return suite


def pytest_command(
    suite: Path, pytest_args: Sequence[str] = (), test_timeout: float = 30
) -> list[str]:
    return cs.pytest_command(
        [str(suite / SUITE_FILE)], suite, suite / "setup.cfg",
        plugins=("no:rerunfailures",),
        options=("-W", "ignore::pytest.PytestUnknownMarkWarning"),
        test_timeout=test_timeout, pytest_args=pytest_args,
    )  # fmt: skip


def run_suite(
    suite: Path,
    host: str,
    port: int,
    pytest_args: Sequence[str] = (),
    *,
    test_timeout: float = 30,
    timeout: float | None = None,
) -> int:
    """Run the suite against ``host:port``; returns pytest's exit status."""
    cs.refuse_shadowing(suite, "kombu")  # would shadow the installed kombu (see the docstring)
    env = {"RABBITMQ_HOST": host, "RABBITMQ_5672_TCP": str(port)}
    cmd = pytest_command(suite, pytest_args, test_timeout)
    return cs.run_pytest(cmd, suite, env=env, timeout=timeout)


@contextmanager
def warren_subprocess(log: IO[str]) -> Iterator[int]:
    """A fresh Warren (``python -m warren``) on an ephemeral port; yields the port.

    Its log goes to ``log``; it is stopped with SIGTERM at the end.
    """
    with cs.warren_subprocess(log) as ports:
        yield ports.amqp


def main(argv: Sequence[str] | None = None) -> int:
    ours, pytest_args = cs.split_argv(argv)
    parser = argparse.ArgumentParser(
        description="Run kombu's t/integration/test_py_amqp.py (from the sdist of the "
        "installed kombu) against an AMQP broker. Arguments after -- go to pytest.",
        allow_abbrev=False,
    )
    parser.add_argument("--host", default="127.0.0.1", help="broker host (default: %(default)s)")
    parser.add_argument("--port", type=int, default=5672, help="broker port (default: %(default)s)")
    parser.add_argument(
        "--start-warren",
        action="store_true",
        help="start a fresh Warren subprocess on an ephemeral port and test it "
        "(--host and --port are ignored)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="where the sdist is downloaded and extracted (default: %(default)s)",
    )
    parser.add_argument(
        "--test-timeout",
        type=float,
        default=30,
        help="seconds each test may take, with pytest-timeout; 0 disables (default: %(default)s)",
    )
    opts = parser.parse_args(ours)

    version = installed_kombu_version()
    try:
        suite = fetch_suite(version, opts.cache_dir)
    except SdistUnavailable as exc:
        print(f"kombu_integration: {exc}", file=sys.stderr)
        return EXIT_SDIST_UNAVAILABLE
    print(f"kombu {version}: {suite / SUITE_FILE}", flush=True)

    if not opts.start_warren:
        print(f"broker: {opts.host}:{opts.port}", flush=True)
        return run_suite(suite, opts.host, opts.port, pytest_args, test_timeout=opts.test_timeout)

    with tempfile.TemporaryFile("w+") as log:
        with warren_subprocess(log) as port:
            print(f"broker: Warren subprocess on 127.0.0.1:{port}", flush=True)
            status = run_suite(
                suite, "127.0.0.1", port, pytest_args, test_timeout=opts.test_timeout
            )
        if status != 0:
            cs.print_log_tail(log)
    return status


if __name__ == "__main__":
    sys.exit(main())
