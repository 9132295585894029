"""How the ``warren`` data source turns an option's string into a value, and
the error it raises when it cannot: shared by the endpoint (endpoint.py) and
the source and sink options (options.py). Spark's option names are
case-insensitive, so every lookup is too."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["OptionError", "boolean", "count", "get", "non_negative_int"]


class OptionError(ValueError):
    """An option is missing, malformed, or names something the broker does not have."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"warren data source: option '{option}': {problem}")
        self.option = option


def non_negative_int(text: str) -> int | None:
    text = text.strip()
    if not text.isdigit():
        return None
    value = int(text)
    return value if value < 1 << 63 else None


def get(options: Mapping[str, str], name: str) -> str | None:
    """Options are case-insensitive in Spark; accept any case here too (for direct use)."""
    if name in options:
        return options[name]
    lower = name.lower()
    for key, value in options.items():
        if key.lower() == lower:
            return value
    return None


def count(option: str, raw: str | None, default: int) -> int:
    if raw is None:
        return default
    value = non_negative_int(raw)
    if value is None:
        raise OptionError(option, f"expected an integer >= 0, got {raw!r}")
    return value


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = get(options, name)
    if raw is None:
        return default
    lower = raw.strip().lower()
    if lower in ("true", "false"):
        return lower == "true"
    raise OptionError(name, f"expected true or false, got {raw!r}")
