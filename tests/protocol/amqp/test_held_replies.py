"""Replies held for a sync round keep their order with what follows them.

Moved from tests/core/test_declare_sync.py (whose other tests watch which thread
syncs and a pika client served meanwhile, over sockets): this one is the
order of frames on one connection, which the in-memory harness shows as
well; the broker's group commit runs as over a socket.
"""

from __future__ import annotations

from harness import Harness
from pamqp import commands


def test_a_held_delete_ok_is_not_overtaken_by_the_consumer_cancel(harness: Harness) -> None:
    """queue.delete-ok waits for its sync round; the basic.cancel that tells the
    queue's consumer it is gone follows it, as RabbitMQ sends them (kombu raises
    ConsumerCancelled when the cancel comes first)."""
    raw = harness.amqp()
    raw.handshake()
    raw.send_method(1, commands.Channel.Open())
    raw.expect_method(commands.Channel.OpenOk)
    raw.send_method(1, commands.Queue.Declare(queue="doomed", durable=True))
    raw.expect_method(commands.Queue.DeclareOk)
    raw.send_method(1, commands.Basic.Consume(queue="doomed", consumer_tag="c1"))
    raw.expect_method(commands.Basic.ConsumeOk)
    raw.send_method(1, commands.Queue.Delete(queue="doomed"))
    raw.expect_method(commands.Queue.DeleteOk)
    assert raw.expect_method(commands.Basic.Cancel).consumer_tag == "c1"
    raw.close_socket()
