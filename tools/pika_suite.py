#!/usr/bin/env python3
"""Run pika's own acceptance tests, plain and with ``--use-tls``, against Warren.

pika's sdist has no tests; its repository at the tag of the *installed*
version has ``tests/acceptance/`` (run against a live broker),
``tests/conftest.py`` (the ``--use-tls`` option) and ``testdata/certs/`` (the
CA, the server's and a client's certificates). The broker's addresses are
hard-coded: ``amqp://...@127.0.0.1:5672`` (blocking adapter tests),
``localhost:5672`` and, with ``--use-tls``,
``amqps://localhost:5671/%2F?ssl_options=...testdata/certs/...`` (the async
adapter tests; relative paths). So this script (the shared parts are in
``tools/client_suites.py``):

* gets the sources of tag ``<version>`` once into ``.cache/pika``: from
  https://codeload.github.com/pika/pika/tar.gz/refs/tags/<version>, or from
  ``--source`` (a checkout, or such a tarball); it extracts only ``tests/``,
  ``testdata/certs/`` and ``pyproject.toml`` (pytest's settings), never
  ``pika/``, so that the installed pika is tested;
* installs the acceptance tests' optional dependencies gevent, tornado and
  twisted (pika's own test environment has them) with ``pip install
  --target`` into ``.cache/pika/deps`` (when that fails, the tests that need
  them are left out, and the script says so);
* starts a fresh Warren subprocess on the fixed ports 5672 and 5671 (it stops
  if something listens there already) with the TLS setup of pika's CI broker
  (``testdata/rabbitmq.conf.in``): the suite's ``server_certificate.pem`` (CN
  shostakovich, SAN localhost), client certificates verified against its
  ``ca_certificate.pem`` and required (``verify_peer``,
  ``fail_if_no_peer_cert = true``);
* runs ``tests/acceptance`` twice from the extracted root: plain, then with
  ``--use-tls`` (the blocking adapter tests connect in plain in both runs: only
  the async adapter tests switch to TLS, as in pika's CI), deselecting
  ``TestGetaddrinfoWWWGoogleDotComPort80`` (it resolves www.google.com: no
  internet here).

Usage (the exit status is the first failing run's pytest status, else 0; 6 when
the sources cannot be had; 7 when port 5672 or 5671 is taken)::

    .venv/bin/python tools/pika_suite.py --source /path/to/pika-checkout
    .venv/bin/python tools/pika_suite.py --variant tls -- -k Blocking -x   # pytest args
    .venv/bin/python tools/pika_suite.py --host localhost   # a broker already on 5672/5671

docs/testing.md records the results.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

DEFAULT_CACHE_DIR = cs.CACHE / "pika"
URL = "https://codeload.github.com/pika/pika/tar.gz/refs/tags/{version}"
EXTRACTED = ("tests", "testdata/certs", "pyproject.toml")
CERTS = ("ca_certificate.pem", "server_certificate.pem", "server_key.pem",
         "client_certificate.pem", "client_key.pem")  # fmt: skip
REQUIRED = ("tests/conftest.py", "tests/acceptance", "pyproject.toml",
            *(f"testdata/certs/{c}" for c in CERTS))  # fmt: skip
#: The ports the suite hard-codes.
PORT, TLS_PORT = 5672, 5671
EXIT_PORTS_TAKEN = 7
#: Optional test dependencies: (pip name, module, how the tests that need it are left out
#: when it cannot be installed: a -k keyword, or a file to --ignore).
OPTIONAL_DEPS = (
    ("gevent", "gevent", "-k", "gevent"),
    ("tornado", "tornado", "-k", "tornado"),
    ("twisted", "twisted", "--ignore", "tests/acceptance/twisted_adapter_tests.py"),
)
#: Tests deselected here (node id prefixes), with the reason.
DESELECTED = {
    "tests/acceptance/io_services_tests.py::TestGetaddrinfoWWWGoogleDotComPort80::": (
        "resolves www.google.com (internet; none here)"
    ),
}


def fetch_suite(version: str, cache_dir: Path, source: Path | None = None) -> Path:
    suite = cache_dir / f"pika-{version}"
    if all((suite / r).exists() for r in REQUIRED):
        return suite
    if source is not None and source.is_dir():
        cs.copy_subset(source, suite, EXTRACTED, required=REQUIRED)
    else:
        tarball = source or cs.download_url(
            URL.format(version=version), cache_dir / f"pika-{version}.tar.gz"
        )
        cs.extract(tarball, suite, EXTRACTED, required=REQUIRED)
    return suite


def fetch_deps(cache_dir: Path) -> tuple[Path, list[str]]:
    """The directory with gevent, tornado and twisted, and the pytest options that
    leave out the tests of those that could not be installed (each reported)."""
    deps = cache_dir / "deps"
    keywords: list[str] = []
    options: list[str] = []
    for name, module, how, what in OPTIONAL_DEPS:
        if (deps / module).is_dir() or importlib.util.find_spec(module) is not None:
            continue
        try:
            cs.install_deps(deps, [name], module, no_deps=False)
        except cs.SuiteUnavailable as exc:
            print(f"pika_suite: no {name} ({exc}); leaving out: {how} {what}", flush=True)
            if how == "-k":
                keywords.append(what)
            else:
                options += [how, what]
    if keywords:
        options += ["-k", " and ".join(f"not {k}" for k in keywords)]
    return deps, options


def run_variant(
    suite: Path, deps: Path, tls: bool, options: Sequence[str], pytest_args: Sequence[str],
    test_timeout: float,
) -> int:  # fmt: skip
    cs.refuse_shadowing(suite, "pika")
    opts = ["-W", "ignore::DeprecationWarning", "-rfEs", *options]
    for test, reason in DESELECTED.items():
        print(f"deselected: {test}: {reason}", flush=True)
        opts += ["--deselect", test]
    if tls:
        opts.append("--use-tls")
    cmd = cs.pytest_command(
        ["tests/acceptance"], suite, suite / "pyproject.toml",
        plugins=("no:xdist", "no:warren"),
        options=opts, test_timeout=test_timeout, pytest_args=pytest_args,
    )  # fmt: skip
    print(f"== pika acceptance tests, {'TLS (--use-tls)' if tls else 'plain'} ==", flush=True)
    return cs.run_pytest(cmd, suite, pythonpath=[deps])


def is_loopback(host: str) -> bool:
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None)
        )
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    ours, pytest_args = cs.split_argv(argv)
    parser = cs.suite_parser(
        "Run pika's tests/acceptance (from the repository at the installed version's tag), "
        "plain and with --use-tls, against a fresh Warren subprocess on 5672/5671.",
        DEFAULT_CACHE_DIR,
        host_help="test the broker already listening on this (loopback) host's 5672/5671 "
        "instead of starting Warren",
        port_help="with --host; must be 5672",
        tls_port=TLS_PORT,
        tls_port_help="with --host; must be 5671",
    )
    parser.add_argument("--source", type=Path,
                        help="a pika checkout (or tag tarball) instead of downloading it")  # fmt: skip
    parser.add_argument("--variant", choices=("plain", "tls", "both"), default="both")
    opts = parser.parse_args(ours)
    if opts.host and (not is_loopback(opts.host) or (opts.port, opts.tls_port) != (PORT, TLS_PORT)):
        parser.error(
            f"pika's suite hard-codes localhost:{PORT} and localhost:{TLS_PORT}: "
            "the broker must listen there"
        )
    version = cs.installed_version("pika")
    try:
        suite = fetch_suite(version, opts.cache_dir, opts.source)
    except cs.SuiteUnavailable as exc:
        print(f"pika_suite: {exc}", file=sys.stderr)
        return cs.EXIT_UNAVAILABLE
    deps, leave_out = fetch_deps(opts.cache_dir)
    variants = {"plain": [False], "tls": [True], "both": [False, True]}[opts.variant]
    print(f"pika {version}: {suite / 'tests/acceptance'}", flush=True)

    def run_all() -> int:
        status = 0
        for tls in variants:
            result = run_variant(suite, deps, tls, leave_out, pytest_args, opts.test_timeout)
            status = status or result
        return status

    if opts.host:
        print(f"broker: the one on {opts.host}:{PORT}, amqps {TLS_PORT}", flush=True)
        return run_all()
    busy = cs.busy_ports("127.0.0.1", (PORT, TLS_PORT))
    if busy:
        print(f"pika_suite: port(s) {busy} already taken on 127.0.0.1; pika's suite "
              f"needs {PORT} and {TLS_PORT} (stop that broker, or test it with --host "
              "localhost)", file=sys.stderr)  # fmt: skip
        return EXIT_PORTS_TAKEN
    certs = suite / "testdata" / "certs"
    tls = cs.TLSFiles(certs / "ca_certificate.pem", certs / "server_certificate.pem",
                      certs / "server_key.pem")  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="pika-suite-") as tmp,
        tempfile.TemporaryFile("w+") as log,
    ):
        config = cs.warren_ini(Path(tmp) / "warren.ini", tls, tls_port=TLS_PORT,
                               verify_peer=True, fail_if_no_peer_cert=True)  # fmt: skip
        with cs.warren_subprocess(log, amqp_port=PORT, config=config) as ports:
            print(f"broker: Warren subprocess on {ports.host}:{ports.amqp}, amqps {ports.amqps}")
            status = run_all()
        if status != 0:
            cs.print_log_tail(log)
    return status


if __name__ == "__main__":
    sys.exit(main())
