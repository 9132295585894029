"""DTLS 1.2 with pre-shared keys under CoAP's message layer (``coaps://``, 5684).

tinydtls (through DTLSSocket's binding, an optional dependency) does the
records and the handshake; this module feeds it datagrams and keeps what
tinydtls does not: which user a peer authenticated as (its PSK identity), a
bound on the peers at once, and the node clock's deadlines (a handshake that
does not finish, a session left idle). tinydtls's own resend timers read the
system clock in C; the node clock only decides when it is asked to resend
(every second while a handshake is open). No I/O: the socket's ``send`` is
given, and plaintext goes to ``deliver`` (the CoAP Endpoint's datagram).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.core.clock import Clock, TimerHandle

__all__ = ["MAX_IDENTITY", "MAX_KEY", "DTLSLayer", "load_psk_file"]

log = logging.getLogger("warren.coap")

Address = tuple[Any, ...]

# tinydtls's event codes (level 0) and TLS alert levels (RFC 5246 7.2).
_EVENT_CONNECTED = 0x01DE
_LEVEL_FATAL = 2
_CLOSE_NOTIFY = 0
# A record's content type and the handshake message type after its 13-byte header.
_HANDSHAKE = 22
_APPLICATION_DATA = 23
#: change_cipher_spec, alert, handshake, application_data (RFC 6347 4.1).
_CONTENT_TYPES = (20, 21, _HANDSHAKE, _APPLICATION_DATA)
_RECORD_HEADER = 13
_SERVER_HELLO = 2
#: How often tinydtls is asked to resend a handshake flight (node clock, ms).
_RETRANSMIT_CHECK_MS = 1000


#: tinydtls's limits (crypto.h): a longer key would overrun its buffer (the
#: binding copies without a check), a longer identity is refused by it.
MAX_KEY = 16
MAX_IDENTITY = 32


def load_psk_file(path: str) -> dict[bytes, bytes]:
    """``identity:key`` lines (EMQX's PSK file form; ``#`` comments): the
    identity is a user name, the key its secret, both as UTF-8 text, at most
    MAX_IDENTITY and MAX_KEY bytes."""
    keys: dict[bytes, bytes] = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            identity, sep, key = line.partition(":")
            if not sep or not identity or not key:
                raise ValueError(f"{path}:{number}: expected identity:key")
            if len(identity.encode()) > MAX_IDENTITY or len(key.encode()) > MAX_KEY:
                raise ValueError(
                    f"{path}:{number}: an identity is at most {MAX_IDENTITY} bytes, "
                    f"a key at most {MAX_KEY} (tinydtls's)"
                )
            keys[identity.encode()] = key.encode()
    return keys


class _Keys(Mapping[bytes, bytes]):
    """The PSK store tinydtls asks during a handshake: a lookup also tells the
    layer which identity the peer in hand is authenticating as."""

    def __init__(self, layer: DTLSLayer, keys: Callable[[bytes], bytes | None]) -> None:
        self.layer = layer
        self.lookup = keys

    def __getitem__(self, identity: bytes) -> bytes:
        key = self.lookup(identity)
        if key is None or len(key) > MAX_KEY:
            raise KeyError(identity)
        return key

    def __contains__(self, identity: object) -> bool:
        if not isinstance(identity, bytes):
            return False
        self.layer._claimed(identity)
        key = self.lookup(identity)
        return key is not None and len(key) <= MAX_KEY

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def keys(self) -> Any:  # tinydtls's binding asks ``identity in store.keys()``
        return self


class _Peer:
    __slots__ = ("addr", "claimed", "connected", "identity", "last_ms", "started_ms")

    def __init__(self, addr: Address, now_ms: float) -> None:
        self.addr = addr
        #: Whom the session is: the identity of its finished handshake, and the
        #: one a handshake under way claims (a peer may handshake again).
        self.identity: bytes | None = None
        self.claimed: bytes | None = None
        self.connected = False
        self.started_ms = now_ms
        self.last_ms = now_ms


def _key(host: str, port: int) -> tuple[str, int]:
    """tinydtls's sessions are IPv6: an IPv4 peer as its mapped address."""
    return (host if ":" in host else "::ffff:" + host, port)


class DTLSLayer:
    """One UDP socket's DTLS peers: records in, CoAP datagrams out."""

    def __init__(
        self,
        send: Callable[[bytes, Address], None],
        clock: Clock,
        keys: Callable[[bytes], bytes | None],
        *,
        max_sessions: int,
        handshake_timeout_ms: float,
        idle_timeout_ms: float,
    ) -> None:
        from DTLSSocket import dtls  # optional: only a DTLS listener needs it

        self._dtls_module = dtls
        self.send = send
        self.clock = clock
        self.deliver: Callable[[bytes, Address], None] = lambda data, addr: None
        self.max_sessions = max_sessions
        self.handshake_timeout_ms = handshake_timeout_ms
        self.idle_timeout_ms = idle_timeout_ms
        #: Peers tinydtls holds state for (past its cookie check).
        self.peers: dict[tuple[str, int], _Peer] = {}
        #: The peer whose datagram tinydtls is handling (its callbacks are
        #: synchronous and name no session for the key lookup and events).
        self._current: tuple[tuple[str, int], Address] | None = None
        self.dropped = 0
        self._delivered = False
        self._logged_ms = -1_000_000.0
        self._timer: TimerHandle | None = None
        self.closed = False
        self._ctx = dtls.DTLS(
            read=self._read, write=self._write, event=self._event, pskStore=_Keys(self, keys)
        )

    # -- from the socket ------------------------------------------------------------------
    def datagram(self, data: bytes, addr: Address) -> None:
        """A datagram from ``addr``: never raises for what a peer sent."""
        if self.closed:
            return
        if len(data) < _RECORD_HEADER or data[0] not in _CONTENT_TYPES or data[1] != 0xFE:
            self._drop(addr, "not a DTLS 1.x record")
            return
        key = _key(str(addr[0]), int(addr[1]))
        self._current = (key, addr)
        self._delivered = False
        try:
            result = self._ctx.handleMessage(self._dtls_module.Session(key[0], key[1]), data)
        except Exception as exc:  # the binding's own checks, or a callback's bug
            self._drop(addr, f"tinydtls: {exc!r}")
            return
        finally:
            self._current = None
        if result < 0:
            self._drop(addr, "a DTLS record tinydtls refused")
        elif data[0] == _APPLICATION_DATA and not self._delivered:
            # tinydtls drops such a record silently: no session, or it did not decrypt.
            self._drop(addr, "application data outside a session, or not authentic")

    def _drop(self, addr: Address, why: str) -> None:
        self.dropped += 1
        now = self.clock.monotonic_ms()
        if now - self._logged_ms >= 1000:  # at most a line a second
            self._logged_ms = now
            log.warning(
                "CoAP DTLS: dropped a datagram from %s (%s), %d so far", addr, why, self.dropped
            )

    # -- to the socket --------------------------------------------------------------------
    def write(self, data: bytes, addr: Address) -> None:
        """The Endpoint's send: a CoAP datagram, encrypted for ``addr``'s session
        (dropped when there is none: a CON notification then times out)."""
        key = _key(str(addr[0]), int(addr[1]))
        peer = self.peers.get(key)
        if peer is None or not peer.connected or self.closed:
            return
        if self._ctx.write(self._dtls_module.Session(key[0], key[1]), data) < 0:
            self._drop(addr, f"{len(data)} bytes to send: over tinydtls's records")
        else:  # an observer at QoS 0 only listens: what it is sent keeps it
            peer.last_ms = self.clock.monotonic_ms()

    def identity(self, addr: Address) -> str | None:
        """The PSK identity (a user name) ``addr``'s session authenticated with."""
        peer = self.peers.get(_key(str(addr[0]), int(addr[1])))
        if peer is None or not peer.connected or peer.identity is None:
            return None
        return peer.identity.decode("utf-8", "replace")

    # -- tinydtls's callbacks -------------------------------------------------------------
    def _write(self, dest: tuple[str, int], data: bytes) -> int:
        current = self._current
        key = (dest[0], int(dest[1]))
        if current is not None and current[0] == key:
            addr = current[1]
            if (
                len(data) > _RECORD_HEADER
                and data[0] == _HANDSHAKE
                and data[_RECORD_HEADER] == _SERVER_HELLO
            ):
                # Past the cookie: tinydtls now keeps a peer, a new one or one
                # that handshakes again (a restarted client), whose old session
                # the new handshake replaces.
                self._started(key, addr)
        else:
            peer = self.peers.get(key)
            if peer is None:
                return len(data)
            addr = peer.addr
        self.send(data, addr)
        return len(data)

    def _started(self, key: tuple[str, int], addr: Address) -> None:
        if key in self.peers:
            self.peers[key] = _Peer(addr, self.clock.monotonic_ms())
            return
        if len(self.peers) >= self.max_sessions:
            self._drop(addr, f"{self.max_sessions} DTLS sessions already")
            self.clock.call_later(0, lambda: self._reset(key))
            return
        self.peers[key] = _Peer(addr, self.clock.monotonic_ms())
        self._arm()

    def _read(self, source: tuple[str, int], data: bytes) -> int:
        peer = self.peers.get((source[0], int(source[1])))
        if peer is not None and peer.connected:
            # Only an authentic record keeps a session: not one with its address.
            self._delivered = True
            peer.last_ms = self.clock.monotonic_ms()
            self.deliver(data, peer.addr)
        return len(data)

    def _event(self, level: int, code: int) -> None:
        current = self._current
        if current is None:
            return
        peer = self.peers.get(current[0])
        if peer is None:
            return
        if level == 0 and code == _EVENT_CONNECTED:
            peer.connected = True
            peer.identity = peer.claimed
        elif level == _LEVEL_FATAL or code == _CLOSE_NOTIFY:
            # tinydtls forgets the peer itself.
            del self.peers[current[0]]

    def _claimed(self, identity: bytes) -> None:
        current = self._current
        if current is not None:
            peer = self.peers.get(current[0])
            if peer is not None:
                peer.claimed = identity

    # -- the node clock ---------------------------------------------------------------------
    def _arm(self) -> None:
        if self._timer is None and not self.closed:
            self._timer = self.clock.call_later(_RETRANSMIT_CHECK_MS, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.clock.monotonic_ms()
        for key, peer in list(self.peers.items()):
            if not peer.connected and now - peer.started_ms >= self.handshake_timeout_ms:
                self._drop(peer.addr, "the DTLS handshake did not finish in time")
                self._reset(key)
            elif peer.connected and now - peer.last_ms >= self.idle_timeout_ms:
                log.info("CoAP DTLS: the session of %s ended (idle)", peer.addr)
                self._reset(key)
        if any(not p.connected for p in self.peers.values()):
            self._ctx.checkRetransmit()
        if self.peers:
            self._arm()

    def _reset(self, key: tuple[str, int]) -> None:
        """Forget a peer, in tinydtls too (no alert: the peer may not be there)."""
        self.peers.pop(key, None)
        self._ctx.resetPeer(self._dtls_module.Session(key[0], key[1]))

    def close(self) -> None:
        """Every session ends (close_notify to the connected ones)."""
        for key, peer in list(self.peers.items()):
            if peer.connected:
                # The binding raises when tinydtls has no such peer.
                with contextlib.suppress(Exception):
                    self._ctx.close(self._dtls_module.Session(key[0], key[1]))
            self._reset(key)
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
