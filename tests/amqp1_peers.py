"""The brokers a python-qpid-proton scenario runs against (issue 30): Warren,
and, where RabbitMQ 3.10's rabbitmq_amqp1_0 plugin is the reference, a
private RabbitMQ 3.10 with that plugin (tests/rabbitmq_proc.py, one node per
test process). docs/amqp1.md, "Which RabbitMQ is the reference", lists the
scenarios and the reference of each.

A scenario asks for the ``peer`` fixture (tests/conftest.py) and is written
once against :class:`Peer`: the addresses (RabbitMQ 4's v2
forms on Warren, 3.10's v1 forms on 3.10, which knows no others), a fresh
queue, its depth. A scenario only RabbitMQ 4 is the reference for takes
``broker`` (Warren alone) and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pika

WARREN = "warren"
RABBITMQ_310 = "rabbitmq-3.10"


@dataclass
class Peer:
    """One broker: ``port`` takes AMQP 1.0 and 0-9-1, ``url`` is pika's."""

    name: str
    port: int
    url: str
    #: Warren's BrokerThread (tests/conftest.py); None on RabbitMQ.
    warren: Any = None

    @property
    def is_warren(self) -> bool:
        return self.warren is not None

    @property
    def anonymous_relay(self) -> bool:
        """Whether a null target (one sender for every message's ``to``) is
        there: RabbitMQ 4's and Warren's; 3.10's plugin refuses it."""
        return self.is_warren

    def queue(self, name: str) -> str:
        """The queue's address: v2 ``/queues/Q`` on Warren, v1 ``/amq/queue/Q`` on 3.10."""
        return f"/queues/{name}" if self.is_warren else f"/amq/queue/{name}"

    def exchange(self, exchange: str, key: str) -> str:
        return f"/exchanges/{exchange}/{key}" if self.is_warren else f"/exchange/{exchange}/{key}"

    def connect(self) -> Any:
        """A blocking proton connection as guest to the vhost "/"."""
        from proton.utils import BlockingConnection

        return BlockingConnection(
            f"amqp://127.0.0.1:{self.port}",
            user="guest",
            password="guest",
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
            timeout=10,
        )

    def declare(self, name: str, durable: bool = True, **arguments: Any) -> None:
        """A queue, empty: RabbitMQ's node outlives the test, so the name's
        queue of an earlier test is deleted first."""
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = conn.channel()
            if not self.is_warren:
                channel.queue_delete(name)
            channel.queue_declare(name, durable=durable, arguments=arguments or None)
        finally:
            conn.close()

    def bind(self, queue: str, exchange: str, key: str) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            conn.channel().queue_bind(queue, exchange, key)
        finally:
            conn.close()

    def delete(self, queue: str) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            conn.channel().queue_delete(queue)
        finally:
            conn.close()

    def exists(self, queue: str) -> bool:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            conn.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
        finally:
            if conn.is_open:
                conn.close()
        return True

    def depth(self, name: str) -> tuple[int, int | None]:
        """The queue's ready and unacknowledged messages. RabbitMQ's unacked
        count is not there without its management plugin (whose figures lag):
        None; a queue.declare's message count is its ready messages."""
        if self.warren is not None:
            broker = self.warren

            def counts() -> tuple[int, int]:
                queue = broker.broker.vhosts["/"].queues[name]
                return queue.message_count, queue.unacked

            result: tuple[int, int] = broker.call(counts)
            return result
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            ok = conn.channel().queue_declare(name, passive=True)
            return ok.method.message_count, None
        finally:
            conn.close()

    def check_depth(self, name: str, ready: int, unacked: int) -> None:
        """Assert the queue's depth, as far as the broker tells it."""
        got_ready, got_unacked = self.depth(name)
        assert got_ready == ready, (name, got_ready, ready)
        if got_unacked is not None:
            assert got_unacked == unacked, (name, got_unacked, unacked)
