"""The INI values' parsers and the simplest checks of a setting, shared by
config_ini.py and the settings kept in their own modules (config_coap.py,
config_mgmt_oauth.py), which config_ini.py and config_checks.py import: so
these live apart, importing nothing of the configuration.

A parser takes the raw INI text and gives the field's value or raises
ValueError with why; a check takes a value (from a file, a flag or code)
and gives why it is unacceptable, or None.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "any_str",
    "int_in",
    "is_bool",
    "non_empty_str",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_optional",
    "parse_str",
    "parse_user_list",
]

_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_int(raw: str) -> int:
    """Stricter than int(): no '1_000', no unicode digits, no empty value."""
    text = raw.strip()
    if not _INT_RE.fullmatch(text):
        raise ValueError("not an integer")
    return int(text)


def parse_float(raw: str) -> float:
    text = raw.strip()
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError("not a number")
    return float(text)


def parse_str(raw: str) -> str:
    return raw.strip()


def parse_optional(raw: str) -> str | None:
    """A path or URL; an empty value means none."""
    return raw.strip() or None


def parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a boolean (true/false)")


def parse_user_list(raw: str) -> tuple[str, ...]:
    """Comma-separated names; an empty value means none."""
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def int_in(low: int, high: int) -> Callable[[Any], str | None]:
    """An integer from ``low`` to ``high`` (not a bool)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return "must be an integer"
        if not low <= value <= high:
            return f"must be between {low} and {high}"
        return None

    return check


def is_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def any_str(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def non_empty_str(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if not value.strip():
        return "must not be empty"
    return None
