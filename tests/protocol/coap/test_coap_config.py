"""The ``[coap]`` settings (config_coap.py): read from the INI file, checked,
and the listener made only when enabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.app import default_listeners
from warren.config import Config, ConfigError


def test_coap_is_off_unless_enabled() -> None:
    assert "coap" not in [listener.name for listener in default_listeners(Config())]
    on = default_listeners(Config(coap_enabled=True, coap_port=0))
    assert [listener.name for listener in on].count("coap") == 1


def test_the_coap_section(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[coap]\nenabled = true\nbind = 0.0.0.0\nport = 5684\nanonymous_user = sensors\n"
        "requests_per_second = 0\nmax_payload = 512\nclient_idle_timeout = 30\n"
    )
    config = Config.from_ini(ini)
    assert (config.coap_enabled, config.coap_bind, config.coap_port) == (True, "0.0.0.0", 5684)
    assert (config.coap_anonymous_user, config.coap_requests_per_second) == ("sensors", 0)
    assert (config.coap_max_payload, config.coap_client_idle_timeout) == (512, 30)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("port = 70000", "between 0 and 65535"),
        ("max_payload = 0", "between 1 and 1048576"),
        ("client_idle_timeout = -1", "between 0 and 86400"),
        ("enabled = maybe", "not a boolean"),
        ("prot = 5683", "did you mean port?"),
    ],
)
def test_bad_coap_settings_stop_the_start(tmp_path: Path, text: str, problem: str) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(f"[coap]\n{text}\n")
    with pytest.raises(ConfigError, match=problem):
        Config.from_ini(ini)


def test_dtls_is_its_own_listener(tmp_path: Path) -> None:
    psk = tmp_path / "psk"
    psk.write_text("dev:key\n")
    ini = tmp_path / "warren.ini"
    ini.write_text(
        f"[coap]\ndtls_enabled = true\ndtls_port = 15684\ndtls_psk_file = {psk}\n"
        "dtls_max_sessions = 5\ndtls_handshake_timeout = 10\ndtls_idle_timeout = 60\n"
    )
    config = Config.from_ini(ini)
    assert (config.coap_dtls_enabled, config.coap_dtls_port) == (True, 15684)
    assert config.coap_dtls_psk_file == str(psk)
    assert (config.coap_dtls_max_sessions, config.coap_dtls_handshake_timeout) == (5, 10)
    assert config.coap_dtls_idle_timeout == 60
    # DTLS alone (no plain CoAP), or beside it.
    names = [listener.name for listener in default_listeners(config)]
    assert "coaps" in names and "coap" not in names
    assert "coaps" not in [listener.name for listener in default_listeners(Config())]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("dtls_enabled = true", "dtls_enabled needs dtls_psk_file"),
        ("dtls_port = -1", "between 0 and 65535"),
        ("dtls_max_sessions = 0", "between 1 and 1000000"),
        ("dtls_handshake_timeout = 0", "between 1 and 3600"),
    ],
)
def test_bad_dtls_settings_stop_the_start(tmp_path: Path, text: str, problem: str) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(f"[coap]\n{text}\n")
    with pytest.raises(ConfigError, match=problem):
        Config.from_ini(ini)
