"""Entry point for ``python -m warren``."""

from warren.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
