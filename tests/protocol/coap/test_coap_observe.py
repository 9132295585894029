"""CoAP's message layer and observations on the broker's ManualClock, with a
raw UDP client (aiocoap's codec decodes what comes back): confirmable
notifications resent on the clock and settled by ACK, ended by RST, timeout or
deregistration; duplicates answered once; requests per address limited."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiocoap.numbers.codes import Code
from aiocoap.numbers.types import Type
from coaphelp import Raw, coap_port
from conftest import BrokerThread, start_broker

from warren.coap import codec as C
from warren.coap.endpoint import MAX_RETRANSMIT
from warren.core.clock import ManualClock

OBSERVE = [(C.OBSERVE, b"")]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(
        tmp_path,
        clock=ManualClock(),
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_anonymous_user="guest",
    )
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def clients(broker: BrokerThread) -> Iterator[tuple[Raw, Raw]]:
    observer, publisher = Raw(coap_port(broker)), Raw(coap_port(broker))
    try:
        yield observer, publisher
    finally:
        observer.close()
        publisher.close()


def observations(broker: BrokerThread) -> int:
    listener: Any = broker.broker.listener("coap")
    return broker.call(lambda: len(listener.pubsub.observations))


def coap_queues(broker: BrokerThread) -> dict[str, tuple[int, int]]:
    """The observations' queues: (ready, unacked) of each."""
    return broker.call(
        lambda: {
            name: (q.message_count, q.unacked)
            for name, q in broker.broker.vhosts["/"].queues.items()
            if name.startswith("coap-subscription-")
        }
    )


def observe(observer: Raw, path: str = "ps/obs/x", token: bytes = b"o1") -> None:
    observer.request(C.GET, path, token=token, options=OBSERVE)
    reply = observer.receive()
    assert (reply.mtype, reply.code, reply.opt.observe) == (Type.ACK, Code.CONTENT, 1)


def publish(publisher: Raw, payload: bytes, path: str = "ps/obs/x") -> None:
    mid = publisher.request(C.POST, path, payload=payload)
    reply = publisher.receive()
    assert (reply.mtype, reply.code, reply.mid) == (Type.ACK, Code.CHANGED, mid)


def test_a_notification_is_resent_on_the_clock_until_it_times_out(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    observer, publisher = clients
    observe(observer)
    publish(publisher, b"m1")
    note = observer.receive()
    assert (note.mtype, note.code, note.payload, note.token) == (
        Type.CON,
        Code.CONTENT,
        b"m1",
        b"o1",
    )
    assert observer.nothing()  # no resend until the clock says so
    # ACK_TIMEOUT (2-3 s), doubling: each step passes exactly one resend.
    for step in (3000, 6000, 12000, 24000)[:MAX_RETRANSMIT]:
        broker.advance(step)
        again = observer.receive()
        assert (again.mid, again.payload) == (note.mid, b"m1")
    assert list(coap_queues(broker).values()) == [(0, 1)]
    broker.advance(48000)  # the last wait: the client is taken as gone
    assert observer.nothing()
    assert observations(broker) == 0
    assert coap_queues(broker) == {}


def test_an_ack_settles_and_the_next_message_follows(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    observer, publisher = clients
    observe(observer)
    publish(publisher, b"m1")
    publish(publisher, b"m2")
    first = observer.receive()
    assert first.payload == b"m1"
    assert observer.nothing()  # one confirmable notification in flight at a time
    assert list(coap_queues(broker).values()) == [(1, 1)]
    observer.answer(first.mid)
    second = observer.receive()
    assert second.payload == b"m2" and second.opt.observe > first.opt.observe
    observer.answer(second.mid)
    assert observer.nothing()
    assert list(coap_queues(broker).values()) == [(0, 0)]
    broker.advance(100_000)  # nothing left to resend
    assert observer.nothing()
    assert observations(broker) == 1


def test_qos_0_notifications_are_not_confirmable(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    observer, publisher = clients
    observe(observer)
    publisher.request(C.POST, "ps/obs/x", mtype=C.NON, payload=b"q0")
    assert publisher.receive().code == Code.CHANGED
    note = observer.receive()
    assert (note.mtype, note.payload) == (Type.NON, b"q0")
    assert observer.nothing()
    assert list(coap_queues(broker).values()) == [(0, 0)]  # acked as it went out


def test_a_reset_ends_the_observation(broker: BrokerThread, clients: tuple[Raw, Raw]) -> None:
    observer, publisher = clients
    observe(observer)
    publish(publisher, b"m1")
    note = observer.receive()
    observer.answer(note.mid, C.RST)
    publish(publisher, b"m2")
    assert observer.nothing()
    assert observations(broker) == 0
    assert coap_queues(broker) == {}


def test_deregistration_and_reregistration(broker: BrokerThread, clients: tuple[Raw, Raw]) -> None:
    observer, publisher = clients
    observe(observer)
    observe(observer)  # the same token again: replaces it
    assert observations(broker) == 1 and len(coap_queues(broker)) == 1
    observer.request(C.GET, "ps/obs/x", token=b"o1", options=[(C.OBSERVE, b"\x01")])
    reply = observer.receive()
    assert (reply.code, reply.opt.observe) == (Code.NOT_FOUND, None)  # nothing retained
    assert observations(broker) == 0 and coap_queues(broker) == {}
    # The vhost keeps nothing of the ended observations.
    assert broker.call(lambda: len(broker.broker.vhosts["/"].exclusive._owned)) == 0


def test_a_resent_request_is_answered_once(broker: BrokerThread, clients: tuple[Raw, Raw]) -> None:
    observer, publisher = clients
    observe(observer)
    mid = publisher.request(C.POST, "ps/obs/x", payload=b"once")
    first = publisher.receive()
    publisher.mid -= 1  # the same message id again: a retransmission
    publisher.request(C.POST, "ps/obs/x", payload=b"once")
    again = publisher.receive()
    assert (first.mid, first.code) == (again.mid, again.code) == (mid, Code.CHANGED)
    note = observer.receive()
    observer.answer(note.mid)
    assert observer.nothing()  # published once


def test_malformed_and_unexpected_datagrams_are_answered(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    raw, _ = clients
    raw.send(b"\xff\x00")  # no CoAP at all: dropped
    raw.send(b"\x40\x01\x00\x07\xf1x")  # CON with a reserved option nibble: RST
    reset = raw.receive()
    assert (reset.mtype, reset.code, reset.mid) == (Type.RST, Code.EMPTY, 7)
    raw.send(b"\x40\x00\x00\x08")  # a CoAP ping: RST
    assert raw.receive().mid == 8
    raw.request(C.GET, "ps/a", options=[(9, b"x")])  # an unknown critical option
    assert raw.receive().code == Code.BAD_OPTION
    raw.request(C.POST, "ps/a", payload=b"x" * 2000)
    big = raw.receive()
    assert (big.code, big.opt.size1) == (Code.REQUEST_ENTITY_TOO_LARGE, 1024)
    raw.request(C.POST, "ps/a", options=[(C.URI_QUERY, b"u=\xff")])  # not UTF-8
    assert raw.receive().code == Code.BAD_REQUEST
    raw.request(C.POST, "ps/bad", payload=b"x")
    assert raw.receive().code == Code.CHANGED  # still serving
    listener: Any = broker.broker.listener("coap")
    assert broker.call(lambda: listener.endpoint.malformed) == 2


def test_requests_per_address_are_limited(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path,
        clock=ManualClock(),
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        coap_requests_per_second=3,
    )
    raw = Raw(coap_port(b))
    try:
        for _ in range(5):
            raw.request(C.GET, "ps/a")
        codes = sorted(raw.receive().code for _ in range(5))
        # No anonymous user: 4.01 within the limit, then 4.29.
        assert codes == [Code.UNAUTHORIZED] * 3 + [Code.TOO_MANY_REQUESTS] * 2
        assert b.call(lambda: b.broker.rate_limits.counts.connections_refused) == 2
        b.advance(1000)  # the next second
        raw.request(C.GET, "ps/a")
        assert raw.receive().code == Code.UNAUTHORIZED
    finally:
        raw.close()
        b.stop()


def test_a_resource_alarm_refuses_publishes(broker: BrokerThread, clients: tuple[Raw, Raw]) -> None:
    _, publisher = clients
    broker.call(lambda: broker.broker.alarms.add("disk"))
    publisher.request(C.POST, "ps/obs/x", payload=b"m1")
    refused = publisher.receive()
    assert (refused.code, refused.opt.max_age) == (Code.SERVICE_UNAVAILABLE, 5)
    broker.call(lambda: broker.broker.alarms.discard("disk"))
    publish(publisher, b"m2")


def test_a_deleted_vhost_ends_its_observations(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    observer, publisher = clients
    observe(observer)
    broker.call(lambda: broker.broker.delete_vhost("/"))
    assert observations(broker) == 0
    # Its client (a connection in the vhost) is closed: a last 5.03 notification.
    last = observer.receive()
    assert (last.mtype, last.code, last.token, last.opt.observe) == (
        Type.NON,
        Code.SERVICE_UNAVAILABLE,
        b"o1",
        None,
    )
    publisher.request(C.POST, "ps/obs/x", payload=b"m1")
    assert publisher.receive().code == Code.SERVICE_UNAVAILABLE  # no such vhost
    assert observer.nothing()


def test_failed_logins_are_answered_late(tmp_path: Path) -> None:
    """The auth guard's delay (core/auth_guard.py) holds a repeated refusal
    on the clock, as every protocol's."""
    b = start_broker(
        tmp_path,
        clock=ManualClock(),
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_enabled=True,
        coap_port=0,
        auth_failure_delay=1000,
    )
    raw = Raw(coap_port(b))
    try:
        raw.request(C.POST, "ps/a", query=("u=guest", "p=wrong"))
        assert raw.receive().code == Code.UNAUTHORIZED  # the first: at once
        raw.request(C.POST, "ps/a", query=("u=guest", "p=wrong"))
        assert raw.nothing()
        b.advance(1000)
        assert raw.receive().code == Code.UNAUTHORIZED
    finally:
        raw.close()
        b.stop()


def test_a_checked_password_is_taken_for_a_minute(
    broker: BrokerThread, clients: tuple[Raw, Raw]
) -> None:
    """One password check per address and minute, not per datagram: a user
    deleted meanwhile is refused once the minute is over."""
    _, publisher = clients

    def add_dev() -> None:
        broker.broker.users.add_user("dev", "secret")
        broker.broker.users.set_permissions("dev", "/")

    broker.call(add_dev)
    creds = ("u=dev", "p=secret")
    publisher.request(C.POST, "ps/obs/x", query=creds, payload=b"1")
    assert publisher.receive().code == Code.CHANGED
    broker.call(lambda: broker.broker.users.users.pop("dev"))
    publisher.request(C.POST, "ps/obs/x", query=creds, payload=b"2")
    assert publisher.receive().code == Code.CHANGED
    broker.advance(60_000)
    publisher.request(C.POST, "ps/obs/x", query=creds, payload=b"3")
    assert publisher.receive().code == Code.UNAUTHORIZED
