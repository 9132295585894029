"""Warren: an AMQP 0-9-1 message broker in Python, wire-compatible with RabbitMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Broker", "Config", "__version__"]

if TYPE_CHECKING:
    from warren.broker import Broker
    from warren.config import Config


def __getattr__(name: str) -> Any:
    # Lazy, so `warren --help` does not import the whole broker.
    if name == "Broker":
        from warren.broker import Broker

        return Broker
    if name == "Config":
        from warren.config import Config

        return Config
    raise AttributeError(name)
