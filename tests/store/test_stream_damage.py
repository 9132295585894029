"""Damaged stream files never cost intact messages or their offsets, and damaged
bytes are never served: real StreamStore instances over real files, damaged on
disk, reopened. docs/storage.md, "Damage to message files"."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from damage_helpers import (
    DAMAGE_SETTINGS,
    Written,
    damage,
    errors,
    fields,
    flip,
    hit_by,
    layout,
    msg,
    noise,
    overwrite,
    varied,
)
from hypothesis import given
from hypothesis import strategies as st

from warren.core.message import Message
from warren.core.properties import peek_headers
from warren.core.stream import OFFSET_HEADER
from warren.store.stream_records import stamp_properties
from warren.store.stream_store import StreamStore

# -- streams --------------------------------------------------------------------------


def read_stream(store: StreamStore, start: int = 0) -> list[tuple[int, Message]]:
    """Every message a reader from ``start`` gets, checking that each carries
    the offset it is delivered at."""
    cursor = store.cursor(start)
    out = []
    while (item := cursor.next()) is not None:
        headers = peek_headers(item[1].properties) or {}
        assert headers[OFFSET_HEADER] == item[0]
        out.append(item)
    cursor.close()
    return out


def stream_filled(d: Path, n: int = 100) -> list[tuple[int, int]]:
    """A closed stream of messages 0 .. n-1; (segment id, position) of each."""
    store = StreamStore(d, 4096)
    for i in range(n):
        assert store.append(msg(i)) == i
    where = [store.position_of(i)[:2] for i in range(n)]
    store.close()
    return where


def layout_of(path: Path, where: tuple[int, int]) -> list[tuple[int, int]]:
    """The (offset, length) of the record at ``where`` if it is in ``path``."""
    sid, pos = where
    if path.name != f"msgs.{sid:010d}":
        return []
    return [r for r in layout(path) if r[0] == pos]


def test_a_damaged_stream_record_costs_only_itself_and_keeps_offsets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "s"
    where = stream_filled(d)
    sid, pos = where[10]
    path = d / f"msgs.{sid:010d}"
    sid2, pos2 = where[50]
    path2 = d / f"msgs.{sid2:010d}"
    hit = (pos2 + 8, pos2 + 308)
    lost = {10} | {
        i
        for i in range(100)
        for start, length in layout_of(path2, where[i])
        if start < hit[1] and hit[0] < start + length
    }
    assert 50 in lost and 51 in lost
    overwrite(path, pos, b"\x00\x01\x00\x00")  # record 10's length field
    overwrite(path2, hit[0], noise(hit[1] - hit[0]))
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = StreamStore(d, 4096)
    assert (store.first_offset, store.next_offset) == (0, 100)
    got = read_stream(store)
    offsets = [o for o, _m in got]
    assert offsets == [i for i in range(100) if i not in lost]
    assert all(m.body == msg(o).body for o, m in got)
    assert read_stream(store, 10)[0][0] == 11  # an offset damage took: the next one
    assert len(errors(caplog)) == 2
    assert store.append(msg(100)) == 100
    store.close()
    caplog.clear()
    store = StreamStore(d, 4096)
    assert not errors(caplog)
    assert [o for o, _m in read_stream(store)] == [*offsets, 100]
    store.close()


def test_a_stream_record_damaged_while_open_is_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "s"
    store = StreamStore(d, 4096)
    for i in range(60):
        store.append(msg(i))
    store.flush()
    sid, pos = store.position_of(30)[:2]
    flip(d / f"msgs.{sid:010d}", pos + 70)
    caplog.set_level(logging.WARNING, logger="warren.store")
    first = read_stream(store)
    assert [o for o, _m in first] == [i for i in range(60) if i != 30]
    second = read_stream(store, 25)  # a second reader steps over the known damage
    assert [o for o, _m in second] == [i for i in range(25, 60) if i != 30]
    assert len(errors(caplog)) == 1
    assert store.append(msg(60)) == 60
    store.close()
    store = StreamStore(d, 4096)
    assert [o for o, _m in read_stream(store)] == [i for i in range(61) if i != 30]
    store.close()


def test_a_damaged_offsets_file_costs_no_stream_record(tmp_path: Path) -> None:
    d = tmp_path / "s"
    store = StreamStore(d, 4096)
    for i in range(30):
        store.append(msg(i))
    store.track("reader", 12)
    store.close()
    tracking = d / "offsets"
    whole = tracking.read_bytes()
    for cut in range(len(whole)):
        for damaged in (whole[:cut], whole[:cut] + bytes([whole[cut] ^ 0x80]) + whole[cut + 1 :]):
            tracking.write_bytes(damaged)
            store = StreamStore(d, 4096)
            assert [o for o, _m in read_stream(store)] == list(range(30))
            store.close()


# -- every flip and cut in the last KB ------------------------------------------------


@pytest.fixture(scope="module", params=[1, 2], ids=["version-1", "version-2"])
def written_stream(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Written:
    w = Written(tmp_path_factory.mktemp("damage") / "s")
    store = StreamStore(w.directory, 2048, format_version=request.param)
    for i in range(60):
        store.append(varied(i))
    store.flush()
    for i in range(60):
        sid, pos = store.position_of(i)[:2]
        name = f"msgs.{sid:010d}"
        w.where[i] = (name, pos, dict(layout(w.directory / name))[pos])
    store.track("reader", 17)
    store.close()
    return w


@DAMAGE_SETTINGS
@given(data=st.data(), while_open=st.booleans())
def test_any_flip_or_cut_in_a_stream_costs_only_what_it_hits(
    written_stream: Written, data: st.DataObject, while_open: bool
) -> None:
    w = written_stream
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "s"
        shutil.copytree(w.directory, d)
        names = sorted({f for f, _o, _n in w.where.values()}) + ["offsets"]
        name = data.draw(st.sampled_from(names))
        store = StreamStore(d, 2048) if while_open else None
        kind, at = damage(data, d / name, bits_only=while_open)
        hit = hit_by(w, name, kind, at)
        if store is None:
            store = StreamStore(d, 2048)
        got = read_stream(store)
        offsets = [o for o, _m in got]
        assert offsets == sorted(set(offsets))
        assert all(fields(m) == fields(stamped(o)) for o, m in got)
        assert set(range(60)) - hit <= set(offsets)
        assert set(offsets) <= set(range(60))
        store.close()
        reopened = StreamStore(d, 2048)
        again = [o for o, _m in read_stream(reopened)]
        assert set(range(60)) - hit <= set(again) <= set(range(60))
        reopened.close()


def stamped(offset: int) -> Message:
    """Message ``offset`` as the stream stored it (its offset and time in headers)."""
    m = varied(offset)
    props = stamp_properties(m.properties, offset, m.timestamp)
    return Message(m.exchange, m.routing_key, props, m.body, m.timestamp)
