"""Durable declarations are made durable by the group commit, not on the event loop
(issue 25, item 6): a client pipelining durable declares does not stall the
others, and each reply still waits until its definition is on disk.

On sockets: what this shows is which thread calls fdatasync while another
client (pika) is served beside the pipeline, the broker's loop on a thread of
its own. That a declare-ok waits for its round, and the order of held replies,
are tested in memory (tests/protocol/amqp/test_held_replies.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import start_broker
from pamqp import commands
from rawamqp import RawAMQP, method_frame


@pytest.fixture
def loop_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[str], list[int]]]:
    """Who calls os.fdatasync: the names of the threads, and a place for the test
    to put the broker loop's thread id (the calls still reach the kernel)."""
    callers: list[str] = []
    loop_ident: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if loop_ident and threading.get_ident() == loop_ident[0]:
            callers.append("loop")
        else:
            callers.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    yield callers, loop_ident


def test_pipelined_durable_declares_sync_off_the_loop(
    tmp_path: Path, loop_syncs: tuple[list[str], list[int]]
) -> None:
    callers, loop_ident = loop_syncs
    b = start_broker(tmp_path / "data")
    try:
        loop_ident.append(b.call(threading.get_ident))
        raw = RawAMQP(b.port)
        raw.handshake()
        raw.send_method(1, commands.Channel.Open())
        raw.expect_method(commands.Channel.OpenOk)
        other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
        other_ch = other.channel()
        rounds_before = b.call(lambda: b.broker.syncer.rounds)
        callers.clear()
        count = 300
        raw.send(
            b"".join(
                method_frame(1, commands.Queue.Declare(queue=f"d{i}", durable=True))
                for i in range(count)
            )
        )
        # Another client is served while the pipeline is worked through.
        other_ch.queue_declare("other", durable=True)
        names = [raw.expect_method(commands.Queue.DeclareOk).queue for _ in range(count)]
        assert names == [f"d{i}" for i in range(count)]  # in order, none lost
        other.close()
        raw.close_socket()
        assert "loop" not in callers  # before: one fdatasync on the loop per declare
        rounds = b.call(lambda: b.broker.syncer.rounds) - rounds_before
        assert 1 <= rounds <= count + 1
    finally:
        b.stop()
    # Every declare that was answered is in the log that a restart reads.
    b = start_broker(tmp_path / "data")
    try:
        names_after: Any = b.call(lambda: set(b.broker.vhosts["/"].queues))
        assert {f"d{i}" for i in range(300)} | {"other"} <= names_after
    finally:
        b.stop()
