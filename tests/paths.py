"""Where things are, for tests in any subdirectory of tests/ (tests/ is on
sys.path through its conftest.py)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SRC = REPO / "src"
TOOLS = REPO / "tools"
DATA = TESTS / "data"
# RabbitMQ's recorded management answers (tests/http).
HTTP_DATA = TESTS / "http"
