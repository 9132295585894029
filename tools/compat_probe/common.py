"""The probe's registry (scenario, SCENARIOS), its settings, and how observations
are normalised into JSON that compares across runs and brokers.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Observation = dict[str, Any]
ScenarioFn = Callable[[str, int], Observation]

#: Seconds to wait for a reply (or for the socket to close) before giving up. RabbitMQ
#: closes some sockets 3 s after an error, so this must be comfortably longer.
TIMEOUT = 5.0
#: Seconds to keep reading after a ping was answered, for frames racing it.
GRACE = 0.75
#: Seconds a whole scenario may take before it is recorded as timed out.
SCENARIO_TIMEOUT = 60.0

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

#: Capabilities a modern client (pika, aio-pika, the Java client) advertises.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "per_consumer_qos": True,
    "publisher_confirms": True,
}


class ProbeError(Exception):
    """The broker did something the scenario cannot continue from."""


@dataclass
class Scenario:
    name: str
    fn: ScenarioFn
    queues: tuple[str, ...] = ()
    exchanges: tuple[str, ...] = ()
    doc: str = ""


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str | None = None, *, queues: Sequence[str] = (), exchanges: Sequence[str] = ()
) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register a scenario; ``queues``/``exchanges`` are deleted before and after it."""

    def register(fn: ScenarioFn) -> ScenarioFn:
        key = name or fn.__name__.removeprefix("s_")
        if key in SCENARIOS:
            raise ValueError(f"duplicate scenario {key}")
        SCENARIOS[key] = Scenario(
            key, fn, tuple(queues), tuple(exchanges), (fn.__doc__ or "").strip()
        )
        return fn

    return register


# --------------------------------------------------------------------------------------
# Normalisation / JSON
# --------------------------------------------------------------------------------------

_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"amq\.gen-[A-Za-z0-9_\-]+"), "amq.gen-*"),
    (re.compile(r"amq\.ctag-[A-Za-z0-9_\-]+"), "amq.ctag-*"),
    (re.compile(r"amq\.rabbitmq\.reply-to\.[A-Za-z0-9_\-+/=.]+"), "amq.rabbitmq.reply-to.*"),
    (re.compile(r"<\d+\.\d+\.\d+>"), "<pid>"),
]


def normalise(value: Any) -> Any:
    """Replace server-generated parts of strings with placeholders, recursively."""
    if isinstance(value, str):
        for pattern, repl in _NORMALISERS:
            value = pattern.sub(repl, value)
        return value
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def escape_bytes(data: bytes) -> str:
    """Printable ASCII kept, everything else as ``\\xNN``: 'AMQP\\x00\\x00\\x09\\x01'."""
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in data)


def jsonable(value: Any) -> Any:
    """Convert decoded AMQP values (tables, bytes, decimals, timestamps) to JSON types."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return escape_bytes(raw)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return repr(value)
