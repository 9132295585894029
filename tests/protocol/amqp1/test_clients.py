"""The AMQP 1.0 clients the tests will drive the broker with are installed.

Python's come with the test extra (pyproject.toml), Node.js's rhea with
`make rhea` (tests/protocol/amqp1/js); each check skips when its client is
missing, as the tests that use them will.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from paths import TESTS

JS = TESTS / "protocol" / "amqp1" / "js"


def test_qpid_proton_encodes_a_message() -> None:
    proton = pytest.importorskip("proton")
    message = proton.Message(body="hello", address="/queues/q")
    copy = proton.Message()
    copy.decode(message.encode())
    assert (copy.body, copy.address) == ("hello", "/queues/q")


def test_rabbitmq_amqp_python_client_imports() -> None:
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    assert client.AddressHelper.queue_address("q") == "/queues/q"


def test_rhea_loads_in_node() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node (Node.js)")
    if not (JS / "node_modules" / "rhea").is_dir():
        pytest.skip("rhea is not installed: make rhea")
    pinned = json.loads((JS / "package.json").read_text())["dependencies"]["rhea"]
    script = (
        "const rhea = require('rhea');"
        "console.log(require('rhea/package.json').version, typeof rhea.connect)"
    )
    result = subprocess.run(
        [node, "-e", script], cwd=JS, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [pinned, "function"]
