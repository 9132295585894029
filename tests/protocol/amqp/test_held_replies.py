"""Replies held for a sync round: a declare-ok waits for its round, and held
replies keep their order with what follows them.

Moved from tests/core/test_declare_sync.py (whose other test watches which thread
syncs and a pika client served meanwhile, over sockets): these are the frames
on one connection and the broker's sync rounds, which the in-memory harness
shows as well (pamqp decoding). The broker's own group commit runs, with its
file syncs held on their thread while the test looks (HeldSyncs): the loop has
done all it can, and the reply is still not out; let go, it comes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Harness
from harness.held_syncs import HeldSyncs
from pamqp import commands


def test_a_held_delete_ok_is_not_overtaken_by_the_consumer_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """queue.delete-ok waits for its sync round; the basic.cancel that tells the
    queue's consumer it is gone follows it, as RabbitMQ sends them (kombu raises
    ConsumerCancelled when the cancel comes first): while the round's syncs
    are held neither is out, and then they come in that order."""
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        raw = harness.amqp()
        raw.handshake()
        raw.send_method(1, commands.Channel.Open())
        raw.expect_method(commands.Channel.OpenOk)
        raw.send_method(1, commands.Queue.Declare(queue="doomed", durable=True))
        raw.expect_method(commands.Queue.DeclareOk)
        raw.send_method(1, commands.Basic.Consume(queue="doomed", consumer_tag="c1"))
        raw.expect_method(commands.Basic.ConsumeOk)
        harness.settle()
        syncs.hold()
        try:
            raw.send_method(1, commands.Queue.Delete(queue="doomed"))
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()
            assert raw.frames_now() == []
        finally:
            syncs.release()
        raw.expect_method(commands.Queue.DeleteOk)
        assert raw.expect_method(commands.Basic.Cancel).consumer_tag == "c1"
        raw.close_socket()


def test_a_declare_ok_waits_for_its_sync_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply is held until a round that covers the definitions log has
    ended: with the round's file syncs held, the broker has nothing left to do
    and still no declare-ok has been written (and the connection reads no
    more); once the syncs are let go, it comes. A transient queue writes no
    definition and waits for nothing, even while a round is held."""
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        c = harness.amqp_client()
        harness.settle()
        syncer = harness.broker.syncer
        assert syncer is not None
        rounds, writes = harness.call(lambda: (syncer.rounds, syncer.definition_writes))
        syncs.hold()
        try:
            c.send_method(1, commands.Queue.Declare(queue="held", durable=True))
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()  # all the broker can do before the round ends
            assert c.frames_now() == []
            assert not c.reading
            assert harness.call(lambda: (syncer.rounds, syncer.definition_writes)) == (
                rounds + 1,
                writes + 1,
            )
        finally:
            syncs.release()
        c.expect_method(commands.Queue.DeclareOk)
        assert c.reading
        harness.settle()
        syncs.hold()
        try:
            c.send_method(1, commands.Queue.Declare(queue="transient", durable=False))
            c.expect_method(commands.Queue.DeclareOk)
            assert harness.call(lambda: syncer.definition_writes) == writes + 1
        finally:
            syncs.release()
        c.close()
