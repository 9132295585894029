"""A StreamConnection driven in memory, rstream's frame encoder and decoder as the client.

rstream (rstream/encoding.py, schema.py) is an independent implementation of
the stream protocol's frames: the test builds rstream's request objects, the
harness encodes them with rstream, feeds the broker's sans-IO connection, and
decodes what the broker wrote with rstream again. ``raw`` bytes go in as
they are, for frames rstream would not write.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from rstream import encoding, schema

from warren.app import AMQP1StreamMessages
from warren.stream_protocol.connection import StreamConnection

if TYPE_CHECKING:
    from harness.broker import Harness


def split_frames(data: bytes) -> list[bytes]:
    """The frames (without their size) in ``data``."""
    frames, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        frames.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(data), "a frame cut short"
    return frames


class MemoryStream:
    """The broker's side: one StreamConnection on the harness broker, its output
    gathered as a transport would write it, and whether it asked to close."""

    def __init__(
        self,
        harness: Harness,
        peer: tuple[str, int] = ("127.0.0.1", 45000),
        cert_login: str | None = None,
    ) -> None:
        self.harness = harness
        self.close_asked = False
        self.lost = False
        self.correlation = 0
        self.conn: StreamConnection = harness.call(
            lambda: StreamConnection(
                harness.broker,
                peer,
                ("127.0.0.1", 5552),
                lambda: None,
                self._on_close,
                messages=AMQP1StreamMessages(),
            )
        )
        self.conn.cert_login = cert_login

    def _on_close(self) -> None:
        self.close_asked = True

    def next_id(self) -> int:
        self.correlation += 1
        return self.correlation

    def raw(self, data: bytes) -> list[bytes]:
        """Feed bytes, run the loop, the frames written back (undecoded)."""
        conn = self.conn

        def feed() -> None:
            conn.now_ms = self.harness.broker.clock.now_ms()
            conn.feed(data)

        self.harness.call(feed)
        self.harness.settle()
        return split_frames(self.take())

    def take(self) -> bytes:
        """What the connection wrote; once it asked to close and its output is
        out, the transport is lost (as a socket's close)."""
        data = b"".join(self.harness.call(self.conn.take_output))
        if self.close_asked and not self.lost:
            self.lost = True
            self.harness.call(self.conn.connection_lost)
        return data

    def send(self, frame: Any) -> list[Any]:
        """Send an rstream frame, the broker's frames back decoded by rstream."""
        return [encoding.decode_frame(f) for f in self.raw(encoding.encode_frame(frame))]

    def request(self, frame: Any) -> Any:
        """Send an rstream request, the one answer back."""
        answers = self.send(frame)
        assert len(answers) == 1, answers
        return answers[0]

    def open(
        self, user: str = "guest", password: str = "guest", vhost: str = "/", heartbeat: int = 60
    ) -> Any:
        """The whole handshake as rstream's Client.authenticate makes it; Open's answer."""
        self.request(schema.PeerProperties(self.next_id(), [schema.Property("product", "t")]))
        handshake = self.request(schema.SaslHandshake(self.next_id()))
        assert "PLAIN" in handshake.mechanisms
        auth = b"\0" + user.encode() + b"\0" + password.encode()
        answers = self.send(schema.SaslAuthenticate(self.next_id(), "PLAIN", auth))
        assert answers[0].response_code == 1, answers
        tune = answers[1]
        assert isinstance(tune, schema.Tune)
        self.send(schema.Tune(min(tune.frame_max, 1 << 20), min(tune.heartbeat, heartbeat)))
        return self.request(schema.Open(self.next_id(), vhost))
