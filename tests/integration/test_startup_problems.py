"""The first seconds of ``warren`` (issue 28): a bad data dir, an early Ctrl-C.

Real processes: ``python -m warren`` with a temporary data dir, its exit
status, what it wrote and what it left on disk. A data dir that is a file or
not writable used to end in ``[Errno 17] File exists`` / ``[Errno 1]
Operation not permitted: .../.lock``; a Ctrl-C before the broker's handler
was in place, in a KeyboardInterrupt traceback. `warren users` and `warren
orphans`, which work on a stopped broker's data dir, say the same one line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import SRC

from warren import cli

#: Listeners that cannot collide with another broker on this machine.
QUIET_PORTS = ("--amqp-port", "0", "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1")
QUIET_PORTS += ("--prometheus-port", "-1")


def warren_command(*args: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return [sys.executable, "-m", "warren", *QUIET_PORTS, *args], env


def run_warren(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command, env = warren_command(*args)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- the data dir ----------------------------------------------------------------


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    result = run_warren(tmp_path, "-D", "data")
    assert result.returncode == 1
    assert (
        result.stderr
        == "warren: cannot start: data dir data exists but is a file, not a directory\n"
    )
    assert result.stdout == ""  # no log line before it
    assert tree(tmp_path) == ["data"] and (tmp_path / "data").read_text() == "not a directory"


def test_data_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    result = run_warren(tmp_path, "-D", str(tmp_path / "f" / "sub" / "data"))
    assert result.returncode == 1
    assert result.stderr == (
        f"warren: cannot start: data dir {tmp_path}/f/sub/data cannot be created: "
        f"{tmp_path}/f is not a directory\n"
    )
    assert tree(tmp_path) == ["f"]


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write to: mode 0555, and immutable for root."""
    path = tmp_path / "readonly"
    path.mkdir()
    (path / "kept").write_text("")
    path.chmod(0o555)
    immutable = False
    if os.geteuid() == 0:  # root ignores the mode bits, not the immutable attribute
        try:
            done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, timeout=30)
        except FileNotFoundError:
            pytest.skip("running as root without chattr: no directory root cannot write")
        if done.returncode != 0:
            pytest.skip(f"chattr +i not supported here: {done.stderr.decode().strip()}")
        immutable = True
    try:
        assert not os.access(path, os.W_OK)
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True, timeout=30)
        path.chmod(0o755)


def test_data_dir_not_writable(unwritable_dir: Path) -> None:
    result = run_warren(unwritable_dir.parent, "-D", str(unwritable_dir))
    assert result.returncode == 1
    assert re.fullmatch(
        rf"warren: cannot start: data dir {re.escape(str(unwritable_dir))} is not writable "
        r"by user \S+\n",
        result.stderr,
    ), result.stderr
    assert tree(unwritable_dir) == ["kept"]  # no .lock


def test_data_dir_whose_parent_cannot_be_made(unwritable_dir: Path) -> None:
    data = unwritable_dir / "sub" / "data"
    result = run_warren(unwritable_dir.parent, "-D", str(data))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"warren: cannot start: data dir {data} cannot be created: {unwritable_dir} "
        "is not writable by user "
    )
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert tree(unwritable_dir) == ["kept"]


def test_writable_or_missing_data_dir_has_no_problem(tmp_path: Path) -> None:
    assert cli.data_dir_problem(str(tmp_path)) is None
    assert cli.data_dir_problem(str(tmp_path / "new" / "deeper")) is None
    assert tree(tmp_path) == []  # the check creates nothing


def test_other_file_errors_at_start_name_the_path(tmp_path: Path) -> None:
    """An OSError about a file met later in the start: its path and reason, no errno dump."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "vhosts").write_text("a file where the vhosts directory goes")
    result = run_warren(tmp_path, "-D", "data")
    assert result.returncode == 1
    assert re.fullmatch(
        rf"warren: cannot start: {re.escape(str(tmp_path))}/data/vhosts/\S+: Not a directory\n",
        result.stderr,
    ), result.stderr


# --- the same for the commands on a stopped broker's data dir --------------------------

#: `warren users` and `warren orphans`, each with a read-only subcommand.
OFFLINE = [("users", "list"), ("orphans", "list")]


def run_offline(
    cwd: Path, command: str, data_dir: str, sub: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "warren", command, "-D", data_dir, sub],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("command", "sub"), OFFLINE)
def test_offline_command_on_a_data_dir_that_is_a_file(
    tmp_path: Path, command: str, sub: str
) -> None:
    (tmp_path / "data").write_text("not a directory")
    result = run_offline(tmp_path, command, "data", sub)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"warren {command}: data dir data exists but is a file, not a directory\n"
    )
    assert tree(tmp_path) == ["data"] and (tmp_path / "data").read_text() == "not a directory"


@pytest.mark.parametrize(("command", "sub"), OFFLINE)
def test_offline_command_on_a_data_dir_not_writable(
    unwritable_dir: Path, command: str, sub: str
) -> None:
    result = run_offline(unwritable_dir.parent, command, str(unwritable_dir), sub)
    assert (result.returncode, result.stdout) == (1, "")
    assert re.fullmatch(
        rf"warren {command}: data dir {re.escape(str(unwritable_dir))} is not writable "
        r"by user \S+\n",
        result.stderr,
    ), result.stderr
    assert tree(unwritable_dir) == ["kept"]  # no .lock


def test_users_on_a_data_dir_that_cannot_be_made(unwritable_dir: Path) -> None:
    """`warren users` makes a missing data dir (a new broker's users), as `warren` would."""
    data = unwritable_dir / "sub" / "data"
    result = run_offline(unwritable_dir.parent, "users", str(data), "list")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(
        f"warren users: data dir {data} cannot be created: {unwritable_dir} "
        "is not writable by user "
    )
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert tree(unwritable_dir) == ["kept"]


def test_users_on_a_data_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    result = run_offline(tmp_path, "users", "f/data", "list")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"warren users: data dir f/data cannot be created: {tmp_path}/f is not a directory\n"
    )
    assert tree(tmp_path) == ["f"]


def test_orphans_on_a_missing_data_dir(tmp_path: Path) -> None:
    """`warren orphans` never makes one: nothing to look at is an error, made nowhere."""
    (tmp_path / "f").write_text("")
    for missing in ("data", "f/data"):
        result = run_offline(tmp_path, "orphans", missing, "list")
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == f"warren orphans: data dir {missing} does not exist\n"
    assert tree(tmp_path) == ["f"]


# --- Ctrl-C early ------------------------------------------------------------------------


def _warren_frames(output: str) -> list[str]:
    """Traceback lines in Warren's sources (the package's __init__ aside: see below)."""
    return [
        line
        for line in output.splitlines()
        if line.strip().startswith("File ")
        and str(SRC / "warren") in line
        and not line.strip().startswith(f'File "{SRC / "warren" / "__init__.py"}"')
    ]


def test_sigint_right_after_spawn(tmp_path: Path) -> None:
    """However early Ctrl-C comes, Warren's code prints no traceback and creates nothing.

    Right after spawn the signal meets the interpreter's own start (killed by
    SIGINT, or CPython's "Fatal Python error" on a slow machine) or the import
    of the warren package, which no code of Warren's can catch (the console
    script and runpy import it first); from warren.cli on, it is one line and
    status 130.
    """
    command, env = warren_command("-D", "data")
    for _ in range(3):
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert not _warren_frames(out + err), err
        if "Traceback" not in err:
            assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, out, err)
        assert proc.returncode != 0
        assert tree(tmp_path) == []


def _sigint_after_first_line(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    command, env = warren_command(*args)
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, first + out, err


def test_sigint_while_the_broker_is_imported_stops_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """At debug level the first line comes just before the event loop and the broker's import."""
    status, out, err = _sigint_after_first_line(tmp_path, "-D", "data", "--log-level", "debug")
    assert "Traceback" not in out + err and err == ""
    assert "event loop:" in out.splitlines()[0]
    if status == 130:
        # Debug level may log more before the interrupt lands (asyncio's selector line):
        # the last line is the interrupt's, and nothing was made.
        assert "interrupted before the broker started" in out.splitlines()[-1], out
        assert tree(tmp_path) == []  # no ./data
    else:  # the import won the race on a slow machine: the normal Ctrl-C path
        assert status == 0 and "received SIGINT, shutting down" in out


def test_sigint_after_the_first_line_of_an_ephemeral_broker(tmp_path: Path) -> None:
    status, out, err = _sigint_after_first_line(tmp_path, "--ephemeral")
    assert "Traceback" not in out + err and err == ""
    first, *rest = out.splitlines()
    data_dir = Path(re.search(r"ephemeral: data in (\S+),", first).group(1))  # type: ignore[union-attr]
    assert status in (0, 130)
    if status == 130:
        assert len(rest) == 1 and "interrupted before the broker started" in rest[0]
    else:
        assert "received SIGINT, shutting down" in out
    assert not data_dir.exists()  # removed however the run ended


def test_sigint_during_start_takes_the_normal_path(tmp_path: Path) -> None:
    """Once the broker logs, its own handler is in place: an orderly stop, status 0."""
    status, out, err = _sigint_after_first_line(tmp_path, "-D", "data")
    assert "Traceback" not in out + err and err == ""
    assert status == 0
    assert "received SIGINT, shutting down" in out and out.rstrip().endswith("stopped")
