"""Rate limits (core/rate_limits.py): the rules on a ManualClock, then on a
broker whose clock the test moves: connections per address refused, a
publisher over its rate paused and nothing it sent dropped, subscriptions
per client refused, and the Prometheus counters of each."""

from __future__ import annotations

import base64
import contextlib
import http.client
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api, wait_for
from hypothesis import given
from hypothesis import strategies as st
from proxyhelp import Forwarder, v1_header
from tlshelp import write_pki

from warren.core.clock import ManualClock
from warren.core.rate_limits import PublishBucket, RateLimits

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def test_connections_per_address_per_second_window() -> None:
    clock = ManualClock(start_ms=10_000)
    limits = RateLimits(clock, connections_per_second=2)
    assert [limits.allow_connection("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert limits.allow_connection("10.0.0.2")  # each address its own count
    assert limits.allow_connection(None)  # not a network connection
    clock.advance(999)
    assert not limits.allow_connection("10.0.0.1")
    clock.advance(1)  # the next second
    assert limits.allow_connection("10.0.0.1")
    assert limits.counts.connections_refused == 2
    assert RateLimits(clock).allow_connection("10.0.0.1")  # 0: none


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 50)), max_size=40))
def test_a_paused_publisher_never_goes_over_its_rate(sends: list[tuple[int, int]]) -> None:
    """Whatever the sends, one that resumes only when told stays within one
    second's burst plus the rate over the time it ran."""
    rate = 100
    bucket = PublishBucket(rate)
    now = 0
    sent = 0
    for gap, n in sends:
        now += gap
        pause = bucket.spend(now, n)
        sent += n
        now += pause  # reading resumes then
        assert sent <= rate * (now / 1000) + rate + 50  # the last read may overshoot by itself
    if sends:
        assert bucket.spend(now, 0) == 0


def test_bucket_pause_lengths() -> None:
    bucket = PublishBucket(10)  # 100 ms a message, a second's burst
    assert bucket.spend(0, 10) == 0
    assert bucket.spend(0, 1) == 101  # one over: paid for after 100 ms
    assert bucket.spend(2000, 10) == 0  # idle time is not banked beyond the burst
    assert bucket.spend(2000, 20) == 2001


def test_subscriptions_per_client() -> None:
    limits = RateLimits(ManualClock(0), max_subscriptions=2)
    assert limits.allow_subscription(0) and limits.allow_subscription(1)
    assert not limits.allow_subscription(2)
    assert limits.counts.subscriptions_refused == 1


@pytest.fixture
def warren(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        connection_rate_limit=2,
        publish_rate_limit=10,
        max_subscriptions_per_client=2,
    )
    try:
        yield b
    finally:
        b.stop()


def metric(b: BrokerThread, name: str) -> float:
    port = b.broker.listener("http/prometheus").port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_amqp_connections_beyond_the_rate_are_refused(warren: BrokerThread) -> None:
    params = pika.ConnectionParameters("127.0.0.1", warren.port)
    opened = [pika.BlockingConnection(params) for _ in range(2)]
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)
    warren.advance(1000)
    opened.append(pika.BlockingConnection(params))
    for conn in opened:
        conn.close()
    assert metric(warren, "warren_rate_limit_connections_refused_total") == 1


def test_mqtt_connect_beyond_the_rate_gets_quota_exceeded(warren: BrokerThread) -> None:
    mqtt_port = warren.broker.listener("mqtt").port
    codes: list[int] = []
    for i in range(3):
        answered = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, f"c{i}", protocol=mqtt.MQTTv5)

        def on_connect(c: Any, u: Any, f: Any, reason: Any, p: Any, done: Any = answered) -> None:
            codes.append(int(reason.value))
            done.set()

        client.on_connect = on_connect
        client.connect("127.0.0.1", mqtt_port)
        client.loop_start()
        try:
            assert answered.wait(30)
        finally:
            client.disconnect()
            client.loop_stop()
    assert codes == [0, 0, 0x97]  # the third: Quota exceeded
    assert metric(warren, "warren_rate_limit_connections_refused_total") == 1


def test_a_publisher_over_its_rate_is_paused_and_loses_nothing(warren: BrokerThread) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    ch = conn.channel()
    ch.queue_declare("rated")
    for i in range(25):  # 10/s with a second's burst: 15 too many at once
        ch.basic_publish("", "rated", str(i).encode())
    limits = warren.broker.rate_limits
    wait_for(lambda: limits.counts.publishers_paused == 1, what="the publisher paused")
    vhost = warren.broker.vhosts["/"]

    def stored() -> int:
        return int(warren.call(lambda: vhost.queues["rated"].message_count))

    # What was read before the pause is stored (the read that went over the
    # rate, at least); the rest waits in the socket (how much one read took
    # depends on the build's speed).
    wait_for(lambda: stored() > 10, what="the reads before the pause stored")
    answered = threading.Event()
    result: dict[str, Any] = {}

    def declare() -> None:
        result["ok"] = ch.queue_declare("rated", passive=True)
        answered.set()

    # The connection is not read while paused: the declare waits for the clock.
    thread = threading.Thread(target=declare, daemon=True)
    thread.start()
    assert not answered.wait(0.5)

    # Each 1.6 s of the clock pays for what the next reads bring (two are enough
    # for the 14 left); a few at most, so that the broker's clock does not run
    # past the client's heartbeats.
    for _ in range(5):
        warren.advance(1600)
        if answered.wait(10):
            break
    assert answered.is_set(), "the declare was not answered as the clock moved"
    assert result["ok"].method.message_count == 25
    # The last reads may have paused it again: their debt paid, the close is read.
    warren.advance(5000)
    conn.close()
    assert metric(warren, "warren_rate_limit_publishers_paused_total") >= 1


def test_amqp_consumers_per_connection(warren: BrokerThread) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    ch = conn.channel()
    ch.queue_declare("subs")
    ch.basic_consume("subs", lambda *a: None)
    ch.basic_consume("subs", lambda *a: None)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        conn.channel().basic_consume("subs", lambda *a: None)
    assert refused.value.reply_code == 530
    assert metric(warren, "warren_rate_limit_subscriptions_refused_total") == 1


def test_mqtt_subscriptions_per_client(warren: BrokerThread) -> None:
    mqtt_port = warren.broker.listener("mqtt").port
    got: list[list[int]] = []
    done = threading.Event()

    def on_subscribe(client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        got.append([int(c.value) for c in codes])
        done.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "subs", protocol=mqtt.MQTTv5)
    client.on_subscribe = on_subscribe
    client.connect("127.0.0.1", mqtt_port)
    client.loop_start()
    try:
        client.subscribe([("a", 0), ("b", 1), ("c", 0)])
        assert done.wait(30)
        assert got == [[0, 1, 0x97]]  # the third: Quota exceeded
    finally:
        client.disconnect()
        client.loop_stop()


def test_mqtt_publisher_over_its_rate_is_paused_and_loses_nothing(warren: BrokerThread) -> None:
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    ch = amqp.channel()
    ch.queue_declare("from-mqtt")
    ch.queue_bind("from-mqtt", "amq.topic", "rated")
    amqp.close()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "rated", protocol=mqtt.MQTTv311)
    client.connect("127.0.0.1", warren.broker.listener("mqtt").port)
    client.loop_start()
    try:
        for i in range(25):
            client.publish("rated", str(i).encode(), qos=0)
        limits = warren.broker.rate_limits
        wait_for(lambda: limits.counts.publishers_paused >= 1, what="the publisher paused")
        queue = warren.broker.vhosts["/"].queues["from-mqtt"]
        # Paused after the read that went over: what came later waits for the clock.
        warren.advance(3000)
        wait_for(lambda: warren.call(lambda: queue.message_count) == 25)
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("limit", ["connections", "subscriptions"])
def test_stream_connections_and_subscriptions(tmp_path: Path, limit: str) -> None:
    import asyncio

    from rstream import Consumer, Producer
    from rstream.exceptions import ServerError, VirtualHostAccessFailure

    if limit == "connections":
        b = start_broker(tmp_path / "data", clock=ManualClock(), connection_rate_limit=2)
    else:
        b = start_broker(tmp_path / "data", clock=ManualClock(), max_subscriptions_per_client=2)
    port = b.broker.listener("stream").port

    def producer() -> Producer:
        return Producer("127.0.0.1", port, username="guest", password="guest")

    async def nothing(*args: Any) -> None:
        return None

    async def connections() -> None:
        async with producer(), producer():
            with pytest.raises(VirtualHostAccessFailure):  # a third in the same second
                async with producer():
                    pass

    async def subscriptions() -> None:
        async with producer() as p:
            for name in ("s1", "s2", "s3"):
                await p.create_stream(name)
        async with Consumer("127.0.0.1", port, username="guest", password="guest") as c:
            await c.subscribe("s1", nothing)
            await c.subscribe("s2", nothing)
            with pytest.raises(ServerError):
                await c.subscribe("s3", nothing)

    try:
        asyncio.run(connections() if limit == "connections" else subscriptions())
        counts = b.broker.rate_limits.counts
        expected = (1, 0) if limit == "connections" else (0, 1)
        assert (counts.connections_refused, counts.subscriptions_refused) == expected
    finally:
        b.stop()


def test_stream_publisher_over_its_rate_is_paused_and_loses_nothing(tmp_path: Path) -> None:
    import asyncio

    from rstream import AMQPMessage, Producer

    b = start_broker(tmp_path / "data", clock=ManualClock(), publish_rate_limit=10)
    port = b.broker.listener("stream").port
    limits = b.broker.rate_limits

    async def run() -> None:
        async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
            await p.create_stream("rated")
            await p.send_batch("rated", [AMQPMessage(body=b"%d" % i) for i in range(25)])
            await asyncio.to_thread(wait_for, lambda: limits.counts.publishers_paused == 1)
            await asyncio.to_thread(b.advance, 3000)  # reading resumes: the confirms flow
            await p.send_wait("rated", AMQPMessage(body=b"last"))

    try:
        asyncio.run(run())
        queue = b.broker.vhosts["/"].queues["rated"]
        assert b.call(lambda: queue.message_count) == 26
    finally:
        b.stop()


def test_management_connections_are_counted_apart() -> None:
    clock = ManualClock(start_ms=10_000)
    limits = RateLimits(clock, connections_per_second=1, http_connections_per_second=2)
    assert [limits.allow_http_connection("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert limits.allow_connection("10.0.0.1")  # its AMQP connection: its own count
    assert limits.allow_http_connection(None)
    clock.advance(1000)
    assert limits.allow_http_connection("10.0.0.1")
    assert limits.counts.http_connections_refused == 1
    assert limits.counts.connections_refused == 0


def test_http_connections_beyond_the_rate_get_429(warren: BrokerThread) -> None:
    """[mgmt] connection_rate_limit unset: [main]'s 2 per address per second, on
    the management port only (Prometheus' is not limited)."""
    api = Api(warren.http_port)
    assert [api.request("GET", "/api/whoami").status for _ in range(2)] == [200, 200]
    refused = api.request("GET", "/api/whoami")
    assert refused.status == 429 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"] == "too_many"
    # A connection kept alive is counted once, whatever it asks.
    warren.advance(1000)
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", warren.http_port)) as conn:
        for _ in range(5):
            conn.request("GET", "/api/overview", headers={"Authorization": GUEST})
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200
    # AMQP connections of the address are counted apart.
    pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port)).close()
    assert metric(warren, "warren_rate_limit_http_connections_refused_total") == 1
    assert metric(warren, "warren_rate_limit_connections_refused_total") == 0


def test_http_rate_limit_counts_the_proxied_client(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        http_connection_rate_limit=1,
        http_proxy_protocol=True,
    )
    try:
        port = b.http_port
        statuses = []
        for source in ("127.0.0.7", "127.0.0.7", "127.0.0.8"):
            with Forwarder(port, lambda s=source: v1_header((s, 999), ("127.0.0.1", 1))) as fwd:
                statuses.append(Api(fwd.port).request("GET", "/api/whoami").status)
        assert statuses == [200, 429, 200]
    finally:
        b.stop()


def test_http_rate_limit_off_for_the_management_port(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path / "data", clock=ManualClock(), connection_rate_limit=1, http_connection_rate_limit=0
    )
    try:
        api = Api(b.http_port)
        assert {api.request("GET", "/api/whoami").status for _ in range(5)} == {200}
    finally:
        b.stop()


def test_https_connections_beyond_the_rate_get_429(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        http_connection_rate_limit=1,
        http_tls_port=0,
        tls_cert=pki["server"],
        tls_key=pki["server.key"],
    )
    try:
        context = ssl.create_default_context(cafile=pki["ca"])
        url = f"https://127.0.0.1:{b.broker.listener('http').tls_port}/api/whoami"
        statuses = []
        for _ in range(2):
            request = urllib.request.Request(url, headers={"Authorization": GUEST})
            try:
                with urllib.request.urlopen(request, context=context, timeout=30) as reply:
                    statuses.append(reply.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
        assert statuses == [200, 429]
    finally:
        b.stop()
