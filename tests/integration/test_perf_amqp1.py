"""`warren perf amqp1` against an embedded Warren and a private RabbitMQ 3.10 with
its rabbitmq_amqp1_0 plugin (skipped where rabbitmq-server is not installed).

Short runs with a message count: every message published is consumed, the
settled (confirmed) count matches, the summary is printed. The client's
pre-encoded frames and its in-place transfer reading are checked against
warren.amqp1's codec and Qpid Proton's message codec as oracles.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import Any

import proton
import pytest
from conftest import BrokerThread
from test_perf import check_no_broker_imports, perf

from warren.amqp import spec
from warren.amqp1.frames import Frame, FrameReader, encode_frame
from warren.amqp1.message import decode_message
from warren.amqp1.performatives import (
    Accepted,
    Detach,
    Disposition,
    Error,
    Flow,
    Received,
    Rejected,
    Released,
    Transfer,
)
from warren.amqp1.types import Symbol
from warren.client import AMQPError, Client
from warren.perf.amqp1 import AMQP1Params, measure, print_summary
from warren.perf.amqp1_client import (
    TRANSFER,
    AMQP1Error,
    TransferTemplate,
    data_offset,
    split_frames,
    transfer_fields,
)
from warren.perf.amqp1_workers import _Sender


def check(s: dict[str, Any], expected: int, confirm: bool) -> None:
    assert "errors" not in s, s["errors"]
    assert s["published"] == expected
    assert s["consumed"] == expected and s["expected"] == expected
    assert s["publish_rate"] > 0 and s["consume_rate"] > 0 and s["duration_s"] > 0
    assert set(s["client_cpu"]) == {"publishers", "receivers"}
    lat = s["latency_ms"]
    assert lat is not None and lat["samples"] == expected
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]
    if confirm:
        assert s["accepted"] == expected and s["rejected"] == 0
        assert s["link_credit"] > 0
    else:
        assert "accepted" not in s


def queue_names(broker: BrokerThread) -> list[str]:
    return broker.call(lambda: sorted(broker.broker.vhosts["/"].queues))


# -- against Warren -------------------------------------------------------------------------


def test_presettled_in_process(broker: BrokerThread) -> None:
    s, status = measure(AMQP1Params(uri=broker.url, count=3000))
    assert status == 0, s
    check(s, 3000, confirm=False)
    assert "perf-test" not in queue_names(broker)  # deleted again
    out = io.StringIO()
    print_summary(s, out)
    assert "consumed" in out.getvalue() and "latency" in out.getvalue()


def test_unsettled_accepting_receivers_1k_cli(broker: BrokerThread) -> None:
    """Unsettled transfers with a window, receivers accepting ranges, 1 KiB bodies, two
    of each, through the CLI: the queue's consumers share the messages."""
    r = perf(
        "amqp1",
        "--uri",
        broker.url,
        "-x",
        "2",
        "-y",
        "2",
        "-C",
        "2000",
        "-c",
        "300",
        "-a",
        "50",
        "-q",
        "200",
        "-s",
        "1024",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    check(s, 4000, confirm=True)
    assert s["params"]["uri"] == broker.url.replace(":guest@", ":***@")
    assert "warren perf amqp1: 2 sender(s)" in r.stderr  # the live output, with --json


def test_exchange_address_and_persistent(broker: BrokerThread) -> None:
    s, status = measure(
        AMQP1Params(
            uri=broker.url,
            count=1000,
            confirm=100,
            exchange="amq.direct",
            routing_key="rk",
            persistent=True,
            queue="perf-amqp1-x",
        )
    )
    assert status == 0, s
    check(s, 1000, confirm=True)
    assert s["params"]["exchange"] == "amq.direct"


def test_v1_addresses_and_large_messages(broker: BrokerThread) -> None:
    """RabbitMQ 3.x's /amq/queue/Q; bodies larger than the broker's frames go out in
    several transfer frames and come back in one (this client's frames are 1 MiB)."""
    p = AMQP1Params(uri=broker.url, count=200, addresses="v1", size=300_000, confirm=20)
    assert p.target_address() == p.source_address() == "/amq/queue/perf-test"
    s, status = measure(p)
    assert status == 0, s
    check(s, 200, confirm=True)


def test_idle_receiver_sends_heartbeats(broker_factory: Callable[..., BrokerThread]) -> None:
    """A broker with heartbeat 1 closes a connection silent for 1 s (it announces an
    idle-time-out of 500 ms): a receiver on an empty queue for 2.5 s stays connected."""
    b = broker_factory(heartbeat=1)
    s, status = measure(AMQP1Params(uri=b.url, publishers=0, time=2.5))
    assert status == 0, s
    assert s["consumed"] == 0 and "errors" not in s


def test_missing_queue_without_declare(broker: BrokerThread) -> None:
    s, status = measure(AMQP1Params(uri=broker.url, count=10, declare=False, queue="absent"))
    assert status != 0
    assert any("absent" in e or "not-found" in e or "refused" in e for e in s["errors"]), s


def test_bad_parameters_and_setup_failure() -> None:
    s, status = measure(AMQP1Params(publishers=0, consumers=0))
    assert status == 2 and s["errors"] == ["nothing to do with -x 0 -y 0"]
    s, status = measure(AMQP1Params(uri="amqp://guest:guest@127.0.0.1:1/", count=1))
    assert status == 1 and "setup failed" in s["errors"][0]
    s, status = measure(AMQP1Params(uri="amqps://guest:guest@127.0.0.1:5671/"))
    assert status == 2 and "amqps://" in s["errors"][0]
    r = perf("amqp1", "--addresses", "v3")
    assert r.returncode == 2


def test_cli_help() -> None:
    r = perf("--help")
    assert r.returncode == 0 and "amqp1" in r.stdout
    r = perf("amqp1", "--help")
    assert r.returncode == 0
    for option in ("--confirm", "--credit", "--ack", "--addresses", "--no-declare", "--rate"):
        assert option in r.stdout


def test_amqp1_perf_does_not_import_the_broker() -> None:
    check_no_broker_imports(
        "warren.perf.cli, warren.perf.amqp1",
        (
            "warren.broker",
            "warren.node",
            "warren.store",
            "warren.amqp1.server",
            "warren.amqp1.connection",
        ),
    )


# -- the client's frames against the oracles --------------------------------------------------


@pytest.mark.parametrize("size", [0, 7, 16, 255, 256, 1024])
@pytest.mark.parametrize("settled", [True, False])
@pytest.mark.parametrize("durable", [True, False])
def test_transfer_template_decodes(size: int, settled: bool, durable: bool) -> None:
    t = TransferTemplate(size, settled=settled, durable=durable, latency=size >= 8)
    first = 0xFFFFFFFE  # wraps to 0
    data = t.pack(first, 3, ts=123456789)
    assert len(data) == 3 * t.frame_len
    frames = FrameReader(max_frame_size=1 << 20).feed(data)
    assert len(frames) == 3
    for frame, did in zip(frames, (0xFFFFFFFE, 0xFFFFFFFF, 0), strict=True):
        assert isinstance(frame, Frame)
        tr = frame.performative
        assert isinstance(tr, Transfer)
        assert (tr.handle, tr.delivery_id, tr.delivery_tag) == (0, did, struct.pack(">I", did))
        assert tr.settled is settled and not tr.more and tr.message_format == 0
        m = proton.Message()
        m.decode(bytes(frame.payload))
        assert m.durable is durable
        body = m.body.tobytes() if isinstance(m.body, memoryview) else bytes(m.body)
        assert len(body) == size
        if size >= 8:
            assert struct.unpack(">Q", body[:8])[0] == 123456789
        assert decode_message(frame.payload).data() == body


def _proton_message(body: bytes) -> bytes:
    m = proton.Message(
        body=body, inferred=True, durable=True, subject="s", address="/queues/q", id="m1"
    )  # inferred: the bytes are a data section
    m.properties = {"k": "v" * 300}  # a section with a 4-byte size
    m.annotations = {"x-opt-a": 1}
    return bytes(m.encode())


@pytest.mark.parametrize(
    "transfer",
    [
        Transfer(handle=0, delivery_id=5, delivery_tag=b"t", message_format=0),
        Transfer(handle=3, delivery_id=300, delivery_tag=b"x" * 40, settled=True, more=True),
        Transfer(handle=70000, delivery_id=0, delivery_tag=b"", settled=False, more=False),
        Transfer(handle=1, delivery_id=None, more=True),
        Transfer(handle=1, delivery_id=1 << 31, delivery_tag=b"1", batchable=True),
    ],
)
def test_transfer_fields_in_place(transfer: Transfer) -> None:
    body = struct.pack(">Q", 42) + b"z" * 100
    payload = _proton_message(body)
    frame = encode_frame(0, transfer, payload)
    ((start, end, code),) = list(split_frames(frame + frame[:9]))  # the rest is incomplete
    assert code == TRANSFER and end == len(frame)
    did, more, after = transfer_fields(frame, start)
    assert (did, more) == (transfer.delivery_id, transfer.more)
    assert frame[after:] == payload
    at = data_offset(frame, after, end)
    assert frame[at : at + len(body)] == body


def test_data_offset_without_data_section() -> None:
    payload = bytes(proton.Message(body="text").encode())  # an amqp-value body
    assert data_offset(payload, 0, len(payload)) == -1


# -- against RabbitMQ 3.10 ------------------------------------------------------------------


@pytest.mark.parametrize("confirm", [0, 200])
def test_against_rabbitmq_amqp1_0(rabbitmq_amqp1: Any, confirm: int) -> None:
    p = AMQP1Params(
        uri=rabbitmq_amqp1.url, count=3000, addresses="v1", confirm=confirm, ack=confirm // 4
    )
    s, status = measure(p)
    assert status == 0, s
    check(s, 3000, confirm=bool(confirm))
    with Client(rabbitmq_amqp1.url).connect() as c:  # the queue is gone again
        c.channel_open(1)
        with pytest.raises(AMQPError, match="NOT_FOUND|404"):
            c.rpc(1, spec.QueueDeclare(queue="perf-test", passive=True), spec.QueueDeclareOk)


# -- a sender's view of the broker's frames ------------------------------------------------


def test_sender_counts_flows_and_dispositions() -> None:
    """Credit and the session window from flows; settled outcomes from dispositions
    (ranges; a non-terminal state does not count); a detach is the end."""
    sender = _Sender(0, AMQP1Params(confirm=100), None)  # type: ignore[arg-type]
    frames = [
        Flow(
            next_incoming_id=0,
            incoming_window=400,
            next_outgoing_id=0,
            outgoing_window=400,
            handle=0,
            delivery_count=0,
            link_credit=170,
        ),
        Disposition(role=True, first=0, last=9, settled=True, state=Accepted()),
        Disposition(role=True, first=10, state=Received(section_number=0, section_offset=0)),
        Disposition(role=True, first=10, last=11, settled=True, state=Rejected()),
        Disposition(role=True, first=12, settled=True, state=Released()),
    ]
    data = b"".join(encode_frame(0, f) for f in frames)
    assert sender.feed(data + data[:5]) == len(data)  # the incomplete rest is left
    assert (sender.credit_limit, sender.session_limit, sender.max_credit) == (170, 400, 170)
    assert (sender.acked(), sender.rejected) == (13, 3)
    sender.delivered = sender.frames_sent = 100
    assert sender.credit() == 70
    with pytest.raises(AMQP1Error, match="detach from the broker: amqp:not-found"):
        sender.feed(encode_frame(0, Detach(handle=0, error=Error(Symbol("amqp:not-found")))))
