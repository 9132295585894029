"""The first seconds of ``warren`` (issue 28): a bad data dir.

Real processes: ``python -m warren`` with a temporary data dir, its exit
status, what it wrote and what it left on disk. A data dir that is a file or
not writable used to end in ``[Errno 17] File exists`` / ``[Errno 1]
Operation not permitted: .../.lock``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import cli

SRC = Path(__file__).resolve().parent.parent / "src"
#: Listeners that cannot collide with another broker on this machine.
QUIET_PORTS = ("--amqp-port", "0", "--http-port", "-1", "--mqtt-port", "-1")
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
