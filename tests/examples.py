"""How many examples a property-based test runs in this pass of `make test`.

The pure-Python pass (WARREN_PURE_PYTHON=1) runs a third of each test's
examples: it is there to show that the .py files do what their compiled build
does, on the same source the compiled pass has just run with the full count
(docs/testing.md, "The two passes"). Run alone, a test file gets the full count
in either build only when WARREN_PURE_PYTHON is unset.
"""

from __future__ import annotations

import os

#: The divisor of the pure pass.
PURE_PASS_SHARE = 3 if os.environ.get("WARREN_PURE_PYTHON") == "1" else 1


def examples(n: int) -> int:
    """``n`` examples in the compiled pass, a third of them (at least 1) in the pure one."""
    return max(n // PURE_PASS_SHARE, 1)
