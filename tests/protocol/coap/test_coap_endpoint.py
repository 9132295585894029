"""The message layer (coap/endpoint.py) in memory on a ManualClock: whatever
bytes arrive, it never raises, and what it answers is a CoAP message."""

from __future__ import annotations

import random

from aiocoap.message import Message as Oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.coap import codec as C
from warren.coap.endpoint import EXCHANGE_LIFETIME_MS, MAX_REMEMBERED, Endpoint
from warren.core.clock import ManualClock

PEER = ("192.0.2.1", 5683)


def endpoint() -> tuple[Endpoint, list[bytes], list[C.CoAPMessage]]:
    sent: list[bytes] = []
    requests: list[C.CoAPMessage] = []

    def handle(req: C.CoAPMessage, addr: tuple[object, ...]) -> None:
        requests.append(req)
        ep.reply(req, addr, C.CHANGED)

    ep = Endpoint(lambda data, addr: sent.append(data), ManualClock(0), handle)
    return ep, sent, requests


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=40), max_size=20))
def test_any_datagram_is_taken_without_raising(datagrams: list[bytes]) -> None:
    ep, sent, _ = endpoint()
    for data in datagrams:
        ep.datagram(data, PEER)
    for data in sent:
        Oracle.decode(data)  # every answer is a well-formed message


@settings(max_examples=200)
@given(st.integers(0, 3), st.integers(0, 255), st.integers(0, 0xFFFF), st.binary(max_size=8))
def test_any_header_gets_at_most_one_answer(mtype: int, code: int, mid: int, token: bytes) -> None:
    ep, sent, requests = endpoint()
    data = C.encode(C.CoAPMessage(mtype, code, mid, token))
    ep.datagram(data, PEER)
    assert len(sent) <= 1
    assert len(requests) == (1 if 1 <= code <= 31 and mtype in (C.CON, C.NON) else 0)


def test_remembered_message_ids_are_bounded() -> None:
    ep, sent, requests = endpoint()
    rng = random.Random(7)
    for i in range(MAX_REMEMBERED + 100):
        msg = C.CoAPMessage(C.NON, C.POST, i & 0xFFFF, b"", [(C.URI_PATH, b"ps")])
        ep.datagram(C.encode(msg), (f"10.0.{rng.randrange(256)}.{i % 256}", 1000 + i))
    assert len(ep._seen) <= MAX_REMEMBERED
    assert len(requests) == MAX_REMEMBERED + 100


def test_a_message_id_is_new_again_after_the_exchange_lifetime() -> None:
    ep, sent, requests = endpoint()
    clock = ep.clock
    assert isinstance(clock, ManualClock)
    data = C.encode(C.CoAPMessage(C.CON, C.POST, 7, b"t", [(C.URI_PATH, b"ps")]))
    ep.datagram(data, PEER)
    ep.datagram(data, PEER)  # a resend: the same answer, not handled again
    assert len(requests) == 1 and sent[0] == sent[1]
    clock.advance(EXCHANGE_LIFETIME_MS)
    ep.datagram(data, PEER)
    assert len(requests) == 2
