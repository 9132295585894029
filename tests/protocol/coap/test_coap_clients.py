"""CoAP over UDP with aiocoap's client against an embedded broker: publish,
observe, retained messages, across to MQTT (paho) and back, logins and
permissions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiocoap
import pika
import pytest
from aiocoap import Code, Message
from coaphelp import HOST, coap_port
from mqttclient import V5, Client

from warren.pytest_plugin import WarrenBroker, start_broker

QUEUE_PREFIX = "coap-subscription-"


@pytest.fixture(scope="module")
def warren() -> Iterator[WarrenBroker]:
    broker = start_broker(
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
        auth_failure_delay=0,
    )

    def users() -> None:
        u = broker.broker.users
        u.add_user("dev", "secret")
        u.set_permissions("dev", "/")
        u.set_topic_permission("dev", "/", "amq.topic", write="^dev\\.", read="^dev\\.")

    broker.call(users)
    try:
        yield broker
    finally:
        broker.stop()


def uri(warren: WarrenBroker, path: str) -> str:
    return f"coap://{HOST}:{coap_port(warren)}/{path}"


def run(coro_fn: Any) -> Any:
    """Run ``coro_fn(context)`` with a fresh aiocoap client context."""

    async def main() -> Any:
        ctx = await aiocoap.Context.create_client_context()
        try:
            return await asyncio.wait_for(coro_fn(ctx), 30)
        finally:
            await ctx.shutdown()

    return asyncio.run(main())


def coap_queues(warren: WarrenBroker) -> list[str]:
    return warren.call(
        lambda: [q for q in warren.broker.vhosts["/"].queues if q.startswith(QUEUE_PREFIX)]
    )


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_coap_publish_reaches_an_mqtt_subscriber(warren: WarrenBroker) -> None:
    sub = Client(warren.mqtt_port, client_id="coap-sub", protocol=V5)
    sub.connect()
    sub.subscribe("coap/t/#", qos=1)

    async def publish(ctx: aiocoap.Context) -> list[Any]:
        con = Message(code=Code.POST, uri=uri(warren, "ps/coap/t/1"), payload=b'{"t": 21.5}')
        con.opt.content_format = 50
        non = Message(
            code=Code.POST,
            uri=uri(warren, "ps/coap/t/2"),
            payload=b"plain",
            transport_tuning=aiocoap.Unreliable,
        )
        return [(await ctx.request(m).response).code for m in (con, non)]

    try:
        assert run(publish) == [Code.CHANGED, Code.CHANGED]
        first, second = sub.next(), sub.next()
        assert (first.topic, first.payload, first.qos) == ("coap/t/1", b'{"t": 21.5}', 1)
        assert first.properties.ContentType == "application/json"
        assert (second.topic, second.payload, second.qos) == ("coap/t/2", b"plain", 0)
    finally:
        sub.close()


def test_an_mqtt_publish_reaches_a_coap_observer(warren: WarrenBroker) -> None:
    pub = Client(warren.mqtt_port, client_id="coap-pub")
    pub.connect()

    async def observe(ctx: aiocoap.Context) -> list[tuple[bytes, int | None]]:
        req = ctx.request(Message(code=Code.GET, uri=uri(warren, "ps/sensors/+/temp"), observe=0))
        first = await req.response
        assert first.code == Code.CONTENT and first.opt.observe is not None
        assert len(coap_queues(warren)) == 1
        seen: list[tuple[bytes, int | None]] = []
        notes = req.observation.__aiter__()
        # One at a time: aiocoap's iterator keeps only the newest notification.
        for topic, payload, qos in [("sensors/a/temp", b"20", 1), ("sensors/b/temp", b"21", 0)]:
            await asyncio.to_thread(pub.publish, topic, payload, qos)
            note = await notes.__anext__()
            seen.append((note.payload, note.opt.observe))
        await asyncio.to_thread(pub.publish, "other/a/temp", b"no", 1)
        req.observation.cancel()  # aiocoap's is lazy: test_coap_observe.py resets
        return seen

    try:
        seen = run(observe)
        assert [p for p, _ in seen] == [b"20", b"21"]
        assert seen[0][1] is not None and seen[1][1] is not None and seen[1][1] > seen[0][1]
    finally:
        pub.close()


def test_retained_messages_across_protocols(warren: WarrenBroker) -> None:
    pub = Client(warren.mqtt_port, client_id="coap-retainer")
    pub.connect()
    pub.publish("state/lamp", b"on", qos=1, retain=True)

    async def get(ctx: aiocoap.Context) -> list[tuple[Any, bytes]]:
        out = []
        for path in ("ps/state/lamp", "ps/state/+", "ps/state/none"):
            r = await ctx.request(Message(code=Code.GET, uri=uri(warren, path))).response
            out.append((r.code, r.payload))
        kept = Message(code=Code.PUT, uri=uri(warren, "ps/state/door?retain=true"), payload=b"shut")
        out.append(((await ctx.request(kept).response).code, b""))
        return out

    try:
        got = run(get)
        assert got[:2] == [(Code.CONTENT, b"on"), (Code.CONTENT, b"on")]
        assert got[2][0] == Code.NOT_FOUND
        assert got[3][0] == Code.CHANGED
        late = Client(warren.mqtt_port, client_id="coap-late")
        late.connect()
        late.subscribe("state/door", qos=1)
        msg = late.next()
        assert (msg.payload, msg.retain) == (b"shut", True)
        late.close()
    finally:
        pub.close()


def test_logins_and_permissions(warren: WarrenBroker) -> None:
    async def requests(ctx: aiocoap.Context) -> list[Any]:
        paths = [
            ("ps/dev/x?u=dev&p=secret", Code.POST),  # topic permission: ^dev\.
            ("ps/other/x?u=dev&p=secret", Code.POST),  # not its topic
            ("ps/dev/x?u=dev&p=wrong", Code.POST),
            ("ps/dev/x?u=nobody&p=x", Code.POST),
            ("ps/other/x?u=dev&p=secret", Code.GET),  # read: not its topic either
        ]
        out = []
        for path, code in paths:
            r = await ctx.request(Message(code=code, uri=uri(warren, path), payload=b"1")).response
            out.append(r.code)
        return out

    assert run(requests) == [
        Code.CHANGED,
        Code.FORBIDDEN,
        Code.UNAUTHORIZED,
        Code.UNAUTHORIZED,
        Code.FORBIDDEN,
    ]
    attempts = warren.call(lambda: list(warren.broker.auth_attempts.by_protocol["coap"]))
    assert attempts[2] >= 2  # the two failed logins counted


def test_requests_coap_does_not_serve(warren: WarrenBroker) -> None:
    async def requests(ctx: aiocoap.Context) -> list[Any]:
        out = []
        for code, path, payload in [
            (Code.GET, "nope", b""),
            (Code.GET, "ps", b""),
            (Code.DELETE, "ps/a", b""),
            (Code.POST, "ps/a/+", b"x"),  # a wildcard is no topic name
            (Code.GET, "ps/a/%23/b", b""),  # nor a valid filter (# not last)
            (Code.POST, "ps/big", b"x" * 5000),  # over max_payload (aiocoap goes blockwise)
        ]:
            r = await ctx.request(
                Message(code=code, uri=uri(warren, path), payload=payload)
            ).response
            out.append(r.code)
        return out

    assert run(requests) == [
        Code.NOT_FOUND,
        Code.BAD_REQUEST,
        Code.METHOD_NOT_ALLOWED,
        Code.BAD_REQUEST,
        Code.BAD_REQUEST,
        Code.REQUEST_ENTITY_TOO_LARGE,
    ]


def test_amqp_sees_coap_messages_as_mqtt_ones_and_back(warren: WarrenBroker) -> None:
    """A CoAP publish reaches an AMQP queue bound to amq.topic with MQTT's
    headers and its Content-Format as content_type; an AMQP message's
    content_type is a CoAP observer's Content-Format."""
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(host=HOST, port=warren.amqp_port, connection_attempts=1)
    )
    ch = conn.channel()
    ch.queue_declare("coap-amqp", exclusive=True)
    ch.queue_bind("coap-amqp", "amq.topic", "coap.amqp.#")

    async def both(ctx: aiocoap.Context) -> Any:
        post = Message(code=Code.POST, uri=uri(warren, "ps/coap/amqp/1"), payload=b"hi")
        post.opt.content_format = 0
        assert (await ctx.request(post).response).code == Code.CHANGED
        req = ctx.request(Message(code=Code.GET, uri=uri(warren, "ps/amqp/out"), observe=0))
        await req.response
        props = pika.BasicProperties(content_type="application/cbor", delivery_mode=2)
        await asyncio.to_thread(ch.basic_publish, "amq.topic", "amqp.out", b"\xa0", props)
        note = await req.observation.__aiter__().__anext__()
        req.observation.cancel()
        return note.payload, note.opt.content_format

    try:
        payload, fmt = run(both)
        assert (payload, int(fmt)) == (b"\xa0", 60)
        method, props, body = ch.basic_get("coap-amqp", auto_ack=True)
        assert method is not None and body == b"hi"
        assert props.content_type == "text/plain;charset=utf-8"
        assert props.delivery_mode == 2
        assert props.headers == {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}
    finally:
        conn.close()
