"""The pytest plugin (warren.pytest_plugin), exercised as its users run it.

Each test writes a small test suite with pytester and runs it in a fresh pytest
session that loads the plugin, so the fixtures start real brokers and real
clients connect to them. The plugin is loaded explicitly (``-p no:warren -p
warren.pytest_plugin``): the ``pytest11`` entry point is active only where
this checkout is installed, and blocking its name first keeps the module from
being registered twice where it is.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from free_ports import free_port
from paths import REPO

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "no:warren", "-p", "warren.pytest_plugin", "-p", "no:cacheprovider")
#: hypothesis's plugin: 0.13 s of CPU of imports in every pytest process started
#: (xdist's workers, runpytest_subprocess), and no test here uses it.
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
#: pytest-asyncio (test extra) warns in every session that leaves this unset.
QUIET = ("-o", "asyncio_default_fixture_loop_scope=function")


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions pytester runs here are not xdist workers, even when this suite
    runs under xdist (the plugin would offset their ports by the worker's index)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, *QUIET, *args)


def test_broker_url_and_management_url_serve_real_clients(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import json, urllib.request, base64
        import pika

        def test_publish_and_get(warren_url, warren_broker):
            assert warren_url == warren_broker.url
            assert warren_url.startswith("amqp://guest:guest@127.0.0.1:")
            conn = pika.BlockingConnection(pika.URLParameters(warren_url))
            ch = conn.channel()
            ch.queue_declare("q")
            ch.basic_publish("", "q", b"hello")
            assert ch.basic_get("q", auto_ack=True)[2] == b"hello"
            conn.close()
            assert warren_broker.queues("/") == ["q"]

        def test_management_api(warren_broker, warren_http_url):
            assert warren_http_url == warren_broker.http_url == warren_broker.management_url
            req = urllib.request.Request(warren_http_url + "/api/overview")
            req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
            with urllib.request.urlopen(req, timeout=10) as resp:
                overview = json.load(resp)
            assert overview["listeners"]

        def test_mqtt(warren_broker, warren_mqtt_url):
            import paho.mqtt.publish as publish
            import paho.mqtt.subscribe as subscribe
            assert warren_mqtt_url == f"mqtt://127.0.0.1:{warren_broker.mqtt_port}"
            publish.single("plugin/t", b"kept", qos=1, retain=True, port=warren_broker.mqtt_port)
            got = subscribe.simple("plugin/#", qos=1, port=warren_broker.mqtt_port)
            assert (got.topic, got.payload, got.retain) == ("plugin/t", b"kept", True)

        def test_stream_protocol(warren_broker, warren_stream_url):
            import asyncio
            from rstream import Producer
            port = warren_broker.stream_port
            assert warren_stream_url == f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2F"

            async def run():
                async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
                    await p.create_stream("plugin-s")
                    assert await p.stream_exists("plugin-s")

            asyncio.run(run())
            assert "plugin-s" in warren_broker.queues("/")
        """
    )
    run(pytester).assert_outcomes(passed=4)


def test_each_test_gets_a_fresh_vhost_deleted_afterwards(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pika, pytest

        seen = []

        @pytest.mark.parametrize("n", [1, 2])
        def test_isolated(warren_vhost, warren_broker, n):
            assert warren_vhost.name in warren_broker.vhosts()
            assert [v for v in seen if v in warren_broker.vhosts()] == []  # earlier ones gone
            seen.append(warren_vhost.name)
            conn = pika.BlockingConnection(pika.URLParameters(warren_vhost.url))
            ch = conn.channel()
            # The same name in every test: a leftover would hold the earlier message.
            ch.queue_declare("jobs", durable=True)
            assert ch.basic_get("jobs", auto_ack=True) == (None, None, None)
            ch.basic_publish("", "jobs", b"left behind on purpose")
            assert warren_vhost.queues() == ["jobs"]
            assert warren_broker.queues("/") == []
            # Left open on purpose: deleting the vhost closes it.

        def test_urls_quote_the_vhost_name(warren_broker):
            assert warren_broker.vhost_url("/").endswith("/%2F")
            url = warren_broker.add_vhost("a b/c")
            assert url.endswith("/a%20b%2Fc")
            conn = pika.BlockingConnection(pika.URLParameters(url))
            assert conn.is_open
            warren_broker.delete_vhost("a b/c")
            assert "a b/c" not in warren_broker.vhosts()
            warren_broker.delete_vhost("a b/c")  # missing: ignored
        """
    )
    run(pytester).assert_outcomes(passed=3)


def test_options_fixed_port_kept_data_dir_and_session_end(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """--warren-port and --warren-data-dir are honoured; the broker is stopped at
    session end (its port refuses connections) and a kept data dir stays."""
    port, data = free_port(), tmp_path / "kept"
    pytester.makepyfile(
        f"""
        def test_options(warren_broker):
            assert warren_broker.amqp_port == {port}
            assert warren_broker.data_dir == {str(data)!r}
        """
    )
    run(pytester, f"--warren-port={port}", f"--warren-data-dir={data}").assert_outcomes(passed=1)
    assert (data / "users.json").exists() or any(data.iterdir())
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))


def test_port_in_use_fails_the_tests_with_a_clear_message(pytester: pytest.Pytester) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pytester.makepyfile("def test_x(warren_url): pass\n")
        result = run(pytester, f"--warren-port={port}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*warren_broker: cannot start Warren*"])


def test_temporary_data_dir_is_removed_at_session_end(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    record = tmp_path / "data_dir.txt"
    pytester.makepyfile(
        f"""
        import os

        def test_record(warren_broker):
            assert os.path.isdir(warren_broker.data_dir)
            open({str(record)!r}, "w").write(warren_broker.data_dir)
        """
    )
    run(pytester).assert_outcomes(passed=1)
    assert not Path(record.read_text()).exists()


def test_ini_settings_and_config_file(pytester: pytest.Pytester) -> None:
    pytester.makefile(".ini", warren="[amqp]\nframe_max = 8192\n")
    pytester.makeini(
        """
        [pytest]
        warren_config = warren.ini
        warren_http_port = -1
        warren_settings =
            channel_max = 7
            consumer_timeout = 5000
        """
    )
    pytester.makepyfile(
        """
        import pika

        def test_settings(warren_broker, warren_url):
            assert warren_broker.http_url is None
            assert warren_broker.config.consumer_timeout == 5000
            conn = pika.BlockingConnection(pika.URLParameters(warren_url))
            assert conn._impl.params.channel_max == 7
            assert conn._impl.params.frame_max == 8192
            conn.close()
        """
    )
    run(pytester).assert_outcomes(passed=1)


def test_bad_settings_are_reported(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nwarren_settings = no_such_field = 1\n")
    pytester.makepyfile("def test_x(warren_broker): pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*warren_settings*no_such_field*"])
    pytester.makeini("[pytest]\nwarren_settings = frame_max = 100\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*warren_broker: cannot start Warren*frame_max*"])


def test_pytest_asyncio_with_aio_pika(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_asyncio")
    pytester.makepyfile(
        """
        import aio_pika, pytest

        @pytest.mark.asyncio
        async def test_round_trip(warren_vhost):
            async with await aio_pika.connect(warren_vhost.url) as conn:
                ch = await conn.channel()
                q = await ch.declare_queue("q", auto_delete=True)
                await ch.default_exchange.publish(aio_pika.Message(b"hi"), "q")  # confirmed
                # No timeout (aio-pika's default is 5 s): the message is in the queue, the
                # answer is certain; a busy machine that stalls this process for 5 s must
                # not fail the test (pytest-timeout still bounds a real hang).
                msg = await q.get(timeout=None)
                await msg.ack()
                assert msg.body == b"hi"
        """
    )
    run(pytester, "-p", "asyncio").assert_outcomes(passed=1)


def test_pytest_xdist_one_broker_per_worker(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    out = tmp_path / "workers"
    out.mkdir()
    pytester.makepyfile(
        f"""
        import os, pika, pytest

        @pytest.mark.parametrize("n", range(6))
        def test_worker(warren_broker, warren_vhost, n):
            conn = pika.BlockingConnection(pika.URLParameters(warren_vhost.url))
            conn.channel().queue_declare("same-name-everywhere", exclusive=True)
            conn.close()
            worker = os.environ["PYTEST_XDIST_WORKER"]
            with open(os.path.join({str(out)!r}, worker), "a") as f:
                f.write(f"{{warren_broker.amqp_port}}\\n")
        """
    )
    run(pytester, *NO_HYPOTHESIS, "-p", "xdist", "-n", "2").assert_outcomes(passed=6)
    ports = {f.name: set(f.read_text().split()) for f in out.iterdir()}
    assert sorted(ports) == ["gw0", "gw1"]
    assert all(len(p) == 1 for p in ports.values())  # one broker per worker ...
    assert ports["gw0"] != ports["gw1"]  # ... and not the same one


def test_importing_the_plugin_does_not_import_the_broker() -> None:
    """pytest imports the plugin in every session where warren is installed."""
    code = (
        "import sys, warren.pytest_plugin; "
        "heavy = [m for m in ('warren.app', 'warren.broker', 'warren.amqp.server', 'aiohttp') "
        "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pytest11_entry_point_is_declared() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["pytest11"] == {"warren": "warren.pytest_plugin"}


def _installed_from_this_checkout() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11", name="warren")
    if not eps:
        return False
    import warren

    return Path(warren.__file__).resolve().is_relative_to(REPO)


@pytest.mark.skipif(
    not _installed_from_this_checkout(),
    reason="the pytest11 entry point is active only where this checkout is installed",
)
def test_entry_point_autoloads_and_opts_out(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_url(warren_url):\n    assert warren_url\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *NO_HYPOTHESIS).assert_outcomes(
        passed=1
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *NO_HYPOTHESIS, "-p", "no:warren"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'warren_url' not found*"])


def test_start_broker_outside_pytest() -> None:
    """The fixture's broker as a context manager, for scripts and other runners."""
    import pika

    from warren.pytest_plugin import start_broker

    with pytest.raises(TypeError, match="nope"):
        start_broker(nope=1)
    with start_broker(http_port=-1, stream_port=-1, channel_max=5) as broker:
        data_dir = Path(broker.data_dir)
        url = broker.add_vhost("scratch")
        conn = pika.BlockingConnection(pika.URLParameters(url))
        assert conn._impl.params.channel_max == 5
        conn.channel().queue_declare("q")
        conn.close()
        assert broker.queues("scratch") == ["q"]
        assert broker.http_url is None
        assert (broker.stream_port, broker.stream_url) == (0, None)
    assert not data_dir.exists()
    broker.stop()  # idempotent


def test_stop_with_a_blocked_loop_says_so_and_a_later_stop_finishes() -> None:
    """stop() on a loop a test's call blocks raises a clear error and leaves the
    broker (thread, loop, data dir) as it is; once the call returns, stop() again
    ends it cleanly."""
    import threading

    from warren.pytest_plugin import start_broker

    broker = start_broker(http_port=-1, mqtt_port=-1, prometheus_port=-1)
    data_dir = Path(broker.data_dir)
    release = threading.Event()
    broker.loop.call_soon_threadsafe(release.wait)  # a call that blocks the loop
    with pytest.raises(RuntimeError, match=r"did not stop within 0\.2 s .* are left"):
        broker.stop(timeout=0.2)
    assert data_dir.exists() and not broker.loop.is_closed()
    release.set()
    broker.stop()
    assert broker.loop.is_closed() and not data_dir.exists()
