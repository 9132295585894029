"""How many examples a property-based test runs in this pass of `make test`.

A test states its count; WARREN_EXAMPLES (a factor, 1 when unset) scales it.
`make test` sets it to its EXAMPLES (a half: the counts were chosen for
finding bugs, and the suite runs on every change; `make test EXAMPLES=4`, or
`make fuzz`'s atheris targets, go deeper). The pure-Python pass
(WARREN_PURE_PYTHON=1) runs a third of that: it is there to show that the .py
files do what their compiled build does, on the same source the compiled
pass has just run (docs/testing.md, "The two passes").
"""

from __future__ import annotations

import os

#: The divisor of the pure pass.
PURE_PASS_SHARE = 3 if os.environ.get("WARREN_PURE_PYTHON") == "1" else 1
#: make test's factor (WARREN_EXAMPLES; 1: each test's own count).
SCALE = float(os.environ.get("WARREN_EXAMPLES") or 1)


def examples(n: int) -> int:
    """``n`` examples scaled by WARREN_EXAMPLES, a third of them in the pure
    pass; at least 1."""
    return max(int(n * SCALE) // PURE_PASS_SHARE, 1)
