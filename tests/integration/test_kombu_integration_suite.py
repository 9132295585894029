"""kombu's own py-amqp integration suite against an embedded Warren.

``tools/kombu_integration.py`` fetches ``t/integration/test_py_amqp.py`` from
the sdist of the installed kombu (cached under ``.cache/kombu-sdist``, so only
the first run needs the network) and runs it with pytest in a subprocess;
here it runs against the ``broker`` fixture, and every test of the suite must
pass except those in ``KNOWN_FAILURES``. The suite's own sleeps and retry
intervals (TTL tests sleep 3 s, failed connects wait 2 s) make it take about
40 s whatever the broker.
"""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from paths import TOOLS

TOOL = TOOLS / "kombu_integration.py"

#: Tests of the suite ("class::test") known to fail against Warren, each with the
#: reason. They must fail (the test is then xfailed); one that passes must be
#: taken off the list, so the list stays exact.
KNOWN_FAILURES: dict[str, str] = {}


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kombu_integration", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcomes(junit_xml: Path) -> dict[str, str]:
    """``{"class::test": "passed" | "failed" | "error" | "skipped"}`` from a JUnit report."""
    result: dict[str, str] = {}
    for case in ET.parse(junit_xml).iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        outcome = "passed"
        for kind in ("skipped", "failure", "error"):  # the worst one wins
            if case.find(kind) is not None:
                outcome = "failed" if kind == "failure" else kind
        result[name] = outcome
    return result


def test_kombu_py_amqp_integration_suite(broker: Any, tmp_path: Path) -> None:
    tool = load_tool()
    version = tool.installed_kombu_version()
    try:
        suite = tool.fetch_suite(version, tool.DEFAULT_CACHE_DIR)
    except tool.SdistUnavailable as exc:
        pytest.skip(f"cannot download the kombu {version} sdist (no network?): {exc}")

    report = tmp_path / "kombu-suite.xml"
    status = tool.run_suite(
        suite, "127.0.0.1", broker.port, ["-q", f"--junitxml={report}"], timeout=100
    )

    assert report.is_file(), f"pytest exited with status {status} without a report"
    results = outcomes(report)
    assert results, f"no test of {tool.SUITE_FILE} ran (pytest status {status})"
    not_passed = {name: outcome for name, outcome in results.items() if outcome != "passed"}
    unexpected = {n: o for n, o in not_passed.items() if n not in KNOWN_FAILURES}
    assert not unexpected, f"kombu {version} suite, not passed against Warren: {unexpected}"
    now_passing = sorted(set(KNOWN_FAILURES) - set(not_passed))
    assert not now_passing, f"listed in KNOWN_FAILURES but passed: {now_passing}"
    if not_passed:
        pytest.xfail("; ".join(f"{name}: {KNOWN_FAILURES[name]}" for name in sorted(not_passed)))
    assert status == 0, f"pytest status {status} although every test passed"
