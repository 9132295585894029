"""Helpers shared by the pika (BlockingConnection) tests, test_pika_*.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

Connections: TypeAlias = BlockingConnection | list[BlockingConnection]


def params(broker: Any, **kwargs: Any) -> pika.ConnectionParameters:
    """Parameters for ``broker`` on 127.0.0.1, as guest/guest with one connection attempt."""
    kwargs.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
    kwargs.setdefault("connection_attempts", 1)
    return pika.ConnectionParameters(host="127.0.0.1", port=broker.port, **kwargs)


def connect(broker: Any, **kwargs: Any) -> BlockingConnection:
    """A new connection to ``broker``; ``kwargs`` are further connection parameters."""
    return pika.BlockingConnection(params(broker, **kwargs))


def can_login(broker: Any, user: str, password: str) -> bool:
    """Whether ``user`` gets a connection to ``broker`` with ``password``."""
    try:
        connect(broker, credentials=pika.PlainCredentials(user, password)).close()
    except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError):
        return False
    return True


def uniq(prefix: str = "q") -> str:
    """A name no other test uses: ``test-<prefix>-<random hex>``."""
    return f"test-{prefix}-{uuid.uuid4().hex[:10]}"


def barrier(ch: BlockingChannel) -> None:
    """A synchronous round trip on ``ch``: what was sent before it has been handled."""
    ch.exchange_declare("amq.direct", passive=True)


def channel_error(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``fn(*args, **kwargs)`` gets the channel closed with ``code``; the reply text."""
    with pytest.raises(ChannelClosedByBroker) as info:
        fn(*args, **kwargs)
    assert info.value.reply_code == code, info.value
    return info.value.reply_text


def connection_error(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``fn(*args, **kwargs)`` gets the connection closed with ``code``; the reply text."""
    with pytest.raises(ConnectionClosedByBroker) as info:
        fn(*args, **kwargs)
    assert info.value.reply_code == code, info.value
    return info.value.reply_text


def _as_list(conns: Connections) -> list[BlockingConnection]:
    return conns if isinstance(conns, list) else [conns]


def wait_until(conns: Connections, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Process I/O on the given connection(s) until ``predicate()`` holds."""
    conns = _as_list(conns)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        for c in conns:
            c.process_data_events(time_limit=0.01)


def record_blocking(conn: BlockingConnection) -> list[tuple[str, str]]:
    """A list the connection's connection.blocked (name, reason) and
    connection.unblocked (name, "") notifications are appended to."""
    events: list[tuple[str, str]] = []
    conn.add_on_connection_blocked_callback(
        lambda _c, m: events.append((m.method.NAME, m.method.reason))
    )
    conn.add_on_connection_unblocked_callback(lambda _c, m: events.append((m.method.NAME, "")))
    return events


def settle(conns: Connections, seconds: float = 0.2) -> None:
    """Keep processing I/O for a while, to show that nothing more arrives."""
    conns = _as_list(conns)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in conns:
            c.process_data_events(time_limit=0.02)


def publish(ch: BlockingChannel, queue: str, *bodies: bytes) -> None:
    """Publish ``bodies`` to ``queue`` through the default exchange, in order."""
    for body in bodies:
        ch.basic_publish("", queue, body)


def drain(ch: BlockingChannel, queue: str) -> list[bytes]:
    """Every body basic.get (auto-ack) finds in ``queue``, in order."""
    bodies = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def ready_count(ch: BlockingChannel, queue: str) -> int:
    """The queue's ready messages, as a passive queue.declare reports them."""
    return int(ch.queue_declare(queue, passive=True).method.message_count)


class Session:
    """One connection with a channel (``conn``, ``ch``) for a test.

    Afterwards the extra connections opened with :meth:`connect` are closed and
    the queues and exchanges in ``queues`` and ``exchanges`` are deleted.
    """

    #: Carry on when a queue cannot be deleted (its channel is closed by the broker).
    tolerate_failed_queue_delete = False

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.conn = connect(broker)
        self.ch = self.conn.channel()
        self.others: list[BlockingConnection] = []
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def connect(self, **params: Any) -> BlockingConnection:
        """Another connection, closed with the session."""
        conn = connect(self.broker, **params)
        self.others.append(conn)
        return conn

    def reopen(self) -> BlockingChannel:
        """A fresh default channel after a channel error closed the previous one."""
        self.ch = self.conn.channel()
        return self.ch

    def queue(self, name: str | None = None, **kwargs: Any) -> str:
        """Declare a queue (by default with a unique name) on ``ch``; deleted afterwards."""
        name = self.ch.queue_declare(uniq() if name is None else name, **kwargs).method.queue
        self.queues.append(name)
        return name

    def exchange(self, type_: str = "direct", name: str | None = None, **kwargs: Any) -> str:
        """Declare an exchange (by default with a unique name) on ``ch``; deleted afterwards."""
        name = name or uniq(type_)
        self.exchanges.append(name)
        self.ch.exchange_declare(name, type_, **kwargs)
        return name

    def close(self) -> None:
        for conn in self.others:
            if conn.is_open:
                conn.close()
        conn = self.conn if self.conn.is_open else connect(self.broker)
        try:
            ch = conn.channel()
            for q in self.queues:
                try:
                    ch.queue_delete(q)
                except ChannelClosedByBroker:
                    if not self.tolerate_failed_queue_delete:
                        raise
                    ch = conn.channel()
            for ex in self.exchanges:
                ch.exchange_delete(ex)
        finally:
            conn.close()
