"""Configuration: LavinMQ-style INI files, validation, CLI precedence and entry point."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from paths import SRC

from warren import cli
from warren.bound_port import BindError
from warren.cli import build_config, main
from warren.config import Config, ConfigError

ALL_FLAGS = (
    "--data-dir",
    "-D",
    "--bind",
    "--amqp-port",
    "--http-port",
    "--http-bind",
    "--prometheus-bind",
    "--prometheus-port",
    "--prometheus-tls-port",
    "--log-level",
    "--config",
    "-c",
    "--heartbeat",
    "--frame-max",
    "--channel-max",
    "--max-message-size",
    "--load-definitions",
    "--amqp1-announce-rabbitmq",
    "--version",
)


def write_ini(tmp_path: Path, text: str, name: str = "warren.ini") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def ini_error(tmp_path: Path, section: str, key: str, value: str) -> tuple[Path, str]:
    """A file setting ``key = value`` in ``[section]``, and the ConfigError reading it gives."""
    path = write_ini(tmp_path, f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as info:
        Config.from_ini(path)
    return path, str(info.value)


def run_warren(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "warren", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- defaults ----------------------------------------------------------------


def test_defaults() -> None:
    c = Config()
    assert c.data_dir == "./data"
    assert c.log_level == "info"
    assert c.bind == "127.0.0.1"
    assert c.amqp_port == 5672
    assert c.heartbeat == 300
    assert c.frame_max == 131072
    assert c.channel_max == 2047
    assert c.max_message_size == 134217728
    assert c.default_user == "guest"
    assert c.default_password == "guest"
    assert c.loopback_users == ("guest",)
    assert c.default_vhost == "/"
    c.validate()


# --- INI parsing -------------------------------------------------------------


def test_from_ini_reads_lavinmq_sections_and_keys(tmp_path: Path) -> None:
    path = write_ini(
        tmp_path,
        """
# a LavinMQ-style config
[main]
data_dir = /var/lib/warren
log_level = warn
default_user = admin
default_password = s3cr%t
loopback_users = admin, ops

[amqp]
bind = 0.0.0.0
port = 5673
heartbeat = 60
frame_max = 65536
channel_max = 128
max_message_size = 1048576
""",
    )
    c = Config.from_ini(path)
    assert c.data_dir == "/var/lib/warren"
    assert c.log_level == "warning"
    assert c.logging_level == logging.WARNING
    assert c.default_user == "admin"
    assert c.default_password == "s3cr%t"
    assert c.loopback_users == ("admin", "ops")
    assert c.bind == "0.0.0.0"
    assert c.amqp_port == 5673
    assert c.heartbeat == 60
    assert c.frame_max == 65536
    assert c.channel_max == 128
    assert c.max_message_size == 1048576
    # Untouched settings keep their defaults.
    assert c.default_vhost == "/"


def test_partial_file_keeps_defaults(tmp_path: Path) -> None:
    c = Config.from_ini(write_ini(tmp_path, "[amqp]\nport = 6000\n"))
    assert c.amqp_port == 6000
    assert dataclasses.replace(c, amqp_port=5672) == Config()


def test_empty_loopback_users_lifts_restriction(tmp_path: Path) -> None:
    c = Config.from_ini(write_ini(tmp_path, "[main]\nloopback_users =\n"))
    assert c.loopback_users == ()


def test_heartbeat_zero_is_allowed(tmp_path: Path) -> None:
    assert Config.from_ini(write_ini(tmp_path, "[amqp]\nheartbeat = 0\n")).heartbeat == 0


def test_lavinmq_only_keys_and_sections_warn_and_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """LavinMQ settings of features Warren lacks are not typos: a warning, then the rest."""
    path = write_ini(
        tmp_path,
        "[main]\nstats_interval = 5000\n"
        "[amqp]\nport = 5680\ntls_port = 5671\nunix_path = /tmp/warren.sock\n"
        "[mgmt]\nport = 15673\ntls_port = 15671\nunix_path = /tmp/mgmt.sock\n"
        "[experimental]\n",  # ([clustering] is known since issue 16)
    )
    with caplog.at_level(logging.WARNING, logger="warren.config"):
        c = Config.from_ini(path)
    assert c.amqp_port == 5680  # [mgmt] port must not leak into the AMQP port
    assert c.http_port == 15673
    records = [r for r in caplog.records if r.name == "warren.config"]
    messages = [r.getMessage() for r in records]
    assert all(r.levelno == logging.WARNING for r in records)
    assert any(f"{path}:2: LavinMQ's [main] stats_interval" in m for m in messages)
    assert (c.amqp_tls_port, c.http_tls_port) == (5671, 15671)  # known since issue 14
    assert any(f"{path}:6: LavinMQ's [amqp] unix_path" in m for m in messages)
    assert any(f"{path}:10: LavinMQ's [mgmt] unix_path" in m for m in messages)
    assert any(f"{path}:11: LavinMQ's [experimental]" in m for m in messages)


def test_default_section_is_not_inherited(tmp_path: Path) -> None:
    # [DEFAULT] is no special section here: an unknown one, so an error.
    path = write_ini(tmp_path, "[amqp]\nbind = ::1\n[DEFAULT]\nport = 1\n")
    with pytest.raises(ConfigError) as info:
        Config.from_ini(path)
    assert str(info.value).startswith(f"{path}:3: unknown section [DEFAULT]")


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("amqp", "port", "abc"),
        ("amqp", "port", ""),
        ("amqp", "port", "56.72"),
        ("amqp", "port", "1_000"),
        ("amqp", "heartbeat", "ten"),
        ("amqp", "frame_max", "128k"),
        ("amqp", "channel_max", "many"),
        ("amqp", "max_message_size", "1e6"),
    ],
)
def test_non_integer_value_names_file_section_key_value(
    tmp_path: Path, section: str, key: str, value: str
) -> None:
    path, msg = ini_error(tmp_path, section, key, value)
    assert str(path) in msg
    assert f"[{section}]" in msg
    assert key in msg
    assert repr(value) in msg


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("amqp", "port", "65536"),
        ("amqp", "port", "-1"),
        ("amqp", "frame_max", "4095"),
        ("amqp", "frame_max", "0"),
        ("amqp", "frame_max", str(2**31)),
        ("amqp", "channel_max", "65536"),
        ("amqp", "heartbeat", "65536"),
        ("amqp", "max_message_size", "0"),
        ("amqp", "max_message_size", str(512 * 1024 * 1024 + 1)),
        ("amqp", "bind", ""),
        ("main", "log_level", "verbose"),
        ("main", "data_dir", ""),
        ("main", "default_user", ""),
    ],
)
def test_out_of_range_value_in_file_names_its_source(
    tmp_path: Path, section: str, key: str, value: str
) -> None:
    path, msg = ini_error(tmp_path, section, key, value)
    assert str(path) in msg and f"[{section}] {key}" in msg and repr(value) in msg


def test_apply_ini_is_all_or_nothing(tmp_path: Path) -> None:
    c = Config()
    path = write_ini(tmp_path, "[amqp]\nport = 6000\nheartbeat = nope\n")
    with pytest.raises(ConfigError):
        c.apply_ini(path)
    assert c == Config()


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        Config.from_ini(tmp_path / "nope.ini")


def test_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="malformed"):
        Config.from_ini(write_ini(tmp_path, "port = 5672\n"))  # no section header
    with pytest.raises(ConfigError, match="malformed"):
        Config.from_ini(write_ini(tmp_path, "[amqp]\nport = 1\nport = 2\n"))


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# --- validate() --------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"amqp_port": 65536},
        {"amqp_port": -1},
        {"frame_max": 4095},
        {"frame_max": 0},
        {"frame_max": 2**31},
        {"channel_max": -1},
        {"channel_max": 65536},
        {"heartbeat": -1},
        {"heartbeat": 65536},
        {"max_message_size": 0},
        {"max_message_size": 512 * 1024 * 1024 + 1},
        {"log_level": "trace"},
        {"amqp_port": True},
        {"amqp_port": "5672"},
        {"loopback_users": ["guest"]},
        {"default_vhost": ""},
    ],
)
def test_validate_rejects(changes: dict[str, Any]) -> None:
    c = dataclasses.replace(Config(), **changes)
    (field,) = changes
    with pytest.raises(ConfigError, match=field):
        c.validate()


@pytest.mark.parametrize(
    "changes",
    [
        {"amqp_port": 0},
        {"amqp_port": 65535},
        {"frame_max": 4096},
        {"frame_max": 2**31 - 1},
        {"channel_max": 0},
        {"channel_max": 65535},
        {"heartbeat": 0},
        {"max_message_size": 512 * 1024 * 1024},
        {"log_level": "warn"},
        {"log_level": "DEBUG"},
        {"log_level": "error"},
        {"loopback_users": ()},
        {"default_password": ""},
    ],
)
def test_validate_accepts_boundaries(changes: dict[str, Any]) -> None:
    dataclasses.replace(Config(), **changes).validate()


def test_clustering_tls_settings(tmp_path: Path) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text(
        "[main]\ntls_cert = /c.pem\ntls_key = /c.key\ntls_ca_cert = /ca.pem\n"
        "[clustering]\ntls = true\netcd_ca_cert = /eca.pem\netcd_cert = /e.pem\n"
        "etcd_key = /e.key\netcd_endpoints = https://a:2379,b:2379\n"
    )
    c = Config.from_ini(ini)
    assert c.clustering_tls and c.clustering_etcd_ca_cert == "/eca.pem"
    assert (c.clustering_etcd_cert, c.clustering_etcd_key) == ("/e.pem", "/e.key")
    assert c.clustering_etcd_endpoints == ("https://a:2379", "b:2379")
    # Replication over TLS needs this node's certificate and the cluster's CA.
    with pytest.raises(ConfigError, match=r"\[clustering\] tls needs"):
        dataclasses.replace(c, tls_ca_cert=None).validate()
    with pytest.raises(ConfigError, match="etcd_cert and etcd_key go together"):
        dataclasses.replace(c, clustering_etcd_key=None).validate()


# --- CLI: precedence ---------------------------------------------------------


def test_build_config_without_args_gives_defaults() -> None:
    assert build_config([]) == Config()


def test_precedence_defaults_file_flags(tmp_path: Path) -> None:
    path = write_ini(
        tmp_path,
        "[main]\ndata_dir = /from/file\nlog_level = debug\n"
        "[amqp]\nport = 5673\nheartbeat = 60\nchannel_max = 100\n",
    )
    c = build_config(["-c", str(path), "--amqp-port", "5674", "--log-level", "ERROR"])
    assert c.amqp_port == 5674  # flag beats file
    assert c.log_level == "error"  # flag beats file, normalized
    assert c.heartbeat == 60  # file beats default, no flag given
    assert c.channel_max == 100
    assert c.data_dir == "/from/file"
    assert c.frame_max == Config().frame_max  # neither file nor flag


def test_every_override_flag_applies(tmp_path: Path) -> None:
    c = build_config(
        [
            "-D",
            str(tmp_path),
            "--bind",
            "::",
            "--amqp-port",
            "0",
            "--log-level",
            "warn",
            "--heartbeat",
            "0",
            "--frame-max",
            "8192",
            "--channel-max",
            "16",
            "--max-message-size",
            "1024",
        ]
    )
    assert c == dataclasses.replace(
        Config(),
        data_dir=str(tmp_path),
        bind="::",
        amqp_port=0,
        log_level="warning",
        heartbeat=0,
        frame_max=8192,
        channel_max=16,
        max_message_size=1024,
    )
    assert build_config(["--data-dir", "/x", "--config", os.devnull]).data_dir == "/x"


def test_flag_overrides_invalid_value_in_file_only_if_file_parses(tmp_path: Path) -> None:
    # The file is read first and must be valid on its own.
    path = write_ini(tmp_path, "[amqp]\nport = 99999\n")
    with pytest.raises(ConfigError, match=r"\[amqp\] port"):
        build_config(["-c", str(path), "--amqp-port", "5672"])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--amqp-port", "70000"),
        ("--frame-max", "100"),
        ("--heartbeat", "-5"),
        ("--channel-max", "65536"),
        ("--max-message-size", "0"),
        ("--log-level", "loud"),
        ("--bind", ""),
    ],
)
def test_invalid_flag_value_names_the_flag(flag: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config([flag, value])
    msg = str(info.value)
    assert msg.startswith(f"{flag} ") and value in msg


def test_parser_does_not_import_broker() -> None:
    # In a fresh interpreter: this process may have imported warren.broker elsewhere.
    code = (
        "import sys; from warren.cli import build_config, build_parser; "
        "build_parser(); build_config([]); sys.exit('warren.broker' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


# --- CLI: main() exit codes ----------------------------------------------------


def test_main_config_error_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--amqp-port", "70000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("warren: ") and "--amqp-port" in err


def test_main_missing_config_file_returns_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-c", str(tmp_path / "missing.ini")]) == 2
    assert "warren: cannot read config file" in capsys.readouterr().err


def test_main_usage_error_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--amqp-port", "not-a-number"]) == 2
    assert "--amqp-port" in capsys.readouterr().err


def test_main_leaves_root_logger_as_found() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    main(["--heartbeat", "-1"])
    assert root.handlers == handlers and root.level == level


class FakeBroker:
    """Stands in for warren.app.Broker, which main() imports lazily."""

    instances: list[FakeBroker] = []
    start_error: OSError | None = None

    def __init__(self, config: Config) -> None:
        self.config = config
        self.started = False
        self.stopped = False
        self.listeners: list[object] = []  # main() names them in its ready line
        FakeBroker.instances.append(self)

    async def start(self) -> None:
        if FakeBroker.start_error is not None:
            raise FakeBroker.start_error
        self.started = True
        # Handlers are installed before start(), so this reaches _serve's handler.
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        self.stopped = True

    def reload_tls(self) -> None:
        """SIGHUP's target (tests/protocol/amqp/test_tls.py runs the real one)."""


@pytest.fixture
def fake_broker(monkeypatch: pytest.MonkeyPatch) -> type[FakeBroker]:
    module = types.ModuleType("warren.app")
    module.Broker = FakeBroker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "warren.app", module)
    monkeypatch.setattr(FakeBroker, "instances", [])
    monkeypatch.setattr(FakeBroker, "start_error", None)
    return FakeBroker


def test_main_runs_broker_until_sigterm_then_stops_it(fake_broker: type[FakeBroker]) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["--amqp-port", "0", "--log-level", "debug"]) == 0
    (broker,) = fake_broker.instances
    assert broker.started and broker.stopped
    assert broker.config.amqp_port == 0
    assert signal.getsignal(signal.SIGTERM) == previous


def test_main_port_in_use_returns_1(
    fake_broker: type[FakeBroker], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_broker.start_error = OSError(errno.EADDRINUSE, "Address already in use")
    assert main(["--bind", "127.0.0.1", "--amqp-port", "5999"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("warren: ")
    assert "127.0.0.1:5999" in err and "already in use" in err


def test_stream_listener_settings(tmp_path: Path) -> None:
    """[stream] as RabbitMQ with rabbitmq_stream enabled: 5552; its TLS port 5551
    once there is a certificate to serve, unless told otherwise; flags win."""
    from warren.app import default_listeners

    def stream_ports(c: Config) -> tuple[int, int] | None:
        for listener in default_listeners(c):
            if listener.name == "stream":
                return listener.requested_port, listener.requested_tls_port  # type: ignore[attr-defined]
        return None

    c = Config()
    assert (c.stream_port, c.stream_tls_port, c.stream_tls_listen_port) == (5552, None, -1)
    assert stream_ports(c) == (5552, -1)
    certs = {"tls_cert": "cert.pem", "tls_key": "key.pem"}
    assert stream_ports(Config(**certs)) == (5552, 5551)  # type: ignore[arg-type]
    assert stream_ports(Config(tls_cert="cert.pem")) == (5552, -1)  # no key: nothing to serve
    assert stream_ports(Config(stream_tls_port=-1, **certs)) == (5552, -1)  # type: ignore[arg-type]
    assert stream_ports(Config(stream_port=-1)) is None
    assert stream_ports(Config(stream_port=-1, stream_tls_port=0)) == (-1, 0)
    path = write_ini(tmp_path, "[stream]\nbind = 0.0.0.0\nport = 5553\ntls_port = 5554\n")
    c = Config.from_ini(path)
    assert (c.stream_bind, c.stream_port, c.stream_tls_listen_port) == ("0.0.0.0", 5553, 5554)
    c = build_config(["-c", str(path), "--stream-port", "-1", "--stream-tls-port", "-1"])
    assert (c.stream_port, c.stream_tls_listen_port) == (-1, -1)
    c = build_config(["--tls-cert", "c.pem", "--tls-key", "k.pem"])
    assert (c.stream_port, c.stream_tls_listen_port) == (5552, 5551)
    with pytest.raises(ConfigError, match="--stream-tls-port 70000"):
        build_config(["--stream-tls-port", "70000"])


def test_prometheus_listener_settings(tmp_path: Path) -> None:
    """[prometheus] as RabbitMQ's prometheus.tcp.*: port 15692 unless told, flags win."""
    assert (Config().prometheus_port, Config().prometheus_tls_port) == (15692, -1)
    path = write_ini(tmp_path, "[prometheus]\nbind = 0.0.0.0\nport = 9419\ntls_port = 15691\n")
    c = Config.from_ini(path)
    assert (c.prometheus_bind, c.prometheus_port, c.prometheus_tls_port) == ("0.0.0.0", 9419, 15691)
    assert build_config(["-c", str(path), "--prometheus-port", "-1"]).prometheus_port == -1
    with pytest.raises(ConfigError, match="prometheus"):
        build_config(["--prometheus-port", "70000"])


def test_main_prometheus_port_in_use_names_it(
    fake_broker: type[FakeBroker], capsys: pytest.CaptureFixture[str]
) -> None:
    busy = OSError(errno.EADDRINUSE, "Address already in use")
    fake_broker.start_error = BindError(busy, "Prometheus", "127.0.0.1", 15999)
    assert main(["--prometheus-port", "15999"]) == 1
    err = capsys.readouterr().err
    assert "Prometheus 127.0.0.1:15999" in err and "already in use" in err


def test_loop_factory_uses_uvloop_when_installed() -> None:
    factory = cli._loop_factory()
    try:
        import uvloop
    except ImportError:
        assert factory is None
    else:
        assert factory is uvloop.new_event_loop


# --- entry point -------------------------------------------------------------


def test_help_lists_every_flag() -> None:
    result = run_warren("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: warren")
    for flag in ALL_FLAGS:
        assert flag in result.stdout, flag


def test_version_flag() -> None:
    from warren import __version__, build_description

    result = run_warren("--version")
    assert result.returncode == 0
    # The version, and whether compiled modules are in use (tests/integration/test_compiled.py).
    assert result.stdout.strip() == f"warren {__version__} ({build_description()})"


def test_config_error_exit_status_from_command_line(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[amqp]\nport = lots\n")
    result = run_warren("-c", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith("warren: ")
    assert str(path) in result.stderr and "[amqp] port" in result.stderr


def test_mgmt_section_sets_the_http_listener(tmp_path: Path) -> None:
    c = Config.from_ini(write_ini(tmp_path, "[mgmt]\nbind = 0.0.0.0\nport = -1\n"))
    assert (c.http_bind, c.http_port) == ("0.0.0.0", -1)
    assert (Config().http_bind, Config().http_port) == ("127.0.0.1", 15672)
    with pytest.raises(ConfigError, match=r"\[mgmt\] port"):
        Config.from_ini(write_ini(tmp_path, "[mgmt]\nport = -2\n"))


def test_http_flags_override_the_mgmt_section(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[mgmt]\nport = 15680\n")
    config = build_config(["-c", str(path), "--http-port", "0", "--http-bind", "::1"])
    assert (config.http_port, config.http_bind) == (0, "::1")
    with pytest.raises(ConfigError, match="--http-port"):
        build_config(["--http-port", "70000"])


def test_amqp1_announces_warren_unless_asked(tmp_path: Path) -> None:
    """Off by default (issue 30): RabbitMQ is announced to AMQP 1.0 clients only
    by [amqp1] announce_rabbitmq or its flag."""
    assert Config().amqp1_announce_rabbitmq is False
    path = write_ini(tmp_path, "[amqp1]\nannounce_rabbitmq = true\n")
    assert Config.from_ini(path).amqp1_announce_rabbitmq is True
    assert build_config(["--amqp1-announce-rabbitmq"]).amqp1_announce_rabbitmq is True
    off = write_ini(tmp_path, "[amqp1]\nannounce_rabbitmq = false\n", "off.ini")
    assert build_config(["-c", str(off)]).amqp1_announce_rabbitmq is False
    _, text = ini_error(tmp_path, "amqp1", "announce_rabbitmq", "maybe")
    assert "[amqp1] announce_rabbitmq" in text
