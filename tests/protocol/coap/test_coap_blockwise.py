"""Block-wise transfers (RFC 7959): aiocoap's client sends payloads of several
Block1 blocks and puts together answers and notifications sent in Block2
blocks; bad sequences by hand (a raw UDP client, aiocoap's codec the oracle)
on a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiocoap
import pytest
from aiocoap import Code, Message
from aiocoap.numbers.types import Type
from coaphelp import HOST, Raw, coap_port
from conftest import BrokerThread
from conftest import start_broker as start_thread
from mqttclient import Client

from warren.coap import codec as C
from warren.coap.blockwise import REPRESENTATION_LIFETIME_MS, TRANSFER_TIMEOUT_MS, block_option
from warren.core.clock import ManualClock
from warren.pytest_plugin import WarrenBroker, start_broker

LIMIT = 8000
BIG = bytes(range(256)) * 20  # 5120 bytes: five blocks of 1024


@pytest.fixture(scope="module")
def warren() -> Iterator[WarrenBroker]:
    broker = start_broker(
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
        coap_max_payload=LIMIT,
    )
    try:
        yield broker
    finally:
        broker.stop()


def uri(warren: WarrenBroker, path: str) -> str:
    return f"coap://{HOST}:{coap_port(warren)}/{path}"


def run(coro_fn: Any) -> Any:
    async def main() -> Any:
        ctx = await aiocoap.Context.create_client_context()
        try:
            return await asyncio.wait_for(coro_fn(ctx), 30)
        finally:
            await ctx.shutdown()

    return asyncio.run(main())


def test_a_large_post_arrives_whole_at_an_mqtt_subscriber(warren: WarrenBroker) -> None:
    sub = Client(warren.mqtt_port, client_id="block1-sub")
    sub.connect()
    sub.subscribe("big/#", qos=1)

    async def post(ctx: aiocoap.Context) -> Any:
        msg = Message(code=Code.POST, uri=uri(warren, "ps/big/1"), payload=BIG)
        return (await ctx.request(msg).response).code

    try:
        assert run(post) == Code.CHANGED
        got = sub.next()
        assert (got.topic, got.payload) == ("big/1", BIG)
    finally:
        sub.close()


def test_an_upload_over_max_payload_is_refused(warren: WarrenBroker) -> None:
    async def post(ctx: aiocoap.Context) -> Any:
        msg = Message(code=Code.PUT, uri=uri(warren, "ps/big/2"), payload=b"x" * (LIMIT + 1))
        return await ctx.request(msg).response

    reply = run(post)
    assert reply.code == Code.REQUEST_ENTITY_TOO_LARGE
    assert reply.opt.size1 == LIMIT


def test_a_large_retained_message_is_read_in_blocks(warren: WarrenBroker) -> None:
    async def put_and_get(ctx: aiocoap.Context) -> Any:
        put = Message(code=Code.PUT, uri=uri(warren, "ps/big/kept?retain=true"), payload=BIG)
        assert (await ctx.request(put).response).code == Code.CHANGED
        return await ctx.request(Message(code=Code.GET, uri=uri(warren, "ps/big/kept"))).response

    reply = run(put_and_get)
    assert (reply.code, reply.payload) == (Code.CONTENT, BIG)


def test_a_large_notification_is_put_together_by_the_observer(warren: WarrenBroker) -> None:
    pub = Client(warren.mqtt_port, client_id="block2-pub")
    pub.connect()
    second = BIG[::-1] + b"!"

    async def observe(ctx: aiocoap.Context) -> list[bytes]:
        req = ctx.request(Message(code=Code.GET, uri=uri(warren, "ps/notes/big"), observe=0))
        assert (await req.response).code == Code.CONTENT
        notes = req.observation.__aiter__()
        seen = []
        for payload in (BIG, second):
            await asyncio.to_thread(pub.publish, "notes/big", payload, 1)
            seen.append((await notes.__anext__()).payload)
        req.observation.cancel()
        return seen

    try:
        assert run(observe) == [BIG, second]
    finally:
        pub.close()


# -- bad sequences, by hand, on the ManualClock ----------------------------------------------
@pytest.fixture
def raw(tmp_path: Path) -> Iterator[tuple[BrokerThread, Raw]]:
    broker = start_thread(
        tmp_path,
        clock=ManualClock(),
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
        coap_max_payload=2048,
    )
    client = Raw(coap_port(broker))
    try:
        yield broker, client
    finally:
        client.close()
        broker.stop()


def block(client: Raw, num: int, more: bool, payload: bytes, szx: int = 4) -> Any:
    """Send block ``num`` (SZX 4: 256 bytes) of a POST; the answer."""
    client.request(
        C.POST, "ps/raw/x", options=[block_option(C.BLOCK1, num, more, szx)], payload=payload
    )
    return client.receive()


def test_blocks_are_continued_then_answered_with_block1_echoed(
    raw: tuple[BrokerThread, Raw],
) -> None:
    _, client = raw
    first = block(client, 0, True, b"a" * 256)
    assert (first.mtype, first.code) == (Type.ACK, Code.CONTINUE)
    assert tuple(first.opt.block1) == (0, True, 4)
    last = block(client, 1, False, b"b" * 10)
    assert last.code == Code.CHANGED and tuple(last.opt.block1) == (1, False, 4)


def test_a_missing_block_is_4_08(raw: tuple[BrokerThread, Raw]) -> None:
    _, client = raw
    assert block(client, 0, True, b"a" * 256).code == Code.CONTINUE
    assert block(client, 2, True, b"c" * 256).code == Code.REQUEST_ENTITY_INCOMPLETE
    # The transfer is dropped: its next block finds none.
    assert block(client, 1, False, b"b").code == Code.REQUEST_ENTITY_INCOMPLETE
    assert block(client, 3, False, b"x").code == Code.REQUEST_ENTITY_INCOMPLETE


def test_a_wrong_block_size_and_bert_are_bad_requests(raw: tuple[BrokerThread, Raw]) -> None:
    _, client = raw
    assert block(client, 0, True, b"a" * 100).code == Code.BAD_REQUEST
    assert block(client, 0, True, b"a" * 1024, szx=7).code == Code.BAD_REQUEST


def test_an_upload_over_the_limit_is_4_13_as_it_grows(raw: tuple[BrokerThread, Raw]) -> None:
    _, client = raw
    for num in range(8):
        assert block(client, num, True, b"a" * 256).code == Code.CONTINUE
    refused = block(client, 8, False, b"z")
    assert refused.code == Code.REQUEST_ENTITY_TOO_LARGE and refused.opt.size1 == 2048
    client.request(
        C.POST,
        "ps/raw/y",
        options=[block_option(C.BLOCK1, 0, True, 4), (C.SIZE1, C.encode_uint(4096))],
        payload=b"a" * 256,
    )
    assert client.receive().code == Code.REQUEST_ENTITY_TOO_LARGE  # Size1 says so up front


def test_an_idle_upload_is_forgotten_on_the_clock(raw: tuple[BrokerThread, Raw]) -> None:
    broker, client = raw
    assert block(client, 0, True, b"a" * 256).code == Code.CONTINUE
    broker.advance(TRANSFER_TIMEOUT_MS - 1000)
    assert block(client, 1, True, b"b" * 256).code == Code.CONTINUE
    broker.advance(TRANSFER_TIMEOUT_MS + 1)
    assert block(client, 2, False, b"c").code == Code.REQUEST_ENTITY_INCOMPLETE


def test_concurrent_uploads_from_one_address_are_bounded(raw: tuple[BrokerThread, Raw]) -> None:
    _, client = raw
    answers = []
    for i in range(5):
        client.request(
            C.POST,
            f"ps/raw/{i}",
            options=[block_option(C.BLOCK1, 0, True, 4)],
            payload=b"a" * 256,
        )
        answers.append(client.receive().code)
    assert answers == [Code.CONTINUE] * 4 + [Code.SERVICE_UNAVAILABLE]


def test_a_block2_request_picks_a_smaller_block(raw: tuple[BrokerThread, Raw]) -> None:
    _, client = raw
    body = bytes(range(200)) * 3
    client.request(C.PUT, "ps/raw/kept", query=("retain=true",), payload=body)
    assert client.receive().code == Code.CHANGED
    got = b""
    for num in range(3):
        client.request(C.GET, "ps/raw/kept", options=[block_option(C.BLOCK2, num, False, 4)])
        answer = client.receive()
        assert answer.code == Code.CONTENT and answer.opt.block2.block_number == num
        got += answer.payload
        if num == 0:
            assert answer.opt.size2 == len(body) and answer.opt.etag
            etag = answer.opt.etag
            # A newer retained message: the later blocks are still of the copy kept.
            client.request(C.PUT, "ps/raw/kept", query=("retain=true",), payload=b"new")
            assert client.receive().code == Code.CHANGED
        assert answer.opt.etag == etag
    assert got == body and not answer.opt.block2.more
    client.request(C.GET, "ps/raw/kept", options=[block_option(C.BLOCK2, 9, False, 4)])
    assert client.receive().code == Code.BAD_REQUEST


def test_a_large_notification_is_settled_once_its_blocks_are_fetched(
    raw: tuple[BrokerThread, Raw],
) -> None:
    broker, observer = raw
    publisher = Raw(coap_port(broker))
    try:
        observer.request(C.GET, "ps/raw/n", token=b"ob", options=[(C.OBSERVE, b"")])
        assert observer.receive().code == Code.CONTENT
        first, second = b"1" * 1500, b"2" * 1500
        for payload in (first, second):
            publisher.request(C.POST, "ps/raw/n", payload=payload)
            assert publisher.receive().code == Code.CHANGED
        note = observer.receive()
        assert (note.mtype, note.token, note.payload) == (Type.CON, b"ob", first[:1024])
        assert tuple(note.opt.block2) == (0, True, 6) and note.opt.size2 == 1500
        observer.answer(note.mid)
        assert observer.nothing()  # the next waits until this one is fetched
        observer.request(
            C.GET, "ps/raw/n", token=b"b1", options=[block_option(C.BLOCK2, 1, False, 6)]
        )
        rest = observer.receive()
        assert (rest.code, rest.token, rest.payload) == (Code.CONTENT, b"b1", first[1024:])
        assert rest.opt.etag == note.opt.etag and rest.opt.observe is None
        after = observer.receive()
        assert (after.token, after.payload) == (b"ob", second[:1024])
        assert after.opt.etag != note.opt.etag
        observer.answer(after.mid)
        # Never fetched: the queue moves on when the blocks are dropped, on the clock.
        publisher.request(C.POST, "ps/raw/n", payload=b"3")
        assert publisher.receive().code == Code.CHANGED
        assert observer.nothing()
        broker.advance(REPRESENTATION_LIFETIME_MS + 1000)
        assert observer.receive().payload == b"3"
    finally:
        publisher.close()


def test_an_observer_asking_for_small_blocks_gets_its_notifications_in_them(
    raw: tuple[BrokerThread, Raw],
) -> None:
    """RFC 7959 2.4's early negotiation: a Block2 in the registration (here SZX 4,
    256 bytes) sets the block size of every large notification, as a constrained
    observer needs; the later blocks are fetched at that size."""
    broker, observer = raw
    publisher = Raw(coap_port(broker))
    try:
        observer.request(
            C.GET,
            "ps/raw/small",
            token=b"ob",
            options=[(C.OBSERVE, b""), block_option(C.BLOCK2, 0, False, 4)],
        )
        assert observer.receive().code == Code.CONTENT
        body = bytes(range(200)) * 3  # 600 bytes: three blocks of 256, not one of 1,024
        publisher.request(C.POST, "ps/raw/small", payload=body)
        assert publisher.receive().code == Code.CHANGED
        note = observer.receive()
        assert (note.token, note.payload) == (b"ob", body[:256])
        assert tuple(note.opt.block2) == (0, True, 4) and note.opt.size2 == len(body)
        observer.answer(note.mid)
        got = note.payload
        for num in (1, 2):
            observer.request(
                C.GET,
                "ps/raw/small",
                token=b"b%d" % num,
                options=[block_option(C.BLOCK2, num, False, 4)],
            )
            rest = observer.receive()
            assert rest.code == Code.CONTENT and rest.opt.etag == note.opt.etag
            assert tuple(rest.opt.block2) == (num, num < 2, 4)
            got += rest.payload
        assert got == body
        # A small notification goes whole, as before.
        publisher.request(C.POST, "ps/raw/small", payload=b"tiny")
        assert publisher.receive().code == Code.CHANGED
        small = observer.receive()
        assert small.payload == b"tiny" and small.opt.block2 is None
        observer.answer(small.mid)
    finally:
        publisher.close()
