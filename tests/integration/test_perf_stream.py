"""`warren perf stream` against an embedded Warren with its stream listener and a
private RabbitMQ 3.10 with its rabbitmq_stream plugin (skipped where
rabbitmq-server is not installed).

Short runs with a message count: every message published is confirmed and
consumed by every consumer, the summary is printed. The client's Publish frames
built as bytes and its reading of Deliver chunk headers in place are checked
against rstream's frame codec and Qpid Proton's message codec as oracles.
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import proton
import pytest
from free_ports import free_port
from rstream import Producer
from rstream.encoding import decode_frame as rstream_decode
from streamhelp import stream_broker_fixture
from test_perf import check_no_broker_imports, perf

from warren.perf.stream import StreamParams, measure, print_summary
from warren.perf.stream_client import (
    PublishTemplate,
    StreamURI,
    chunk_info,
    chunk_timestamps,
    walk_frames,
)
from warren.perf.stream_workers import _Producer
from warren.pytest_plugin import WarrenBroker, start_broker
from warren.stream_protocol.chunk import build_chunk, simple_entry, sub_batch_entry
from warren.stream_protocol.commands import PublishConfirm, PublishError
from warren.stream_protocol.constants import Compression
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver, Publish
from warren.stream_protocol.wire import PublishingError

warren = stream_broker_fixture()


def url(broker: WarrenBroker) -> str:
    return f"rabbitmq-stream://guest:guest@127.0.0.1:{broker.broker.listener('stream').port}/%2F"


def check(s: dict[str, Any], expected: int, published: int) -> None:
    assert "errors" not in s, s["errors"]
    assert s["published"] == published and s["confirmed"] == published
    assert s["publish_errors"] == 0
    assert s["consumed"] == expected and s["expected"] == expected
    assert s["publish_rate"] > 0 and s["consume_rate"] > 0 and s["duration_s"] > 0
    assert s["chunks"] > 0 and s["records_per_chunk"] >= 1
    assert set(s["client_cpu"]) == {"publishers", "consumers"}
    lat = s["latency_ms"]
    assert lat is not None and lat["samples"] == expected
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]


def streams(broker: WarrenBroker) -> list[str]:
    return sorted(broker.broker.vhosts["/"].queues)


# -- against Warren -------------------------------------------------------------------------


def test_in_process(warren: WarrenBroker) -> None:
    s, status = measure(StreamParams(uri=url(warren), count=3000))
    assert status == 0, s
    check(s, 3000, 3000)
    assert "perf-stream" not in streams(warren)  # created, and deleted again
    out = io.StringIO()
    print_summary(s, out)
    text = out.getvalue()
    assert "consumed" in text and "confirmed" in text and "latency" in text


def test_several_publishers_per_connection_1k_decoded_cli(warren: WarrenBroker) -> None:
    """Two producer connections with three publishers each, small Publish frames and
    a window, two consumers locating every record: each consumer gets every message."""
    r = perf(
        "stream",
        "--uri",
        url(warren),
        "-x",
        "2",
        "--publishers-per-connection",
        "3",
        "-y",
        "2",
        "-C",
        "1500",
        "-b",
        "7",
        "-c",
        "300",
        "-s",
        "1024",
        "--decode",
        "--stream",
        "perf-stream-cli",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    check(s, 2 * 3000, 3000)
    assert s["params"]["uri"] == url(warren).replace(":guest@", ":***@")
    assert "warren perf stream: 2 producer connection(s) x 3 publisher(s)" in r.stderr


def test_existing_stream_is_kept_and_read_from_first(warren: WarrenBroker) -> None:
    """--keep leaves the stream; a second run from `first` reads the first run's
    messages too, and does not delete the stream it did not create."""
    p = StreamParams(uri=url(warren), count=500, stream="perf-kept", keep=True, size=8)
    s, status = measure(p)
    assert status == 0, s
    check(s, 500, 500)
    assert "perf-kept" in streams(warren)
    s, status = measure(
        StreamParams(uri=url(warren), count=500, stream="perf-kept", offset="first")
    )
    assert status == 0, s
    assert s["consumed"] == 1000 and s["published"] == 500
    assert "perf-kept" in streams(warren)


def test_small_bodies_without_a_window_at_a_rate(warren: WarrenBroker) -> None:
    """No confirm window: the confirms are still read and waited for at the end."""
    p = StreamParams(uri=url(warren), count=200, size=4, rate=20_000, confirm=0)
    s, status = measure(p)
    assert status == 0, s
    assert s["consumed"] == 200 and s["confirmed"] == 200 and s["latency_ms"] is None
    out = io.StringIO()
    print_summary(s, out)
    assert "bodies under 8 bytes" in out.getvalue()


def test_idle_consumer_sends_heartbeats() -> None:
    """A broker with a 1 s heartbeat cuts off a client silent for two intervals: a
    consumer of an empty stream for 3 s stays connected."""
    b = start_broker(
        http_port=-1, mqtt_port=-1, prometheus_port=-1, stream_port=0, stream_heartbeat=1
    )
    try:
        s, status = measure(StreamParams(uri=url(b), producers=0, time=3))
        assert status == 0, s
        assert s["consumed"] == 0 and "errors" not in s
    finally:
        b.stop()


def test_bad_parameters_and_setup_failure() -> None:
    s, status = measure(StreamParams(producers=0, consumers=0))
    assert status == 2 and s["errors"] == ["nothing to do with -x 0 -y 0"]
    s, status = measure(StreamParams(uri="amqp://guest:guest@127.0.0.1:5672/"))
    assert status == 2 and "rabbitmq-stream://" in s["errors"][0]
    s, status = measure(StreamParams(offset="middle"))
    assert status == 2
    s, status = measure(StreamParams(uri="rabbitmq-stream://guest:guest@127.0.0.1:1/", count=1))
    assert status == 1 and "setup failed" in s["errors"][0]
    assert perf("stream", "--offset", "middle").returncode == 2
    assert perf("stream", "--credit", "70000").returncode == 2


def test_uri() -> None:
    u = StreamURI.parse("rabbitmq-stream://u%40x:p%2Fw@h:1234/v%2Fh")
    assert (u.host, u.port, u.username, u.password, u.vhost) == ("h", 1234, "u@x", "p/w", "v/h")
    assert StreamURI.parse("rabbitmq-stream://localhost").vhost == "/"
    assert StreamURI.parse("rabbitmq-stream://h/%2F").port == 5552
    assert StreamURI().masked("rabbitmq-stream://a:secret@h/") == "rabbitmq-stream://a:***@h/"


def test_cli_help() -> None:
    r = perf("--help")
    assert r.returncode == 0 and "stream" in r.stdout
    r = perf("stream", "--help")
    assert r.returncode == 0
    for option in ("--batch", "--confirm", "--credit", "--offset", "--decode", "--rate"):
        assert option in r.stdout
    assert "--publishers-per-connection" in r.stdout


def test_stream_perf_does_not_import_the_broker() -> None:
    check_no_broker_imports(
        "warren.perf.cli, warren.perf.stream",
        (
            "warren.broker",
            "warren.node",
            "warren.store",
            "warren.stream_protocol.server",
            "warren.stream_protocol.connection",
            "warren.stream_protocol.control",
            "warren.stream_protocol.publishing",
            "warren.stream_protocol.delivering",
        ),
    )


# -- the client's frames against the oracles --------------------------------------------------


@pytest.mark.parametrize("size", [0, 7, 8, 16, 255, 256, 1024])
@pytest.mark.parametrize("per_frame", [1, 3, 100])
def test_publish_template_decodes(size: int, per_frame: int) -> None:
    t = PublishTemplate(size, per_frame, latency=size >= 8)
    data = t.pack(5, 1000, 7, ts=123456789)
    frames = list(walk_frames(data))
    assert frames[-1][1] == len(data)
    ids: list[int] = []
    for start, end, key in frames:
        assert key == 2
        # rstream's decoder: the publisher id and the messages as it reads them
        theirs = rstream_decode(data[start:end])
        assert theirs.publisher_id == 5
        ours = decode_frame(data[start:end])
        assert isinstance(ours, Publish) and ours.publisher_id == 5
        assert len(theirs.messages) == ours.count <= per_frame
        for message in theirs.messages:
            ids.append(message.publishing_id)
            m = proton.Message()
            m.decode(bytes(message.data))
            body = m.body.tobytes() if isinstance(m.body, memoryview) else bytes(m.body)
            assert len(body) == size
            if size >= 8:
                assert struct.unpack(">Q", body[:8])[0] == 123456789
    assert ids == list(range(1000, 1007))
    assert len(data) == 7 * t.message_len + len(frames) * 13


def _message(ts: int, size: int = 16, sections: bool = False) -> bytes:
    """A message with a data section whose body starts with ``ts``; ``sections``:
    with a header, annotations, properties and application properties before it
    (a map of over 255 bytes)."""
    m = proton.Message(body=struct.pack(">Q", ts) + bytes(size - 8), inferred=True)
    if sections:
        m.durable = True
        m.subject = "s"
        m.annotations = {"x-opt-a": 1}
        m.properties = {"k": "v" * 300}
    return bytes(m.encode())


@pytest.mark.parametrize("committed", [None, 77])
def test_chunk_header_read_in_place(committed: int | None) -> None:
    """A chunk of simple entries and a sub-entry batch (Warren's codec writes it):
    chunk_info counts its records from the header and takes the first record's
    timestamp, chunk_timestamps every record's; rstream reads the same chunk."""
    entries = [
        simple_entry(_message(11, sections=True)),
        sub_batch_entry([_message(12), _message(13, 300, sections=True)]),
        sub_batch_entry([_message(14)], Compression.GZIP),
        simple_entry(b"not amqp"),
    ]
    chunk = build_chunk(entries, first_offset=40, timestamp=1).delivered()
    frame = Deliver(3, chunk, committed).encode()
    junk = PublishConfirm(0, [1]).encode()
    ((start, end, key),) = [f for f in walk_frames(frame + frame[:20]) if f[2] == 8]
    assert end == len(frame)
    assert chunk_info(frame, start, end, latency=True) == (5, 11)
    assert chunk_info(frame, start, end, latency=False) == (5, -1)
    assert chunk_timestamps(frame, start, end) == [11, 12, 13, 14, -1]
    if committed is None:  # rstream asks for Deliver v1 only
        theirs = rstream_decode(frame[4:])
        assert theirs.num_records == 5 and len(theirs.get_messages()) == 5
    assert [k for _, _, k in walk_frames(junk + frame)] == [3, 8]


def test_producer_counts_confirms_and_errors() -> None:
    producer = _Producer(0, StreamParams(), None)  # type: ignore[arg-type]
    data = (
        PublishConfirm(0, [1, 2, 3]).encode()
        + PublishError(1, [PublishingError(4, 0x12), PublishingError(5, 0x12)]).encode()
        + PublishConfirm(1, list(range(10, 110))).encode()
    )
    assert producer.feed(data + data[:6]) == len(data)
    assert (producer.acked(), producer.errors) == (105, 2)


# -- against RabbitMQ 3.10 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def rabbitmq_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private RabbitMQ 3.10 with rabbitmq_stream on a free port."""
    from rabbitmq_proc import AVAILABLE, RabbitMQ

    if not AVAILABLE:
        pytest.skip("rabbitmq-server is not installed (make rabbitmq installs Debian's)")
    port = free_port()
    server = RabbitMQ(
        Path(tmp_path_factory.mktemp("rabbitmq")),
        plugins=["rabbitmq_stream"],
        config=f"stream.listeners.tcp.1 = 127.0.0.1:{port}\nstream.advertised_host = 127.0.0.1\n",
    )
    server.stream_port = port  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


def test_against_rabbitmq_stream(rabbitmq_stream: Any) -> None:
    uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{rabbitmq_stream.stream_port}/%2F"
    s, status = measure(
        StreamParams(uri=uri, count=3000, consumers=2, publishers_per_connection=2, batch=50)
    )
    assert status == 0, s
    check(s, 6000, 3000)

    async def exists() -> bool:
        port = rabbitmq_stream.stream_port
        async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
            return await p.stream_exists("perf-stream")

    assert not asyncio.run(exists())  # deleted again
