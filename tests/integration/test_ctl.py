"""`warren ctl` against a real management HTTP API.

By default the server is an embedded Warren with its HTTP listener on an
ephemeral port (Config.http_port=0); the module is skipped when this Warren has
no HTTP management API. WARREN_CTL_TEST_URL=http://127.0.0.1:15672 runs the same
tests against another broker instead, e.g. RabbitMQ with the management plugin
(guest/guest must be an administrator; WARREN_CTL_TEST_AMQP_URL, default
amqp://guest:guest@HOST:5672/, is its AMQP side). Every test works in a vhost of
its own, so a shared broker is left as it was found.

Most tests call warren.ctl.main.main() in-process with captured output; a few run
`python -m warren ctl` as a subprocess, as an operator would. No mocks: the
assertions read the server's state back through the API.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from free_ports import free_port
from paths import REPO

from warren.ctl.client import exit_status_for
from warren.ctl.main import main

ROOT = REPO
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
EXTERNAL_URL = os.environ.get("WARREN_CTL_TEST_URL")


# -- the server ------------------------------------------------------------------------------


@dataclass
class Server:
    url: str  # management API base URL
    amqp_url: str  # amqp://guest:guest@host:port/ (no vhost)
    external: bool  # not the embedded Warren (its statistics may lag)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if EXTERNAL_URL:
        host = urllib.parse.urlsplit(EXTERNAL_URL).hostname or "127.0.0.1"
        amqp = os.environ.get("WARREN_CTL_TEST_AMQP_URL", f"amqp://guest:guest@{host}:5672/")
        yield Server(EXTERNAL_URL.rstrip("/"), amqp.rstrip("/") + "/", external=True)
        return
    from conftest import start_broker

    from warren import Config

    if "http_port" not in getattr(Config, "__dataclass_fields__", {}):
        pytest.skip("Warren has no HTTP management API yet (no Config.http_port)")
    broker = start_broker(tmp_path_factory.mktemp("ctl") / "data", http_port=0)
    try:
        http = broker.broker.listener("http")
        if http is None:
            pytest.skip("Warren has no HTTP management listener yet")
        yield Server(f"http://127.0.0.1:{http.port}", broker.url, external=False)
    finally:
        broker.stop()


def api(
    server: Server,
    method: str,
    path: str,
    body: Any = None,
    user: str = "guest",
    password: str = "guest",
) -> Any:
    """The API directly (set-up and checks that do not go through the CLI)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip() else None


def api_status(server: Server, method: str, path: str, **kw: Any) -> int:
    try:
        api(server, method, path, **kw)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def vhost(server: Server) -> Iterator[str]:
    """A fresh vhost for one test (deleted afterwards with everything in it)."""
    name = unique("ctl-test")
    api(server, "PUT", f"/api/vhosts/{q(name)}", {})
    api(server, "PUT", f"/api/permissions/{q(name)}/guest", perms(".*"))
    try:
        yield name
    finally:
        api_status(server, "DELETE", f"/api/vhosts/{q(name)}")


@pytest.fixture
def make_user(server: Server) -> Iterator[Callable[..., str]]:
    """Create users through the API; all are deleted at the end."""
    made: list[str] = []

    def make(tags: str = "", password: str = "pw-1") -> str:
        name = unique("ctl-user")
        api(server, "PUT", f"/api/users/{q(name)}", {"password": password, "tags": tags})
        made.append(name)
        return name

    yield make
    for name in made:
        api_status(server, "DELETE", f"/api/users/{q(name)}")


def perms(regex: str) -> dict[str, str]:
    return {"configure": regex, "write": regex, "read": regex}


# -- running the CLI -------------------------------------------------------------------------


@dataclass
class Result:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.status == 0, self
        return json.loads(self.out)


def ctl(server: Server | None, *args: str, stdin: bytes = b"", url: str | None = None) -> Result:
    """``warren ctl --url URL ARGS`` in-process."""
    out, err = io.StringIO(), io.StringIO()
    inp = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    base = url if url is not None else (server.url if server else "http://127.0.0.1:1")
    status = main(["--url", base, *args], stdout=out, stderr=err, stdin=inp)
    return Result(status, out.getvalue(), err.getvalue())


def ok(server: Server, *args: str, stdin: bytes = b"") -> str:
    r = ctl(server, *args, stdin=stdin)
    assert r.status == 0, f"exit {r.status}\nstdout: {r.out}\nstderr: {r.err}"
    assert r.err == ""
    return r.out


def run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
    """``python -m warren ctl ARGS`` as a subprocess."""
    p = subprocess.run(
        [sys.executable, "-m", "warren", "ctl", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        env=env or ENV,
    )
    return Result(p.returncode, p.stdout, p.stderr)


def table(out: str) -> list[dict[str, str]]:
    """Parse an aligned table: columns are separated by runs of two or more
    positions that are blank on every line (cells may hold single spaces)."""
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, "no table"
    width = max(len(line) for line in lines)
    padded = [line.ljust(width) for line in lines]
    filled = [any(line[i] != " " for line in padded) for i in range(width)]
    for i in range(1, width - 1):  # a single blank position inside a cell
        if not filled[i] and filled[i - 1] and filled[i + 1]:
            filled[i] = True
    spans: list[tuple[int, int]] = []
    start = None
    for i, f in enumerate([*filled, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            spans.append((start, i))
            start = None
    headers = [padded[0][a:b].strip() for a, b in spans]
    return [
        {h: line[a:b].strip() for h, (a, b) in zip(headers, spans, strict=True)}
        for line in padded[1:]
    ]


def by(rows: list[dict[str, str]], key: str, value: str) -> dict[str, str]:
    found = [r for r in rows if r[key] == value]
    assert len(found) == 1, f"{key}={value!r} in {rows}"
    return found[0]


def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Retry a check that reads the server until it passes (RabbitMQ shows new
    connections, channels and consumers with its next statistics event; Warren's
    state is immediate, so there the first try passes)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise


# -- no server needed ------------------------------------------------------------------------


def test_help_does_not_import_the_broker() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from warren.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    status = main(['ctl', '--help'])\n"
        "assert status == 0 and 'definitions' in out.getvalue(), status\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['ctl', 'queues', 'declare', '--help']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('warren', 'aiohttp'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    modules = r.stdout
    assert "'warren.ctl.main'" in modules
    for forbidden in (
        "warren.app",
        "warren.broker",
        "warren.core",
        "warren.amqp",
        "warren.store",
        "warren.http",
        "aiohttp",
    ):
        assert f"'{forbidden}" not in modules, forbidden


def test_entry_points() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["warrenctl"] == "warren.ctl.main:main"
    # What the console script does: sys.exit(main()) with the arguments in sys.argv.
    code = (
        "import sys; from warren.ctl.main import main; "
        "sys.argv = ['/usr/bin/warrenctl', '--version']; sys.exit(main())"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0 and p.stdout.startswith("warrenctl "), p
    r = run("--help")
    assert r.status == 0
    for command in ("status", "vhosts", "users", "permissions", "queues", "exchanges"):
        assert command in r.out
    assert "exit status" in r.out
    server_help = subprocess.run(
        [sys.executable, "-m", "warren", "--help"], capture_output=True, text=True, env=ENV
    )
    assert "warren ctl --help" in " ".join(server_help.stdout.split())  # however wrapped


def test_usage_errors_exit_1() -> None:
    for args in (
        [],  # no command
        ["nonsense"],
        ["queues", "declare"],  # missing NAME
        ["queues", "frobnicate"],
        ["--timeout", "-3", "status"],
        ["get", "q", "--count", "many"],
        ["get", "q", "--count", "0"],
        ["policies", "set", "p", ".*", "{}", "--apply-to", "everything"],
    ):
        r = ctl(None, *args)
        assert r.status == 1, (args, r)
        assert r.out == ""
        assert r.err, args
    # Bad JSON given to the CLI is found before any request (the URL is unused).
    r = ctl(None, "queues", "declare", "q", "--arguments", "{not json")
    assert r.status == 1 and "--arguments is not valid JSON" in r.err
    r = ctl(None, "queues", "declare", "q", "--arguments", "[1, 2]")
    assert r.status == 1 and "must be a JSON object" in r.err
    r = ctl(None, "definitions", "import", "/nonexistent/defs.json")
    assert r.status == 1 and "cannot read" in r.err
    r = ctl(None, "--url", "ftp://example.com", "status")
    assert r.status == 1 and "invalid --url" in r.err
    # Through the real process too (argparse would exit 2 on its own).
    r = run("queues", "declare")
    assert r.status == 1 and "usage:" in r.err


def test_help_exits_0() -> None:
    r = ctl(None, "--help")
    assert r.status == 0 and "exit status" in r.out and r.err == ""
    r = ctl(None, "queues", "list", "--help")
    assert r.status == 0 and "--all-vhosts" in r.out and "--columns" in r.out
    r = ctl(None, "queues")
    assert r.status == 2  # (no server at the default test URL)
    r = ctl(None, "definitions")  # a resource without a default action
    assert r.status == 1 and "export" in r.err


def test_cannot_connect_exits_2() -> None:
    port = free_port()  # nothing listens on it
    r = ctl(None, "status", url=f"http://127.0.0.1:{port}")
    assert r.status == 2
    assert "cannot connect" in r.err and str(port) in r.err
    r = ctl(None, "queues", "list", url="http://no-such-host.invalid:15672")
    assert r.status == 2
    r = run("--url", f"http://127.0.0.1:{port}", "status")
    assert r.status == 2 and "cannot connect" in r.err


def test_not_http_exits_2() -> None:
    """Something listens but does not speak HTTP (e.g. --url given the AMQP port)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        import threading

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"AMQP\x00\x00\x09\x01")

        t = threading.Thread(target=answer)
        t.start()
        r = ctl(None, "status", url=f"http://127.0.0.1:{port}")
        t.join(10)
    assert r.status == 2, r
    assert "not an HTTP answer" in r.err


def test_exit_status_mapping() -> None:
    assert exit_status_for(401, "Login failed") == 3
    assert exit_status_for(401, "") == 3
    # RabbitMQ says 401 for users that logged in but lack a tag or permission.
    assert exit_status_for(401, "Not management user") == 4
    assert exit_status_for(401, "Not administrator user") == 4
    assert exit_status_for(401, "Access refused.") == 4
    assert exit_status_for(401, "User not authorised to access virtual host") == 4
    assert exit_status_for(403, "") == 4
    assert exit_status_for(404, "Not Found") == 5
    for status in (400, 405, 406, 409, 412, 415):
        assert exit_status_for(status) == 6
    for status in (500, 502, 503):
        assert exit_status_for(status) == 7


def test_ctl_imports_only_the_standard_library() -> None:
    """warren.ctl stays light: the standard library, itself, and warren's version."""
    import ast

    offenders = set()
    for path in sorted((ROOT / "src" / "warren" / "ctl").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or name == "__future__":
                    continue
                if name == "warren" or name.startswith("warren.ctl"):
                    continue
                offenders.add(f"{path.name}: {name}")
    assert not offenders


def test_version() -> None:
    r = ctl(None, "--version")
    assert r.status == 0
    from warren import __version__

    assert __version__ in r.out


# -- TLS -------------------------------------------------------------------------------------


class TLSProxy:
    """A TLS terminator in front of the real server (its certificate is a
    self-signed one made with the openssl command for 127.0.0.1)."""

    def __init__(self, target: tuple[str, int], directory: Path) -> None:
        import ssl
        import threading

        self.cert, key = directory / "cert.pem", directory / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(key), "-out", str(self.cert), "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(self.cert, key)
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        import threading

        while True:
            conn, _ = self.listener.accept()
            if self.closing:
                conn.close()
                self.listener.close()
                return
            try:
                tls = self.context.wrap_socket(conn, server_side=True)
            except OSError:  # the client refused our certificate
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((tls, upstream), (upstream, tls)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closing = True
        socket.create_connection(("127.0.0.1", self.port)).close()  # wakes accept()
        self._thread.join(5)
        assert not self._thread.is_alive()


def test_https(server: Server, tmp_path: Path) -> None:
    parts = urllib.parse.urlsplit(server.url)
    proxy = TLSProxy((parts.hostname or "127.0.0.1", parts.port or 80), tmp_path)
    url = f"https://127.0.0.1:{proxy.port}"
    try:
        r = ctl(None, "--cacert", str(proxy.cert), "--json", "status", url=url)
        assert r.status == 0, r
        assert "object_totals" in json.loads(r.out)
        # Without the CA the certificate is not trusted: cannot connect (2).
        r = ctl(None, "status", url=url)
        assert r.status == 2 and "TLS error" in r.err and "certificate" in r.err, r
        r = ctl(None, "--insecure", "queues", url=url)
        assert r.status == 0, r
        r = ctl(None, "--cacert", str(tmp_path / "missing.pem"), "status", url=url)
        assert r.status == 1 and "--cacert" in r.err
        # https:// to the plain HTTP port.
        r = ctl(None, "--insecure", "status", url=f"https://{parts.netloc}")
        assert r.status == 2 and "TLS error" in r.err
    finally:
        proxy.close()


# -- status ----------------------------------------------------------------------------------


def test_status(server: Server) -> None:
    out = ok(server, "status")
    pairs = dict(line.split(None, 1) for line in out.splitlines() if line and "  " in line)
    assert "product" in pairs
    for key in ("connections", "channels", "exchanges", "queues", "consumers", "messages"):
        assert pairs[key].strip().isdigit(), (key, out)
    assert "listeners" in out
    listeners = table(out.split("\nlisteners\n", 1)[1])
    assert any(row["protocol"] == "amqp" for row in listeners)
    amqp_port = urllib.parse.urlsplit(server.amqp_url).port or 5672
    assert by(listeners, "protocol", "amqp")["port"] == str(amqp_port)
    if not server.external:
        assert pairs["product"].strip().startswith("Warren")
        http_port = urllib.parse.urlsplit(server.url).port
        assert by(listeners, "protocol", "http")["port"] == str(http_port)
    doc = ctl(server, "--json", "status").json()
    assert isinstance(doc["object_totals"]["queues"], int)
    if not server.external:  # (a shared broker may change in between)
        assert pairs["exchanges"].strip() == str(doc["object_totals"]["exchanges"])
    amqp = next(x for x in doc["listeners"] if x["protocol"] == "amqp")
    assert amqp["port"] == amqp_port


def test_url_forms_and_environment(server: Server) -> None:
    # A trailing slash, or /api, in --url; credentials in the URL.
    for url in (server.url + "/", server.url + "/api"):
        r = ctl(None, "--json", "status", url=url)
        assert r.status == 0, r
    parts = urllib.parse.urlsplit(server.url)
    with_creds = f"{parts.scheme}://guest:guest@{parts.netloc}"
    assert ctl(None, "status", url=with_creds).status == 0
    assert ctl(None, "--password", "wrong", "status", url=with_creds).status == 3
    # The environment sets the defaults; flags override it.
    env = dict(ENV, WARREN_URL=server.url, WARREN_USER="guest", WARREN_PASSWORD="guest")
    r = run("--json", "status", env=env)
    assert r.status == 0, r.err
    assert "object_totals" in json.loads(r.out)
    r = run("status", env=dict(env, WARREN_PASSWORD="wrong"))
    assert r.status == 3
    r = run("status", "--password", "guest", env=dict(env, WARREN_PASSWORD="wrong"))
    assert r.status == 0
    # Credentials in the URL come before the environment's.
    r = run("--url", with_creds, "status", env=dict(env, WARREN_PASSWORD="wrong"))
    assert r.status == 0


# -- vhosts ----------------------------------------------------------------------------------


def test_vhosts(server: Server) -> None:
    name = unique("ctl-vh")
    try:
        out = ok(server, "vhosts", "add", name, "--description", "for ctl")
        assert name in out
        assert api(server, "GET", f"/api/vhosts/{q(name)}")["name"] == name
        row = by(table(ok(server, "vhosts", "list")), "name", name)
        assert row["description"] == "for ctl"
        # A resource alone lists it.
        assert by(table(ok(server, "vhosts")), "name", name)
        doc = ctl(server, "vhosts", "list", "--json").json()
        assert name in [v["name"] for v in doc]
        out = ok(server, "vhosts", "delete", name)
        assert api_status(server, "GET", f"/api/vhosts/{q(name)}") == 404
        assert ctl(server, "vhosts", "delete", name).status == 5
    finally:
        api_status(server, "DELETE", f"/api/vhosts/{q(name)}")


# -- users and permissions -------------------------------------------------------------------


def test_users(server: Server, vhost: str) -> None:
    name = unique("ctl-user")
    try:
        ok(server, "users", "add", name, "secret-1", "--tags", "management")
        row = by(table(ok(server, "users", "list")), "name", name)
        assert row["tags"] == "management"
        api(server, "PUT", f"/api/permissions/{q(vhost)}/{q(name)}", perms(".*"))
        # The new user can log in and list.
        r = ctl(server, "--user", name, "--password", "secret-1", "-p", vhost, "queues")
        assert r.status == 0, r
        # set-tags keeps the password.
        ok(server, "users", "set-tags", name, "monitoring", "policymaker")
        user = api(server, "GET", f"/api/users/{q(name)}")
        assert sorted(_tags(user["tags"])) == ["monitoring", "policymaker"]
        assert ctl(server, "-u", name, "--password", "secret-1", "status").status == 0
        # change-password keeps the tags; the old password stops working.
        ok(server, "users", "change-password", name, "secret-2")
        assert ctl(server, "-u", name, "--password", "secret-1", "status").status == 3
        assert ctl(server, "-u", name, "--password", "secret-2", "status").status == 0
        user = api(server, "GET", f"/api/users/{q(name)}")
        assert sorted(_tags(user["tags"])) == ["monitoring", "policymaker"]
        # A password from stdin (first line) stays out of the argument list.
        ok(server, "users", "change-password", name, stdin=b"secret-3\nignored\n")
        assert ctl(server, "-u", name, "--password", "secret-3", "status").status == 0
        # set-tags with no tag clears them; the user then may not use the API (exit 4).
        ok(server, "users", "set-tags", name)
        assert _tags(api(server, "GET", f"/api/users/{q(name)}")["tags"]) == []
        assert ctl(server, "-u", name, "--password", "secret-3", "status").status == 4
        users = ctl(server, "--json", "users", "list").json()
        assert name in [u["name"] for u in users]
        ok(server, "users", "delete", name)
        assert api_status(server, "GET", f"/api/users/{q(name)}") == 404
        assert ctl(server, "users", "delete", name).status == 5
        assert ctl(server, "users", "set-tags", name, "x").status == 5
        assert ctl(server, "users", "change-password", name, "x").status == 5
    finally:
        api_status(server, "DELETE", f"/api/users/{q(name)}")


def _tags(value: Any) -> list[str]:
    if isinstance(value, str):
        return [t for t in value.split(",") if t]
    return list(value)


def test_users_add_reads_password_from_stdin(server: Server) -> None:
    name = unique("ctl-user")
    try:
        ok(server, "users", "add", name, "--tags", "monitoring", stdin=b"from-stdin\n")
        assert ctl(server, "-u", name, "--password", "from-stdin", "status").status == 0
        r = ctl(server, "users", "add", unique("ctl-user"))  # nothing on stdin
        assert r.status == 1 and "no password" in r.err
    finally:
        api_status(server, "DELETE", f"/api/users/{q(name)}")


def test_permissions(server: Server, vhost: str, make_user: Callable[..., str]) -> None:
    user = make_user("management")
    out = ok(server, "-p", vhost, "permissions", "set", user, "^cfg-.*", "^w-.*", ".*")
    assert user in out and vhost in out
    got = api(server, "GET", f"/api/permissions/{q(vhost)}/{q(user)}")
    assert (got["configure"], got["write"], got["read"]) == ("^cfg-.*", "^w-.*", ".*")
    rows = table(ok(server, "-p", vhost, "permissions", "list"))
    row = by(rows, "user", user)
    assert row == {
        "user": user,
        "vhost": vhost,
        "configure": "^cfg-.*",
        "write": "^w-.*",
        "read": ".*",
    }
    by(rows, "user", "guest")
    # Global options after the action work too.
    doc = ctl(server, "permissions", "list", "--vhost", vhost, "--json").json()
    assert {p["user"] for p in doc} == {"guest", user}
    # One user's permissions in every vhost; every vhost's.
    rows = table(ok(server, "permissions", "list", "--of-user", user))
    assert [r["vhost"] for r in rows] == [vhost]
    rows = table(ok(server, "permissions", "list", "--all-vhosts"))
    assert by(rows, "user", user)["vhost"] == vhost
    # The permissions are in force: configure only ^cfg-.* (403/401 -> exit 4).
    base = ["-u", user, "--password", "pw-1", "-p", vhost]
    assert ctl(server, *base, "queues", "declare", "cfg-ok").status == 0
    r = ctl(server, *base, "queues", "declare", "other")
    assert r.status == 4, r
    ok(server, "-p", vhost, "permissions", "clear", user)
    assert api_status(server, "GET", f"/api/permissions/{q(vhost)}/{q(user)}") == 404
    assert ctl(server, "-p", vhost, "permissions", "clear", user).status == 5


# -- queues ----------------------------------------------------------------------------------


def test_queues(server: Server, vhost: str) -> None:
    out = ok(
        server, "-p", vhost, "queues", "declare", "orders", "--arguments", '{"x-max-length": 100}'
    )
    assert "orders" in out
    ok(server, "-p", vhost, "queues", "declare", "scratch", "--no-durable", "--auto-delete")
    ok(server, "-p", vhost, "queues", "declare", "events", "--type", "stream")
    got = api(server, "GET", f"/api/queues/{q(vhost)}/orders")
    assert got["durable"] is True and got["arguments"]["x-max-length"] == 100
    got = api(server, "GET", f"/api/queues/{q(vhost)}/scratch")
    assert got["durable"] is False and got["auto_delete"] is True
    got = api(server, "GET", f"/api/queues/{q(vhost)}/events")
    assert got["type"] == "stream" and got["arguments"]["x-queue-type"] == "stream"
    # Re-declaring the same queue is fine.
    ok(server, "-p", vhost, "queues", "declare", "orders", "--arguments", '{"x-max-length": 100}')

    for i in range(3):
        api(
            server,
            "POST",
            f"/api/exchanges/{q(vhost)}/amq.default/publish",
            {
                "properties": {},
                "routing_key": "orders",
                "payload": f"m{i}",
                "payload_encoding": "string",
            },
        )
    rows = table(ok(server, "-p", vhost, "queues", "list"))
    assert sorted(r["name"] for r in rows) == ["events", "orders", "scratch"]
    orders = by(rows, "name", "orders")
    assert orders["type"] == "classic" and orders["durable"] == "true"
    assert by(rows, "name", "events")["type"] == "stream"
    assert by(rows, "name", "scratch")["auto_delete"] == "true"

    def three_messages() -> None:
        row = by(table(ok(server, "-p", vhost, "queues", "list")), "name", "orders")
        assert (row["messages"], row["ready"], row["unacked"]) == ("3", "3", "0")

    eventually(three_messages)
    doc = ctl(server, "-p", vhost, "--json", "queues", "list").json()
    assert {x["name"] for x in doc} == {"events", "orders", "scratch"}
    assert all(x["vhost"] == vhost for x in doc)
    # --columns and --no-headers.
    out = ok(server, "-p", vhost, "queues", "--columns", "name,durable,arguments.x-max-length")
    assert by(table(out), "name", "orders") == {
        "name": "orders",
        "durable": "true",
        "arguments.x-max-length": "100",
    }
    out = ok(server, "-p", vhost, "queues", "list", "--no-headers", "--columns", "name")
    assert sorted(out.split()) == ["events", "orders", "scratch"]
    # --sort (numbers numerically, missing values last) and --reverse.
    out = ok(server, "-p", vhost, "queues", "--sort", "arguments.x-max-length", "--columns", "name")
    assert out.split()[1] == "orders"
    out = ok(server, "-p", vhost, "queues", "--sort", "arguments.x-max-length", "--reverse")
    assert table(out)[0]["name"] == "orders"  # the missing ones stay last
    out = ok(
        server,
        "-p",
        vhost,
        "queues",
        "--sort",
        "name",
        "--reverse",
        "--no-headers",
        "--columns",
        "name",
    )
    assert out.split() == ["scratch", "orders", "events"]
    doc = ctl(server, "-p", vhost, "--json", "queues", "--sort", "durable", "--reverse").json()
    assert [x["name"] for x in doc][-1] == "scratch"
    # --all-vhosts adds the vhost column.
    rows = table(ok(server, "-p", vhost, "queues", "list", "--all-vhosts"))
    assert by([r for r in rows if r["vhost"] == vhost], "name", "orders")

    # Refusals: delete --if-empty of a queue with messages; an unknown queue type.
    r = ctl(server, "-p", vhost, "queues", "delete", "orders", "--if-empty")
    assert r.status == 6, r
    assert api_status(server, "GET", f"/api/queues/{q(vhost)}/orders") == 200
    r = ctl(server, "-p", vhost, "queues", "declare", "bogus", "--type", "no-such-type")
    assert r.status == 6 and r.err.strip(), r
    # Re-declaring with other properties is refused too.
    r = ctl(server, "-p", vhost, "queues", "declare", "orders", "--no-durable")
    assert r.status == 6, r

    ok(server, "-p", vhost, "queues", "purge", "orders")

    def purged() -> None:
        row = by(table(ok(server, "-p", vhost, "queues")), "name", "orders")
        assert row["messages"] == "0"

    eventually(purged)
    assert (
        api(
            server,
            "POST",
            f"/api/queues/{q(vhost)}/orders/get",
            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
        )
        == []
    )
    ok(server, "-p", vhost, "queues", "delete", "orders", "--if-empty", "--if-unused")
    ok(server, "-p", vhost, "queues", "delete", "scratch")
    assert api_status(server, "GET", f"/api/queues/{q(vhost)}/orders") == 404
    # Missing queue: exit 5, with the API's reason on stderr.
    r = ctl(server, "-p", vhost, "queues", "delete", "orders")
    assert r.status == 5 and r.out == "" and "404" in r.err
    r = ctl(server, "-p", vhost, "get", "orders")
    assert r.status == 5
    # A missing vhost is a 404 as well.
    r = ctl(server, "-p", unique("ctl-none"), "queues", "list")
    assert r.status == 5, r


# -- exchanges and bindings ------------------------------------------------------------------


def test_exchanges(server: Server, vhost: str) -> None:
    ok(server, "-p", vhost, "exchanges", "declare", "logs", "--type", "topic")
    ok(
        server,
        "-p",
        vhost,
        "exchanges",
        "declare",
        "tmp",
        "-t",
        "fanout",
        "--no-durable",
        "--auto-delete",
    )
    ok(
        server,
        "-p",
        vhost,
        "exchanges",
        "declare",
        "inner",
        "--internal",
        "--arguments",
        '{"alternate-exchange": "logs"}',
    )
    got = api(server, "GET", f"/api/exchanges/{q(vhost)}/logs")
    assert got["type"] == "topic" and got["durable"] is True
    got = api(server, "GET", f"/api/exchanges/{q(vhost)}/inner")
    assert got["internal"] is True and got["arguments"] == {"alternate-exchange": "logs"}
    rows = table(ok(server, "-p", vhost, "exchanges", "list"))
    assert by(rows, "name", "logs")["type"] == "topic"
    assert by(rows, "name", "tmp")["durable"] == "false"
    assert by(rows, "name", "tmp")["auto_delete"] == "true"
    assert by(rows, "name", "(AMQP default)")["type"] == "direct"
    assert by(rows, "name", "amq.topic")["type"] == "topic"
    doc = ctl(server, "-p", vhost, "--json", "exchanges").json()
    assert "" in [x["name"] for x in doc] and "logs" in [x["name"] for x in doc]
    r = ctl(server, "-p", vhost, "exchanges", "declare", "logs", "--type", "direct")
    assert r.status == 6, r  # inequivalent type
    r = ctl(server, "-p", vhost, "exchanges", "declare", "x", "--type", "no-such-type")
    assert r.status == 6, r
    ok(server, "-p", vhost, "exchanges", "delete", "tmp")
    ok(server, "-p", vhost, "exchanges", "delete", "logs", "--if-unused")
    assert api_status(server, "GET", f"/api/exchanges/{q(vhost)}/logs") == 404
    assert ctl(server, "-p", vhost, "exchanges", "delete", "logs").status == 5


def test_bindings(server: Server, vhost: str) -> None:
    api(server, "PUT", f"/api/exchanges/{q(vhost)}/logs", {"type": "topic", "durable": True})
    api(server, "PUT", f"/api/exchanges/{q(vhost)}/hdr", {"type": "headers", "durable": True})
    api(server, "PUT", f"/api/queues/{q(vhost)}/errors", {"durable": True})
    out = ok(server, "-p", vhost, "bindings", "add", "logs", "errors", "-k", "*.error")
    assert "*.error" in out
    ok(server, "-p", vhost, "bindings", "add", "logs", "errors", "--routing-key", "db.#")
    ok(
        server,
        "-p",
        vhost,
        "bindings",
        "add",
        "logs",
        "hdr",
        "--destination-type",
        "exchange",
        "-k",
        "#",
    )
    ok(
        server,
        "-p",
        vhost,
        "bindings",
        "add",
        "hdr",
        "errors",
        "--arguments",
        '{"x-match": "any", "level": "error"}',
    )
    rows = table(ok(server, "-p", vhost, "bindings", "list"))
    mine = [r for r in rows if r["source"] != "(AMQP default)"]
    assert sorted(
        (r["source"], r["destination"], r["destination_type"], r["routing_key"]) for r in mine
    ) == [
        ("hdr", "errors", "queue", ""),
        ("logs", "errors", "queue", "*.error"),
        ("logs", "errors", "queue", "db.#"),
        ("logs", "hdr", "exchange", "#"),
    ]
    hdr = by(mine, "source", "hdr")
    assert json.loads(hdr["arguments"]) == {"x-match": "any", "level": "error"}
    # The default exchange's implicit binding is shown by its display name.
    assert (
        by([r for r in rows if r["source"] == "(AMQP default)"], "destination", "errors")[
            "routing_key"
        ]
        == "errors"
    )
    # Filters.
    rows = table(ok(server, "-p", vhost, "bindings", "--source", "logs", "--destination", "errors"))
    assert sorted(r["routing_key"] for r in rows) == ["*.error", "db.#"]
    doc = ctl(server, "-p", vhost, "--json", "bindings", "list", "--source", "hdr").json()
    assert [(b["destination"], b["arguments"]) for b in doc] == [
        ("errors", {"x-match": "any", "level": "error"})
    ]

    # A message published to the topic exchange reaches the queue through the binding.
    routed = ctl(
        server, "-p", vhost, "--json", "publish", "-e", "logs", "-k", "app.error", "-b", "x"
    ).json()
    assert routed == {"routed": True}

    ok(server, "-p", vhost, "bindings", "delete", "logs", "errors", "-k", "*.error")
    ok(
        server,
        "-p",
        vhost,
        "bindings",
        "delete",
        "hdr",
        "errors",
        "--arguments",
        '{"x-match": "any", "level": "error"}',
    )
    ok(
        server,
        "-p",
        vhost,
        "bindings",
        "delete",
        "logs",
        "hdr",
        "--destination-type",
        "exchange",
        "-k",
        "#",
    )
    left = api(server, "GET", f"/api/bindings/{q(vhost)}/e/logs/q/errors")
    assert [b["routing_key"] for b in left] == ["db.#"]
    assert api(server, "GET", f"/api/exchanges/{q(vhost)}/hdr/bindings/source") == []
    r = ctl(server, "-p", vhost, "bindings", "delete", "logs", "errors", "-k", "*.error")
    assert r.status == 5 and "no binding" in r.err
    r = ctl(server, "-p", vhost, "bindings", "add", "logs", "no-such-queue", "-k", "x")
    assert r.status == 5, r
    r = ctl(server, "-p", vhost, "bindings", "add", "no-such-exchange", "errors")
    assert r.status == 5, r


# -- publish and get -------------------------------------------------------------------------


def test_publish_and_get(server: Server, vhost: str) -> None:
    api(server, "PUT", f"/api/queues/{q(vhost)}/inbox", {"durable": True})
    out = ok(
        server,
        "-p",
        vhost,
        "publish",
        "-k",
        "inbox",
        "--body",
        "first",
        "--persistent",
        "--content-type",
        "text/plain",
        "-H",
        "trace=abc",
    )
    assert "routed" in out and "NOT" not in out
    ok(server, "-p", vhost, "publish", "-k", "inbox", stdin=b"second\nline")
    binary = bytes(range(256))
    ok(server, "-p", vhost, "publish", "-k", "inbox", stdin=binary)
    ok(
        server,
        "-p",
        vhost,
        "publish",
        "-k",
        "inbox",
        "--properties",
        '{"priority": 3, "headers": {"n": 1}}',
        "-b",
        "fourth",
    )
    out = ok(server, "-p", vhost, "publish", "-k", "nowhere", "-b", "lost")
    assert "NOT routed" in out
    assert ctl(server, "-p", vhost, "--json", "publish", "-k", "nowhere", "-b", "x").json() == {
        "routed": False
    }

    # The default ackmode requeues: the messages stay.
    rows = table(ok(server, "-p", vhost, "get", "inbox", "--count", "4"))
    assert [r["payload"] for r in rows[:2]] == ["first", "second\\nline"]
    assert [r["exchange"] for r in rows] == ["(AMQP default)"] * 4
    assert [r["routing_key"] for r in rows] == ["inbox"] * 4
    assert rows[2]["encoding"] == "base64" and rows[2]["bytes"] == "256"
    assert base64.b64decode(rows[2]["payload"]) == binary
    msgs = ctl(server, "-p", vhost, "--json", "get", "inbox", "-n", "4").json()
    assert len(msgs) == 4 and all(m["redelivered"] for m in msgs)
    first = msgs[0]["properties"]
    assert first["delivery_mode"] == 2 and first["content_type"] == "text/plain"
    assert first["headers"] == {"trace": "abc"}
    assert msgs[3]["properties"]["priority"] == 3 and msgs[3]["properties"]["headers"] == {"n": 1}
    assert msgs[0]["message_count"] == 3

    # --ack --body-only: the payloads alone, removed from the queue.
    out = ok(server, "-p", vhost, "get", "inbox", "--ack", "--body-only")
    assert out == "first\n"
    r_out = io.BytesIO()
    wrapper = io.TextIOWrapper(r_out, encoding="utf-8")
    status = main(
        [
            "--url",
            server.url,
            "-p",
            vhost,
            "get",
            "inbox",
            "-n",
            "2",
            "--ackmode",
            "ack_requeue_false",
            "--body-only",
        ],
        stdout=wrapper,
        stderr=io.StringIO(),
    )
    wrapper.flush()
    assert status == 0
    assert r_out.getvalue() == b"second\nline\n" + binary + b"\n"
    msgs = ctl(server, "-p", vhost, "--json", "get", "inbox", "--ack", "--truncate", "3").json()
    assert msgs[0]["payload"] == "fou" and msgs[0]["payload_bytes"] == 6
    assert ctl(server, "-p", vhost, "--json", "get", "inbox").json() == []
    assert ok(server, "-p", vhost, "get", "inbox", "--body-only") == ""
    # Publishing to a missing exchange: 404.
    assert ctl(server, "-p", vhost, "publish", "-e", "no-such", "-b", "x").status == 5


# -- connections, channels, consumers --------------------------------------------------------


def test_connections_channels_consumers(server: Server, vhost: str) -> None:
    pika = pytest.importorskip("pika")
    params = pika.URLParameters(server.amqp_url + q(vhost))
    params.client_properties = {"connection_name": "ctl-test-client", "product": "ctl-test"}
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=7)
        channel.queue_declare("work", durable=True)
        channel.basic_consume("work", lambda *a: None, consumer_tag="ctl-consumer")

        def connection_listed() -> dict[str, str]:
            conn.process_data_events(0)
            rows = [r for r in table(ok(server, "connections", "list")) if r["vhost"] == vhost]
            assert len(rows) == 1 and rows[0]["channels"] == "1", rows
            return rows[0]

        row = eventually(connection_listed)
        assert row["user"] == "guest"
        assert row["peer"].startswith("127.0.0.1:")
        assert row["client"] == "ctl-test"
        name = row["name"]
        docs = ctl(server, "--json", "connections").json()
        assert [d["name"] for d in docs if d["vhost"] == vhost] == [name]

        def channel_listed() -> dict[str, str]:
            conn.process_data_events(0)
            rows = [r for r in table(ok(server, "channels", "list")) if r["vhost"] == vhost]
            assert len(rows) == 1 and rows[0]["consumers"] == "1", rows
            return rows[0]

        row = eventually(channel_listed)
        assert row["number"] == "1" and row["prefetch"] == "7" and row["user"] == "guest"
        assert ctl(server, "--json", "channels").json()

        def consumer_listed() -> dict[str, str]:
            conn.process_data_events(0)
            rows = table(ok(server, "-p", vhost, "consumers", "list"))
            assert len(rows) == 1, rows
            return rows[0]

        row = eventually(consumer_listed)
        assert row["queue"] == "work" and row["consumer_tag"] == "ctl-consumer"
        assert row["ack_required"] == "true" and row["channel"]
        rows = table(ok(server, "consumers", "--all-vhosts"))
        assert by(rows, "consumer_tag", "ctl-consumer")["vhost"] == vhost
        doc = ctl(server, "-p", vhost, "--json", "consumers").json()
        assert [(c["queue"]["name"], c["consumer_tag"]) for c in doc] == [("work", "ctl-consumer")]

        out = ok(server, "connections", "close", name, "--reason", "maintenance by ctl")
        assert name in out
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while True:
                conn.process_data_events(1)
        assert closed.value.reply_code == 320
        assert "maintenance by ctl" in closed.value.reply_text
        r = ctl(server, "connections", "close", name)
        assert r.status == 5, r
    finally:
        if conn.is_open:
            conn.close()


# -- policies --------------------------------------------------------------------------------


def test_policies(server: Server, vhost: str) -> None:
    out = ok(
        server,
        "-p",
        vhost,
        "policies",
        "set",
        "limit",
        "^lim\\.",
        '{"max-length": 5}',
        "--priority",
        "3",
        "--apply-to",
        "queues",
    )
    assert "limit" in out
    got = api(server, "GET", f"/api/policies/{q(vhost)}/limit")
    assert got["pattern"] == "^lim\\." and got["definition"] == {"max-length": 5}
    assert got["priority"] == 3 and got["apply-to"] == "queues"
    row = by(table(ok(server, "-p", vhost, "policies", "list")), "name", "limit")
    assert row["pattern"] == "^lim\\." and row["apply_to"] == "queues" and row["priority"] == "3"
    assert json.loads(row["definition"]) == {"max-length": 5}
    doc = ctl(server, "-p", vhost, "--json", "policies").json()
    assert [p["name"] for p in doc] == ["limit"]
    # The policy applies to a matching queue.
    api(server, "PUT", f"/api/queues/{q(vhost)}/lim.a", {"durable": True})

    def applied() -> None:
        assert api(server, "GET", f"/api/queues/{q(vhost)}/lim.a").get("policy") == "limit"

    eventually(applied)
    r = ctl(server, "-p", vhost, "policies", "set", "bad", ".*", '{"no-such-key": 1}')
    assert r.status == 6, r
    r = ctl(server, "-p", vhost, "policies", "set", "bad", ".*", "not json")
    assert r.status == 1
    ok(server, "-p", vhost, "policies", "clear", "limit")
    assert api(server, "GET", f"/api/policies/{q(vhost)}") == []
    assert ctl(server, "-p", vhost, "policies", "clear", "limit").status == 5


# -- definitions -----------------------------------------------------------------------------


def _topology(server: Server, vhost: str) -> tuple[Any, ...]:
    queues = api(server, "GET", f"/api/queues/{q(vhost)}")
    exchanges = api(server, "GET", f"/api/exchanges/{q(vhost)}")
    bindings = api(server, "GET", f"/api/bindings/{q(vhost)}")
    policies = api(server, "GET", f"/api/policies/{q(vhost)}")
    return (
        sorted(
            (x["name"], x["durable"], json.dumps(x["arguments"], sort_keys=True)) for x in queues
        ),
        sorted(
            (x["name"], x["type"], x["durable"])
            for x in exchanges
            if not x["name"].startswith("amq.") and x["name"]
        ),
        sorted((b["source"], b["destination"], b["routing_key"]) for b in bindings if b["source"]),
        sorted(
            (p["name"], p["pattern"], json.dumps(p["definition"], sort_keys=True)) for p in policies
        ),
    )


def test_definitions_vhost_round_trip(server: Server, vhost: str, tmp_path: Path) -> None:
    ok(server, "-p", vhost, "queues", "declare", "d-orders", "--arguments", '{"x-max-length": 9}')
    ok(server, "-p", vhost, "queues", "declare", "d-stream", "--type", "stream")
    ok(server, "-p", vhost, "exchanges", "declare", "d-topic", "-t", "topic")
    ok(server, "-p", vhost, "bindings", "add", "d-topic", "d-orders", "-k", "order.*")
    ok(
        server,
        "-p",
        vhost,
        "policies",
        "set",
        "d-pol",
        "^d-orders$",
        '{"max-length-bytes": 100000}',
    )
    before = _topology(server, vhost)
    assert len(before[0]) == 2 and len(before[2]) == 1

    path = tmp_path / "vhost.json"
    out = ok(server, "-p", vhost, "definitions", "export", str(path), "--vhost-only")
    assert str(path) in out
    doc = json.loads(path.read_text())
    assert {x["name"] for x in doc["queues"]} == {"d-orders", "d-stream"}
    # stdout (no FILE) gives the same document.
    assert json.loads(ok(server, "-p", vhost, "definitions", "export", "--vhost-only")) == doc

    # Empty the vhost, then import the file back into it.
    api(server, "DELETE", f"/api/vhosts/{q(vhost)}")
    api(server, "PUT", f"/api/vhosts/{q(vhost)}", {})
    api(server, "PUT", f"/api/permissions/{q(vhost)}/guest", perms(".*"))
    assert _topology(server, vhost) != before
    out = ok(server, "-p", vhost, "definitions", "import", str(path), "--vhost-only")
    assert "Imported" in out
    assert _topology(server, vhost) == before
    # Importing again changes nothing; stdin works as FILE "-".
    ok(server, "-p", vhost, "definitions", "import", "-", "--vhost-only", stdin=path.read_bytes())
    assert _topology(server, vhost) == before


def test_definitions_global_export_and_import(server: Server, tmp_path: Path) -> None:
    doc = json.loads(ok(server, "definitions", "export"))
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies"):
        assert key in doc, key
    assert "guest" in [u["name"] for u in doc["users"]]
    path = tmp_path / "all.json"
    ok(server, "definitions", "export", str(path))
    assert json.loads(path.read_text())["vhosts"]

    # A broker-wide file (vhost, user, permission, queue, exchange, binding) loads
    # everything it names; only new objects, so a shared broker is not disturbed.
    vh, user = unique("ctl-defs"), unique("ctl-defs-user")
    defs = {
        "users": [{"name": user, "password": "defs-pw", "tags": "management"}],
        "vhosts": [{"name": vh}],
        "permissions": [
            {"user": user, "vhost": vh, **perms(".*")},
            {"user": "guest", "vhost": vh, **perms(".*")},
        ],
        "queues": [
            {
                "name": "imported",
                "vhost": vh,
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
        ],
        "exchanges": [
            {
                "name": "imp-x",
                "vhost": vh,
                "type": "fanout",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "bindings": [
            {
                "source": "imp-x",
                "vhost": vh,
                "destination": "imported",
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {},
            }
        ],
    }
    defs_path = tmp_path / "new.json"
    defs_path.write_text(json.dumps(defs))
    try:
        ok(server, "definitions", "import", str(defs_path))
        assert api(server, "GET", f"/api/queues/{q(vh)}/imported")["durable"] is True
        assert [
            b["destination"]
            for b in api(server, "GET", f"/api/exchanges/{q(vh)}/imp-x/bindings/source")
        ] == ["imported"]
        assert ctl(server, "-u", user, "--password", "defs-pw", "-p", vh, "queues").status == 0
        assert (
            json.loads(ok(server, "-p", vh, "definitions", "export", "--vhost-only"))["queues"][0][
                "name"
            ]
            == "imported"
        )
        # A file the server refuses: 400 -> exit 6.
        bad = tmp_path / "bad.json"
        bad.write_text(
            json.dumps(
                {
                    "queues": [
                        {
                            "name": "q",
                            "vhost": vh,
                            "durable": True,
                            "auto_delete": False,
                            "arguments": {"x-queue-type": "no-such-type"},
                        }
                    ]
                }
            )
        )
        r = ctl(server, "definitions", "import", str(bad))
        assert r.status == 6, r
        bad.write_text("[]")
        assert ctl(server, "definitions", "import", str(bad)).status == 1
    finally:
        api_status(server, "DELETE", f"/api/vhosts/{q(vh)}")
        api_status(server, "DELETE", f"/api/users/{q(user)}")


# -- authentication and authorisation --------------------------------------------------------


def test_bad_password_exits_3(server: Server) -> None:
    r = ctl(server, "--password", "definitely-wrong", "status")
    assert r.status == 3
    assert r.out == "" and "401" in r.err
    r = ctl(server, "-u", unique("nobody"), "--password", "x", "queues")
    assert r.status == 3
    r = run("--url", server.url, "--password", "definitely-wrong", "vhosts")
    assert r.status == 3 and "401" in r.err


def test_user_without_tag_exits_4(
    server: Server, vhost: str, make_user: Callable[..., str]
) -> None:
    plain = make_user("")  # may use AMQP, not the management API
    api(server, "PUT", f"/api/permissions/{q(vhost)}/{q(plain)}", perms(".*"))
    for args in (("status",), ("-p", vhost, "queues"), ("users",)):
        r = ctl(server, "-u", plain, "--password", "pw-1", *args)
        assert r.status == 4, (args, r)
        assert r.out == "" and r.err.strip()
    # A management user may not manage users (administrator only).
    manager = make_user("management")
    r = ctl(server, "-u", manager, "--password", "pw-1", "users", "add", unique("ctl-user"), "pw")
    assert r.status == 4, r
    r = run("--url", server.url, "-u", plain, "--password", "pw-1", "status")
    assert r.status == 4


def test_json_and_table_agree(server: Server, vhost: str) -> None:
    """The table is a view of the same answer --json prints."""
    for i in range(3):
        ok(server, "-p", vhost, "queues", "declare", f"agree-{i}")
    doc = ctl(server, "-p", vhost, "--json", "queues", "list").json()
    rows = table(ok(server, "-p", vhost, "queues", "list"))
    assert [r["name"] for r in rows] == [x["name"] for x in doc]
    assert [r["durable"] for r in rows] == [str(x["durable"]).lower() for x in doc]
    # Changes print nothing with --json (the API answers them with no body).
    r = ctl(server, "-p", vhost, "--json", "queues", "declare", "agree-x")
    assert r.status == 0 and r.out.strip() in ("", "{}")


def test_subprocess_round_trip(server: Server, vhost: str) -> None:
    """The real command, end to end: declare, publish from stdin, get, delete."""
    base = ["--url", server.url, "--vhost", vhost]
    assert run(*base, "queues", "declare", "sp").status == 0
    r = run(*base, "publish", "--routing-key", "sp", stdin="via stdin")
    assert r.status == 0 and "routed" in r.out
    r = run(*base, "get", "sp", "--ack", "--body-only")
    assert (r.status, r.out) == (0, "via stdin\n")
    r = run(*base, "--json", "queues", "list")
    assert [x["name"] for x in json.loads(r.out)] == ["sp"]
    assert run(*base, "queues", "delete", "sp").status == 0
    r = run(*base, "queues", "delete", "sp")
    assert r.status == 5 and r.err.startswith("warren ctl: ")


def test_table_text_is_one_line_per_row(server: Server, vhost: str) -> None:
    api(server, "PUT", f"/api/queues/{q(vhost)}/nl", {"durable": True})
    ok(server, "-p", vhost, "publish", "-k", "nl", "-b", "a\nb\tc")
    out = ok(server, "-p", vhost, "get", "nl")
    lines = out.splitlines()
    assert len(lines) == 2 and re.search(r"a\\nb\\tc$", lines[1])


def test_super_streams(server: Server, vhost: str) -> None:
    """rabbitmq-streams add_super_stream's options over PUT
    /api/stream/super-streams (RabbitMQ's), delete over Warren's DELETE."""
    ok(server, "-p", vhost, "super-streams", "add", "orders")
    ok(
        server,
        "-p",
        vhost,
        "super-streams",
        "add",
        "regions",
        "--binding-keys",
        "amer,emea",
        "--max-length-bytes",
        "2mb",
        "--max-age",
        "PT10M30S",
    )
    names = {x["name"] for x in api(server, "GET", f"/api/queues/{q(vhost)}")}
    assert {"orders-0", "orders-1", "orders-2", "regions-amer", "regions-emea"} <= names
    got = api(server, "GET", f"/api/queues/{q(vhost)}/regions-emea")
    assert got["arguments"]["x-max-length-bytes"] == 2_000_000
    assert got["arguments"]["x-max-age"] == "630s"
    ex = api(server, "GET", f"/api/exchanges/{q(vhost)}/orders")
    assert ex["type"] == "direct" and ex["arguments"]["x-super-stream"] is True
    keys = {b["routing_key"] for b in api(server, "GET", f"/api/bindings/{q(vhost)}")}
    assert {"0", "1", "2", "amer", "emea"} <= keys
    assert ctl(server, "-p", vhost, "super-streams", "add", "orders").status == 6
    r = ctl(
        server, "-p", vhost, "super-streams", "add", "x", "--partitions", "2", "--binding-keys", "a"
    )
    assert r.status == 1, r  # one or the other
    if server.external:
        return  # RabbitMQ's API has no DELETE for a super stream
    ok(server, "-p", vhost, "super-streams", "delete", "orders")
    names = {x["name"] for x in api(server, "GET", f"/api/queues/{q(vhost)}")}
    assert not [n for n in names if n.startswith("orders")]
    assert api_status(server, "GET", f"/api/exchanges/{q(vhost)}/orders") == 404
    assert ctl(server, "-p", vhost, "super-streams", "delete", "orders").status == 5


def test_super_stream_sizes_and_durations() -> None:
    from warren.ctl.super_streams import information_unit, max_age

    assert [information_unit(t) for t in ("1000", "2mb", "2MB", "2m", "1KiB", "3gi")] == [
        1000,
        2_000_000,
        2_000_000,
        2_000_000,
        1024,
        3 << 30,
    ]
    assert [max_age(t) for t in ("PT10M30S", "P5DT8H", "P1Y", "7D", "1h")] == [
        "630s",
        f"{5 * 86400 + 8 * 3600}s",
        f"{365 * 86400}s",
        "7D",
        "1h",
    ]
    for bad in ("lots", "2xb", "-1"):
        r = ctl(None, "super-streams", "add", "s", "--max-length-bytes", bad)
        assert r.status == 1, (bad, r)
    for bad in ("P", "PT", "P1H", "PT1D"):
        r = ctl(None, "super-streams", "add", "s", "--max-age", bad)
        assert r.status == 1, (bad, r)
