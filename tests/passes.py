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


#: Tests that take longest, by node id prefix, with the seconds each took in a
#: `make test` on a quiet 2-core machine (2026-11-29). :func:`long_first` starts
#: them first, spread over the workers, and the short tests fill in around them.
#: An entry that no longer names a test orders nothing; nothing fails.
LONG_FIRST: tuple[tuple[str, float], ...] = (
    # the compiled pass
    ("protocol/amqp/test_header_fuzz.py::test_dead_lettering_keeps_headers", 46),
    ("integration/test_kombu_integration_suite.py", 41),
    # not timed in make test yet: 193 s pure Python on a loaded machine
    ("integration/test_rstream_suite.py", 150),
    ("store/test_persistence.py::test_ten_thousand_durable_queues", 35),
    ("store/test_segment_store.py::TestStoreComparison", 28),
    ("integration/test_readme_quickstart.py::test_the_readme_quick_start", 25),
    ("store/test_metadata_fuzz.py", 25),
    ("integration/test_packaging.py::test_the_built_wheel", 24),
    ("integration/test_soak.py", 17),
    ("protocol/amqp/test_header_fuzz.py::test_validate_table", 17),
    ("protocol/amqp/test_header_fuzz.py::test_publish_through", 15),
    ("protocol/amqp/test_header_fuzz.py::test_persistent_headers", 11),
    ("integration/test_doc_snippets.py", 4),  # 13 for ctl.md, 50 over all pages
    ("cluster/test_failover.py", 8),
    ("cluster/test_partition.py", 10),
    ("cluster/test_amqp1_failover.py", 15),
    ("store/powercut/", 3),
    # the pure pass
    ("spark/test_deploy_cluster.py", 42),
    ("spark/test_docs_snippet.py", 38),
    ("spark/test_deploy_connect.py", 48),
    ("spark/test_example.py", 20),
    ("spark/test_failover.py", 28),
    ("ui/test_ui_links.py", 8),
    ("spark/test_session_guard.py", 9),
    ("spark/test_sink_exactly_once.py", 8),
    ("spark/", 2),
    ("ui/", 3),
)


def _seconds(item: pytest.Item) -> float | None:
    node = item.nodeid.removeprefix("tests/")  # node ids are from the repository's root
    for prefix, seconds in LONG_FIRST:
        if node.startswith(prefix):
            return seconds
    return None


def _together(item: pytest.Item) -> bool:
    """Whether ``item`` needs the RabbitMQ 3.10 node with the AMQP 1.0 plugin
    (tests/conftest.py ``rabbitmq_amqp1``: one per test process, 3-5 s and
    an Erlang VM to start), so that one worker runs them all."""
    return "rabbitmq_amqp1" in getattr(item, "fixturenames", ()) or "[rabbitmq-3.10" in item.nodeid


def long_first(items: list[pytest.Item], workers: int) -> None:
    """Orders ``items`` (in place, after deselection) so that the long tests start
    first and on different workers.

    pytest-xdist's work stealing (``--dist worksteal``) hands each of the
    ``workers`` a contiguous share of the collection at the start (as even as
    integer division makes them) and later moves tests from the end of a busy
    worker's share to an idle one. So each share begins with its part of the
    long tests, given out longest first to the share with the fewest seconds so
    far; the short tests follow in collection order. Long tests all at the front
    of the collection would all be in the first worker's share, one after the
    other (the tail of the run), and a share's head is never stolen."""
    together = [t for t in items if _together(t)]
    long = sorted(
        (t for t in items if _seconds(t) is not None and not _together(t)),
        key=lambda t: -(_seconds(t) or 0),
    )
    rest = [t for t in items if _seconds(t) is None and not _together(t)]
    workers = max(workers, 1)
    sizes = []
    remaining = len(items)
    for k in range(workers):
        sizes.append(remaining // (workers - k))
        remaining -= sizes[-1]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    if together:  # one block, at the head of the largest share (the first)
        heads[0] += together
        load[0] += 2.0 * len(together)
    for test in long:
        k = min((k for k in range(workers) if len(heads[k]) < sizes[k]), key=lambda k: load[k])
        heads[k].append(test)
        load[k] += _seconds(test) or 0
    ordered: list[pytest.Item] = []
    for k in range(workers):
        fill = sizes[k] - len(heads[k])
        ordered += heads[k] + rest[:fill]
        del rest[:fill]
    items[:] = ordered + rest


def mark_passes(items: list[pytest.Item]) -> None:
    """Marks each test ``compiled_pass`` and/or ``pure_pass``, what the Makefile
    selects with -m."""
    for item in items:
        for name in passes_of(item) or ():
            item.add_marker(f"{name}_pass")
