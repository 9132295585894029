"""Which of `make test`'s two passes runs a test (docs/testing.md, "The two passes").

`make test` runs the suite against the compiled modules and again with
WARREN_PURE_PYTHON=1. The pure pass is there to show that the .py files do
what their compiled build does, so it runs the groups whose tests run compiled
modules in the test's own process and are about them: the broker's rules, the
store, the protocols (embedded or in memory), the recorded RabbitMQ
comparisons. A group whose code under test is interpreted in both builds (the
HTTP API and metrics, packaging, the docs) or that runs Warren as separate
processes (cluster nodes, `warren` and `warren-ctl`, the soak, the power cuts
under a `warren` process) runs once, in the compiled pass: the build users
run. Two run once in the pure pass: tests/spark (the data source is never
compiled) and tests/ui (the web UI's JavaScript in Chromium, whatever serves
it), which keeps the two passes about as long (with 3 workers each, 127 s of
UI tests made the compiled pass 7.0 min to the pure pass's 5.6).

The table goes by a test module's directory under tests/ (the longest entry
that holds it), so a new module follows its group; a new group must be
entered here (collection fails until it is). A test that belongs elsewhere
says so itself, with ``@pytest.mark.passes("compiled")`` (or both) and the
reason beside it.
``pytest --collect-only -q -m pure_pass`` lists what a pass runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import TESTS

COMPILED, PURE = "compiled", "pure"
BOTH = (COMPILED, PURE)

#: The passes of each group (tests/<group>/...).
GROUPS: dict[str, tuple[str, ...]] = {
    "core": BOTH,
    "store": BOTH,
    "store/powercut": (COMPILED,),
    "protocol": BOTH,
    # The recorded comparisons drive the same protocol code the in-memory
    # protocol tests run in both passes; over sockets, once.
    "compat": (COMPILED,),
    "http": (COMPILED,),
    "cluster": (COMPILED,),
    "integration": (COMPILED,),
    "ui": (PURE,),
    "spark": (PURE,),
}


def passes_of(item: pytest.Item) -> tuple[str, ...] | None:
    """The passes that run ``item``: its ``passes`` marker's, else its group's.
    None for a test outside tests/ (not make test's)."""
    path = Path(item.path)
    if not path.is_relative_to(TESTS):
        return None
    marker = item.get_closest_marker("passes")
    if marker is not None:
        chosen = tuple(marker.args)
        if not chosen or set(chosen) - set(BOTH):
            raise pytest.UsageError(f"{item.nodeid}: passes() takes {BOTH}, got {chosen}")
        return chosen
    parts = path.relative_to(TESTS).parts[:-1]
    for n in range(len(parts), 0, -1):
        group = "/".join(parts[:n])
        if group in GROUPS:
            return GROUPS[group]
    raise pytest.UsageError(
        f"{item.nodeid}: tests/{'/'.join(parts)} is in no pass of make test (tests/passes.py)"
    )


#: Tests that take longest (seconds in a `make test` on a quiet 2-core machine,
#: measured 2026-11-29), by node id prefix, longest first. Collection puts them
#: first, so that xdist starts them first and the short tests fill in around
#: them: a 40 s test handed out last would keep a worker busy after the rest are
#: done. An entry that no longer names a test orders nothing; nothing fails.
LONG_FIRST: tuple[str, ...] = (
    # the compiled pass
    "protocol/amqp/test_header_fuzz.py::test_dead_lettering_keeps_headers",  # 46
    "integration/test_kombu_integration_suite.py",  # 41
    "store/test_persistence.py::test_ten_thousand_durable_queues",  # 35
    "store/test_segment_store.py::TestStoreComparison",  # 28
    "integration/test_readme_quickstart.py",  # 25
    "store/test_metadata_fuzz.py",  # 25
    "integration/test_packaging.py",  # 24
    "integration/test_soak.py",  # 17
    "protocol/amqp/test_header_fuzz.py",  # 17, 15, 11 (the others)
    "integration/test_doc_snippets.py",  # 13 for ctl.md, 50 over all pages
    "cluster/test_failover.py",  # 13, 11, ...
    "cluster/test_partition.py",  # 12, 11
    "store/powercut/",  # 13, 10, ...
    # the pure pass
    "spark/test_deploy_cluster.py",  # 42
    "spark/test_docs_snippet.py",  # 38
    "spark/test_deploy_connect.py",  # 37 + 11 to set up
    "spark/test_example.py",  # 32 + 14, 12
    "spark/test_failover.py",  # 20 + 8
    "ui/test_ui_links.py",  # 19, 17
    "spark/test_session_guard.py",  # 18, 9
    "spark/test_sink_exactly_once.py",  # 13, 9, 8
    "spark/",
    "ui/",
)


def long_first(items: list[pytest.Item]) -> None:
    """Orders ``items`` (in place) by :data:`LONG_FIRST`, the rest after them
    in their own order."""
    def rank(item: pytest.Item) -> int:
        node = item.nodeid.removeprefix("tests/")  # node ids are from the repository's root
        for n, prefix in enumerate(LONG_FIRST):
            if node.startswith(prefix):
                return n
        return len(LONG_FIRST)

    items.sort(key=rank)  # stable: the rest keep collection's order


def mark_passes(items: list[pytest.Item]) -> None:
    """Marks each test ``compiled_pass`` and/or ``pure_pass``, what the Makefile
    selects with -m."""
    for item in items:
        for name in passes_of(item) or ():
            item.add_marker(f"{name}_pass")
