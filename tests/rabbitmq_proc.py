"""A private RabbitMQ (Debian's rabbitmq-server) for tests that need the real one:
its own node name, ports, Erlang port mapper and directories; no plugins unless
asked for (``plugins=["rabbitmq_management", "rabbitmq_prometheus"]``: each
gets a free port of its own, ``http_port`` and ``prometheus_port``; with
``rabbitmq_mqtt``, ``mqtt_port``; with ``rabbitmq_stream``, ``stream_port``,
which Metadata names as 127.0.0.1)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path

from free_ports import free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
AVAILABLE = os.path.exists(SERVER)


class RabbitMQ:
    def __init__(self, base: Path, plugins: list[str] | None = None, config: str = "") -> None:
        """``config``: more rabbitmq.conf lines (with plugins only)."""
        base.mkdir(parents=True, exist_ok=True)
        plugins = plugins or []
        (base / "enabled_plugins").write_text("[" + ",".join(plugins) + "].\n")
        self.port = free_port()
        self.epmd_port = free_port()
        self.http_port = free_port()
        self.prometheus_port = free_port()
        #: The MQTT port (with rabbitmq_mqtt; 0 without).
        self.mqtt_port = free_port() if "rabbitmq_mqtt" in plugins else 0
        conf = (
            "management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.http_port}\n"
            "prometheus.tcp.ip = 127.0.0.1\n"
            f"prometheus.tcp.port = {self.prometheus_port}\n" + config
            if plugins
            else ""
        )
        if self.mqtt_port:
            conf += f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
        #: The stream protocol's port (with rabbitmq_stream, unless ``config``
        #: names its listeners; 0 without).
        own_stream = "rabbitmq_stream" in plugins and "stream.listeners" not in config
        self.stream_port = free_port() if own_stream else 0
        if self.stream_port:
            conf += f"stream.listeners.tcp.default = 127.0.0.1:{self.stream_port}\n"
            conf += "stream.advertised_host = 127.0.0.1\n"
        (base / "rabbitmq.conf").write_text(conf)
        env = dict(
            os.environ,
            HOME=str(base),
            RABBITMQ_NODENAME=f"warrentest{self.port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_LOGS="-",
            ERL_EPMD_PORT=str(self.epmd_port),
            # No busy waiting in the Erlang schedulers: an idle node beside the
            # test suite leaves the two cores to the tests.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none",
        )
        self._env = env
        self._base = base
        self.log: list[str] = []
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [SERVER],
            cwd=self._base,
            env=self._env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the whole Erlang VM is stopped as one group
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            if "Server startup complete" in line:
                break
        else:
            raise RuntimeError("rabbitmq-server exited:\n" + "".join(self.log[-30:]))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def restart(self) -> None:
        """Stop the node (as a clean shutdown) and start it again on the same
        data, node name and ports."""
        self.stop()
        self._start()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        subprocess.run(
            ["epmd", "-kill"], env=self._env, capture_output=True, timeout=10, check=False
        )
