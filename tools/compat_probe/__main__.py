"""``python tools/compat_probe ...``: the probe's command line (see the package)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for the package

from compat_probe import main  # noqa: E402

sys.exit(main())
