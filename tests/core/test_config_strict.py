"""Config file strictness (issue 28): an unknown section or key stops the start.

A typo in the INI file (``[mian]``, ``prot = 5673``) used to log a warning and
start the broker on defaults, making ./data where it was run. Now it is an
error naming the file, the line and the nearest known name, before anything
is created; and every setting the docs show is one the broker knows.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

from warren import config_ini as config_module
from warren.config import Config, ConfigError
from warren.config_names import RENAMED, UNSUPPORTED_KEYS
from warren.config_oauth2 import is_extra_key

ROOT = REPO
SRC = ROOT / "src"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


#: Listeners that cannot collide with another broker, should a start get that far.
QUIET_PORTS = ("--amqp-port", "0", "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1")
QUIET_PORTS += ("--prometheus-port", "-1")


def run_warren(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m warren`` in ``cwd`` with listeners that cannot collide."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "warren", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def config_error(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        Config.from_ini(path)
    return str(info.value)


# --- unknown names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[mian]\ndata_dir = x\n", ":1: unknown section [mian] (did you mean [main]?)"),
        ("[main]\nlog_level = info\n\n[amqp]\nprot = 5673\n", ":5: unknown setting [amqp] prot (did you mean port?)"),
        ("[amqp]\ndata_dir = /d\n", ":2: unknown setting [amqp] data_dir (did you mean [main] data_dir?)"),
        ("[mgmt]\nbnid = ::\n", ":2: unknown setting [mgmt] bnid (did you mean bind?)"),
        ("[mqtt]\nprefetch_count = 9\n", ":2: unknown setting [mqtt] prefetch_count (did you mean prefetch?)"),
        ("[clustring]\nenabled = true\n", ":1: unknown section [clustring] (did you mean [clustering]?)"),
        # An empty section is still a typo of a known one.
        ("[amqp]\nport = 5673\n[promethues]\n", ":3: unknown section [promethues] (did you mean [prometheus]?)"),
        # No near name: the known ones are listed.
        ("[amqp]\nzzz = 1\n", ":2: unknown setting [amqp] zzz (known keys in [amqp]: bind, channel_max,"),
        ("[zzz]\n", ":1: unknown section [zzz] (known sections: [amqp], [amqp1], [clustering],"),
        # LavinMQ names Warren has under another name: ignoring them would change
        # what the broker does (here: the default user's password).
        ("[main]\ndefault_password_hash = abc\n", ":2: unknown setting [main] default_password_hash (Warren takes the default user's password in plain text: [main] default_password)"),
        ("[http]\nport = 15673\n", ":1: unknown section [http] (Warren's management API section is [mgmt])"),
        ("[mqtt]\nmax_inflight_messages = 10\n", ":2: unknown setting [mqtt] max_inflight_messages (Warren's is [mqtt] prefetch)"),
    ],
)  # fmt: skip
def test_unknown_name_is_an_error_with_file_line_and_nearest(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "warren.ini"
    assert config_error(path, text).startswith(f"{path}{expected}")


def test_unknown_key_leaves_config_untouched(tmp_path: Path) -> None:
    c = Config()
    path = tmp_path / "w.ini"
    path.write_text("[amqp]\nport = 6000\nprot = 6001\n")
    with pytest.raises(ConfigError):
        c.apply_ini(path)
    assert c == Config()


def test_retention_keys_are_known_in_mgmt_only(tmp_path: Path) -> None:
    path = tmp_path / "w.ini"
    path.write_text("[mgmt]\nsample_retention_policies.global.60 = 5\n")
    assert Config.from_ini(path).sample_retention_global == ((60, 5),)
    msg = config_error(path, "[amqp]\nsample_retention_policies.global.60 = 5\n")
    assert msg.startswith(f"{path}:2: unknown setting [amqp] sample_retention_policies.global.60")


# --- bad values and malformed files name file and line -------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[amqp]\nbind = ::1\nport = lots\n", ":3: [amqp] port = 'lots': not an integer"),
        ("[main]\n\nlog_level = loud\n", ":3: [main] log_level = 'loud': must be one of"),
        ("[mqtt]\nallow_anonymous = perhaps\n", ":2: [mqtt] allow_anonymous = 'perhaps': not a boolean"),
        ("[amqp]\nPort = 70000\n", ":2: [amqp] port = '70000': must be between 0 and 65535"),
        ("[mgmt]\nsample_retention_policies.global.x = 5\n", ":2: [mgmt] sample_retention_policies.global.x = '5':"),
        ("[mgmt]\nsample_retention_policies.basic.60 = 120\n", ":2: [mgmt] sample_retention_policies.basic: 60: 120:"),
        # Settings that need another: the line of the one that asks.
        ("[main]\nlog_level = info\ntls_verify_peer = true\n", ":3: [main] tls_verify_peer: tls_verify_peer needs tls_ca_cert"),
        ("[clustering]\netcd_key = /k.pem\n", ":2: [clustering] etcd_key: [clustering] etcd_cert and etcd_key go together"),
        # What configparser refuses, with its line.
        ("port = 5672\n", ":1: malformed config file: 'port = 5672' is before any [section]"),
        ("[amqp]\nport = 1\nport = 2\n", ":3: malformed config file: [amqp] port is set twice"),
        ("[amqp]\nport = 1\n[amqp]\n", ":3: malformed config file: [amqp] appears twice"),
        ("[amqp]\nport = 1\nno value here\n", ":3: malformed config file: not a [section] or key = value: 'no value here'"),
    ],
)  # fmt: skip
def test_bad_value_names_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "warren.ini"
    assert config_error(path, text).startswith(f"{path}{expected}")


def test_inline_comments_as_the_docs_write_them(tmp_path: Path) -> None:
    path = tmp_path / "w.ini"
    path.write_text(
        "[main]\nlog_level = warn   ; a comment\ndefault_password = a;b\n"
        "[amqp]                ; the AMQP listener\nport = 5690\n"
    )
    c = Config.from_ini(path)
    # ';' after whitespace starts a comment; inside a value it is kept.
    assert (c.log_level, c.default_password, c.amqp_port) == ("warning", "a;b", 5690)


# --- the command line: an error, nothing on disk ---------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[mian]\nlog_level = debug\n", "warren.ini:1: unknown section [mian] (did you mean [main]?)"),
        ("[amqp]\nprot = 5673\n", "warren.ini:2: unknown setting [amqp] prot (did you mean port?)"),
        ("[amqp]\nport = 5673x\n", "warren.ini:2: [amqp] port = '5673x': not an integer"),
    ],
)  # fmt: skip
def test_warren_refuses_to_start_and_creates_nothing(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "warren.ini").write_text(text)
    result = run_warren(tmp_path, "-c", "warren.ini", *QUIET_PORTS)
    assert result.returncode == 2
    assert result.stderr == f"warren: {expected}\n"
    assert "Traceback" not in result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warren.ini"]  # no ./data


# --- the docs ------------------------------------------------------------------------------


def _doc_ini_blocks() -> list[tuple[str, str]]:
    blocks = []
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```ini\n(.*?)```", doc.read_text(), re.S)):
            blocks.append((f"{doc.relative_to(ROOT)}#{i + 1}", block))
    return blocks


_BLOCKS = _doc_ini_blocks()


@pytest.mark.parametrize(("where", "block"), _BLOCKS, ids=[where for where, _ in _BLOCKS])
def test_every_ini_block_in_the_docs_loads(
    tmp_path: Path, where: str, block: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each config example in README.md and docs/*.md is read without a warning."""
    path = tmp_path / "doc.ini"
    path.write_text(block)
    with caplog.at_level(logging.WARNING, logger="warren.config"):
        Config.from_ini(path)
    assert not caplog.records, where


def _known(section: str, key: str) -> bool:
    """A setting of Warren's, or a LavinMQ one the docs name to say what Warren does with it."""
    if section == "mgmt" and key.startswith("sample_retention_policies."):
        return True
    if section == "oauth2" and is_extra_key(key):  # config_oauth2.py's dotted keys
        return True
    return (section, key) in config_module._INI_KEYS or (
        (section, key) in UNSUPPORTED_KEYS or (section, key) in RENAMED
    )


def _doc_mentions() -> list[tuple[str, str, str]]:
    """Every ``[section] key`` the docs name in backticks, and the keys in their tables."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        name = str(doc.relative_to(ROOT))
        for m in re.finditer(r"`\[([a-z_]+)\]\s+([a-z_][a-z0-9_.]*)", text):
            found.append((name, m.group(1), m.group(2)))
        # Tables of one section's keys: "| Setting (INI `[mqtt]`) |", or a "| Key |"
        # table right after "`[clustering]` in the INI file".
        for m in re.finditer(
            r"(?:\| Setting \(INI `\[(\w+)\]`\)|`\[(\w+)\]` in the INI file.*?\n\n\| Key) \|.*?\n"
            r"\|[-|]+\n((?:\|.*\n)+)",
            text,
        ):
            section = m.group(1) or m.group(2)
            for row in m.group(3).splitlines():
                for key in re.findall(r"`([a-z_.]+)`", row.split("|")[1]):
                    found.append((name, section, key))
    return found


def test_every_setting_the_docs_name_is_known() -> None:
    mentions = _doc_mentions()
    sections = {s for _, s, _ in mentions}
    assert {"main", "amqp", "mgmt", "mqtt", "clustering", "prometheus"} <= sections
    assert ("docs/mqtt.md", "mqtt", "partial_packet_memory") in mentions  # the table
    assert ("docs/clustering.md", "clustering", "lease_ttl") in mentions
    unknown = [m for m in mentions if not _known(m[1], m[2])]
    assert not unknown
