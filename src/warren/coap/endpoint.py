"""CoAP's message layer (RFC 7252 section 4) on the broker's clock.

Below requests and responses sits the reliability of a datagram protocol:
a confirmable (CON) request is answered once, however often it is resent
(duplicates within EXCHANGE_LIFETIME get the same answer again, or nothing
while the answer is pending); a response is piggybacked on the request's
ACK, or sent non-confirmable (NON) to a NON request. What the server sends
on its own (an observation's notifications) goes CON, resent with the RFC's
doubling timeout until ACKed or reset, or NON; either way the sender hears
how it ended. Every timer is the node clock's (core/clock.py), so tests move
time with a ManualClock. The transport is given (``send``): this module does
no I/O.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from warren.coap import codec as C
from warren.coap.blockwise import MAX_SZX, Blockwise, Resource
from warren.core.codec_errors import DecodeError

if TYPE_CHECKING:
    from warren.core.clock import Clock, TimerHandle

__all__ = ["ACK_TIMEOUT_MS", "MAX_RETRANSMIT", "Address", "Endpoint", "Outcome"]

log = logging.getLogger("warren.coap")

#: A peer's (host, port, ...) as the socket gives it.
Address = tuple[Any, ...]
#: How a notification ended: "ack", "reset" or "timeout" (a NON's: "reset" only).
Outcome = str

# RFC 7252 4.8's transmission parameters.
ACK_TIMEOUT_MS = 2000
ACK_RANDOM_FACTOR = 1.5
MAX_RETRANSMIT = 4
#: How long a CON request's message id is remembered (and its answer kept).
EXCHANGE_LIFETIME_MS = 247_000
#: How long a NON message id is remembered.
NON_LIFETIME_MS = 145_000
#: Remembered message ids at most (the oldest go first): a flood of distinct
#: requests must not grow the memory without bound.
MAX_REMEMBERED = 50_000


class _Outgoing:
    """A CON message of ours awaiting its ACK: resent on the clock."""

    __slots__ = ("addr", "attempts", "data", "done", "timeout_ms", "timer")

    def __init__(self, data: bytes, addr: Address, done: Callable[[Outcome], None]) -> None:
        self.data = data
        self.addr = addr
        self.done = done
        self.attempts = 0
        self.timeout_ms = ACK_TIMEOUT_MS * random.uniform(1.0, ACK_RANDOM_FACTOR)
        self.timer: TimerHandle | None = None


def _after_fetch(
    done: Callable[[Outcome], None], when_fetched: Callable[[Callable[[], None]], None]
) -> Callable[[Outcome], None]:
    """A large notification's ACK counts once the client fetched its last block."""

    def outcome(how: Outcome) -> None:
        if how == "ack":
            when_fetched(lambda: done("ack"))
        else:
            done(how)

    return outcome


class Endpoint:
    """One UDP socket's CoAP message layer: requests go to ``handle``."""

    def __init__(
        self,
        send: Callable[[bytes, Address], None],
        clock: Clock,
        handle: Callable[[C.CoAPMessage, Address], None],
        max_payload: int = 1024,
    ) -> None:
        self.send = send
        self.clock = clock
        self.handle = handle
        #: (address, message id) of requests seen -> (forget at, the answer or
        #: None while it is pending).
        self._seen: OrderedDict[tuple[Address, int], list[Any]] = OrderedDict()
        #: Our CON messages awaiting an ACK, and NON ones an RST may still name.
        self._outgoing: dict[tuple[Address, int], _Outgoing] = {}
        self._non: OrderedDict[tuple[Address, int], tuple[int, Callable[[Outcome], None]]] = (
            OrderedDict()
        )
        self._mid = random.randrange(0x10000)
        #: Datagrams that were no CoAP message, and when one was last logged.
        self.malformed = 0
        self._logged_ms = -1_000_000.0
        self.closed = False
        #: Block-wise transfers (RFC 7959): uploads put together, large answers in blocks.
        self.blocks = Blockwise(clock, max_payload, self.reply)

    # -- receiving ------------------------------------------------------------------------
    def datagram(self, data: bytes, addr: Address) -> None:
        """A datagram from ``addr``: never raises for what a peer sent."""
        try:
            msg = C.decode(data)
        except DecodeError as exc:
            self._malformed(data, addr, str(exc))
            return
        if msg.mtype in (C.ACK, C.RST):
            self._answered(msg, addr)
        elif msg.code == C.EMPTY:
            if msg.mtype == C.CON:  # a CoAP ping
                self._send(C.CoAPMessage(C.RST, C.EMPTY, msg.mid), addr)
        elif not msg.is_request():
            if msg.mtype == C.CON:  # a response to nothing we asked
                self._send(C.CoAPMessage(C.RST, C.EMPTY, msg.mid), addr)
        else:
            self._request(msg, addr)

    def log_limited(self, level: int, text: str, *args: object) -> None:
        """Log what a peer sent wrong, at most a line a second: a flood of bad
        datagrams must not become a flood of log lines."""
        now = self.clock.monotonic_ms()
        if now - self._logged_ms >= 1000:
            self._logged_ms = now
            log.log(level, text, *args)

    def _malformed(self, data: bytes, addr: Address, why: str) -> None:
        self.malformed += 1
        self.log_limited(
            logging.WARNING,
            "CoAP: a malformed datagram from %s (%s), %d so far",
            addr,
            why,
            self.malformed,
        )
        # A CON message that cannot be processed is rejected with an RST (4.2).
        if len(data) >= 4 and data[0] >> 6 == 1 and (data[0] >> 4) & 3 == C.CON:
            self._send(C.CoAPMessage(C.RST, C.EMPTY, data[2] << 8 | data[3]), addr)

    def _request(self, msg: C.CoAPMessage, addr: Address) -> None:
        key = (addr, msg.mid)
        seen = self._seen.get(key)
        now = self.clock.monotonic_ms()
        if seen is not None and seen[0] > now:
            if msg.mtype == C.CON and seen[1] is not None:
                self.send(seen[1], addr)  # our answer was lost: again
            return
        self._seen.pop(key, None)  # an expired id used again: to the end, as new
        self._forget_old(self._seen, now)
        lifetime = EXCHANGE_LIFETIME_MS if msg.mtype == C.CON else NON_LIFETIME_MS
        self._seen[key] = [now + lifetime, None]
        bad = [
            n
            for n, _ in msg.options
            if n & 1 and n not in C.KNOWN_OPTIONS and n not in (C.BLOCK1, C.BLOCK2)
        ]
        if bad:
            self.reply(msg, addr, C.BAD_OPTION, payload=f"unknown option {bad[0]}".encode())
            return
        whole = self.blocks.incoming(msg, addr)
        if whole is not None:
            self.handle(whole, addr)

    def _forget_old(self, table: OrderedDict[Any, Any], now: float) -> None:
        while table:
            first = next(iter(table.values()))
            expires = first[0]
            if expires > now and len(table) < MAX_REMEMBERED:
                break
            table.popitem(last=False)

    # -- answering ------------------------------------------------------------------------
    def reply(
        self,
        req: C.CoAPMessage,
        addr: Address,
        code: int,
        options: Iterable[tuple[int, bytes]] = (),
        payload: bytes = b"",
    ) -> None:
        """Answer request ``req``: piggybacked on its ACK (CON), or NON; a large
        payload in blocks (blockwise.py)."""
        if self.closed:
            return
        code, options, payload = self.blocks.response(req, addr, code, list(options), payload)
        if req.mtype == C.CON:
            msg = C.CoAPMessage(C.ACK, code, req.mid, req.token, list(options), payload)
        else:
            msg = C.CoAPMessage(C.NON, code, self._next_mid(), req.token, list(options), payload)
        data = self._send(msg, addr)
        seen = self._seen.get((addr, req.mid))
        if seen is not None and req.mtype == C.CON:
            seen[1] = data

    def notify(
        self,
        addr: Address,
        token: bytes,
        code: int,
        options: list[tuple[int, bytes]],
        payload: bytes,
        confirmable: bool,
        done: Callable[[Outcome], None],
        resource: Resource = (),
        szx: int = MAX_SZX,
    ) -> None:
        """Send a message of our own (a notification). CON: resent until ACKed,
        then ``done("ack")``; ``done("reset")`` on an RST, ``done("timeout")``
        after MAX_RETRANSMIT resends. NON: ``done("reset")`` if an RST names it.
        A payload over 16 << ``szx`` bytes goes as its first block, the rest kept
        for requests of ``resource`` (the observed URI) with Block2."""
        options, payload, when_fetched = self.blocks.notification(
            addr, resource, options, payload, szx
        )
        if when_fetched is not None and confirmable:
            done = _after_fetch(done, when_fetched)
        mid = self._next_mid()
        mtype = C.CON if confirmable else C.NON
        data = self._send(C.CoAPMessage(mtype, code, mid, token, options, payload), addr)
        key = (addr, mid)
        if confirmable:
            out = self._outgoing[key] = _Outgoing(data, addr, done)
            self._arm(key, out)
        else:
            now = self.clock.monotonic_ms()
            self._forget_old(self._non, now)
            self._non[key] = (int(now + NON_LIFETIME_MS), done)

    def _arm(self, key: tuple[Address, int], out: _Outgoing) -> None:
        out.timer = self.clock.call_later(out.timeout_ms, lambda: self._resend(key))

    def _resend(self, key: tuple[Address, int]) -> None:
        out = self._outgoing.get(key)
        if out is None or self.closed:
            return
        if out.attempts >= MAX_RETRANSMIT:
            del self._outgoing[key]
            out.done("timeout")
            return
        out.attempts += 1
        out.timeout_ms *= 2
        self.send(out.data, out.addr)
        self._arm(key, out)

    def _answered(self, msg: C.CoAPMessage, addr: Address) -> None:
        key = (addr, msg.mid)
        out = self._outgoing.pop(key, None)
        if out is not None:
            if out.timer is not None:
                out.timer.cancel()
            out.done("ack" if msg.mtype == C.ACK else "reset")
            return
        if msg.mtype == C.RST:
            non = self._non.pop(key, None)
            if non is not None:
                non[1]("reset")

    def _next_mid(self) -> int:
        self._mid = (self._mid + 1) & 0xFFFF
        return self._mid

    def _send(self, msg: C.CoAPMessage, addr: Address) -> bytes:
        data = C.encode(msg)
        self.send(data, addr)
        return data

    def close(self) -> None:
        """Nothing more is sent; the CON messages awaiting an ACK end as timed out."""
        self.closed = True
        outgoing, self._outgoing = self._outgoing, {}
        for out in outgoing.values():
            if out.timer is not None:
                out.timer.cancel()
            out.done("timeout")
        self._non.clear()
