"""Entry point for ``python -m warren``."""

import sys

try:
    from warren.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still loading: no traceback
    sys.stderr.write("warren: interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())
