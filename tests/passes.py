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
    "compat": BOTH,
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


def mark_passes(items: list[pytest.Item]) -> None:
    """Marks each test ``compiled_pass`` and/or ``pure_pass``, what the Makefile
    selects with -m."""
    for item in items:
        for name in passes_of(item) or ():
            item.add_marker(f"{name}_pass")
