"""Reading a definitions document (RabbitMQ's JSON format) and its entries.

The files ``load_definitions`` names, and the entries of a category read field
by field, so that every error names the entry it is in (``queues[3] 'q1':
'durable' must be true or false``). definitions_import.py plans and applies an
import with these; DefinitionsError is what any refused import raises.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warren.core.errors import BrokerError
from warren.core.names import name_problem, shown
from warren.core.runtime_parameters import ValidationFailed
from warren.core.table_encode import encode_table
from warren.json_input import JSONInputError, loads
from warren.json_tables import from_json_table

__all__ = ["DefinitionsError", "Entry", "entries", "read_definitions", "wrap_errors"]


class DefinitionsError(ValueError):
    """Definitions that cannot be imported; the message names the entry and the problem."""


# -- reading ------------------------------------------------------------------------------


def read_definitions(path: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """The definitions in a JSON file, or in every ``*.json`` file of a directory
    (name order), as RabbitMQ's ``load_definitions`` reads them."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    out = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise DefinitionsError(
                f"definitions file {file}: cannot read it: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError as exc:
            raise DefinitionsError(f"definitions file {file}: not UTF-8 text: {exc}") from None
        try:
            data = loads(text) if text.strip() else {}
        except JSONInputError as exc:
            raise DefinitionsError(
                f"definitions file {file}: not valid JSON: {exc.reason}"
            ) from None
        if not isinstance(data, dict):
            raise DefinitionsError(f"definitions file {file}: definitions must be a JSON object")
        out.append((file, data))
    return out


# -- entries ------------------------------------------------------------------------------


class Entry:
    """One entry of a category, for reading fields with errors that name it."""

    def __init__(self, category: str, index: int, rec: Any) -> None:
        self.where = f"{category}[{index}]"
        if not isinstance(rec, dict):
            raise DefinitionsError(f"{self.where}: must be a JSON object, not {_kind(rec)}")
        self.rec = rec
        name = rec.get("name")
        if isinstance(name, str):
            self.where += f" '{shown(name)}'"

    def error(self, text: str) -> DefinitionsError:
        return DefinitionsError(f"{self.where}: {text}")

    def text(self, key: str, default: str | None = None) -> str:
        value = self.rec.get(key, default)
        if not isinstance(value, str):
            raise self.error(f"'{key}' must be a string" + ("" if key in self.rec else ", missing"))
        return value

    def name(self, key: str, kind: str, default: str | None = None) -> str:
        """``text(key)`` that must be a valid name for a ``kind`` (core/names.py)."""
        value = self.text(key, default)
        problem = name_problem(kind, value)
        if problem is not None:
            raise self.error(problem)
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.rec.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"'{key}' must be true or false, not {json.dumps(value)}")
        return value

    def table(self, key: str) -> dict[str, Any]:
        value = self.rec.get(key)
        if value is None or value == []:
            return {}
        if not isinstance(value, dict):
            raise self.error(f"'{key}' must be a JSON object")
        return value

    def arguments(self, key: str = "arguments") -> dict[str, Any]:
        """``table(key)`` as the AMQP table it stands for, refused when it could not
        be stored or sent (nested deeper than AMQP allows, a number no type holds)."""
        table = from_json_table(self.table(key))
        try:
            encode_table(table)
        except (ValueError, TypeError, struct.error) as exc:
            raise self.error(f"'{key}' cannot be an AMQP table: {exc}") from None
        return table


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return json.dumps(value)


def entries(data: dict[str, Any], category: str) -> list[Entry]:
    """The entries of ``category`` (none when it is absent), each checked to be an object."""
    value = data.get(category)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionsError(f"'{category}' must be a JSON array")
    return [Entry(category, i, rec) for i, rec in enumerate(value)]


def wrap_errors(entry: Entry, action: Callable[[], Any]) -> Any:
    """``action()``, with the core's refusals turned into DefinitionsError naming ``entry``."""
    try:
        return action()
    except (BrokerError, ValidationFailed) as exc:
        text = exc.text if isinstance(exc, BrokerError) else "; ".join(exc.errors)
        raise entry.error(text) from None
