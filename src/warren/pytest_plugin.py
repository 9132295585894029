"""pytest plugin: a real Warren broker for the tests of any AMQP application.

Registered through the ``pytest11`` entry point, so installing ``warren`` makes
the fixtures available everywhere (``-p no:warren`` opts out). Projects that
test against RabbitMQ usually start a Docker container per session; this
starts a broker in-process in a few milliseconds instead.

Fixtures (all named ``warren_*`` so they never clash with a project's own):

``warren_broker`` (session)
    A :class:`WarrenBroker`: a started broker on an ephemeral port (or
    ``--warren-port``), running on its own event loop in a background thread
    so that blocking clients (pika, kombu, Celery) and asyncio clients (on the
    test's loop) both talk to it over real sockets. Its data directory is a
    temporary one removed at session end unless ``--warren-data-dir`` names one
    to keep. Under pytest-xdist every worker gets its own broker.
``warren_url`` (session)
    ``amqp://guest:guest@127.0.0.1:<port>/`` (the default vhost ``/``).
``warren_mqtt_url``, ``warren_stream_url``, ``warren_http_url`` (session)
    The MQTT, stream protocol and management listeners (all on free ports), None
    when disabled.
``warren_vhost`` (function)
    A fresh vhost for one test, deleted afterwards (closing its connections),
    so tests never see each other's queues: a :class:`WarrenVhost` with
    ``.name`` and ``.url``.

This module must be cheap to import: pytest loads it in every session of any
environment where warren is installed. The broker itself is imported only when
a fixture first needs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import pytest

if TYPE_CHECKING:
    from warren.app import Broker
    from warren.config import Config
    from warren.core.clock import Clock

__all__ = ["WarrenBroker", "WarrenVhost", "start_broker"]

T = TypeVar("T")

#: Numbers the vhosts warren_vhost creates (with a random suffix: unique under xdist too).
_vhost_counter = itertools.count(1)


class WarrenBroker:
    """A started broker plus thread-safe access to its event loop.

    Everything that touches broker state runs on the broker's loop through
    :meth:`call` (plain functions) or :meth:`run` (coroutines), as the core is
    owned by that loop.
    """

    def __init__(
        self, config: Config, *, remove_data_dir: bool = False, clock: Clock | None = None
    ) -> None:
        """``clock``: the broker's (a ManualClock moves time only when told); the
        system's by default."""
        from warren.app import Broker  # deferred: importing the plugin stays cheap

        self.config = config
        self.loop = new_event_loop()
        self.broker: Broker = Broker(config, clock=clock)
        self._remove_data_dir = remove_data_dir
        #: The broker's stop, once asked (a second stop() waits on the same one).
        self._stopping: Future[None] | None = None
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="warren-broker", daemon=True
        )

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 30) -> WarrenBroker:
        """Start the broker; ``timeout`` only stops a hung start."""
        self._thread.start()
        try:
            self.run(self.broker.start(), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop the broker (its clients see 320 CONNECTION_FORCED), end the thread and
        remove the data directory when it was a temporary one. Idempotent.

        A loop that does not stop within ``timeout`` (something the test ran on it
        blocks) raises RuntimeError and is left running, data directory and all:
        closing a running loop would only raise a less helpful error, and removing
        files a live broker writes would hide what went wrong. Calling stop() again
        waits again."""
        if self.loop.is_closed():
            return
        failed: BaseException | None = None
        if self._thread.is_alive():
            if self._stopping is None:
                self._stopping = asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop)
            try:
                self._stopping.result(timeout)
            except TimeoutError:
                raise self._stuck(timeout) from None
            except BaseException as exc:  # it failed to stop cleanly: still end the loop
                failed = exc
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise self._stuck(timeout)
        self.loop.close()
        if self._remove_data_dir:
            shutil.rmtree(self.config.data_dir, ignore_errors=True)
        if failed is not None:
            raise failed

    def _stuck(self, timeout: float) -> RuntimeError:
        return RuntimeError(
            f"the broker's event loop did not stop within {timeout:g} s (is a call on it "
            f"blocked?); its thread, left running, and {self.config.data_dir} are left"
        )

    def __enter__(self) -> WarrenBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self.config.bind

    @property
    def amqp_port(self) -> int:
        return self.broker.amqp_port

    @property
    def url(self) -> str:
        """The AMQP URL of the default vhost ``/`` as guest."""
        return self.vhost_url(self.config.default_vhost)

    def vhost_url(self, vhost: str) -> str:
        user = quote(self.config.default_user, safe="")
        password = quote(self.config.default_password, safe="")
        return f"amqp://{user}:{password}@{self.host}:{self.amqp_port}/{quote(vhost, safe='')}"

    @property
    def http_port(self) -> int:
        """The management API's port; 0 when it is disabled (``http_port = -1``)."""
        listener = self.broker.listener("http")
        return listener.port if listener is not None else 0

    @property
    def http_url(self) -> str | None:
        """``http://host:port`` of the management API and UI, None when disabled."""
        if not self.http_port:
            return None
        return f"http://{self.config.http_bind}:{self.http_port}"

    management_url = http_url

    @property
    def mqtt_port(self) -> int:
        """The MQTT port; 0 when the MQTT TCP listener is disabled (``mqtt_port = -1``)."""
        listener = self.broker.listener("mqtt")
        return listener.port if listener is not None else 0

    @property
    def mqtt_url(self) -> str | None:
        """``mqtt://host:port`` of the MQTT listener, None when disabled."""
        if not self.mqtt_port:
            return None
        return f"mqtt://{self.config.mqtt_bind}:{self.mqtt_port}"

    @property
    def stream_port(self) -> int:
        """The stream protocol's port; 0 when its listener is off (``stream_port = -1``)."""
        listener = self.broker.listener("stream")
        return listener.port if listener is not None else 0

    @property
    def stream_url(self) -> str | None:
        """``rabbitmq-stream://guest:guest@host:port/%2F`` (the URI the stream clients
        take, vhost ``/``), None when the stream listener is off."""
        if not self.stream_port:
            return None
        user = quote(self.config.default_user, safe="")
        password = quote(self.config.default_password, safe="")
        vhost = quote(self.config.default_vhost, safe="")
        return (
            f"rabbitmq-stream://{user}:{password}@{self.config.stream_bind}:"
            f"{self.stream_port}/{vhost}"
        )

    @property
    def data_dir(self) -> str:
        return str(self.broker.data_dir)

    # -- running code on the broker's loop --------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the broker's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """Run a plain function on the broker's loop and return its result."""
        fut: Future[T] = Future()

        def runner() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the calling thread
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(runner)
        return fut.result(timeout)

    # -- vhosts -----------------------------------------------------------------------
    def add_vhost(self, name: str) -> str:
        """Create vhost ``name`` (if missing) with full permissions for the default
        user; returns its AMQP URL."""

        def add() -> None:
            self.broker.add_vhost(name)
            self.broker.users.set_permissions(self.config.default_user, name)
            self.broker.save_users()

        self.call(add)
        return self.vhost_url(name)

    def delete_vhost(self, name: str) -> None:
        """Delete vhost ``name``: its connections are closed, its queues, exchanges,
        permissions and files removed. A vhost that does not exist is ignored."""

        def delete() -> None:
            if name in self.broker.vhosts:
                self.broker.delete_vhost(name)

        self.call(delete)

    def vhosts(self) -> list[str]:
        return self.call(lambda: sorted(self.broker.vhosts))

    def queues(self, vhost: str = "/") -> list[str]:
        """The names of the queues in ``vhost`` (handy in assertions)."""
        return self.call(lambda: sorted(self.broker.get_vhost(vhost).queues))

    def __repr__(self) -> str:
        return f"<WarrenBroker {self.url} http={self.http_url}>"


class WarrenVhost:
    """A vhost created for one test: ``name`` and ``url`` (amqp://, as guest)."""

    def __init__(self, broker: WarrenBroker, name: str) -> None:
        self.broker = broker
        self.name = name
        self.url = broker.add_vhost(name)

    def queues(self) -> list[str]:
        return self.broker.queues(self.name)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"<WarrenVhost {self.name!r} {self.url}>"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (as ``warren`` runs), else asyncio's default loop;
    WARREN_LOOP=asyncio opts out."""
    if os.environ.get("WARREN_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def start_broker(
    *,
    port: int = 0,
    http_port: int = 0,
    mqtt_port: int = 0,
    prometheus_port: int = 0,
    stream_port: int = 0,
    data_dir: str | None = None,
    config_file: str | None = None,
    **settings: Any,
) -> WarrenBroker:
    """Start a broker in a background thread, outside pytest too.

    ``port=0``, ``http_port=0``, ``mqtt_port=0``, ``prometheus_port=0`` and
    ``stream_port=0`` pick free ports (-1 disables the management API, MQTT, the
    Prometheus or the stream protocol listener); the stream protocol's TLS port is
    opened only when asked (``stream_tls_port``), never on its fixed 5551. Without
    ``data_dir`` the data lives in a temporary directory removed by
    :meth:`WarrenBroker.stop`. ``config_file`` (LavinMQ INI, as ``warren -c``) is
    applied first; ``settings`` are Config fields and win.
    """
    from warren.config import Config

    config = Config()
    unknown = set(settings) - {f.name for f in dataclasses.fields(config)}
    if unknown:
        raise TypeError(f"start_broker: not Config fields: {', '.join(sorted(unknown))}")
    if config_file:
        config.apply_ini(config_file)
    temporary = data_dir is None
    config.data_dir = data_dir or tempfile.mkdtemp(prefix="warren-pytest-")
    config.amqp_port = port
    config.http_port = http_port
    config.mqtt_port = mqtt_port
    config.prometheus_port = prometheus_port
    config.stream_port = stream_port
    if config.stream_tls_port is None:  # not 5551 whenever tls_cert is given
        config.stream_tls_port = -1
    config.sync = settings.pop("sync", False)  # tests need no fdatasync per message
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        config.validate()
    except BaseException:
        if temporary:
            shutil.rmtree(config.data_dir, ignore_errors=True)
        raise
    return WarrenBroker(config, remove_data_dir=temporary).start()


# -- pytest hooks and fixtures --------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("warren", "Warren AMQP broker (warren_* fixtures)")
    group.addoption(
        "--warren-port",
        type=int,
        default=None,
        help="AMQP port of the warren_broker fixture (default 0: a free one; under "
        "pytest-xdist each worker adds its index). ini: warren_port",
    )
    group.addoption(
        "--warren-http-port",
        type=int,
        default=None,
        help="management API port (default 0: a free one; -1 disables it). ini: warren_http_port",
    )
    group.addoption(
        "--warren-data-dir",
        default=None,
        help="keep the broker's data in this directory (default: a temporary one, "
        "removed at session end; per-worker subdirectory under xdist). ini: warren_data_dir",
    )
    group.addoption(
        "--warren-config",
        default=None,
        help="an INI config file (as `warren -c`) for the broker. ini: warren_config",
    )
    parser.addini("warren_port", "AMQP port of the warren_broker fixture (0: a free one)")
    parser.addini("warren_http_port", "management API port (0: a free one, -1: disabled)")
    parser.addini("warren_data_dir", "keep the broker's data in this directory")
    parser.addini("warren_config", "an INI config file for the broker (as `warren -c`)")
    parser.addini(
        "warren_settings",
        "extra broker settings, one `field = value` per line (Config field names, "
        "e.g. consumer_timeout = 5000)",
        type="linelist",
    )


def _option(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(f"--warren-{name.replace('_', '-')}")
    if value is None:
        value = config.getini(f"warren_{name}") or None
    return None if value is None else str(value)


def _settings(lines: list[str]) -> dict[str, Any]:
    """``field = value`` lines into Config fields, typed like the field's default."""
    from warren.config import Config

    defaults = Config()
    settings: dict[str, Any] = {}
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, raw = line.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not hasattr(defaults, key):
            raise pytest.UsageError(f"warren_settings: not a `field = value` line: {line!r}")
        current = getattr(defaults, key)
        value: Any
        if isinstance(current, bool):
            value = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int) or key.endswith("_port"):  # stream_tls_port: None
            value = int(raw)
        elif isinstance(current, tuple):
            value = tuple(v.strip() for v in raw.split(",") if v.strip())
        else:
            value = raw
        settings[key] = value
    return settings


def _worker_index() -> int:
    """pytest-xdist's worker number (gw3 -> 3); 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


@pytest.fixture(scope="session")
def warren_broker(pytestconfig: pytest.Config) -> Iterator[WarrenBroker]:
    """A Warren broker for the whole session (per xdist worker), stopped at the end."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    index = _worker_index()
    port = int(_option(pytestconfig, "port") or 0)
    http_port = int(_option(pytestconfig, "http_port") or 0)
    if port > 0:
        port += index  # a fixed port per worker, so parallel workers never collide
    if http_port > 0:
        http_port += index
    data_dir = _option(pytestconfig, "data_dir")
    if data_dir is not None:
        data_dir = os.path.abspath(os.path.join(data_dir, worker) if worker else data_dir)
    settings = _settings(pytestconfig.getini("warren_settings"))
    try:
        broker = start_broker(
            port=port,
            http_port=http_port,
            data_dir=data_dir,
            config_file=_option(pytestconfig, "config"),
            **settings,
        )
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        pytest.fail(f"warren_broker: cannot start Warren: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def warren_url(warren_broker: WarrenBroker) -> str:
    """The session broker's AMQP URL (vhost ``/``, user guest)."""
    return warren_broker.url


@pytest.fixture(scope="session")
def warren_mqtt_url(warren_broker: WarrenBroker) -> str | None:
    """The session broker's MQTT URL, ``mqtt://host:port`` (None when disabled)."""
    return warren_broker.mqtt_url


@pytest.fixture(scope="session")
def warren_stream_url(warren_broker: WarrenBroker) -> str | None:
    """The session broker's stream protocol URI (None when disabled)."""
    return warren_broker.stream_url


@pytest.fixture(scope="session")
def warren_http_url(warren_broker: WarrenBroker) -> str | None:
    """The session broker's management API/UI URL (None when disabled)."""
    return warren_broker.http_url


@pytest.fixture
def warren_vhost(
    warren_broker: WarrenBroker, request: pytest.FixtureRequest
) -> Iterator[WarrenVhost]:
    """A fresh vhost for this test only; deleted (connections closed) afterwards."""
    name = f"test-{next(_vhost_counter)}-{uuid.uuid4().hex[:8]}"
    vhost = WarrenVhost(warren_broker, name)
    try:
        yield vhost
    finally:
        warren_broker.delete_vhost(name)
