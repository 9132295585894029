"""rstream's own test suite against an embedded Warren's stream listener.

``tools/rstream_suite.py`` takes ``tests/`` from rstream's repository at the
tag of the installed rstream (cached under ``.cache/rstream-tests``; the
first run needs to reach GitHub, or the cache filled with the tool's
``--source``) and runs it in a subprocess. Every test of the suite must pass
except those in ``KNOWN_FAILURES`` (which must fail) and ``MAY_FAIL`` (whose
outcome is not asserted).

The same suite against RabbitMQ 3.10.8 (Debian's, with rabbitmq_stream and
rabbitmq_management; ``tools/rstream_suite.py --host 127.0.0.1 --port ...``,
the tests on 5552 deselected): 70 passed, and it fails what came later than
3.10 (super streams, filters and a plain stream's single active consumer,
3.11-3.13: "unknown frame"). It passes ``test_amqp_message`` (annotations
kept), ``test_peer_properties`` and ``test_deliver`` (its own chunk layout),
and the two 100,000-message tests.
"""

from __future__ import annotations

import importlib.util
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from paths import TOOLS

from warren.pytest_plugin import WarrenBroker, start_broker

TOOL = TOOLS / "rstream_suite.py"

#: Tests of the suite ("module::test") known to fail against Warren, each with
#: the reason: a Warren bug or a RabbitMQ-only assumption. They must fail; one
#: that passes must be taken off the list, so the list stays exact.
KNOWN_FAILURES: dict[str, str] = {
    # RabbitMQ-only assumptions
    "test_client::test_peer_properties": "RabbitMQ only: asserts product == 'RabbitMQ'",
    "test_client::test_deliver": (
        "RabbitMQ only: asserts osiris's chunk trailer (24 bytes: the publisher's "
        "deduplication entry written in the chunk); Warren keeps that sequence in the "
        "stream's tracking file and sends chunks without a trailer"
    ),
}

#: Tests whose outcome depends on the machine's speed, not on the broker:
#: run, reported, not asserted.
MAY_FAIL: dict[str, str] = {
    **{
        name: "100,000 messages must be consumed within 2 s of the last send"
        for name in (
            "test_producer::test_publishing_several_messages",
            "test_producer::test_publishing_several_messages_different_streams",
        )
    },
    # All of them come, each partition to one consumer, 2-3 s after the last
    # send in pure Python on a loaded machine.
    **{
        f"test_consumer::{name}": "10,000 messages over a super stream's three partitions "
        "must be consumed within 1 s of the last send"
        for name in (
            "test_consume_superstream_with_sac_all_active",
            "test_consume_superstream_with_sac_one_non_active",
            "test_consume_superstream_with_callback_next",
            "test_consume_superstream_with_callback_first",
            "test_consume_superstream_with_callback_offset",
        )
    },
}


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rstream_suite", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def warren() -> Iterator[WarrenBroker]:
    """Warren on RabbitMQ's stream port when it is free (some of the suite's
    tests connect there whatever the options), as rstream's CI broker:
    Metadata and Open name ``localhost``."""
    port = 5552 if port_free(5552) else 0
    broker = start_broker(
        mqtt_port=-1, prometheus_port=-1, stream_port=port, stream_advertised_host="localhost"
    )
    try:
        yield broker
    finally:
        broker.stop()


def outcomes(junit_xml: Path) -> dict[str, str]:
    """``{"module::test": "passed" | "failed" | "error" | "skipped"}``."""
    result: dict[str, str] = {}
    for case in ET.parse(junit_xml).iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        outcome = "passed"
        for kind in ("skipped", "failure", "error"):  # the worst one wins
            if case.find(kind) is not None:
                outcome = "failed" if kind == "failure" else kind
        result[name] = outcome
    return result


@pytest.mark.timeout(900)
def test_rstream_suite(warren: WarrenBroker, tmp_path: Path) -> None:
    tool = load_tool()
    version = tool.installed_version()
    try:
        suite = tool.fetch_suite(version)
    except tool.SuiteUnavailable as exc:
        pytest.skip(f"rstream {version}'s tests cannot be had: {exc}")
    port = warren.broker.listener("stream").port
    deselect = () if port == 5552 else tool.ON_5552
    report = tmp_path / "rstream-suite.xml"
    status = tool.run_suite(
        suite,
        port,
        warren.http_port,
        ["-q", f"--junitxml={report}"],
        deselect=deselect,
        timeout=800,
    )

    assert report.is_file(), f"pytest exited with status {status} without a report"
    results = outcomes(report)
    assert results, f"no test of rstream's suite ran (pytest status {status})"
    not_passed = {n: o for n, o in results.items() if o != "passed" and n not in MAY_FAIL}
    unexpected = {n: o for n, o in not_passed.items() if n not in KNOWN_FAILURES}
    assert not unexpected, f"rstream {version} suite, not passed against Warren: {unexpected}"
    now_passing = sorted(n for n in set(KNOWN_FAILURES) - set(not_passed) if n in results)
    assert not now_passing, f"listed in KNOWN_FAILURES but passed: {now_passing}"
    passed = sum(o == "passed" for o in results.values())
    timed = ", ".join(f"{n} {results[n]}" for n in sorted(MAY_FAIL) if n in results)
    summary = f"rstream {version}: {passed} of {len(results)} passed ({timed})"
    if not_passed:
        pytest.xfail(
            summary + "; " + "; ".join(f"{n}: {KNOWN_FAILURES[n]}" for n in sorted(not_passed))
        )
