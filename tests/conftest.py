"""Shared fixtures: a real Warren broker on an ephemeral port.

The broker runs on its own event loop in a background thread, so blocking
clients (pika, kombu, Celery) and asyncio clients (aio-pika, on their own loop)
talk to it over real sockets exactly as they would to RabbitMQ.

A test about time (TTL, expiry, delays, timeouts, keep alive, heartbeats,
rates) gives the broker a ManualClock (``broker_factory(clock=ManualClock())``,
``start_broker(dir, clock=...)``) and moves it with ``BrokerThread.advance(ms)``:
no test waits for time to pass (core/clock.py).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from amqp1_peers import RABBITMQ_310, WARREN, Peer
from cputime import account
from harness import harness_fixture
from hypothesis import settings as hypothesis_settings
from passes import long_first, mark_passes
from paths import TESTS

from examples import examples
from warren import Config
from warren.amqp.server import AMQPListener
from warren.core.clock import Clock, ManualClock
from warren.pytest_plugin import WarrenBroker, new_event_loop  # noqa: F401 - tests import it from here
from warren.store.damage import DamagedFile

# No property-based test has a deadline: an example's time says how busy the
# machine is (make test-busy), not whether the code is right, and a deadline
# missed once makes Hypothesis report the test as flaky. A test's own
# settings() keep this unless they set one. A test without its own count
# runs Hypothesis's 100, scaled as every count is (tests/examples.py).
hypothesis_settings.register_profile("warren", deadline=None, max_examples=examples(100))
hypothesis_settings.load_profile("warren")

# A test run started in the background by a shell (`make test &`, or make's own
# background pure pass) inherits SIGINT ignored, and so would every process a
# test starts: an ignored Ctrl-C never reaches warren, warren perf or a cluster
# node, and tests that send one wait for nothing. Handled here, it is the
# default again in every child (exec resets handled signals, not ignored ones).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

T = TypeVar("T")


class BrokerThread(WarrenBroker):
    """The pytest plugin's broker on a thread (warren.pytest_plugin), with what
    Warren's own tests add: a clock to hand in and move, the AMQP listener."""

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        super().__init__(config, clock=clock)

    def start(self, timeout: float = 120) -> BrokerThread:
        """``timeout`` only stops a hung start. A restart on a big data dir
        (10,000 durable queues, pure Python) took over 30 s beside the other
        pass of make test and two CPU hogs (make test-busy)."""
        super().start(timeout)
        return self

    @property
    def port(self) -> int:
        return self.broker.amqp_port

    @property
    def amqp_listener(self) -> AMQPListener:
        listener = self.broker.listener("amqp")
        assert isinstance(listener, AMQPListener)
        return listener

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def clock(self) -> ManualClock:
        """The broker's clock, when the test gave it a ManualClock."""
        clock = self.broker.clock
        assert isinstance(clock, ManualClock), "start the broker with clock=ManualClock()"
        return clock

    def advance(self, ms: float) -> int:
        """Move the broker's ManualClock forward by ``ms`` on its loop, running the
        timers that fall due; how many ran. What they started (deliveries, closes)
        goes on on the loop: wait for it as a client would."""
        clock = self.clock
        return self.call(lambda: clock.advance(ms))


SPARK_TESTS = TESTS / "spark"


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """make test's tests/spark pytest (WARREN_TEST_PASS=spark) collects
    tests/spark alone: its -m keeps nothing else, and importing the other
    4,400 tests to deselect them took each of its workers 3 s of CPU."""
    if os.environ.get("WARREN_TEST_PASS") != "spark":
        return None
    if collection_path.is_relative_to(SPARK_TESTS) or SPARK_TESTS.is_relative_to(collection_path):
        return None
    return True if collection_path.is_relative_to(TESTS) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with the passes of make test that run it (tests/passes.py),
    before -m selects by those marks."""
    mark_passes(items)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Puts the longest tests first, one share per xdist worker (tests/passes.py),
    once -m and -k have deselected what this run leaves out, and before xdist's
    worker sends the controller its collection (in the same hook)."""
    long_first(session.items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


_CPU = account()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With WARREN_TEST_CPU set, each test's CPU time (tests/cputime.py)."""
    if _CPU is None:
        yield
        return
    before = _CPU.before()
    yield
    _CPU.measure(item.nodeid, before)


def pytest_sessionfinish() -> None:
    if _CPU is not None:
        _CPU.write()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the last lines each broker process it ran
    logged (tests/cluster/nodes.py keeps them in <tmp_path>/<name>.node.log): a
    cluster test that fails once in CI is explained by its nodes' logs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and report.when in ("setup", "call") and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.glob("*.node.log")):
            tail = log.read_text(errors="replace").splitlines()[-80:]
            report.sections.append((f"node {log.name.removesuffix('.node.log')}", "\n".join(tail)))


def start_broker(
    data_dir: Path, start_timeout: float = 120, clock: Clock | None = None, **settings: Any
) -> BrokerThread:
    # Ephemeral ports for every listener, so brokers started in parallel never collide
    # (the stream protocol's TLS port only when asked, never its 5551).
    settings.setdefault("http_port", 0)
    settings.setdefault("mqtt_port", 0)
    settings.setdefault("prometheus_port", 0)
    settings.setdefault("stream_port", 0)
    settings.setdefault("stream_tls_port", -1)
    # Failed logins are tested on purpose here and there: no delays, no lockout
    # (tests/core/test_auth_guard.py turns them on).
    settings.setdefault("auth_failure_delay", 0)
    settings.setdefault("auth_failures_per_minute", 0)
    settings.setdefault("amqp_port", 0)
    config = Config(data_dir=str(data_dir), **settings)
    return BrokerThread(config, clock).start(start_timeout)


def refused_start(data_dir: Path, **settings: Any) -> DamagedFile:
    """Start a broker on a damaged data dir that must refuse: the DamagedFile it
    raised (store/damage.py)."""
    settings.setdefault("http_port", 0)
    settings.setdefault("mqtt_port", 0)
    settings.setdefault("prometheus_port", 0)
    settings.setdefault("stream_port", 0)
    settings.setdefault("stream_tls_port", -1)
    b = BrokerThread(Config(data_dir=str(data_dir), amqp_port=0, **settings))
    try:
        with pytest.raises(DamagedFile) as info:
            b.start()
    finally:
        b.stop()
    return info.value


def data_tree(root: Path) -> dict[str, bytes]:
    """Every file under a data directory but its lock, with its content: what a
    refused start must leave exactly as it was."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    """A fresh broker per test."""
    b = start_broker(tmp_path / "data")
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def hand_sampled_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    """A broker whose message rates are sampled only when the test calls
    ``broker.sample_stats(t)`` (collect_statistics_interval = 0): exact rates."""
    b = start_broker(tmp_path / "data", collect_statistics_interval=0)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers with custom settings (and ``clock=``); all are stopped at the end."""
    started: list[BrokerThread] = []

    def factory(**settings: Any) -> BrokerThread:
        settings.setdefault("data_dir", tmp_path / "data")
        data_dir = settings.pop("data_dir")
        b = start_broker(Path(data_dir), **settings)
        started.append(b)
        return b

    yield factory
    for b in started:
        b.stop()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Any]:
    """A real etcd (Debian's etcd-server) on free ports (tests/cluster/etcd_proc.py)."""
    # By the name tests/cluster's modules use (one module object), not as
    # cluster.etcd_proc: another module named "cluster" may be imported first.
    cluster_tests = str(Path(__file__).parent / "cluster")
    if cluster_tests not in sys.path:
        sys.path.append(cluster_tests)
    from etcd_proc import ETCD, EtcdProcess

    if ETCD is None:
        pytest.skip("etcd is not installed (make etcd installs Debian's etcd-server)")
    proc = EtcdProcess(tmp_path / "etcd")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def rabbitmq(tmp_path: Path) -> Iterator[Any]:
    """A private real RabbitMQ (Debian's rabbitmq-server) on free ports."""
    from rabbitmq_proc import AVAILABLE, RabbitMQ

    if not AVAILABLE:
        pytest.skip("rabbitmq-server is not installed (make rabbitmq installs Debian's)")
    server = RabbitMQ(tmp_path / "rabbitmq")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rabbitmq_amqp1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private RabbitMQ with the rabbitmq_amqp1_0 plugin on its AMQP port, one
    per test process (3 s to start): RabbitMQ 3.10's plugin as the reference of
    the AMQP 1.0 scenarios its behaviour is the reference for (docs/amqp1.md)."""
    from rabbitmq_proc import AVAILABLE, RabbitMQ

    if not AVAILABLE:
        pytest.skip("rabbitmq-server is not installed (make rabbitmq installs Debian's)")
    server = RabbitMQ(tmp_path_factory.mktemp("rabbitmq"), plugins=["rabbitmq_amqp1_0"])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(
    params=[
        WARREN,
        # RabbitMQ's run tests no Warren code: once, in make test's compiled pass.
        pytest.param(RABBITMQ_310, marks=pytest.mark.passes("compiled")),
    ]
)
def peer(request: pytest.FixtureRequest) -> Peer:
    """An AMQP 1.0 scenario whose reference is RabbitMQ 3.10's rabbitmq_amqp1_0
    plugin runs against Warren (a fresh broker per test) and against that plugin
    (``rabbitmq_amqp1``): tests/amqp1_peers.py."""
    if request.param == WARREN:
        broker = request.getfixturevalue("broker")
        return Peer(WARREN, broker.port, broker.url, warren=broker)
    rabbitmq = request.getfixturevalue("rabbitmq_amqp1")
    return Peer(RABBITMQ_310, rabbitmq.port, rabbitmq.url)


#: A broker without listeners, driven in memory on this thread (tests/harness).
harness = harness_fixture()
