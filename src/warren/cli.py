"""The ``warren`` command: merge configuration, set up logging and run the broker.

Precedence is defaults < config file < command-line flags; only flags that
were actually given override the file, which is why every flag defaults to
None rather than to the Config default.

``warren.app`` (the broker) is imported only inside :func:`_serve` so that ``--help``,
``--version`` and configuration errors work without loading the broker, and
``warren.config`` only where the server's command line is read, so that ``warren
ctl ...`` (a Python start per command in scripts and the docs) does not load it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # asyncio and the listeners only where the broker runs: not for `warren ctl`
    import asyncio

    from warren.config import Config

__all__ = ["build_config", "build_parser", "config_from_args", "data_dir_problem", "main"]

log = logging.getLogger("warren.cli")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Flags that override a Config field: (argparse dest == field name, flag spelling).
_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("data_dir", "--data-dir"),
    ("rabbitmq_version", "--rabbitmq-version"),
    ("amqp1_announce_rabbitmq", "--amqp1-announce-rabbitmq"),
    ("bind", "--bind"),
    ("amqp_port", "--amqp-port"),
    ("http_bind", "--http-bind"),
    ("http_port", "--http-port"),
    ("mqtt_bind", "--mqtt-bind"),
    ("mqtt_port", "--mqtt-port"),
    ("mqtt_tls_port", "--mqtt-tls-port"),
    ("stream_port", "--stream-port"),
    ("stream_tls_port", "--stream-tls-port"),
    ("amqp_tls_port", "--amqp-tls-port"),
    ("http_tls_port", "--http-tls-port"),
    ("prometheus_bind", "--prometheus-bind"),
    ("prometheus_port", "--prometheus-port"),
    ("prometheus_tls_port", "--prometheus-tls-port"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("log_level", "--log-level"),
    ("heartbeat", "--heartbeat"),
    ("frame_max", "--frame-max"),
    ("channel_max", "--channel-max"),
    ("max_message_size", "--max-message-size"),
    ("segment_size", "--segment-size"),
    ("free_disk_min", "--free-disk-min"),
    ("consumer_timeout", "--consumer-timeout"),
    ("sync", "--no-sync"),
    ("load_definitions", "--load-definitions"),
    ("damaged_metadata", "--damaged-metadata"),
)


def _version() -> str:
    try:
        from warren import __version__, build_description

        return f"{__version__} ({build_description()})"
    except ImportError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("warren-broker")
        except PackageNotFoundError:
            return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; defaults shown in --help come from Config itself."""
    from warren.config import Config, ini_sections

    d = Config()
    sections = ", ".join(f"[{name}]" for name in ini_sections())
    p = argparse.ArgumentParser(
        prog="warren",
        description="Warren, an AMQP 0-9-1 and MQTT 3.1.1/5 message broker with RabbitMQ's "
        "management HTTP API and Prometheus metrics. Settings come from the built-in defaults, "
        "then the config file (LavinMQ INI format), then these flags. Settings without a "
        f"flag are in the config file only; its sections: {sections} "
        "(README.md and docs/*.md list the keys: MQTT in docs/mqtt.md, clustering in "
        "docs/clustering.md).",
        epilog="Load testing: `warren perf --help` (throughput, connection-count, queue-count, "
        "mqtt, mqtt-idle). Management: `warren ctl --help` (queues, users, definitions, cluster "
        "status ... over the HTTP API); `warren users --help` (users and permissions, also of a "
        "stopped broker); `warren orphans --help` (queue data no definition claims).",
    )
    p.add_argument("-c", "--config", metavar="FILE", help=f"INI config file ({sections})")
    p.add_argument(
        "-D",
        "--data-dir",
        metavar="DIR",
        help=f"directory for persistent data (default: {d.data_dir}; [main] data_dir)",
    )
    p.add_argument(
        "--bind", metavar="ADDR", help=f"address to listen on (default: {d.bind}; [amqp] bind)"
    )
    p.add_argument(
        "--amqp-port",
        type=int,
        metavar="PORT",
        help=f"AMQP TCP port, 0 picks a free one (default: {d.amqp_port}; [amqp] port)",
    )
    p.add_argument(
        "--http-bind",
        metavar="ADDR",
        help=f"address of the HTTP management API (default: {d.http_bind}; [mgmt] bind)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        help=f"HTTP management API port, 0 picks a free one, -1 disables it "
        f"(default: {d.http_port}; [mgmt] port)",
    )
    p.add_argument(
        "--mqtt-bind",
        metavar="ADDR",
        help=f"address of the MQTT listener (default: {d.mqtt_bind}; [mqtt] bind)",
    )
    p.add_argument(
        "--mqtt-port",
        type=int,
        metavar="PORT",
        help=f"MQTT TCP port, 0 picks a free one, -1 disables it "
        f"(default: {d.mqtt_port}; [mqtt] port)",
    )
    p.add_argument(
        "--mqtt-tls-port",
        type=int,
        metavar="PORT",
        help="MQTT over TLS port (needs --tls-cert and --tls-key), -1: none "
        "(default: -1; [mqtt] tls_port)",
    )
    p.add_argument(
        "--stream-port",
        type=int,
        metavar="PORT",
        help=f"RabbitMQ stream protocol port, 0 picks a free one, -1 disables it "
        f"(default: {d.stream_port}; [stream] port)",
    )
    p.add_argument(
        "--stream-tls-port",
        type=int,
        metavar="PORT",
        help="stream protocol over TLS port (needs --tls-cert and --tls-key), -1: none "
        "(default: 5551 with --tls-cert and --tls-key, else none; [stream] tls_port)",
    )
    p.add_argument(
        "--amqp-tls-port",
        type=int,
        metavar="PORT",
        help="AMQP over TLS (amqps) port, e.g. 5671; needs --tls-cert and --tls-key; -1: none "
        "(default: -1; [amqp] tls_port)",
    )
    p.add_argument(
        "--http-tls-port",
        type=int,
        metavar="PORT",
        help="management API over HTTPS port, e.g. 15671; -1: none (default: -1; [mgmt] tls_port)",
    )
    p.add_argument(
        "--prometheus-bind",
        metavar="ADDR",
        help=f"address of the Prometheus metrics listener (default: {d.prometheus_bind}; "
        "[prometheus] bind)",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        metavar="PORT",
        help=f"Prometheus metrics port, 0 picks a free one, -1 disables it "
        f"(default: {d.prometheus_port}; [prometheus] port)",
    )
    p.add_argument(
        "--prometheus-tls-port",
        type=int,
        metavar="PORT",
        help="Prometheus metrics over HTTPS port, e.g. 15691; -1: none "
        "(default: -1; [prometheus] tls_port)",
    )
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate chain ([main] tls_cert)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key ([main] tls_key)")
    p.add_argument(
        "--log-level",
        metavar="LEVEL",
        help=f"debug, info, warning (or warn), error (default: {d.log_level}; [main] log_level)",
    )
    p.add_argument(
        "--heartbeat",
        type=int,
        metavar="SECONDS",
        help=f"heartbeat proposed in connection.tune, 0 disables "
        f"(default: {d.heartbeat}; [amqp] heartbeat)",
    )
    p.add_argument(
        "--frame-max",
        type=int,
        metavar="BYTES",
        help=f"largest frame proposed in connection.tune (default: {d.frame_max}; "
        f"[amqp] frame_max)",
    )
    p.add_argument(
        "--channel-max",
        type=int,
        metavar="N",
        help=f"most channels per connection (default: {d.channel_max}; [amqp] channel_max)",
    )
    p.add_argument(
        "--max-message-size",
        type=int,
        metavar="BYTES",
        help=f"largest message body accepted (default: {d.max_message_size}; "
        f"[amqp] max_message_size)",
    )
    p.add_argument(
        "--segment-size",
        type=int,
        metavar="BYTES",
        help=f"size of message segment files (default: {d.segment_size}; [main] segment_size)",
    )
    p.add_argument(
        "--free-disk-min",
        type=int,
        metavar="BYTES",
        help=f"block publishers below this much free disk (default: {d.free_disk_min}; "
        f"[main] free_disk_min)",
    )
    p.add_argument(
        "--consumer-timeout",
        type=int,
        metavar="MS",
        help=f"close a channel whose delivery stays unacked this long, 0 disables "
        f"(default: {d.consumer_timeout}; [main] consumer_timeout)",
    )
    p.add_argument(
        "--no-sync",
        dest="sync",
        action="store_const",
        const=False,
        default=None,
        help="confirm persistent messages without waiting for fdatasync ([main] sync = false)",
    )
    p.add_argument(
        "--damaged-metadata",
        choices=("refuse", "set-aside"),
        help="a damaged metadata file at start: refuse to start (default), or set it "
        "aside and start without it ([main] damaged_metadata)",
    )
    p.add_argument(
        "--load-definitions",
        metavar="PATH",
        help="import a RabbitMQ definitions export (JSON file or directory) at start "
        "([main] load_definitions)",
    )
    p.add_argument(
        "--ephemeral",
        action="store_true",
        help="keep the data in a temporary directory removed at exit, for scripts and CI "
        "jobs (replaces --data-dir; implies --no-sync: nothing outlives the process)",
    )
    p.add_argument(
        "--rabbitmq-version",
        metavar="X.Y.Z",
        help="the RabbitMQ release announced to clients that check it (AMQP connection.start, "
        f"the management API; default: {d.rabbitmq_version}; [main] rabbitmq_version)",
    )
    p.add_argument(
        "--amqp1-announce-rabbitmq",
        dest="amqp1_announce_rabbitmq",
        action="store_const",
        const=True,
        default=None,
        help="announce RabbitMQ 4.x (not Warren) to AMQP 1.0 clients, for RabbitMQ's own "
        "1.0 clients that refuse other brokers ([amqp1] announce_rabbitmq = true)",
    )
    p.add_argument("--version", action="version", version=f"warren {_version()}")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    """Apply defaults < config file < given flags, then validate the result."""
    from warren.config import Config, ConfigError, check_field, normalize_log_level

    config = Config()
    origin: dict[str, str] = {}
    if args.config is not None:
        origin = config.apply_ini(args.config)
    for field, flag in _OVERRIDES:
        value: Any = getattr(args, field)
        if value is None:
            continue
        if field == "log_level":
            value = normalize_log_level(value)
        problem = check_field(field, value)
        if problem is not None:
            raise ConfigError(f"{flag} {getattr(args, field)!r}: {problem}")
        setattr(config, field, value)
        origin[field] = flag
    if getattr(args, "ephemeral", False):
        # The directory itself is made (and removed) by main(); nothing is synced
        # to a disk that is thrown away at exit.
        config.sync = False
    config.validate(origin)
    return config


def build_config(argv: Sequence[str] | None = None) -> Config:
    """Parse ``argv`` (default: sys.argv[1:]) into a validated Config without starting anything.

    Raises ConfigError for bad values; argparse's own errors, --help and
    --version raise SystemExit as usual.
    """
    return config_from_args(build_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    """Run the broker until SIGINT/SIGTERM. Returns 0 on clean stop, 1 on start failure,
    2 on bad configuration or usage.

    ``warren perf ...`` runs the load-test tools instead (warren.perf, which does
    not import the broker), ``warren ctl ...`` the management command line
    (warren.ctl, neither), ``warren users ...`` user management on a stopped or
    running broker (warren.users_cli), ``warren orphans ...`` the data directories
    no definition claims (warren.orphans_cli); every other argument list is the
    server's.
    """
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "perf":
        from warren.perf import main as perf_main

        return perf_main(list(args[1:]))
    if args and args[0] == "users":
        from warren.users_cli import main as users_main

        return users_main(list(args[1:]))
    if args and args[0] == "orphans":
        from warren.orphans_cli import main as orphans_main

        return orphans_main(list(args[1:]))
    if args and args[0] == "ctl":
        from warren.ctl.main import main as ctl_main

        return ctl_main(list(args[1:]))
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C while logging is set up or torn down: one line, no traceback.
        print("warren: interrupted before the broker started", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    """The server: configuration, logging, data dir check, then the broker."""
    from warren.config import ConfigError

    root = logging.getLogger()
    saved_level = root.level
    # Installed before the config is read so warnings about the config file
    # (LavinMQ settings Warren ignores) already come out in the final format.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        try:
            parsed = build_parser().parse_args(argv)
            config = config_from_args(parsed)
        except ConfigError as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return 2
        except SystemExit as exc:  # --help, --version or an argparse usage error
            return _exit_status(exc.code)
        root.setLevel(config.logging_level)
        if parsed.ephemeral:
            return _run_ephemeral(config)
        problem = data_dir_problem(config.data_dir)
        if problem is not None:
            print(f"warren: cannot start: {problem}", file=sys.stderr)
            return 1
        return _run(config)
    except KeyboardInterrupt:
        # Ctrl-C before the broker's own handler is in place (reading the
        # config, importing the broker): stop here, quietly, as a shell expects.
        log.warning("interrupted before the broker started")
        return 130
    finally:
        # Leave the process's logging as we found it (matters when main() is
        # called from tests or embedded).
        root.removeHandler(handler)
        root.setLevel(saved_level)


def data_dir_problem(data_dir: str) -> str | None:
    """What stops this user from using ``data_dir`` as the data directory, or None.

    Checked before anything starts so the operator reads what is wrong with
    which path, rather than an errno from somewhere inside the store. Creates
    nothing: a missing directory is fine when it can be made.
    """
    path = Path(data_dir)
    if path.exists() or path.is_symlink():
        if path.is_file():
            return f"data dir {data_dir} exists but is a file, not a directory"
        if not path.is_dir():
            return f"data dir {data_dir} exists but is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"data dir {data_dir} is not writable by {_user()}"
        if not os.access(path, os.R_OK):
            return f"data dir {data_dir} is not readable by {_user()}"
        lock = path / ".lock"
        if lock.exists() and not os.access(lock, os.R_OK | os.W_OK):
            return f"data dir {data_dir}: {lock} is not writable by {_user()}"
        return None
    ancestor = path.absolute().parent
    while not (ancestor.exists() or ancestor.is_symlink()) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"data dir {data_dir} cannot be created: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"data dir {data_dir} cannot be created: {ancestor} is not writable by {_user()}"
    return None


def _user() -> str:
    """This process's user, for messages about permissions."""
    try:
        import pwd

        return f"user {pwd.getpwuid(os.geteuid()).pw_name}"
    except (ImportError, KeyError):  # no pwd module (Windows), or a uid without an entry
        return "this user"


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when available; passed to asyncio.Runner, which (unlike
    uvloop.install()) is not deprecated on newer Pythons."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run_ephemeral(config: Config) -> int:
    """Run with the data in a fresh temporary directory, removed however the run ends."""
    with tempfile.TemporaryDirectory(prefix="warren-ephemeral-") as data_dir:
        config.data_dir = data_dir
        log.info("ephemeral: data in %s, removed at exit", data_dir)
        return _run(config)


def _run(config: Config) -> int:
    import asyncio

    try:
        factory = _loop_factory()
        log.debug("event loop: %s", "uvloop" if factory is not None else "asyncio default")
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_serve(config))
    except KeyboardInterrupt:
        # SIGINT before our handler was installed (or after it was removed).
        log.warning("interrupted before the broker started")
        return 130
    except asyncio.CancelledError:
        log.error("forced exit before the broker stopped cleanly")
        return 1


async def _serve(config: Config) -> int:
    """Start the broker, wait for SIGINT/SIGTERM, stop it gracefully; SIGHUP reloads
    the TLS certificate.

    A second signal while stopping cancels the shutdown, so a stuck stop()
    can still be interrupted from the terminal.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    stop_event = asyncio.Event()
    task = asyncio.current_task()
    assert task is not None

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop_event.is_set():
            log.warning("received %s again, forcing exit", name)
            task.cancel()
            return
        log.info("received %s, shutting down", name)
        stop_event.set()

    # A Ctrl-C while the broker is imported (a good part of a second) finds
    # asyncio.Runner's handler, which cancels this task: it ends at the sleep,
    # before anything is created, and runner.run raises KeyboardInterrupt.
    from warren.app import Broker  # deferred: see module docstring
    from warren.config import ConfigError
    from warren.definitions_document import DefinitionsError
    from warren.ready import ready_line
    from warren.store.damage import DamagedFile

    await asyncio.sleep(0)
    # Installed before start() so a signal arriving during startup still
    # leads to an orderly stop instead of killing the process mid-start.
    restore = _install_signal_handlers(loop, on_signal)
    if task.cancelling():  # Runner's handler ran between the sleep and the line above
        task.uncancel()
        restore()
        log.warning("interrupted before the broker started")
        return 130
    if config.clustering:
        from warren.app import ReplicaReadServer, replica_stream_server
        from warren.cluster.node import ClusterNode

        try:
            node = ClusterNode(
                config,
                Broker,
                ReplicaReadServer,
                make_stream_protocol_reads=replica_stream_server,
            )
            await node.run(stop_event)
        finally:
            restore()
        log.info("stopped")
        return 0
    try:
        try:
            broker = Broker(config)
            if hasattr(signal, "SIGHUP"):  # before start: a reload asked early is harmless
                with contextlib.suppress(NotImplementedError):  # loops without signals
                    loop.add_signal_handler(signal.SIGHUP, broker.reload_tls)
            await broker.start()
        except OSError as exc:
            print(_start_error_message(config, exc), file=sys.stderr)
            return 1
        except (DefinitionsError, DamagedFile) as exc:
            print(f"warren: cannot start: {exc}", file=sys.stderr)
            return 1
        except ConfigError as exc:  # a file a setting names (webhooks_file)
            print(f"warren: {exc}", file=sys.stderr)
            return 2
        log.info("%s", ready_line(broker.listeners))
        await stop_event.wait()
        await broker.stop()
        log.info("stopped")
        return 0
    finally:
        restore()
        if hasattr(signal, "SIGHUP"):
            with contextlib.suppress(NotImplementedError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, callback: Callable[[int], None]
) -> Callable[[], None]:
    """Route SIGINT and SIGTERM to ``callback`` on the loop; returns an undo function."""
    signums = (signal.SIGINT, signal.SIGTERM)
    try:
        for signum in signums:
            loop.add_signal_handler(signum, callback, signum)
    except NotImplementedError:  # event loops without add_signal_handler (Windows)
        previous = {s: signal.getsignal(s) for s in signums}
        for signum in signums:
            signal.signal(signum, lambda s, _frame: loop.call_soon_threadsafe(callback, s))

        def restore_plain() -> None:
            for s, handler in previous.items():
                signal.signal(s, handler)

        return restore_plain

    def restore_loop() -> None:
        for s in signums:
            loop.remove_signal_handler(s)

    return restore_loop


def _start_error_message(config: Config, exc: OSError) -> str:
    """Turn the common bind failures into one actionable line."""
    from warren.bound_port import BindError

    where = f"warren: cannot listen on AMQP {config.bind}:{config.amqp_port}"
    if isinstance(exc, BindError):  # the listener and port it names (bound_port.py)
        where = f"warren: cannot listen on {exc.what} {exc.host}:{exc.port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: address already in use (is another broker running?)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: address not available on this host"
    if exc.errno == errno.EACCES and exc.filename is None:
        return f"{where}: permission denied (privileged port?)"
    if exc.filename is not None and exc.strerror:
        return f"warren: cannot start: {exc.filename}: {exc.strerror}"
    return f"warren: cannot start: {exc}"
