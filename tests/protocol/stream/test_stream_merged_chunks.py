"""Publish frames merged into one chunk record (issue 31, publishing.py's
_Pending and flush): the Publish frames of one read, of one or several
publishers, become one chunk per stream (up to CHUNK_ENTRIES entries), so
subscribers get chunks the size RabbitMQ's writer makes; every publisher's
last publishing id is in the record's trailer, so deduplication survives a
restart that lost the tracking file's last write; a filtered Publish or
another command between them keeps its place; a subscription from an offset
inside a merged chunk gets it whole, an AMQP 0-9-1 reader from that offset.
Frames are encoded with rstream's encoder and the harness's helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream
from rstream import schema
from test_stream_chunk_records import records_of, stream_of
from test_stream_publish_deliver import (
    FIRST,
    bodies,
    declare,
    deliveries,
    encode,
    message,
    opened,
    spec,
)

from warren.store.stream_records import CHUNK_BODY_AT, CHUNK_HEADER, parse_trailers
from warren.stream_protocol import commands as c
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Publish, PublishedMessage
from warren.stream_protocol.publishing import CHUNK_ENTRIES

broker = harness_fixture(manual_clock=True)


def frame(
    pid: int, ids: list[int], texts: list[bytes], filters: dict[int, str] | None = None
) -> bytes:
    msgs = [
        PublishedMessage.simple(i, message(t), (filters or {}).get(i))
        for i, t in zip(ids, texts, strict=True)
    ]
    return Publish.of(pid, msgs).encode()


def one_read(client: MemoryStream, *frames: bytes) -> list[object]:
    """``frames`` fed to the broker at once, as one socket read: the answers."""
    return [decode_frame(f) for f in client.raw(b"".join(frames))]


def confirms_of(answers: list[object]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a in answers:
        if isinstance(a, c.PublishConfirm):
            out.setdefault(a.publisher_id, []).extend(a.publishing_ids)
    return {k: sorted(v) for k, v in out.items()}


def trailer_of(harness: Harness, offset: int) -> list[tuple[str, int]] | None:
    """The trailer of the chunk record holding ``offset``, parsed."""
    stream = stream_of(harness).stream
    stream.flush()
    sid, pos, _ = stream.position_of(offset)  # type: ignore[attr-defined]
    data = (stream.directory / f"msgs.{sid:010d}").read_bytes()
    header = CHUNK_HEADER.unpack_from(data, pos + CHUNK_BODY_AT)
    at = pos + CHUNK_BODY_AT + CHUNK_HEADER.size + header[8]  # after the data
    size = int.from_bytes(data[at : at + 4], "big")
    return parse_trailers(data[at + 4 : at + 4 + size])


def test_the_publish_frames_of_one_read_are_one_chunk(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    texts = [b"%d" % i for i in range(1, 10)]
    answers = one_read(
        client,
        frame(1, [1, 2, 3], texts[:3]),
        frame(1, [4, 5], texts[3:5]),
        frame(1, [6, 7, 8, 9], texts[5:]),
    )
    assert confirms_of(answers) == {1: list(range(1, 10))}
    assert len(records_of(broker)) == 1
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert [(first, len(records)) for _s, first, records in deliveries(frames)] == [(0, 9)]
    assert bodies(frames) == texts
    # Another read is another chunk.
    assert confirms_of(one_read(client, frame(1, [10], [b"10"]))) == {1: [10]}
    assert len(records_of(broker)) == 2


def test_a_read_of_more_than_chunk_entries_is_cut_between_frames(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    per_frame = CHUNK_ENTRIES // 4 + 1  # four frames do not fit in one chunk
    frames = [
        frame(1, list(range(k * per_frame + 1, (k + 1) * per_frame + 1)), [b"x"] * per_frame)
        for k in range(5)
    ]
    answers = one_read(client, *frames)
    assert confirms_of(answers) == {1: list(range(1, 5 * per_frame + 1))}
    stream = stream_of(broker).stream
    firsts = sorted({stream.position_of(o)[1] for o in range(5 * per_frame)})  # type: ignore[attr-defined]
    assert len(firsts) == 2  # 3 frames, then 2: a frame is never split
    assert stream.position_of(3 * per_frame - 1)[1] != stream.position_of(3 * per_frame)[1]  # type: ignore[attr-defined]


def test_two_publishers_share_a_record_and_its_trailer(tmp_path: Path) -> None:
    """Deduplication after a restart whose tracking file lost its last write:
    both publishers' last ids come back from the one record's trailer."""
    data = tmp_path / "data"
    with Harness(data) as first:
        client = opened(first)
        declare(client, 1, ref="a")
        declare(client, 2, ref="b")
        answers = one_read(client, frame(1, [1, 2], [b"a1", b"a2"]), frame(2, [1], [b"b1"]))
        assert confirms_of(answers) == {1: [1, 2], 2: [1]}
        directory = stream_of(first).stream.directory
        first.call(lambda: stream_of(first).stream.sync())
        kept = tmp_path / "offsets-before"
        shutil.copy(directory / "offsets", kept)
        answers = one_read(
            client,
            frame(1, [3], [b"a3"]),
            frame(2, [2, 3], [b"b2", b"b3"]),
            frame(1, [4], [b"a4"]),
        )
        assert confirms_of(answers) == {1: [3, 4], 2: [2, 3]}
        assert len(records_of(first)) == 2
        assert trailer_of(first, 3) == [("a", 4), ("b", 3)]
    shutil.copy(kept, directory / "offsets")
    with Harness(data) as second:
        client = opened(second, stream=None)
        for ref, last in (("a", 4), ("b", 3)):
            seq = client.request(schema.QueryPublisherSequence(client.next_id(), ref, "s"))
            assert seq.sequence == last
        declare(client, 1, ref="a")
        declare(client, 2, ref="b")
        answers = one_read(
            client, frame(1, [4, 5], [b"a4", b"a5"]), frame(2, [3, 4], [b"b3", b"b4"])
        )
        assert confirms_of(answers) == {1: [4, 5], 2: [3, 4]}
        frames = client.raw(encode(schema.Subscribe(client.next_id(), 1, "s", FIRST, 10, [])))
        assert bodies(frames) == [b"a1", b"a2", b"b1", b"a3", b"b2", b"b3", b"a4", b"a5", b"b4"]


def test_duplicates_within_one_read_are_dropped(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    answers = one_read(
        client,
        frame(1, [1, 2], [b"1", b"2"]),
        frame(1, [2, 3], [b"2", b"3"]),
        frame(1, [1], [b"1"]),
    )
    assert confirms_of(answers) == {1: [1, 1, 2, 2, 3]}
    assert stream_of(broker).stream.next_offset == 3
    seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
    assert seq.sequence == 3


def test_a_command_after_publish_frames_sees_them_stored(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    query = encode(schema.QueryPublisherSequence(99, "app", "s"))
    answers = one_read(client, frame(1, [1, 2], [b"1", b"2"]), query, frame(1, [3], [b"3"]))
    sequences = [a.sequence for a in answers if isinstance(a, c.QueryPublisherSequenceResponse)]
    assert sequences == [2]
    assert confirms_of(answers) == {1: [1, 2, 3]}
    assert len(records_of(broker)) == 2  # the query cut the chunk


def test_a_filtered_publish_keeps_its_place_and_its_filter(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    answers = one_read(
        client,
        frame(1, [1, 2], [b"p1", b"p2"]),
        frame(1, [3, 4], [b"red", b"blue"], filters={3: "red", 4: "blue"}),
        frame(1, [5], [b"p5"]),
    )
    assert confirms_of(answers) == {1: [1, 2, 3, 4, 5]}
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [b"p1", b"p2", b"red", b"blue", b"p5"]
    red = [schema.Property("filter.0", "red")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 2, "s", FIRST, 10, red)))
    assert bodies(frames) == [b"red"]
    both = [*red, schema.Property("match-unfiltered", "true")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 3, "s", FIRST, 10, both)))
    assert bodies(frames) == [b"p1", b"p2", b"red", b"p5"]


def test_an_offset_inside_a_merged_chunk(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    declare(client, 2)
    texts = [b"a", b"b", b"c", b"d", b"e"]
    one_read(client, frame(1, [1, 2], texts[:2]), frame(2, [1, 2, 3], texts[2:]))
    assert len(records_of(broker)) == 1
    sub = opened(broker, stream=None)
    # From offset 3 (in the second frame's part): the chunk comes whole.
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", spec(4, 3), 10, [])))
    assert [(first, len(records)) for _s, first, records in deliveries(frames)] == [(0, 5)]
    ch = broker.amqp_connection().channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("s", arguments={"x-stream-offset": 3})
    got = [ch.next_delivery() for _ in range(2)]
    assert [d.properties.headers["x-stream-offset"] for d in got] == [3, 4]
    assert [d.body for d in got] == [b"d", b"e"]
