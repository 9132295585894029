"""AMQP field tables as RabbitMQ writes them in JSON, and JSON objects as tables.

Arguments of queues, exchanges and bindings in definitions files and in the
management API (rabbit_misc:amqp_table/1's conversions).
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

__all__ = ["from_json_table", "to_json_table"]


def _json_value(value: Any) -> Any:
    """An AMQP field value as RabbitMQ writes it in JSON (rabbit_misc:amqp_table/1)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def to_json_table(table: dict[str, Any]) -> dict[str, Any]:
    """An AMQP table as RabbitMQ writes it in JSON."""
    return {k: _json_value(v) for k, v in table.items()}


def from_json_table(table: dict[str, Any]) -> dict[str, Any]:
    """JSON arguments as the AMQP table a client would have sent (strings stay str)."""
    return dict(table)
