"""The DTLS layer (coap/dtls.py) in memory on a ManualClock, its peers tinydtls
clients (DTLSSocket's, as aiocoap's coaps:// uses) whose datagrams the test
carries by hand: who a session is, the bound on sessions, the node clock's
handshake and idle deadlines, and bad records dropped with a log line."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

dtls = pytest.importorskip("DTLSSocket.dtls", reason="DTLSSocket (make test installs it)")

from warren.coap.dtls import DTLSLayer  # noqa: E402
from warren.core.clock import ManualClock  # noqa: E402

KEYS = {b"dev": b"dev-secret-key", b"ops": b"ops-key"}


class Server:
    def __init__(self, max_sessions: int = 10) -> None:
        self.clock = ManualClock(0)
        self.sent: list[tuple[bytes, Any]] = []
        self.plain: list[tuple[bytes, Any]] = []
        self.layer = DTLSLayer(
            lambda data, addr: self.sent.append((data, addr)),
            self.clock,
            KEYS.get,
            max_sessions=max_sessions,
            handshake_timeout_ms=30_000,
            idle_timeout_ms=600_000,
        )
        self.layer.deliver = lambda data, addr: self.plain.append((data, addr))


class Peer:
    """A tinydtls client at ``addr``; ``pump`` carries datagrams both ways."""

    def __init__(self, server: Server, addr: tuple[str, int], identity: bytes, key: bytes) -> None:
        self.server = server
        self.addr = addr
        self.identity = identity  # the binding keeps a pointer into it
        self.out: list[bytes] = []
        self.got: list[bytes] = []
        self.events: list[tuple[int, int]] = []
        self.ctx = dtls.DTLS(
            read=self._read,
            write=self._write,
            event=lambda level, code: self.events.append((level, code)),
            pskId=identity,
            pskStore={identity: key},
        )
        self.conn = self.ctx.connect("::1", 5684)

    def _read(self, _addr: Any, data: bytes) -> int:
        self.got.append(data)
        return len(data)

    def _write(self, _addr: Any, data: bytes) -> int:
        self.out.append(data)
        return len(data)

    def pump(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            out, self.out = self.out, []
            for data in out:
                self.server.layer.datagram(data, self.addr)
            back = [d for d, a in self.server.sent if a == self.addr]
            self.server.sent = [(d, a) for d, a in self.server.sent if a != self.addr]
            for data in back:
                self.ctx.handleMessage(self.conn, data)
            if not out and not back:
                return

    @property
    def connected(self) -> bool:
        return (0, 0x01DE) in self.events

    def send(self, data: bytes) -> None:
        self.ctx.write(self.conn, data)
        self.pump()


def test_a_session_carries_coap_datagrams_and_names_its_user() -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.1", 40000), b"dev", KEYS[b"dev"])
    peer.pump()
    assert peer.connected
    assert server.layer.identity(peer.addr) == "dev"
    peer.send(b"\x40\x01\x00\x01")
    assert server.plain == [(b"\x40\x01\x00\x01", peer.addr)]
    server.layer.write(b"\x60\x44\x00\x01", peer.addr)
    peer.pump()
    assert peer.got == [b"\x60\x44\x00\x01"]
    # tinydtls's records hold 1400 bytes: a larger datagram is dropped, logged.
    server.layer.write(b"x" * 1400, peer.addr)
    assert server.sent == [] and server.layer.dropped == 1
    # Another address has no session: nothing goes to it, nobody is named.
    server.layer.write(b"x", ("192.0.2.9", 1))
    assert server.sent == [] and server.layer.identity(("192.0.2.9", 1)) is None


def test_a_wrong_key_or_identity_gets_no_session() -> None:
    server = Server()
    for n, (identity, key) in enumerate([(b"dev", b"wrong"), (b"nobody", b"dev-secret-key")]):
        peer = Peer(server, ("192.0.2.2", 41000 + n), identity, key)
        peer.pump()
        assert not peer.connected
        assert server.layer.identity(peer.addr) is None
    # tinydtls ends a failed handshake without a word: the node clock's deadline does.
    server.clock.advance(31_000)
    assert server.layer.peers == {}


def test_sessions_are_bounded() -> None:
    server = Server(max_sessions=1)
    first = Peer(server, ("192.0.2.3", 1), b"dev", KEYS[b"dev"])
    first.pump()
    second = Peer(server, ("192.0.2.3", 2), b"ops", KEYS[b"ops"])
    second.pump()
    server.clock.advance(0)  # the refused peer is forgotten on the next turn
    assert first.connected and len(server.layer.peers) == 1
    assert server.layer.identity(second.addr) is None
    first.send(b"still here")
    assert server.plain[-1] == (b"still here", first.addr)


def test_an_unfinished_handshake_ends_on_the_node_clock(caplog: pytest.LogCaptureFixture) -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.4", 1), b"dev", KEYS[b"dev"])
    # ClientHello, HelloVerifyRequest, ClientHello with the cookie, then the
    # server's flight (ServerHello ...) is never carried back.
    peer.pump(rounds=1)
    for data in peer.out:
        server.layer.datagram(data, peer.addr)
    peer.out.clear()
    assert len(server.layer.peers) == 1 and not peer.connected
    server.clock.advance(29_000)
    assert len(server.layer.peers) == 1
    with caplog.at_level(logging.WARNING, logger="warren.coap"):
        server.clock.advance(2_000)
    assert server.layer.peers == {}
    assert "did not finish" in caplog.text


def test_an_idle_session_ends() -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.5", 1), b"dev", KEYS[b"dev"])
    peer.pump()
    server.clock.advance(300_000)
    peer.send(b"ping")  # activity keeps it
    server.clock.advance(300_000)
    server.layer.write(b"a notification", peer.addr)  # so does what it is sent
    server.sent.clear()
    server.clock.advance(599_000)
    assert server.layer.identity(peer.addr) == "dev"
    server.clock.advance(2_000)
    assert server.layer.identity(peer.addr) is None
    server.layer.write(b"gone", peer.addr)
    assert server.sent == []
    again = Peer(server, peer.addr, b"ops", KEYS[b"ops"])  # a new handshake from there
    again.pump()
    assert again.connected and server.layer.identity(peer.addr) == "ops"


def test_bad_records_are_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.6", 1), b"dev", KEYS[b"dev"])
    peer.pump()
    rng = random.Random(33)
    with caplog.at_level(logging.WARNING, logger="warren.coap"):
        for n in range(200):
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(60)))
            if n % 2:  # a record header of the session's epoch, a body of noise
                data = b"\x17\xfe\xfd\x00\x01" + data
            server.layer.datagram(data, ("192.0.2.7" if n % 3 else "192.0.2.6", 1))
    assert server.layer.dropped > 0
    assert caplog.text.count("dropped a datagram") == 1  # a line a second at most
    assert server.plain == []
    peer.send(b"after the noise")
    assert server.plain == [(b"after the noise", peer.addr)]


def test_close_ends_every_session() -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.8", 1), b"dev", KEYS[b"dev"])
    peer.pump()
    server.layer.close()
    assert server.layer.peers == {}
    assert [a for _, a in server.sent] == [peer.addr]  # its close_notify
    server.layer.datagram(b"\x16\xfe\xfd", peer.addr)
    assert server.plain == []


def test_a_close_notify_ends_the_session() -> None:
    server = Server()
    peer = Peer(server, ("192.0.2.9", 1), b"dev", KEYS[b"dev"])
    peer.pump()
    assert server.layer.identity(peer.addr) == "dev"
    peer.ctx.close(peer.conn)
    peer.pump()
    assert server.layer.peers == {} and server.layer.identity(peer.addr) is None


def test_a_new_handshake_names_its_user_once_it_is_done() -> None:
    """A client that restarts (same address) handshakes again: the handshake
    replaces the session (in tinydtls too), and names nobody until it is done."""
    server = Server()
    peer = Peer(server, ("192.0.2.10", 1), b"dev", KEYS[b"dev"])
    peer.pump()
    liar = Peer(server, peer.addr, b"ops", b"not-ops-key")
    liar.pump()
    assert not liar.connected and server.layer.identity(peer.addr) is None
    server.layer.write(b"to nobody", peer.addr)
    assert server.sent == []
    again = Peer(server, peer.addr, b"ops", KEYS[b"ops"])
    again.pump()
    assert again.connected and server.layer.identity(peer.addr) == "ops"
