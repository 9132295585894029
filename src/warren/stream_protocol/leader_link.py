"""A follower's stream protocol connection to the leader, sans-IO.

What a follower's read service cannot do from its copy of the data (single
active consumer groups, StoreOffset: replica_forward.py) is the leader's, and
goes there over the stream protocol itself: one LeaderLink per client of the
read service, opened when that client first needs it, logged in with the
client's own PLAIN credentials and vhost, so that the leader checks its
permissions and its connection's end (the client's) ends its subscriptions
there as any client's does. The handshake (PeerProperties, SASL PLAIN, Tune,
Open) is the link's; commands sent before Open went through wait for it. A
Heartbeat from the leader is answered with one. What the leader sends once
open goes to ``on_command``; a refused handshake, the leader's Close or the
transport's end to ``on_lost``, once. The transport calls ``feed``, writes
``take_output`` after ``wake`` and closes once ``closed`` is set.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from typing import Final

from warren import __version__
from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.wire import StreamProtocolError

__all__ = ["LeaderLink"]

log = logging.getLogger("warren.stream")

OK: Final = int(ResponseCode.OK)

# States, in order.
_HANDSHAKE: Final = 0
_OPEN: Final = 1
_CLOSED: Final = 2


class LeaderLink:
    """One read-service client's connection to the leader."""

    def __init__(
        self,
        user: str,
        password: str,
        vhost: str,
        name: str,
        on_command: Callable[[c.Command], None],
        on_lost: Callable[[LeaderLink, str], None],
    ) -> None:
        self.name = name
        self._auth = b"\x00" + user.encode("utf-8") + b"\x00" + password.encode("utf-8")
        self.vhost = vhost
        self._on_command = on_command
        self._on_lost = on_lost
        self.state = _HANDSHAKE
        self.reader = FrameReader(0)  # the leader is trusted: no limit
        self.output: list[bytes] = []
        #: Commands sent before Open went through.
        self._waiting: list[c.Command] = []
        self._correlation = 0
        #: Called when output waits (the transport writes it on its next turn).
        self.wake: Callable[[], None] = lambda: None
        props = {
            "product": "Warren",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "connection_name": f"follower link for {name}",
        }
        self._write(c.PeerProperties(self.next_id(), props))

    @property
    def closed(self) -> bool:
        return self.state == _CLOSED

    def next_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def send(self, command: c.Command) -> None:
        """Send ``command`` to the leader (once open; nothing once closed)."""
        if self.state == _OPEN:
            self._write(command)
        elif self.state == _HANDSHAKE:
            self._waiting.append(command)

    def take_output(self) -> list[bytes]:
        out, self.output = self.output, []
        return out

    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for frame in self.reader.feed(data):
                self._command(decode_frame(frame))
                if self.closed:
                    return
        except StreamProtocolError as exc:
            self.lost(f"the leader sent a frame not understood: {exc}")

    def lost(self, reason: str) -> None:
        """The link is gone (its transport, or refused): the owner hears once."""
        if self.closed:
            return
        self.state = _CLOSED
        self._waiting.clear()
        self.wake()
        self._on_lost(self, reason)

    def close(self) -> None:
        """The owner is done with the link: the transport closes it."""
        if not self.closed:
            self.state = _CLOSED
            self._waiting.clear()
            self.wake()

    def _write(self, command: c.Command) -> None:
        self.output.append(command.encode())
        self.wake()

    def _command(self, command: c.Command) -> None:
        if isinstance(command, c.Heartbeat):
            self._write(c.Heartbeat())
        elif isinstance(command, c.Close):
            self._write(c.CloseResponse(command.correlation_id))
            self.lost(f"the leader closed the link: {command.reason}")
        elif self.state == _OPEN:
            self._on_command(command)
        elif isinstance(command, c.PeerPropertiesResponse):
            self._write(c.SaslHandshake(self.next_id()))
        elif isinstance(command, c.SaslHandshakeResponse):
            self._write(c.SaslAuthenticate(self.next_id(), "PLAIN", self._auth))
        elif isinstance(command, c.SaslAuthenticateResponse) and command.code != OK:
            self.lost(f"the leader refused the login ({command.code})")
        elif isinstance(command, c.Tune):
            self._write(c.TuneResponse(command.frame_max, command.heartbeat))
            self._write(c.Open(self.next_id(), self.vhost))
        elif isinstance(command, c.OpenResponse):
            if command.code != OK:
                self.lost(f"the leader refused vhost '{self.vhost}' ({command.code})")
                return
            self.state = _OPEN
            waiting, self._waiting = self._waiting, []
            for waited in waiting:
                self._write(waited)
        elif not isinstance(command, c.SaslAuthenticateResponse):
            self.lost(f"the leader sent {type(command).__name__} during the handshake")
