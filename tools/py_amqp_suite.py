#!/usr/bin/env python3
"""Run py-amqp's own integration suite (plain and TLS) against Warren (or any broker).

py-amqp's ``t/integration/test_rmq.py`` runs every test over a plain and a TLS
connection (the ``connection`` fixture's parameters ``plain``/``tls``) to the
broker in ``RABBITMQ_HOST`` on the ports in ``RABBITMQ_5672_TCP`` and
``RABBITMQ_5671_TCP``, with a client certificate from the relative paths
``t/certs/{client_key,client_certificate,ca_certificate}.pem``;
``test_tls_connect_fails`` expects ``ssl.SSLError`` with
``t/certs/client_{key,certificate}_broken.pem`` and no CA. The sdist ships no
``t/certs/`` (py-amqp's CI image builds its own), so this script (the shared
parts are in ``tools/client_suites.py``):

* downloads the sdist of the *installed* amqp with ``pip download --no-deps
  --no-binary amqp`` into ``.cache/py-amqp`` and extracts ``t/`` and
  ``setup.cfg`` (its ``python_classes = test_*`` collects the lower-case test
  classes), never ``amqp/``;
* generates with trustme into the extracted ``t/certs/``: a CA
  (``ca_certificate.pem``), a server certificate for localhost/127.0.0.1, a
  client certificate (``client_*.pem``) and the "broken" pair: a key and a
  certificate that belong together but were issued by another CA, which the
  broker refuses (and which the client cannot verify the broker with either:
  the test gives it no CA, so the broker's certificate fails verification
  against the system's CAs; either way ``ssl.SSLError``);
* starts a fresh Warren subprocess on free ports with the TLS setup of
  py-amqp's CI image (its ``Dockerfile``): client certificates verified
  against the CA and required (``verify_peer``,
  ``fail_if_no_peer_cert = true``);
* runs pytest on ``t/integration`` (``test_rmq.py``, plus
  ``test_integration.py``, which mocks the socket) from the extracted root
  (the certificate paths are relative), deselecting the two tests that
  connect to ``tls-v1-2.badssl.com`` over the internet. pytest-rerunfailures
  is blocked (py-amqp marks every test ``flaky(reruns=5)``; here each gets
  one chance) and the unknown ``env``/``flaky`` marks are silenced, as in
  ``tools/kombu_integration.py``. The vhost would be pytest-xdist's worker id
  (xdist is blocked): amqp.Connection ignores the fixture's ``vhost``
  keyword anyway and uses ``/``.

Usage (the exit status is pytest's; 6 when the sdist cannot be had)::

    .venv/bin/python tools/py_amqp_suite.py                       # a fresh Warren subprocess
    .venv/bin/python tools/py_amqp_suite.py --host 127.0.0.1 --port 5672 --tls-port 5671
    .venv/bin/python tools/py_amqp_suite.py -- -k tls -x          # pytest args

Another broker must use the generated certificates (the script prints where
they are) and require client certificates. docs/testing.md records the results.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_suites as cs  # noqa: E402 - tools/ is not a package

DEFAULT_CACHE_DIR = cs.CACHE / "py-amqp"
EXTRACTED = ("t", "setup.cfg")
REQUIRED = ("t/integration/test_rmq.py", "setup.cfg")
#: Tests deselected here, with the reason.
DESELECTED = {
    "t/integration/test_rmq.py::test_tls_default_certs": "connects to tls-v1-2.badssl.com "
    "(internet; none here)",
    "t/integration/test_rmq.py::test_tls_no_default_certs_fails": "connects to "
    "tls-v1-2.badssl.com (internet; none here)",
}


def fetch_suite(version: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    suite = cache_dir / f"amqp-{version}"
    if not all((suite / r).is_file() for r in REQUIRED):
        tarball = cs.download_sdist("amqp", version, cache_dir)
        cs.extract(tarball, suite, EXTRACTED, required=REQUIRED)
    return suite


def make_certs(suite: Path) -> cs.TLSFiles:
    """t/certs/: the suite's certificates (see the module's docstring), once."""
    certs = suite / "t" / "certs"
    tls = cs.make_certs(certs, client="guest")
    broken_key, broken_cert = (
        certs / "client_key_broken.pem",
        certs / "client_certificate_broken.pem",
    )
    if not (broken_key.is_file() and broken_cert.is_file()):
        other = cs.make_certs(certs / "other-ca", client="guest")
        assert other.client_key is not None and other.client_cert is not None
        broken_key.write_bytes(other.client_key.read_bytes())
        broken_cert.write_bytes(other.client_cert.read_bytes())
    return tls


def run_suite(
    suite: Path, host: str, port: int, tls_port: int, pytest_args: Sequence[str] = (),
    *, test_timeout: float = 30,
) -> int:  # fmt: skip
    cs.refuse_shadowing(suite, "amqp")
    options = ["-p", "no:rerunfailures", "-W", "ignore::pytest.PytestUnknownMarkWarning", "-rfEs"]
    for test, reason in DESELECTED.items():
        print(f"deselected: {test}: {reason}", flush=True)
        options += ["--deselect", test]
    cmd = cs.pytest_command(
        ["t/integration"], suite, suite / "setup.cfg", plugins=("no:xdist",),
        options=options, test_timeout=test_timeout, pytest_args=pytest_args,
    )  # fmt: skip
    env = {
        "RABBITMQ_HOST": host,
        "RABBITMQ_5672_TCP": str(port),
        "RABBITMQ_5671_TCP": str(tls_port),
    }
    return cs.run_pytest(cmd, suite, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    ours, pytest_args = cs.split_argv(argv)
    parser = cs.suite_parser(
        "Run py-amqp's t/integration suite (from the sdist of the installed amqp), plain "
        "and over TLS, against a fresh Warren subprocess, or an AMQP broker at "
        "--host/--port/--tls-port.",
        DEFAULT_CACHE_DIR,
        host_help="test this broker instead of a Warren subprocess",
        test_timeout=30,
    )
    opts = parser.parse_args(ours)
    version = cs.installed_version("amqp")
    try:
        suite = fetch_suite(version, opts.cache_dir)
    except cs.SuiteUnavailable as exc:
        print(f"py_amqp_suite: {exc}", file=sys.stderr)
        return cs.EXIT_UNAVAILABLE
    tls = make_certs(suite)
    print(f"amqp {version}: {suite / 't/integration'}; certificates: {tls.ca_cert.parent}")
    if opts.host:
        print(f"broker: {opts.host}:{opts.port}, amqps {opts.tls_port}", flush=True)
        return run_suite(suite, opts.host, opts.port, opts.tls_port, pytest_args,
                         test_timeout=opts.test_timeout)  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="py-amqp-suite-") as tmp,
        tempfile.TemporaryFile("w+") as log,
    ):
        config = cs.warren_ini(
            Path(tmp) / "warren.ini", tls, verify_peer=True, fail_if_no_peer_cert=True
        )
        with cs.warren_subprocess(log, config=config) as ports:
            assert ports.amqps is not None
            print(
                f"broker: Warren subprocess on {ports.host}:{ports.amqp}, amqps {ports.amqps}",
                flush=True,
            )
            status = run_suite(suite, ports.host, ports.amqp, ports.amqps, pytest_args,
                               test_timeout=opts.test_timeout)  # fmt: skip
        if status != 0:
            cs.print_log_tail(log)
    return status


if __name__ == "__main__":
    sys.exit(main())
