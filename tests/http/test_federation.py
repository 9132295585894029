"""Federated exchanges between real brokers: an upstream and a policy make an
exchange receive what is published to the upstream's exchange of the same
name, following the downstream's bindings as they change, with the
x-received-from header, max-hops and loop detection, upstream sets, the
links' state, and RabbitMQ as the upstream."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api

from warren.core.clock import ManualClock
from warren.federation.queue_link import DEMAND_CHECK_MS


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[BrokerThread, BrokerThread]]:
    up = start_broker(tmp_path / "up")
    down = start_broker(tmp_path / "down")
    Api(up.http_port).put("/api/cluster-name", {"name": "upstream-cluster"})
    Api(down.http_port).put("/api/cluster-name", {"name": "downstream-cluster"})
    try:
        yield up, down
    finally:
        up.stop()
        down.stop()


def _federate(api: Api, upstream_port: int, pattern: str = "^fed\\.", **upstream: Any) -> None:
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{upstream_port}/%2F", **upstream}
    assert api.put("/api/parameters/federation-upstream/%2F/origin", {"value": value}).status == 201
    reply = api.put(
        "/api/policies/%2F/federate",
        {
            "pattern": pattern,
            "definition": {"federation-upstream-set": "all"},
            "apply-to": "exchanges",
        },
    )
    assert reply.status in (201, 204), reply


def _wait_running(
    broker: BrokerThread, wanted: Callable[[dict[str, Any]], bool], timeout: float = 30
) -> dict[str, Any]:
    """Wait on the broker's loop until the first link ``wanted`` picks is running
    (Federation.wait_for: woken as links come, go and change state, no polling);
    the link as GET /api/federation-links lists it at that change. A TimeoutError
    lists the links as they were."""

    def running(links: list[dict[str, Any]]) -> dict[str, Any] | None:
        found = [link for link in links if wanted(link)]
        return found[0] if found and found[0]["status"] == "running" else None

    component: Any = broker.broker.parameter_components["federation-upstream"]
    return broker.run(component.wait_for(running, timeout), timeout + 5)


def _wait_link(broker: BrokerThread, exchange: str, timeout: float = 30) -> dict[str, Any]:
    """The running link of ``exchange``."""
    return _wait_running(broker, lambda link: link.get("exchange") == exchange, timeout)


def _bound_upstream(
    up: BrokerThread, link: dict[str, Any], count: int, timeout: float = 30
) -> None:
    """Wait until the link's upstream queue has ``count`` bindings besides the
    default, as the upstream's API lists them (what the link asked of another
    broker: polled, at most ``timeout`` s)."""
    api = Api(up.http_port)
    path = "/api/queues/%2F/" + urllib.parse.quote(link["queue"], safe="") + "/bindings"
    deadline = time.monotonic() + timeout
    while True:
        bindings = [b for b in api.get(path) if b["source"]]
        if len(bindings) == count:
            return
        assert time.monotonic() < deadline, (
            f"{link['queue']} upstream has {len(bindings)} bindings, not {count}, "
            f"after {timeout} s: {bindings}"
        )
        time.sleep(0.05)


def _consumer(
    port: int, exchange: str, keys: list[str]
) -> tuple[pika.BlockingConnection, Any, str]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.exchange_declare(exchange, "topic", durable=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    for key in keys:
        ch.queue_bind(queue, exchange, key)
    return conn, ch, queue


def _publish(port: int, exchange: str, key: str, body: bytes) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True)
        ch.confirm_delivery()
        ch.basic_publish(exchange, key, body)


def _next(ch: Any, queue: str, timeout: float = 30) -> tuple[Any, bytes] | None:
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout, auto_ack=True):
        ch.cancel()
        return None if method is None else (props, body)
    return None


def test_a_federated_exchange_receives_what_its_bindings_ask_for(
    pair: tuple[BrokerThread, BrokerThread],
) -> None:
    up, down = pair
    api = Api(down.http_port)
    _federate(api, up.port)
    conn, ch, queue = _consumer(down.port, "fed.events", ["order.*"])
    try:
        link = _wait_link(down, "fed.events")
        assert link["upstream"] == "origin" and link["type"] == "exchange"
        metrics = Api(down.http_port).anonymous().request("GET", "/metrics").body.decode()
        assert 'rabbitmq_federation_links{status="running"} 1\n' in metrics  # RabbitMQ 3.13's
        _bound_upstream(up, link, 1)
        _publish(up.port, "fed.events", "order.created", b"o1")
        _publish(up.port, "fed.events", "invoice.sent", b"i1")  # no such binding downstream
        got = _next(ch, queue)
        assert got is not None
        props, body = got
        assert body == b"o1"
        (hop,) = props.headers["x-received-from"]
        assert hop["exchange"] == "fed.events" and hop["cluster-name"] == "upstream-cluster"
        assert "guest:guest" not in hop["uri"]
        # A new binding downstream is propagated upstream.
        ch.queue_bind(queue, "fed.events", "invoice.*")
        _bound_upstream(up, link, 2)
        _publish(up.port, "fed.events", "invoice.sent", b"i2")
        got = _next(ch, queue)
        assert got is not None and got[1] == b"i2"
        # An exchange the policy does not match is left alone.
        assert all(link["exchange"] == "fed.events" for link in api.get("/api/federation-links"))
        # RabbitMQ's route restarts one link by the id and node the listing gives;
        # the restarted link comes back with its bindings.
        (listed,) = api.get("/api/federation-links")
        restart = "/api/federation-links/vhost/%2F/{}/{}/restart".format(
            urllib.parse.quote(listed["id"], safe=""), urllib.parse.quote(listed["node"], safe="")
        )
        assert api.delete(restart).status == 204
        assert api.delete(restart.replace("/restart", "x/restart")).status == 404
        link = _wait_link(down, "fed.events")
        _bound_upstream(up, link, 2)
        _publish(up.port, "fed.events", "order.paid", b"o2")
        got = _next(ch, queue)
        assert got is not None and got[1] == b"o2"
    finally:
        conn.close()
    # Clearing the upstream stops the link.
    assert api.delete("/api/parameters/federation-upstream/%2F/origin").status == 204
    assert api.get("/api/federation-links") == []


def test_max_hops_stops_messages_going_round_in_a_circle(
    pair: tuple[BrokerThread, BrokerThread],
) -> None:
    a, b = pair
    _federate(Api(a.http_port), b.port)  # each is the other's upstream
    _federate(Api(b.http_port), a.port)
    conn_a, ch_a, qa = _consumer(a.port, "fed.ring", ["#"])
    conn_b, ch_b, qb = _consumer(b.port, "fed.ring", ["#"])
    try:
        _bound_upstream(b, _wait_link(a, "fed.ring"), 1)
        _bound_upstream(a, _wait_link(b, "fed.ring"), 1)
        _publish(a.port, "fed.ring", "k", b"once")
        got_b = _next(ch_b, qb)
        assert got_b is not None and got_b[1] == b"once"
        got_a = _next(ch_a, qa)  # its own publish
        assert got_a is not None and got_a[1] == b"once"
        # It does not come back to a from b (max-hops 1): nothing more on either side.
        _publish(a.port, "fed.ring", "k", b"marker")
        for ch, q in ((ch_a, qa), (ch_b, qb)):
            got = _next(ch, q)
            assert got is not None and got[1] == b"marker"
        link = _wait_link(a, "fed.ring")
        assert link["messages_dropped"] >= 1
    finally:
        conn_a.close()
        conn_b.close()


def test_upstream_sets_and_bad_definitions(pair: tuple[BrokerThread, BrokerThread]) -> None:
    up, down = pair
    api = Api(down.http_port)
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}/%2F", "max-hops": 2}
    assert api.put("/api/parameters/federation-upstream/%2F/u1", {"value": value}).status == 201
    assert (
        api.put(
            "/api/parameters/federation-upstream-set/%2F/s1", {"value": [{"upstream": "u1"}]}
        ).status
        == 201
    )
    assert api.put(
        "/api/policies/%2F/by-set",
        {"pattern": "^set\\.", "definition": {"federation-upstream-set": "s1"}},
    ).status in (201, 204)
    conn, ch, queue = _consumer(down.port, "set.x", ["#"])
    try:
        _bound_upstream(up, _wait_link(down, "set.x"), 1)
        _publish(up.port, "set.x", "any", b"via-set")
        got = _next(ch, queue)
        assert got is not None and got[1] == b"via-set"
    finally:
        conn.close()
    # A pattern over upstream names selects them too.
    assert api.put(
        "/api/policies/%2F/by-pattern",
        {"pattern": "^pat\\.", "definition": {"federation-upstream-pattern": "^u"}},
    ).status in (201, 204)
    conn, ch, queue = _consumer(down.port, "pat.x", ["#"])
    try:
        _bound_upstream(up, _wait_link(down, "pat.x"), 1)
        _publish(up.port, "pat.x", "any", b"via-pattern")
        got = _next(ch, queue)
        assert got is not None and got[1] == b"via-pattern"
    finally:
        conn.close()
    reply = api.put("/api/parameters/federation-upstream/%2F/bad", {"value": {"max-hops": 0}})
    assert reply.status == 400
    reason = reply.json()["reason"]
    assert "uri" in reason and "max-hops" in reason
    reply = api.put(
        "/api/policies/%2F/both",
        {
            "pattern": "x",
            "definition": {"federation-upstream-set": "all", "federation-upstream": "u1"},
        },
    )
    assert reply.status == 400 and "together" in reply.json()["reason"]


def test_rabbitmq_as_the_upstream(broker: BrokerThread, rabbitmq: Any) -> None:
    api = Api(broker.http_port)
    _federate(api, rabbitmq.port)
    conn, ch, queue = _consumer(broker.port, "fed.rabbit", ["#"])
    try:
        _wait_link(broker, "fed.rabbit")
        deadline = time.monotonic() + 30
        while True:  # the link's queue is bound on RabbitMQ once a publish reaches it
            _publish(rabbitmq.port, "fed.rabbit", "k", b"from-rabbit")
            got = _next(ch, queue, timeout=1)
            if got is not None:
                break
            assert time.monotonic() < deadline, "nothing came across from RabbitMQ"
        assert got[1] == b"from-rabbit"
        assert got[0].headers["x-received-from"][0]["exchange"] == "fed.rabbit"
    finally:
        conn.close()


def test_a_federated_queue_fetches_only_while_it_has_consumers(
    pair: tuple[BrokerThread, BrokerThread],
) -> None:
    up, down = pair
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port)) as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True)
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", "work", b"job-%d" % i)
    api = Api(down.http_port)
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}/%2F"}
    assert api.put("/api/parameters/federation-upstream/%2F/origin", {"value": value}).status == 201
    assert api.put(
        "/api/policies/%2F/fed-queues",
        {
            "pattern": "^work$",
            "apply-to": "queues",
            "definition": {"federation-upstream": "origin"},
        },
    ).status in (201, 204)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", down.port)) as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True)
        # The link starts (the policy is matched by the next sweep) ...
        _wait_running(down, lambda link: link["type"] == "queue")
        # ... but takes nothing while nobody consumes here.
        links = [link for link in api.get("/api/federation-links") if link["type"] == "queue"]
        assert links[0]["status"] == "running" and not links[0]["consuming"]
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port)) as uc:
            assert uc.channel().queue_declare("work", passive=True).method.message_count == 20
        bodies = []
        for method, props, body in ch.consume("work", inactivity_timeout=30):
            assert method is not None, f"only {len(bodies)} came across"
            ch.basic_ack(method.delivery_tag)
            bodies.append(body)
            assert props.headers["x-received-from"][0]["queue"] == "work"
            if len(bodies) == 20:
                break
        ch.cancel()
        assert sorted(bodies) == sorted(b"job-%d" % i for i in range(20))


def test_a_federated_queue_looks_for_demand_on_the_brokers_clock(
    tmp_path: Path, broker_factory: Callable[..., BrokerThread]
) -> None:
    """The link looks at the local queue's consumers on the broker's clock (a
    ManualClock here): a consumer that arrives is not served until the clock
    reaches the next look, and then is, with no wait for wall-clock time."""
    up = start_broker(tmp_path / "up")
    down = broker_factory(data_dir=tmp_path / "down", clock=ManualClock())
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port)) as conn:
            ch = conn.channel()
            ch.queue_declare("work", durable=True)
            ch.confirm_delivery()
            for i in range(3):
                ch.basic_publish("", "work", b"job-%d" % i)
        api = Api(down.http_port)
        value = {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}/%2F"}
        assert (
            api.put("/api/parameters/federation-upstream/%2F/origin", {"value": value}).status
            == 201
        )
        policy = {
            "pattern": "^work$",
            "apply-to": "queues",
            "definition": {"federation-upstream": "origin"},
        }
        assert api.put("/api/policies/%2F/fed-queues", policy).status in (201, 204)
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", down.port)) as conn:
            ch = conn.channel()
            ch.queue_declare("work", durable=True)
            _wait_running(down, lambda link: link["type"] == "queue")
            now = down.call(lambda: down.clock.now_ms())
            # The next look is a timer on the broker's clock, not the loop's.
            assert now + DEMAND_CHECK_MS in down.call(down.clock.pending)
            bodies: list[bytes] = []
            ch.basic_consume("work", lambda c, m, p, body: bodies.append(body), auto_ack=True)
            link = _link_info(down)
            assert link["status"] == "running" and not link["consuming"]  # no look yet
            down.advance(DEMAND_CHECK_MS)
            _wait_running(down, lambda link: link["type"] == "queue" and link["consuming"])
            conn.process_data_events(time_limit=0)
            while len(bodies) < 3:
                conn.process_data_events(time_limit=None)  # returns as frames arrive
        assert sorted(bodies) == [b"job-0", b"job-1", b"job-2"]
    finally:
        up.stop()


def _link_info(broker: BrokerThread) -> dict[str, Any]:
    component: Any = broker.broker.parameter_components["federation-upstream"]
    (link,) = [x for x in broker.call(component.status) if x["type"] == "queue"]
    return link
