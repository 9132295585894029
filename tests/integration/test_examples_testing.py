"""examples/testing: the docs/testing.md examples pass against the plugin's broker.

They run as a user runs them, in their own pytest process (each example
directory imports its app module by its plain name); marked ``examples`` so
`make test` runs them once, in the compiled pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from paths import REPO

EXAMPLES = REPO / "examples" / "testing"
CLIENTS = ("pika", "aio_pika", "kombu", "celery")


def test_examples_pass() -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            p for p in [str(REPO / "src"), os.environ.get("PYTHONPATH")] if p
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         # The plugin by module: its pytest11 entry point is active only where this
         # checkout is installed (blocking the name first avoids a double registration).
         "-p", "no:warren", "-p", "warren.pytest_plugin",
         "-p", "no:hypothesispytest",  # 0.13 s of CPU of imports no example uses
         *(str(EXAMPLES / c) for c in CLIENTS)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) == 8, proc.stdout[-2000:]


def test_every_client_has_an_app_and_a_test() -> None:
    for client in CLIENTS:
        files = sorted(p.name for p in (EXAMPLES / client).glob("*.py"))
        assert any(f.startswith("test_") for f in files), client
        assert any(not f.startswith("test_") for f in files), client
