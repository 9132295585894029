"""Replies held for a sync round: a declare-ok waits for its round, and held
replies keep their order with what follows them.

Moved from tests/core/test_declare_sync.py (whose other test watches which thread
syncs and a pika client served meanwhile, over sockets): these are the frames
on one connection and the broker's sync rounds, which the in-memory harness
shows as well (pamqp decoding, pika before for the first); the broker's group
commit runs as over a socket.
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


def test_a_declare_ok_waits_for_its_sync_round(harness: Harness) -> None:
    """The reply is held until a round that covers the definitions log has ended."""
    c = harness.amqp_client()
    syncer = harness.broker.syncer
    assert syncer is not None
    before = harness.call(lambda: (syncer.rounds, syncer.definition_writes))
    c.send_method(1, commands.Queue.Declare(queue="held", durable=True))
    c.expect_method(commands.Queue.DeclareOk)
    after = harness.call(lambda: (syncer.rounds, syncer.definition_writes))
    assert after[1] > before[1] and after[0] > before[0]
    # A transient queue writes no definition and waits for nothing.
    c.send_method(1, commands.Queue.Declare(queue="transient", durable=False))
    c.expect_method(commands.Queue.DeclareOk)
    assert harness.call(lambda: syncer.definition_writes) == after[1]
    c.close()
