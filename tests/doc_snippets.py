"""The code blocks of README.md and docs/*.md, and a runner that executes them.

Every fenced block names its language. Blocks in ``python``, ``sh`` and
``console`` are code a reader may paste, so tests/integration/test_doc_snippets.py runs
each of them, in the order the page shows them, against a Warren started for
that page, unless an HTML comment on the lines just above the fence says
otherwise::

    <!-- snippet: illustrative: REASON -->   not run (a fragment, a benchmark,
                                            another machine); the reason is required
    <!-- snippet: needs EXE [EXE ...] -->    run only where these programs are on PATH
    <!-- snippet: unchecked-output: REASON --> console: run, the exit status
                                            checked, the output not compared
    <!-- snippet: no-errexit -->             sh: run without ``set -e`` (the block
                                            looks at exit statuses itself)
    <!-- snippet: pika-channel -->           python: run with ``connection`` (a pika
                                            BlockingConnection to the page's broker)
                                            and its ``channel`` defined, as prose
                                            fragments assume; closed afterwards
    <!-- snippet: pytest [DIR ...] -->       python: the block is a test module; run
                                            it as ``test_snippet.py`` in a directory
                                            of its own with pytest and Warren's
                                            plugin (its fixtures), DIRs (relative to
                                            the checkout) on ``PYTHONPATH``; it must
                                            collect a test and pass

Pages show normal code: the default ports (5672, 15672, 1883, 15692, 5552) and
``127.0.0.1``/``localhost``. So the runner works in a private network
namespace (``unshare -rnm``, unprivileged user, network and mount namespaces:
only a loopback interface, and a /tmp of its own): there ``warren
--ephemeral`` listens on the default ports whatever runs on the machine's
own, and the snippets run verbatim. Working directory: a temporary directory holding links to the
checkout's ``src``, ``tools``, ``bench``, ``tests``, ``examples`` and the
running interpreter's venv as ``.venv``; ``PATH`` starts with that venv's
``bin``. Python blocks run in a fresh interpreter each (a fresh fork of the
runner, below); a block with a top-level ``await`` / ``async with`` runs as a coroutine. Shell blocks run
under ``bash -e -o pipefail``. Console blocks (``$ command`` lines, each
followed by its output) run one command at a time and compare the output with
the page's, whitespace runs collapsed.

One runner process in the namespaces runs a pytest process's pages one after
another (PageRunner). It imports the broker, pytest and pika once; each page's
``warren --ephemeral`` is a fork of it, with a /tmp of its own, and so is each
python block, run as ``python snippet.py`` or ``python -m pytest ...`` would
run it (sys.argv, sys.path, environment, atexit; the doc_commands checks are
another module): tests/forkserver.py's ``fork_here``, the tests' fork
server's own way to fork, done by the runner itself (it runs inside the
namespaces, and has imported what a page needs). Importing those was some 0.25 s of CPU a page and 0.1-0.5 s
a python block, half of the pages' CPU. pytest says of the preloaded package:
"Module already imported so cannot be rewritten; warren" (the plugin module
itself is still rewritten).

Run by hand: ``python tests/doc_snippets.py docs/ctl.md`` (it re-executes
itself under ``unshare``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import forkserver

ROOT = Path(__file__).resolve().parent.parent
CODE_LANGUAGES = ("python", "sh", "console")
# Languages of blocks that are not run: data, config and pictures.
OTHER_LANGUAGES = ("text", "ini", "json", "yaml", "toml", "promql", "c", "http", "diff")
MARKER_KINDS = ("illustrative", "needs", "unchecked-output", "no-errexit", "pika-channel", "pytest")
# Markers that say how a python block runs.
PYTHON_MARKERS = ("pika-channel", "pytest")
DEFAULT_PORTS = (5672, 15672, 1883, 15692, 5552)

_FENCE = re.compile(r"^(\s*)(`{3,})(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<kind>[a-z-]+)(?P<rest>.*?)\s*-->\s*$")


@dataclasses.dataclass
class Marker:
    kind: str
    args: list[str]
    reason: str


@dataclasses.dataclass
class Block:
    path: str  # relative to the checkout
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    markers: list[Marker]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def marker(self, kind: str) -> Marker | None:
        return next((m for m in self.markers if m.kind == kind), None)

    @property
    def is_code(self) -> bool:
        return self.language in CODE_LANGUAGES


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_marker(line: str) -> Marker | None:
    """A ``<!-- snippet: ... -->`` line, or None; ValueError when malformed."""
    m = _MARKER.match(line)
    if m is None:
        if "snippet:" in line and "<!--" in line:
            raise ValueError(f"malformed snippet marker: {line.strip()}")
        return None
    kind, rest = m.group("kind"), m.group("rest")
    if kind not in MARKER_KINDS:
        raise ValueError(f"unknown snippet marker {kind!r} (known: {', '.join(MARKER_KINDS)})")
    args_part, _, reason = rest.partition(":")
    args = args_part.split()
    reason = reason.strip()
    if kind in ("illustrative", "unchecked-output") and not reason:
        raise ValueError(f"snippet marker {kind!r} needs a reason: <!-- snippet: {kind}: why -->")
    if kind == "needs" and not args:
        raise ValueError("snippet marker 'needs' names the programs: <!-- snippet: needs java -->")
    return Marker(kind, args, reason)


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page; ValueError for a malformed or stray marker."""
    rel = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: list[Marker] = []
    i = 0
    while i < len(lines):
        try:
            marker = parse_marker(lines[i])
        except ValueError as e:
            raise ValueError(f"{rel}:{i + 1}: {e}") from None
        if marker is not None:
            pending.append(marker)
            i += 1
            continue
        m = _FENCE.match(lines[i])
        if m is None:
            if pending and lines[i].strip():
                raise ValueError(f"{rel}:{i}: a snippet marker not followed by a code block")
            i += 1
            continue
        indent, fence, language = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        found.append(Block(rel, i + 1, language, "\n".join(body) + "\n", pending))
        pending = []
        i = j + 1
    if pending:
        raise ValueError(f"{rel}: a snippet marker at the end of the page, with no block")
    return found


def all_blocks() -> list[Block]:
    return [b for p in doc_paths() for b in blocks(p)]


def to_run(block: Block) -> bool:
    """Whether the runner executes this block (where its ``needs`` are met)."""
    return block.is_code and block.marker("illustrative") is None


def missing_programs(block: Block) -> list[str]:
    needs = block.marker("needs")
    return [exe for exe in (needs.args if needs else []) if shutil.which(exe) is None]


# --- the runner, inside the namespace ----------------------------------------------------


def _loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (SIOCGIFFLAGS / SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, req)[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))


def _wait_ports(ports: tuple[int, ...], pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() > deadline:
                raise RuntimeError(f"warren did not listen on {port}")
            time.sleep(0.05)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="warren-doc-") as tmp:
        work = Path(tmp)
        for name in ("src", "tools", "bench", "tests", "examples", "docs"):
            (work / name).symlink_to(ROOT / name)
        (work / ".venv").symlink_to(Path(sys.prefix))
        yield work


def _env(work: Path) -> dict[str, str]:
    env = forkserver.env_with_src()
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(work)
    for var in ("WARREN_URL", "WARREN_USER", "WARREN_PASSWORD"):
        env.pop(var, None)
    return env


# The names a ``pika-channel`` block finds defined: what "``channel`` is a pika
# channel" means in the prose around such a fragment.
_PIKA_CHANNEL = """\
import pika
connection = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@localhost:5672/%2F"))
channel = connection.channel()
exec(compile({text!r}, "<snippet>", "exec"))
connection.close()
"""


def run_python(
    text: str, work: Path, env: dict[str, str], pika_channel: bool = False
) -> tuple[int, str]:
    """A python block in a fresh interpreter (_python); top-level await runs as a coroutine."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code = compile(text, "<snippet>", "exec", flags=flags)
    script = work / "snippet.py"
    if pika_channel:
        script.write_text(_PIKA_CHANNEL.format(text=text))
    elif code.co_flags & 0x80:  # CO_COROUTINE: the block awaits at top level
        script.write_text(
            "import ast, asyncio\n"
            f"_code = compile({text!r}, '<snippet>', 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
            "asyncio.run(eval(_code, {'__name__': '__main__'}))\n"
        )
    else:
        script.write_text(text)
    return _python([str(script)], work, env)


def run_pytest(text: str, work: Path, env: dict[str, str], paths: list[str]) -> tuple[int, str]:
    """A python block that is a pytest module, run with Warren's plugin as a
    reader's suite would: its own directory, no ini file, the fixtures from the
    plugin (``-p no:warren -p warren.pytest_plugin``: whether or not the
    package's entry point is installed)."""
    suite = Path(tempfile.mkdtemp(prefix="pytest-", dir=work))
    (suite / "test_snippet.py").write_text(text)
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(ROOT / p) for p in paths), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    return _python(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["-p", "no:hypothesispytest"]  # seconds of imports that no snippet uses
        + ["-p", "no:warren", "-p", "warren.pytest_plugin", "test_snippet.py"],
        suite,
        env,
    )


#: Set in the runner (serve): python blocks run in children forked from it;
#: the runner's own PYTHONPATH, which those children's sys.path replaces.
_FORK = False
_RUNNER_PYTHONPATH = ""


def _python(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """``python ARGS`` (a script, or ``-m MODULE ...``) in ``cwd`` with ``env``:
    (exit status, output). In the runner a fork of it: a fresh copy of an
    interpreter that has imported the broker, pytest and pika (some 0.1-0.5 s
    of CPU a block less than a new one)."""
    if not _FORK:
        proc = subprocess.run(
            [sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=120
        )
        return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
    with tempfile.TemporaryFile() as out:
        # What the command line would put on sys.path: the working directory
        # (-m) or the script's, PYTHONPATH, then the interpreter's own (the
        # runner's PYTHONPATH taken out).
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        runner_extra = [p for p in _RUNNER_PYTHONPATH.split(os.pathsep) if p]
        rest = [p for p in sys.path[1:] if p not in runner_extra]
        first = str(cwd) if args[0] == "-m" else str(Path(args[0]).parent)
        job = {
            "module": args[1] if args[0] == "-m" else None,
            "script": None if args[0] == "-m" else args[0],
            "args": args[2:] if args[0] == "-m" else args[1:],
            "env": env, "cwd": str(cwd), "streams": [0, 1, 2],
            "sys_path_exact": [first, *extra, *rest],
        }
        with open(os.devnull, "rb") as null:
            pid = forkserver.fork_here(job, [null.fileno(), out.fileno(), out.fileno()])
        pidfd = os.pidfd_open(pid)
        try:
            if not select.select([pidfd], [], [], 120)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired([sys.executable, *args], 120)
        finally:
            os.close(pidfd)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0)
        return status, out.read().decode(errors="replace")


def run_sh(text: str, work: Path, env: dict[str, str], errexit: bool) -> tuple[int, str]:
    opts = ["-e", "-o", "pipefail"] if errexit else []
    proc = subprocess.run(
        ["bash", *opts, "-c", text], cwd=work, env=env, capture_output=True, timeout=120
    )
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines and the output lines after each."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block: output before the first '$ ' line: {line!r}")
    return steps


def _normal(lines: list[str]) -> list[str]:
    out = [" ".join(ln.split()) for ln in lines]
    while out and not out[-1]:
        out.pop()
    return out


def run_console(text: str, work: Path, env: dict[str, str], compare: bool) -> tuple[int, str]:
    for command, expected in console_steps(text):
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
        actual = proc.stdout.decode(errors="replace")
        if proc.returncode != 0:
            return proc.returncode, f"$ {command}\n{actual}"
        if compare and _normal(actual.splitlines()) != _normal(expected):
            shown = "\n".join(expected)
            return 1, f"$ {command}\nexpected:\n{shown}\ngot:\n{actual}"
    return 0, ""


def run_block(block: Block, work: Path, env: dict[str, str]) -> tuple[int, str]:
    if block.language == "python":
        suite = block.marker("pytest")
        if suite is not None:
            return run_pytest(block.text, work, env, suite.args)
        return run_python(block.text, work, env, block.marker("pika-channel") is not None)
    if block.language == "sh":
        return run_sh(block.text, work, env, errexit=block.marker("no-errexit") is None)
    return run_console(block.text, work, env, compare=block.marker("unchecked-output") is None)


@contextlib.contextmanager
def _private_tmp() -> Iterator[None]:
    """A fresh tmpfs on /tmp for one page, so pages that write to /tmp/... (README's
    embedding example) neither collide with a parallel run or another page nor
    leave files."""
    here = (ROOT, Path(sys.prefix).resolve())
    if any(Path("/tmp") in (p, *p.parents) for p in here):
        yield  # the checkout or the venv lives there: keep it visible
        return
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp"], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", "/tmp"], check=True)


def _preload() -> None:
    """Import what a page's broker imports once, in the runner: each page's broker
    is a fork of it (importing warren.app is some 0.25 s of CPU, per page before)."""
    import pika  # noqa: F401
    import pytest  # noqa: F401

    import warren.app  # noqa: F401
    import warren.cli  # noqa: F401


def _fork_broker(work: Path, env: dict[str, str], log: int) -> int:
    """``warren --ephemeral --log-level warning`` forked from the runner
    (tests/forkserver.py's fork_here: as ``python -m warren`` would run it, cwd,
    environment, stdin and stdout /dev/null, killed if the runner ends); its
    stderr goes to ``log``. Returns its pid."""
    job = {
        "module": "warren", "args": ["--ephemeral", "--log-level", "warning"],
        "env": env, "cwd": str(work), "streams": [0, 1, 2],
    }
    with open(os.devnull, "r+b") as null:
        return forkserver.fork_here(job, [null.fileno(), null.fileno(), log])


def _stop(pid: int) -> None:
    """SIGTERM (the broker stops cleanly), SIGKILL after 20 s; reaped either way."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def run_page(rel: str) -> list[dict[str, object]]:
    """Start Warren on the default ports and run the page's blocks in order (in the
    runner: inside the namespaces, _preload done)."""
    page = [b for b in blocks(ROOT / rel) if to_run(b)]
    results: list[dict[str, object]] = []
    with _private_tmp(), _workdir() as work, tempfile.TemporaryFile() as log:
        env = _env(work)
        broker = _fork_broker(work, env, log.fileno())
        try:
            try:
                _wait_ports(DEFAULT_PORTS, broker, 60)
            except RuntimeError as e:
                log.seek(0)
                raise RuntimeError(f"{e}:\n{log.read().decode(errors='replace')}") from None
            for block in page:
                missing = missing_programs(block)
                if missing:
                    results.append({"where": block.where, "skipped": f"needs {missing}"})
                    continue
                status, output = run_block(block, work, env)
                results.append({"where": block.where, "status": status, "output": output})
        finally:
            _stop(broker)
    return results


def serve() -> None:
    """The runner, in private user, network and mount namespaces: a page's path a
    line on stdin, its results a JSON line on stdout, until stdin ends."""
    global _FORK, _RUNNER_PYTHONPATH
    _loopback_up()
    _preload()
    _FORK, _RUNNER_PYTHONPATH = True, os.environ.get("PYTHONPATH", "")
    for line in sys.stdin:
        try:
            answer: object = run_page(line.strip())
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            answer = {"error": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def can_unshare() -> bool:
    exe = shutil.which("unshare")
    if exe is None:
        return False
    return subprocess.run([exe, "-rnm", "true"], capture_output=True).returncode == 0


class PageRunner:
    """A runner (``serve``) in private user, network and mount namespaces
    (``unshare -rnm``), which runs pages one after another, each against a fresh
    broker: one per pytest process rather than a process and a broker import per
    page. After a failure to answer (a timeout, an interrupted test) it is ended,
    and the next page starts a new one."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
        )
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        return subprocess.Popen(
            ["unshare", "-rnm", sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def run(self, rel: str, timeout: float = 900) -> list[dict[str, object]]:
        if self._proc is None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(rel.encode() + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
            line = proc.stdout.readline() if ready else b""
        except BaseException:
            self.close(kill=True)
            raise
        if not line:
            proc.kill()
            proc.wait()
            problem = f"snippet runner gave no answer ({proc.returncode}):\n{self._stderr_text()}"
            self.close()
            raise RuntimeError(problem)
        answer = json.loads(line)
        if isinstance(answer, dict):
            raise RuntimeError(f"snippet runner failed on {rel}:\n{answer['error']}")
        return list(answer)

    def close(self, kill: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the end of the pages: the runner returns
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def run_page_isolated(rel: str) -> list[dict[str, object]]:
    """One page in a runner of its own."""
    runner = PageRunner()
    try:
        return runner.run(rel)
    finally:
        runner.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        serve()
        return 0
    failed = 0
    runner = PageRunner()
    try:
        for rel in argv:
            for r in runner.run(rel):
                ok = r.get("status", 0) == 0
                failed += not ok
                print(
                    r["where"],
                    "skipped: " + str(r["skipped"])
                    if "skipped" in r
                    else ("ok" if ok else f"FAILED ({r['status']})\n{r['output']}"),
                )
    finally:
        runner.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
