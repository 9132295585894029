"""A confirmable publish is answered once its message is durable: with the
group commit's file syncs held (tests/harness/held_syncs.py), no 2.04 goes
out; once they are let go, it does. A non-confirmable one is answered at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiocoap.numbers.codes import Code
from coaphelp import Raw, coap_port
from conftest import start_broker
from harness.held_syncs import HeldSyncs

from warren.coap import codec as C


def test_a_confirmable_publish_waits_for_its_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = HeldSyncs(monkeypatch)
    b = start_broker(
        tmp_path,
        sync=True,
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
    )
    raw = Raw(coap_port(b))

    def durable_queue() -> None:
        vhost = b.broker.vhosts["/"]
        queue = vhost.declare_queue("held", durable=True)
        vhost.bind(vhost.get_exchange("amq.topic"), queue, "held.#")

    try:
        b.call(durable_queue)
        syncs.hold()
        try:
            mid = raw.request(C.POST, "ps/held/x", payload=b"durable")
            assert syncs.waiting.wait(30), "no sync round started"
            assert raw.nothing(0.5)  # not before the message is on disk
        finally:
            syncs.release()
        reply = raw.receive()
        assert (reply.mid, reply.code) == (mid, Code.CHANGED)
        assert b.call(lambda: b.broker.vhosts["/"].queues["held"].message_count) == 1
    finally:
        raw.close()
        b.stop()
