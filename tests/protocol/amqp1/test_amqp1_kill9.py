"""An AMQP 1.0 publish the broker settled as accepted survives kill -9: a real
`warren` process is killed while Qpid Proton sends unsettled durable
messages to a durable queue, and every accepted one is in the queue after a
restart on the same data dir (the outcome comes after the group commit)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pika
import pytest
from procs import Process, start_warren

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

pytestmark = pytest.mark.timeout(90)

TOTAL = 2000
KILL_AFTER = 300


def stop(proc: Process) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class _Publisher(MessagingHandler):
    """Sends TOTAL durable messages unsettled and kills the broker once
    KILL_AFTER are accepted; what was accepted by then is in ``accepted``."""

    def __init__(self, port: int, proc: Process) -> None:
        super().__init__()
        self.port, self.proc = port, proc
        self.sent = 0
        self.ids: dict[Any, int] = {}
        self.accepted: set[int] = set()
        self.killed = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            f"amqp://guest:guest@127.0.0.1:{self.port}",
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
            reconnect=False,
        )
        event.container.create_sender(conn, "/queues/durable")

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < TOTAL and not self.killed:
            message = Message(id=self.sent, body=b"m%d" % self.sent, durable=True)
            message.inferred = True  # a data section: the 0-9-1 body as sent
            delivery = event.sender.send(message)
            self.ids[delivery.tag] = self.sent
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        if self.killed:
            return  # arrived after the kill: not counted, it may be in flight
        self.accepted.add(self.ids[event.delivery.tag])
        if len(self.accepted) >= KILL_AFTER:
            self.killed = True
            os.kill(self.proc.pid, signal.SIGKILL)

    def on_transport_error(self, event: Any) -> None:
        pass  # the kill: Container.run returns once the transport is gone


def test_accepted_publishes_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/"))
        conn.channel().queue_declare("durable", durable=True)
        conn.close()
        publisher = _Publisher(port, proc)
        Container(publisher).run()
        assert publisher.killed
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert publisher.sent > len(publisher.accepted) >= KILL_AFTER  # killed mid-stream
        stop(proc)
        proc, port = start_warren(data)
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/"))
        channel = conn.channel()
        recovered: list[int] = []
        while True:
            method, props, body = channel.basic_get("durable", auto_ack=True)
            if method is None:
                break
            assert props.delivery_mode == 2
            recovered.append(int(body.decode().removeprefix("m")))
        conn.close()
        assert publisher.accepted <= set(recovered)
        assert recovered == sorted(set(recovered))  # in order, no duplicates
    finally:
        stop(proc)
