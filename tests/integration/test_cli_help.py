"""`warren --help` names every protocol and every INI section the config file takes."""

from __future__ import annotations

import contextlib
import io

import pytest

from warren.cli import main as warren_main
from warren.config import ini_sections


def _help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert warren_main(["--help"]) == 0
    return " ".join(out.getvalue().split())  # argparse wraps lines


def test_help_names_every_ini_section() -> None:
    text = _help()
    assert {"main", "amqp", "mgmt", "mqtt", "clustering", "prometheus"} <= set(ini_sections())
    for section in ini_sections():
        assert f"[{section}]" in text, section


@pytest.mark.parametrize("word", ["MQTT", "--mqtt-port", "docs/clustering.md", "warren orphans"])
def test_help_mentions(word: str) -> None:
    assert word in _help()
