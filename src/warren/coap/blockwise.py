"""Block-wise transfers (RFC 7959) between CoAP's message layer and the resources.

A payload larger than a datagram travels in blocks. Block1 carries a request's
payload (a POST or PUT): the blocks of one transfer (source address, method and
URI) are put together here, each but the last answered 2.31 Continue, and the
resources see one request with the whole payload. What a transfer may hold is
bounded: at most ``[coap] max_payload`` bytes (then 4.13 with Size1), at most
MAX_TRANSFERS at once on the listener and MAX_TRANSFERS_PER_ADDRESS from one
address (then 5.03), each forgotten TRANSFER_TIMEOUT_MS after its last block
(on the node clock); a block out of sequence is 4.08 Request Entity Incomplete.

Block2 carries an answer's payload: an answer or a notification larger than
the block size (BLOCK_SIZE, or the smaller size the request asks for) goes out
as its first block, with Size2 and an ETag; the representation is kept for the
client's requests of the following blocks (a GET with Block2 n, as aiocoap
sends them, also after a notification), bounded in entries and bytes and
forgotten after REPRESENTATION_LIFETIME_MS. This module does no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.coap import codec as C

if TYPE_CHECKING:
    from warren.coap.endpoint import Address
    from warren.core.clock import Clock, TimerHandle

__all__ = ["Blockwise", "Resource", "block_option", "parse_block", "resource_key"]

#: The largest block (SZX 6, 1024 bytes): RFC 7252's datagram budget.
MAX_SZX = 6
BLOCK_SIZE = 16 << MAX_SZX
#: Uploads being put together at once on a listener, and from one address.
MAX_TRANSFERS = 64
MAX_TRANSFERS_PER_ADDRESS = 4
#: An upload whose next block does not come within this long is dropped.
TRANSFER_TIMEOUT_MS = 60_000
#: Large representations kept for their later blocks: how many, how many bytes
#: in all, and for how long.
MAX_REPRESENTATIONS = 256
MAX_REPRESENTATION_BYTES = 16 << 20
REPRESENTATION_LIFETIME_MS = 120_000

#: What names a resource: its Uri-Path and Uri-Query options, in order.
Resource = tuple[tuple[int, bytes], ...]
Reply = Callable[[C.CoAPMessage, "Address", int, list[tuple[int, bytes]], bytes], None]


def resource_key(msg: C.CoAPMessage) -> Resource:
    return tuple((n, v) for n, v in msg.options if n in (C.URI_PATH, C.URI_QUERY))


def parse_block(raw: bytes) -> tuple[int, bool, int]:
    """(block number, more, SZX) of a Block1 or Block2 value."""
    value = C.decode_uint(raw)
    return value >> 4, bool(value & 8), value & 7


def asked_szx(req: C.CoAPMessage) -> int:
    """The block size a request's Block2 asks for (its SZX, at most MAX_SZX);
    MAX_SZX without one."""
    raw = req.option(C.BLOCK2)
    return MAX_SZX if raw is None else min(parse_block(raw)[2], MAX_SZX)


def block_option(number: int, num: int, more: bool, szx: int) -> tuple[int, bytes]:
    return number, C.encode_uint(num << 4 | (8 if more else 0) | szx)


class _Upload:
    __slots__ = ("data", "expires")

    def __init__(self, expires: float) -> None:
        self.data = bytearray()
        self.expires = expires


class _Representation:
    __slots__ = ("code", "etag", "expires", "fetched", "options", "payload", "timer")

    def __init__(
        self, code: int, options: list[tuple[int, bytes]], payload: bytes, expires: float
    ) -> None:
        self.code = code
        self.options = options
        self.payload = payload
        self.etag = hashlib.blake2b(payload, digest_size=4).digest()
        self.expires = expires
        #: Called once the last block went out, or the representation is dropped.
        self.fetched: Callable[[], None] | None = None
        self.timer: TimerHandle | None = None

    def done(self) -> None:
        fetched, self.fetched = self.fetched, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if fetched is not None:
            fetched()


class _Refused(Exception):
    def __init__(self, code: int, text: str, options: list[tuple[int, bytes]] | None = None):
        super().__init__(text)
        self.code = code
        self.options = options or []


class Blockwise:
    """The block-wise layer of one endpoint: ``reply`` answers a request."""

    def __init__(self, clock: Clock, max_payload: int, reply: Reply) -> None:
        self.clock = clock
        self.max_payload = max_payload
        self.reply = reply
        self._uploads: OrderedDict[tuple[Address, int, Resource], _Upload] = OrderedDict()
        self._kept: OrderedDict[tuple[Address, Resource], _Representation] = OrderedDict()
        self._kept_bytes = 0

    # -- requests ---------------------------------------------------------------------------
    def incoming(self, msg: C.CoAPMessage, addr: Address) -> C.CoAPMessage | None:
        """The request for the resources (a whole upload's last block carrying the
        whole payload), or None when this layer answered it."""
        try:
            block2 = msg.option(C.BLOCK2)
            if block2 is not None and msg.code == C.GET and self._later_block(msg, addr, block2):
                return None
            block1 = msg.option(C.BLOCK1)
            if block1 is None or msg.code not in (C.POST, C.PUT):
                return msg
            return self._upload(msg, addr, block1)
        except _Refused as exc:
            self.reply(msg, addr, exc.code, exc.options, str(exc).encode())
            return None

    def _upload(self, msg: C.CoAPMessage, addr: Address, raw: bytes) -> C.CoAPMessage | None:
        num, more, szx = parse_block(raw)
        if szx > MAX_SZX:
            raise _Refused(C.BAD_REQUEST, "BERT blocks (SZX 7) are for CoAP over TCP")
        limit = self.max_payload
        too_large = [(C.SIZE1, C.encode_uint(limit))]
        size1 = msg.option(C.SIZE1)
        if size1 is not None and C.decode_uint(size1) > limit:
            raise _Refused(C.REQUEST_ENTITY_TOO_LARGE, f"payload over {limit} bytes", too_large)
        size = 16 << szx
        if more and len(msg.payload) != size:
            raise _Refused(C.BAD_REQUEST, f"block {num} is not {size} bytes")
        key = (addr, msg.code, resource_key(msg))
        now = self.clock.monotonic_ms()
        self._expire_uploads(now)
        upload = self._uploads.pop(key, None)
        if num == 0:
            if not more:  # the whole payload in one block
                return msg
            if len(self._uploads) >= MAX_TRANSFERS or (
                sum(1 for k in self._uploads if k[0] == addr) >= MAX_TRANSFERS_PER_ADDRESS
            ):
                raise _Refused(
                    C.SERVICE_UNAVAILABLE,
                    "too many block-wise uploads at once",
                    [(C.MAX_AGE, C.encode_uint(5))],
                )
            upload = _Upload(now)
        elif upload is None or num * size != len(upload.data):
            expected = 0 if upload is None else len(upload.data)
            raise _Refused(
                C.REQUEST_ENTITY_INCOMPLETE,
                f"block {num} of {size} bytes does not start at byte {expected}",
            )
        if len(upload.data) + len(msg.payload) > limit:
            raise _Refused(C.REQUEST_ENTITY_TOO_LARGE, f"payload over {limit} bytes", too_large)
        upload.data += msg.payload
        if more:
            upload.expires = now + TRANSFER_TIMEOUT_MS
            self._uploads[key] = upload
            self.reply(msg, addr, C.CONTINUE, [block_option(C.BLOCK1, num, True, szx)], b"")
            return None
        whole = C.CoAPMessage(msg.mtype, msg.code, msg.mid, msg.token, list(msg.options))
        whole.payload = bytes(upload.data)
        return whole

    def _expire_uploads(self, now: float) -> None:
        for key in [k for k, u in self._uploads.items() if u.expires <= now]:
            del self._uploads[key]

    def _later_block(self, msg: C.CoAPMessage, addr: Address, raw: bytes) -> bool:
        """Answer a GET for block n > 0 of a representation kept here."""
        num, _, szx = parse_block(raw)
        if num == 0:
            return False
        now = self.clock.monotonic_ms()
        self._expire_kept(now)
        kept = self._kept.get((addr, resource_key(msg)))
        if kept is None:
            return False
        code, options, payload = self._block(kept, num, min(szx, MAX_SZX))
        self.reply(msg, addr, code, options, payload)
        if code == kept.code and len(payload) + num * (16 << min(szx, MAX_SZX)) >= len(
            kept.payload
        ):
            kept.done()  # the last block: a notification waiting for it is settled
        return True

    @property
    def uploads(self) -> int:
        """Uploads being put together now."""
        return len(self._uploads)

    # -- answers ----------------------------------------------------------------------------
    def response(
        self,
        req: C.CoAPMessage,
        addr: Address,
        code: int,
        options: list[tuple[int, bytes]],
        payload: bytes,
    ) -> tuple[int, list[tuple[int, bytes]], bytes]:
        """An answer to ``req`` as it goes out: a whole upload's Block1 echoed; a
        payload over the block size as its block (the first, or the one asked for)."""
        if code >> 5 != 2 or any(n == C.BLOCK2 for n, _ in options):
            return code, options, payload  # an error, or a block already
        block1 = req.option(C.BLOCK1)
        if block1 is not None and all(n != C.BLOCK1 for n, _ in options):
            options = [*options, (C.BLOCK1, block1)]
        raw = req.option(C.BLOCK2)
        num, szx = 0, MAX_SZX
        if raw is not None:
            num, _, szx = parse_block(raw)
            szx = min(szx, MAX_SZX)
        if raw is None and len(payload) <= BLOCK_SIZE:
            return code, options, payload
        kept = self._keep(addr, resource_key(req), code, options, payload, szx)
        code, blocked, payload = self._block(kept, num, szx)
        return code, [*blocked, *(o for o in options if o[0] == C.OBSERVE)], payload

    def notification(
        self,
        addr: Address,
        resource: Resource,
        options: list[tuple[int, bytes]],
        payload: bytes,
        szx: int = MAX_SZX,
    ) -> tuple[list[tuple[int, bytes]], bytes, Callable[[Callable[[], None]], None] | None]:
        """A notification's options and payload: its first block when it is large
        (over 16 << ``szx`` bytes: the size the observer asked for in its
        registration's Block2, RFC 7959 2.4), then also a function that calls
        back once the client fetched the last block (or the rest is dropped, at
        the latest REPRESENTATION_LIFETIME_MS on): a confirmable notification is
        settled then, so the next one does not replace the blocks the client is
        fetching."""
        if len(payload) <= 16 << szx:
            return options, payload, None
        kept = self._keep(addr, resource, C.CONTENT, options, payload, szx)
        _, first, block = self._block(kept, 0, szx)

        def when_fetched(callback: Callable[[], None]) -> None:
            if self._kept.get((addr, resource)) is not kept:
                callback()  # dropped already
                return
            kept.fetched = callback
            kept.timer = self.clock.call_later(REPRESENTATION_LIFETIME_MS, kept.done)

        return [*first, *(o for o in options if o[0] == C.OBSERVE)], block, when_fetched

    def _keep(
        self,
        addr: Address,
        resource: Resource,
        code: int,
        options: list[tuple[int, bytes]],
        payload: bytes,
        szx: int,
    ) -> _Representation:
        now = self.clock.monotonic_ms()
        self._expire_kept(now)
        # A later block is no notification: without the Observe option.
        plain = [o for o in options if o[0] not in (C.OBSERVE, C.BLOCK1)]
        kept = _Representation(code, plain, payload, now + REPRESENTATION_LIFETIME_MS)
        if len(payload) <= 16 << szx:
            return kept  # one block: nothing to keep
        old = self._kept.pop((addr, resource), None)
        if old is not None:
            self._kept_bytes -= len(old.payload)
            old.done()
        self._kept[(addr, resource)] = kept
        self._kept_bytes += len(payload)
        while self._kept and (
            len(self._kept) > MAX_REPRESENTATIONS or self._kept_bytes > MAX_REPRESENTATION_BYTES
        ):
            _, first = self._kept.popitem(last=False)
            self._kept_bytes -= len(first.payload)
            first.done()
        return kept

    def _expire_kept(self, now: float) -> None:
        while self._kept:
            first = next(iter(self._kept.values()))
            if first.expires > now:
                break
            self._kept.popitem(last=False)
            self._kept_bytes -= len(first.payload)
            first.done()

    @staticmethod
    def _block(
        kept: _Representation, num: int, szx: int
    ) -> tuple[int, list[tuple[int, bytes]], bytes]:
        size = 16 << szx
        start = num * size
        total = len(kept.payload)
        if start >= total and num:
            return C.BAD_REQUEST, [], f"block {num} is beyond the {total} bytes".encode()
        more = start + size < total
        options = [o for o in kept.options if o[0] not in (C.BLOCK2, C.ETAG, C.SIZE2)]
        options.append(block_option(C.BLOCK2, num, more, szx))
        options.append((C.ETAG, kept.etag))
        if num == 0:
            options.append((C.SIZE2, C.encode_uint(total)))
        return kept.code, options, kept.payload[start : start + size]
