"""The README's quick start, run exactly as written, in a copy of the checkout.

It creates the copy's own .venv (`make install`), installs pika, starts the
broker with `make run &`, waits with `warren ctl await-startup` and runs the
pika client. Its ports are the defaults (5672 ...): it runs in a private
network namespace, where they are free (packaging_help's docstring).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging_help import (
    checkout_copy,
    clean_env,
    quick_start,
    require_namespaces,
    run_isolated,
    wheelhouse,
)

pytestmark = pytest.mark.timeout(400)


def test_the_readme_quick_start_runs_as_written(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_namespaces()
    wheels = wheelhouse(tmp_path_factory, "pika")
    repo = checkout_copy(tmp_path / "repo")
    script = tmp_path / "quickstart.sh"
    script.write_text(quick_start())
    env = clean_env(
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheels),
        PIP_NO_CACHE_DIR="1",  # nothing of this run in the user's cache
        PYTHON=sys.executable,  # the Makefile's interpreter for `python -m venv`
    )
    out = run_isolated(script, repo, env, timeout=300)
    lines = out.strip().splitlines()
    # make's steps, one line each, then the client's print of its basic_get.
    assert "== make: creating (or updating) the virtualenv .venv" in lines
    assert any(line.startswith("== make: starting the broker") for line in lines)
    assert "http://127.0.0.1:15672: started" in lines
    got = [line for line in lines if line.startswith("(<Basic.GetOk(")]
    assert len(got) == 1, out
    assert got[0].startswith("(<Basic.GetOk(['delivery_tag=1', "), out
    assert "'message_count=0'" in got[0] and "'routing_key=hello'" in got[0], out
    assert got[0].endswith("b'hi')"), out
    assert (repo / "data").is_dir()  # make run's data dir: the copy's, not the checkout's


def test_a_make_command_line_does_not_reach_the_inner_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `make -s test VENV=/elsewhere` exports to the tests (GNU make 4):
    # a `make` run with that environment takes VENV=/elsewhere as given on its
    # own command line, so the quick start's `make install` went there.
    for name, value in (
        ("MAKEFLAGS", "s -- VENV=/elsewhere"),
        ("MAKELEVEL", "1"),
        ("MAKEOVERRIDES", "${-*-command-variables-*-}"),
        ("MFLAGS", "-s"),
    ):
        monkeypatch.setenv(name, value)
    env = clean_env(PYTHON=sys.executable)
    assert not {"MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS"} & env.keys()
    (tmp_path / "Makefile").write_text("VENV ?= .venv\nshow:\n\t@echo $(VENV)\n")
    shown = subprocess.run(
        ["make", "--no-print-directory", "show"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    assert shown.stdout.strip() == ".venv"
