"""RabbitMQ's redeclaration rules: an exchange or queue declared again must match.

A declare of an existing exchange or queue with another type, durability,
exclusivity, auto-delete, internal flag or (compared) argument fails with 406
PRECONDITION_FAILED and RabbitMQ's text; which arguments are compared depends
on the queue type (queue_arguments).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.core.errors import PreconditionFailed
from warren.core.queue_arguments import (
    CLASSIC_QUEUE_ARGUMENTS,
    EXCHANGE_ARGUMENTS,
    QUORUM_QUEUE_ARGUMENTS,
    STREAM_QUEUE_ARGUMENTS,
    assert_args_equivalent,
)

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.queue import Queue

__all__ = ["check_exchange_equivalent", "check_queue_equivalent"]

#: The arguments compared on redeclaration, by queue type (classic: the rest).
_EQUIVALENCE_KEYS = {"stream": STREAM_QUEUE_ARGUMENTS, "quorum": QUORUM_QUEUE_ARGUMENTS}


def _flag(value: bool) -> str:
    return "true" if value else "false"


def check_exchange_equivalent(
    vhost: str,
    ex: Exchange,
    type_: str,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    arguments: dict[str, Any],
) -> None:
    def fail(arg: str, received: str, current: str) -> None:
        raise PreconditionFailed(
            f"inequivalent arg '{arg}' for exchange '{ex.name}' in vhost '{vhost}': "
            f"received '{received}' but current is '{current}'"
        )

    if ex.type != type_:
        fail("type", type_, ex.type)
    if ex.durable != durable:
        fail("durable", _flag(durable), _flag(ex.durable))
    if ex.auto_delete != auto_delete:
        fail("auto_delete", _flag(auto_delete), _flag(ex.auto_delete))
    if ex.internal != internal:
        fail("internal", _flag(internal), _flag(ex.internal))
    assert_args_equivalent(
        f"exchange '{ex.name}' in vhost '{vhost}'",
        ex.arguments,
        arguments,
        EXCHANGE_ARGUMENTS,
    )


def check_queue_equivalent(
    vhost: str,
    q: Queue,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> None:
    def fail(arg: str, received: str, current: str) -> None:
        raise PreconditionFailed(
            f"inequivalent arg '{arg}' for queue '{q.name}' in vhost '{vhost}': "
            f"received {received} but current is {current}"
        )

    if q.durable != durable:
        fail("durable", f"'{_flag(durable)}'", f"'{_flag(q.durable)}'")
    if q.exclusive != exclusive:
        fail("exclusive", f"'{_flag(exclusive)}'", f"'{_flag(q.exclusive)}'")
    if q.auto_delete != auto_delete:
        fail("auto_delete", f"'{_flag(auto_delete)}'", f"'{_flag(q.auto_delete)}'")
    assert_args_equivalent(
        f"queue '{q.name}' in vhost '{vhost}'",
        q.arguments,
        arguments,
        _EQUIVALENCE_KEYS.get(q.queue_type, CLASSIC_QUEUE_ARGUMENTS),
    )
