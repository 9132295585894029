"""server.py's StreamProtocol on an in-memory transport, its timer on the
broker's ManualClock: the handshake's deadline, then the heartbeat sent and
the silent client cut off."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import split_frames
from rstream import encoding, schema

from warren.stream_protocol.server import HANDSHAKE_TIMEOUT_MS, StreamListener, StreamProtocol

broker = harness_fixture(manual_clock=True)


class Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40001), "sockname": ("127.0.0.1", 5552)}.get(
            name, default
        )

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connect(broker: Harness) -> tuple[StreamProtocol, Transport]:
    def make() -> tuple[StreamProtocol, Transport]:
        listener = StreamListener("127.0.0.1", -1)
        listener._node = broker.broker  # what start() sets
        protocol, transport = StreamProtocol(listener), Transport()
        protocol.connection_made(transport)
        return protocol, transport

    return broker.call(make)


def send(broker: Harness, protocol: StreamProtocol, transport: Transport, frame: Any) -> list[Any]:
    broker.call(lambda: protocol.data_received(encoding.encode_frame(frame)))
    broker.settle()
    out = bytes(transport.out)
    transport.out.clear()
    return [encoding.decode_frame(f) for f in split_frames(out)]


def test_a_client_that_never_opens_is_cut_off_at_the_handshake_deadline(broker: Harness) -> None:
    protocol, transport = connect(broker)
    send(broker, protocol, transport, schema.SaslHandshake(1))
    broker.advance(HANDSHAKE_TIMEOUT_MS - 1)
    assert not transport.aborted
    broker.advance(1)
    assert transport.aborted


def test_heartbeats_go_out_and_a_silent_client_is_cut_off(broker: Harness) -> None:
    protocol, transport = connect(broker)
    send(broker, protocol, transport, schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0guest"))
    send(broker, protocol, transport, schema.Tune(frame_max=1 << 20, heartbeat=2))
    assert send(broker, protocol, transport, schema.Open(2, "/"))[0].response_code == 1
    broker.advance(2000)
    broker.settle()
    assert split_frames(bytes(transport.out)) == [b"\x00\x17\x00\x01"]  # a Heartbeat
    assert not transport.closing
    broker.advance(2000)
    broker.settle()
    assert transport.closing
    assert not transport.aborted  # a close, not the handshake's abort
