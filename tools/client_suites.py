"""What the runners of the AMQP clients' own test suites share.

``tools/aio_pika_suite.py``, ``tools/aiormq_suite.py``, ``tools/py_amqp_suite.py``,
``tools/pika_suite.py`` and ``tools/kombu_integration.py`` each fetch a client's
test suite for the *installed* client version into ``.cache/<name>/`` once,
adapt only what points at a broker (never a test), start Warren (with a TLS
listener) and run the suite with pytest. This module has the common parts:

* :func:`download_sdist` / :func:`download_url` and :func:`extract` (only the
  named paths of the archive's top directory, never the client's package, so
  the tests import the installed client), :func:`install_deps` (``pip install
  --target`` into the cache: the suite's test-only dependencies never load into
  Warren's own test runs);
* :func:`pytest_command` and :func:`run_pytest`;
* :func:`make_certs`: a CA, a server certificate for localhost/127.0.0.1 and a
  client certificate, generated with trustme, for suites that ship none;
* :func:`warren_ini` and :func:`warren_subprocess`: a fresh Warren
  (``python -m warren``, temporary data directory) with an AMQP/TLS listener,
  waiting until it has started and reporting its ports.

Exit status of every runner: pytest's; :data:`EXIT_UNAVAILABLE` (6) when the
suite or its dependencies cannot be had.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
#: Exit status when the suite or its test dependencies cannot be had.
EXIT_UNAVAILABLE = 6


class SuiteUnavailable(RuntimeError):
    """A client's test suite (or its test dependencies) could not be downloaded."""


def installed_version(dist: str) -> str:
    return importlib.metadata.version(dist)


def suite_parser(
    description: str,
    cache_dir: Path,
    *,
    host_help: str = "test this broker instead of Warren",
    port_help: str = "with --host (default: %(default)s)",
    tls_port: int | None = 5671,
    tls_port_help: str = "with --host (default: %(default)s)",
    test_timeout: float = 60,
) -> argparse.ArgumentParser:
    """The options every runner takes: --host, --port, --tls-port, --cache-dir,
    --test-timeout (a runner adds its own)."""
    parser = argparse.ArgumentParser(
        description=description + " Arguments after -- go to pytest.", allow_abbrev=False
    )
    parser.add_argument("--host", help=host_help)
    parser.add_argument("--port", type=int, default=5672, help=port_help)
    parser.add_argument("--tls-port", type=int, default=tls_port, help=tls_port_help)
    parser.add_argument("--cache-dir", type=Path, default=cache_dir,
                        help="where the suite and its test dependencies go (default: %(default)s)")  # fmt: skip
    parser.add_argument("--test-timeout", type=float, default=test_timeout,
                        help="seconds per test, with pytest-timeout; 0 disables (default: %(default)s)")  # fmt: skip
    return parser


def split_argv(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The runner's own arguments and pytest's (those after ``--``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1 :]
    return args, []


# -- getting the suite -------------------------------------------------------------------
def pip(*args: str) -> None:
    """Run pip (quietly, one retry); :class:`SuiteUnavailable` when it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check",
         "--retries", "1"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SuiteUnavailable(
            f"pip {args[0]} failed (status {proc.returncode}): " + " / ".join(detail)
        )


def download_sdist(dist: str, version: str, cache_dir: Path, no_binary: str | None = None) -> Path:
    """The sdist of ``dist==version`` in ``cache_dir``, downloaded with pip once.

    ``no_binary`` is pip's ``--no-binary`` value, by default ``dist`` alone:
    ``:all:`` would also refuse the wheels of the build backend (poetry-core,
    uv_build), which then cannot be built offline."""
    stem = re.sub(r"[-_.]+", "_", dist).lower()

    def found() -> Path | None:
        for path in sorted(cache_dir.glob("*.tar.gz")):
            name = re.sub(r"[-_.]+", "_", path.name[: -len(f"-{version}.tar.gz")]).lower()
            if path.name.endswith(f"-{version}.tar.gz") and name == stem:
                return path
        return None

    tarball = found()
    if tarball is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        pip("download", "--no-deps", "--no-binary", no_binary or dist, f"{dist}=={version}",
            "--dest", str(cache_dir))  # fmt: skip
        tarball = found()
        if tarball is None:
            raise SuiteUnavailable(f"pip download {dist}=={version} gave no sdist in {cache_dir}")
    return tarball


def download_url(url: str, dest: Path, timeout: float = 60) -> Path:
    """``url`` saved as ``dest`` (once); :class:`SuiteUnavailable` when it cannot be had."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(tmp, "wb") as f:
            shutil.copyfileobj(resp, f)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SuiteUnavailable(f"cannot download {url}: {exc}") from None
    tmp.rename(dest)
    return dest


def _wanted(rel: PurePosixPath, paths: Iterable[PurePosixPath]) -> bool:
    return any(rel == p or p in rel.parents for p in paths)


def extract(archive: Path, dest: Path, paths: Sequence[str], required: Sequence[str] = ()) -> None:
    """Extract ``paths`` (files or directories, relative to the archive's single
    top directory) of a ``.tar.gz`` into ``dest``, replacing it. Each of
    ``required`` must be among them, else :class:`SuiteUnavailable`."""
    wanted = [PurePosixPath(p) for p in paths]
    with tarfile.open(archive) as tar:
        members = []
        tops = set()
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if not parts or ".." in parts:
                continue
            tops.add(parts[0])
            if len(parts) >= 2 and _wanted(PurePosixPath(*parts[1:]), wanted):
                members.append(member)
        if len(tops) != 1:
            raise SuiteUnavailable(f"{archive.name}: not a single top directory: {sorted(tops)}")
        top = tops.pop()
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            tar.extractall(tmp, members=members, filter="data")
            _check_required(Path(tmp) / top, required, archive.name)
            shutil.rmtree(dest, ignore_errors=True)
            (Path(tmp) / top).rename(dest)


def copy_subset(
    source: Path, dest: Path, paths: Sequence[str], required: Sequence[str] = ()
) -> None:
    """Like :func:`extract`, from a directory (a checkout) instead of an archive."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        root = Path(tmp) / "suite"
        root.mkdir()
        for rel in paths:
            src = source / rel
            if src.is_dir():
                shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.is_file():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, root / rel)
        _check_required(root, required, str(source))
        shutil.rmtree(dest, ignore_errors=True)
        root.rename(dest)


def _check_required(root: Path, required: Sequence[str], what: str) -> None:
    missing = [r for r in required if not (root / r).exists()]
    if missing:
        raise SuiteUnavailable(f"{what} has no {', '.join(missing)}")


def append_once(path: Path, marker: str, text: str) -> None:
    """Append ``text`` (which contains ``marker``) to ``path`` unless it is there."""
    if marker not in path.read_text(encoding="utf-8"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def install_deps(
    target: Path, packages: Sequence[str], check: str, *, no_deps: bool = True
) -> Path:
    """``pip install --target`` ``packages`` into ``target`` unless ``target/check``
    exists already; returns ``target`` (to put on ``PYTHONPATH`` for the suite only)."""
    if not (target / check).exists():
        args = ["install", "--target", str(target), "--upgrade"]
        if no_deps:
            args.append("--no-deps")
        pip(*args, *packages)
        if not (target / check).exists():
            raise SuiteUnavailable(f"pip install gave no {target / check}")
    return target


def refuse_shadowing(suite: Path, package: str) -> None:
    """The suite's copy of the client must not exist: it would shadow the installed one."""
    if (suite / package).exists():
        raise RuntimeError(
            f"{suite / package} must not exist (it would shadow the installed {package})"
        )


# -- running pytest --------------------------------------------------------------------
def pytest_command(
    targets: Sequence[str],
    rootdir: Path,
    config_file: Path | None,
    *,
    plugins: Sequence[str] = (),
    options: Sequence[str] = (),
    test_timeout: float = 60,
    pytest_args: Sequence[str] = (),
) -> list[str]:
    """pytest over ``targets`` with the suite's own configuration file, rooted at the
    suite; ``plugins`` are ``-p`` arguments (``no:xyz`` blocks one). When
    ``pytest_args`` name test files or node ids inside a target (``tests/x.py::t``),
    they replace the targets, so that only those run."""
    if any(arg.startswith(t) for arg in pytest_args for t in targets):
        targets = ()
    cmd = [sys.executable, "-m", "pytest", *targets]
    if config_file is not None:
        cmd += ["-c", str(config_file)]
    cmd += ["--rootdir", str(rootdir), "--confcutdir", str(rootdir), "-p", "no:cacheprovider"]
    for plugin in plugins:
        cmd += ["-p", plugin]
    cmd += options
    if test_timeout > 0 and importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={test_timeout:g}")
    return [*cmd, *pytest_args]


def run_pytest(
    cmd: Sequence[str],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    pythonpath: Sequence[Path] = (),
    timeout: float | None = None,
) -> int:
    """Run ``cmd`` in ``cwd`` with ``env`` added and ``pythonpath`` (plus Warren's
    ``src``) in front of ``PYTHONPATH``; pytest's exit status."""
    path = [*map(str, pythonpath), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    full.update(env or {})
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(list(cmd), cwd=cwd, env=full, timeout=timeout).returncode


# -- certificates ----------------------------------------------------------------------
@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA, the server's certificate chain and key, a client's."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path | None = None
    client_key: Path | None = None


def make_certs(
    dest: Path,
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    client: str = "guest",
    prefix: str = "",
) -> TLSFiles:
    """A trustme CA, a server certificate for ``hosts`` and a client certificate
    (common name ``client``) in ``dest``, generated once (kept when all exist).

    Files: ``<prefix>ca_certificate.pem``, ``<prefix>server_certificate.pem``,
    ``<prefix>server_key.pem``, ``<prefix>client_certificate.pem``,
    ``<prefix>client_key.pem``."""
    files = TLSFiles(
        ca_cert=dest / f"{prefix}ca_certificate.pem",
        server_cert=dest / f"{prefix}server_certificate.pem",
        server_key=dest / f"{prefix}server_key.pem",
        client_cert=dest / f"{prefix}client_certificate.pem",
        client_key=dest / f"{prefix}client_key.pem",
    )
    if all(p is not None and p.is_file() for p in vars(files).values()):
        return files
    import trustme  # deferred: only the runners that generate certificates need it

    dest.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="Warren client-suite test CA")
    ca.cert_pem.write_to_path(str(files.ca_cert))
    server = ca.issue_cert(*hosts, common_name=hosts[0])
    server.private_key_pem.write_to_path(str(files.server_key))
    _write_chain(server, files.server_cert)
    leaf = ca.issue_cert(client, common_name=client)
    assert files.client_cert is not None and files.client_key is not None
    leaf.private_key_pem.write_to_path(str(files.client_key))
    _write_chain(leaf, files.client_cert)
    return files


def _write_chain(cert: object, path: Path) -> None:
    with open(path, "wb") as f:
        for blob in cert.cert_chain_pems:  # type: ignore[attr-defined]
            f.write(blob.bytes())


# -- Warren ----------------------------------------------------------------------------
def warren_ini(
    path: Path,
    tls: TLSFiles | None,
    *,
    tls_port: int = 0,
    verify_peer: bool = False,
    fail_if_no_peer_cert: bool = False,
    max_message_size: int | None = None,
) -> Path:
    """Write a Warren INI config (``warren -c``, ``--warren-config``) with an AMQP/TLS
    listener on ``tls_port`` (0: a free one) serving ``tls``'s server certificate;
    ``verify_peer`` asks clients for a certificate (verified against ``tls.ca_cert``),
    ``fail_if_no_peer_cert`` requires one (RabbitMQ's ``ssl_options``)."""
    main = []
    amqp = []
    if tls is not None:
        main += [f"tls_cert = {tls.server_cert}", f"tls_key = {tls.server_key}"]
        if verify_peer:
            main += [f"tls_ca_cert = {tls.ca_cert}", "tls_verify_peer = true"]
            main.append(f"tls_fail_if_no_peer_cert = {str(fail_if_no_peer_cert).lower()}")
        amqp.append(f"tls_port = {tls_port}")
    if max_message_size is not None:
        amqp.append(f"max_message_size = {max_message_size}")
    text = "[main]\n" + "".join(f"{line}\n" for line in main)
    text += "\n[amqp]\n" + "".join(f"{line}\n" for line in amqp)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@dataclass(frozen=True)
class WarrenPorts:
    host: str
    amqp: int
    #: The AMQP/TLS (amqps) port; None without a TLS listener.
    amqps: int | None


def busy_ports(host: str, ports: Iterable[int]) -> list[int]:
    """Those of ``ports`` something already listens on at ``host``."""
    busy = []
    for port in ports:
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((host, port)) == 0:
                busy.append(port)
    return busy


@contextmanager
def warren_subprocess(
    log: IO[str],
    *,
    amqp_port: int = 0,
    config: Path | None = None,
    start_timeout: float = 60,
) -> Iterator[WarrenPorts]:
    """A fresh Warren (``python -m warren``, this checkout's ``src``) with a temporary
    data directory, the management API and MQTT off; ``config`` (see
    :func:`warren_ini`) may add a TLS listener. Yields its ports once it has
    started; its log goes to ``log``; SIGTERM at the end."""
    with tempfile.TemporaryDirectory(prefix="warren-suite-") as data_dir:
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        args = ["--amqp-port", str(amqp_port), "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1", "--prometheus-port", "-1",
                "--data-dir", data_dir, "--no-sync"]  # fmt: skip
        if config is not None:
            args = ["-c", str(config), *args]
        proc = subprocess.Popen(
            [sys.executable, "-m", "warren", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        stdout = proc.stdout
        lines: list[str] = []
        started = threading.Event()

        def read() -> None:  # reads the whole log, so a full pipe never blocks the broker
            for line in stdout:
                log.write(line)
                log.flush()
                if not started.is_set():
                    lines.append(line)
                    if " started: " in line:
                        started.set()
            started.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + start_timeout
            while not started.wait(0.1):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warren did not start in {start_timeout:g} s")
            text = "".join(lines)
            plain = re.search(r"listening on AMQP (\S+):(\d+)\s*$", text, re.M)
            tls = re.search(r"listening on AMQP/TLS \(amqps\) (\S+):(\d+)", text)
            if " started: " not in text or plain is None:
                status = proc.poll()
                raise RuntimeError(
                    f"warren did not start (status {status}):\n" + "".join(lines[-20:])
                )
            yield WarrenPorts(
                plain.group(1), int(plain.group(2)), int(tls.group(2)) if tls else None
            )
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            reader.join(10)


def print_log_tail(log: IO[str], lines: int = 40) -> None:
    log.seek(0)
    print("-- the end of Warren's log --", file=sys.stderr)
    sys.stderr.writelines(log.readlines()[-lines:])


# -- aio-pika and aiormq: their conftest's Docker fixtures -----------------------------
#: Environment variables telling :func:`docker_conftest_overrides`' fixtures to use
#: another broker instead of Warren's ``warren_broker`` fixture.
ENV_HOST, ENV_PORT, ENV_TLS_PORT = "WARREN_SUITE_HOST", "WARREN_SUITE_PORT", "WARREN_SUITE_TLS_PORT"


def docker_conftest_overrides(marker: str) -> str:
    """The block appended to aio-pika's and aiormq's ``tests/conftest.py``: later
    definitions replace the Docker-based ones (same names), no test is touched.

    * ``pytest_configure`` (aio-pika's Docker availability check) does nothing;
    * ``docker`` skips the tests that need a container of their own (restarted);
    * ``amqp_direct_url`` (every connection's URL) and ``rabbitmq_container``
      (``.host`` and ``.ports["5672/tcp"]``/``.ports["5671/tcp"]``, the TLS port)
      come from Warren's ``warren_broker`` fixture (started with
      ``--warren-config``, which gives it a TLS listener), or from the
      ``WARREN_SUITE_*`` variables for another broker; without a TLS port the
      tests that use ``rabbitmq_container`` are skipped.
    """
    return f'''

{marker}
# Later definitions replace the Docker-based ones above (same module names).
import os as _warren_os
from types import SimpleNamespace as _WarrenContainer

import pytest as _warren_pytest
from yarl import URL as _WarrenURL


def pytest_configure(config):  # noqa: F811 - replaces the Docker availability check
    pass


@_warren_pytest.fixture(scope="session")
def docker():  # noqa: F811
    _warren_pytest.skip("needs a Docker container of its own (restarted by the test)")


@_warren_pytest.fixture(scope="session")
def _warren_target(request):
    """(host, AMQP port, AMQP/TLS port or None) of the broker under test."""
    host = _warren_os.environ.get("{ENV_HOST}")
    if host:
        tls = _warren_os.environ.get("{ENV_TLS_PORT}")
        return host, int(_warren_os.environ["{ENV_PORT}"]), int(tls) if tls else None
    broker = request.getfixturevalue("warren_broker")
    tls_port = broker.broker.listener("amqp").tls_port
    return broker.host, broker.amqp_port, tls_port or None


@_warren_pytest.fixture(scope="session")
def rabbitmq_container(_warren_target):  # noqa: F811
    host, port, tls_port = _warren_target
    if tls_port is None:
        _warren_pytest.skip("the broker has no TLS port (--tls-port)")
    return _WarrenContainer(
        id="warren", host=host, ports={{"5672/tcp": port, "5671/tcp": tls_port}}
    )


@_warren_pytest.fixture(scope="session")
def amqp_direct_url(_warren_target):  # noqa: F811
    host, port, _ = _warren_target
    return _WarrenURL.build(
        scheme="amqp", user="guest", password="guest", path="//", host=host, port=port
    )
'''


def docker_suite_env(host: str | None, port: int | None, tls_port: int | None) -> dict[str, str]:
    """The ``WARREN_SUITE_*`` variables for :func:`docker_conftest_overrides`."""
    if host is None:
        return {ENV_HOST: "", ENV_PORT: "", ENV_TLS_PORT: ""}
    return {
        ENV_HOST: host,
        ENV_PORT: str(port or 5672),
        ENV_TLS_PORT: "" if tls_port is None else str(tls_port),
    }
