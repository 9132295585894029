"""kill -9 while a confirming publisher is mid-stream, then restart on the same data dir."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import pika
import pika.exceptions
from diskhelp import eventually
from procs import start_warren

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_kill_9_keeps_every_confirmed_message_exactly_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren(data)
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    try:
        setup = pika.BlockingConnection(params)
        ch = setup.channel()
        ch.confirm_delivery()
        ch.queue_declare("crash", durable=True)
        # A first batch that a consumer acknowledges: it must never come back.
        for i in range(100):
            ch.basic_publish("", "crash", b"acked-%d" % i, PERSISTENT)
        for _ in range(100):
            method, _props, _body = ch.basic_get("crash")
            ch.basic_ack(method.delivery_tag)
        ch.queue_declare("crash", passive=True)  # round trip: the acks were processed
        setup.close()

        confirmed: list[int] = []
        enough = threading.Event()
        finished = threading.Event()

        def publish() -> None:
            conn = pika.BlockingConnection(params)
            pch = conn.channel()
            pch.confirm_delivery()
            i = 0
            try:
                while True:
                    pch.basic_publish("", "crash", b"%d" % i, PERSISTENT)
                    confirmed.append(i)  # returned => the broker confirmed it
                    i += 1
                    if i == 3000:
                        enough.set()
            except (pika.exceptions.AMQPError, OSError):
                pass
            finally:
                enough.set()
                finished.set()

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        assert enough.wait(120)
        proc.send_signal(signal.SIGKILL)  # the publisher is still mid-stream
        proc.wait(10)
        assert finished.wait(30)
        assert len(confirmed) >= 3000
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    proc, port = start_warren(data)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        received: list[bytes] = []
        while True:
            method, _props, body = ch.basic_get("crash", auto_ack=True)
            if method is None:
                break
            received.append(body)
            # As RabbitMQ after a crash: any recovered message may have been
            # delivered, so every one comes back redelivered.
            assert method.redelivered
        conn.close()
    finally:
        proc.terminate()
        proc.wait(15)
    assert not any(body.startswith(b"acked-") for body in received)
    ids = [int(body) for body in received]
    assert len(ids) == len(set(ids)), "a message came back twice"
    assert ids == sorted(ids), "order was not kept"
    missing = set(confirmed) - set(ids)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"


class _Ledger:
    def __init__(self) -> None:
        self.published: set[int] = set()
        self.confirmed: set[int] = set()
        self.acked: set[int] = set()


def _reuse_round(data: Path, ledger: _Ledger) -> bool:
    """One broker: a confirming publisher and an acking consumer until kill -9.
    Whether spare files were there (kept or reused)."""
    proc, port = start_warren(data, "--segment-size", "65536")
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    start = max(ledger.published, default=-1) + 1
    enough = threading.Event()
    consumed = threading.Event()  # 100 acked this round: whole segments retired
    done = threading.Event()

    def publish() -> None:
        try:
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.queue_declare("reuse", durable=True)
            ch.confirm_delivery()
            i = start
            while True:
                ledger.published.add(i)
                ch.basic_publish("", "reuse", b"%d " % i + b"." * 8000, PERSISTENT)
                ledger.confirmed.add(i)
                i += 1
                if i - start == 400:
                    enough.set()
        except (pika.exceptions.AMQPError, OSError):
            pass
        finally:
            enough.set()
            done.set()

    def consume() -> None:
        try:
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.queue_declare("reuse", durable=True)
            acked = 0
            while not done.is_set():
                method, _props, body = ch.basic_get("reuse")
                if method is None:
                    conn.process_data_events(time_limit=0.01)
                    continue
                ledger.acked.add(int(body.split(b" ")[0]))
                ch.basic_ack(method.delivery_tag)
                acked += 1
                if acked == 100:
                    consumed.set()
        except (pika.exceptions.AMQPError, OSError):
            pass
        finally:
            consumed.set()

    try:
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        # Both, however busy the machine: the consumer may start late.
        assert enough.wait(120) and consumed.wait(120)
        queue_dir = next(data.rglob("msgs.*")).parent
        # Retired segments become spares once their acks are in: on a busy
        # machine that may take a while after the consumer's 100th ack.
        spares: set[int] = set()

        def spares_seen() -> bool:
            for p in queue_dir.glob("spare.*"):
                with contextlib.suppress(FileNotFoundError):  # reused meanwhile
                    spares.add(p.stat().st_ino)
            return bool(spares)

        eventually(spares_seen, 60, "a spare segment file")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert done.wait(30)
        consumer.join(30)
        segments = {p.stat().st_ino for p in queue_dir.glob("msgs.*")}
        return bool(spares & segments) or bool(list(queue_dir.glob("spare.*")))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_9_while_segment_files_are_reused_keeps_every_confirmed_message(
    tmp_path: Path,
) -> None:
    """A consumer acks while a confirming publisher fills 64 KiB segments of
    8 KiB messages: segments retire as spares and are reused all the time
    (docs/storage.md, "Writing"). kill -9 twice mid-stream: every confirmed
    message not acked comes back once, nothing of a spare's earlier life."""
    data = tmp_path / "data"
    ledger = _Ledger()
    reused = [_reuse_round(data, ledger) for _ in range(2)]
    assert any(reused), "no segment file was kept as a spare"

    proc, port = start_warren(data, "--segment-size", "65536")
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ids: list[int] = []
        while True:
            method, _props, body = ch.basic_get("reuse", auto_ack=True)
            if method is None:
                break
            ids.append(int(body.split(b" ")[0]))
        conn.close()
    finally:
        proc.terminate()
        proc.wait(15)
    assert len(ids) == len(set(ids)), "a message came back twice"
    assert set(ids) <= ledger.published, "a message never published"
    missing = ledger.confirmed - ledger.acked - set(ids)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
