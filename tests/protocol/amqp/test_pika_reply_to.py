"""Direct reply-to (amq.rabbitmq.reply-to) as a pika (BlockingConnection) client sees it.

A requester consumes the pseudo-queue with no-ack and publishes requests with
reply_to=amq.rabbitmq.reply-to; the broker rewrites that to a per-channel
address, and a server's reply to that address via the default exchange goes
straight to the requester's consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import UnroutableError
from pika.spec import Basic, BasicProperties
from pikahelp import barrier, channel_error, connect, wait_until

pytestmark = pytest.mark.timeout(30)

REPLY_TO = "amq.rabbitmq.reply-to"
PREFIX = REPLY_TO + "."


# -- helpers ------------------------------------------------------------------------------


class Got(list[tuple[Basic.Deliver, BasicProperties, bytes]]):
    def __call__(
        self, ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        self.append((method, props, body))


class RPC:
    """A requester connection and a server connection consuming a request queue.

    The server answers every request at once: body upper-cased, correlation id
    copied, sent to whatever reply_to it received, through the default exchange.
    """

    def __init__(self, broker: Any) -> None:
        self.client = connect(broker)
        self.server = connect(broker)
        self.sch = self.server.channel()
        self.queue = self.sch.queue_declare("", exclusive=True).method.queue
        self.requests: list[BasicProperties] = []
        self.sch.basic_consume(self.queue, self._serve, auto_ack=True)
        self.cch = self.client.channel()
        self.replies = Got()

    def _serve(
        self, ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        self.requests.append(props)
        ch.basic_publish(
            "",
            props.reply_to,
            body.upper(),
            BasicProperties(correlation_id=props.correlation_id, headers={"served": True}),
        )

    def listen(self, consumer_tag: str | None = None) -> str:
        return self.cch.basic_consume(
            REPLY_TO, self.replies, auto_ack=True, consumer_tag=consumer_tag
        )

    def request(self, body: bytes, correlation_id: str) -> None:
        self.cch.basic_publish(
            "",
            self.queue,
            body,
            BasicProperties(reply_to=REPLY_TO, correlation_id=correlation_id),
        )

    def wait(self, n: int) -> None:
        wait_until([self.client, self.server], lambda: len(self.replies) >= n)

    def close(self) -> None:
        for conn in (self.client, self.server):
            if conn.is_open:
                conn.close()


@pytest.fixture
def rpc(broker: Any) -> Iterator[RPC]:
    with closing(RPC(broker)) as r:
        yield r


# -- the round trip -------------------------------------------------------------------------


def test_rpc_round_trip(rpc: RPC) -> None:
    tag = rpc.listen("reply-consumer")
    assert tag == "reply-consumer"
    rpc.request(b"ping", "corr-1")
    rpc.wait(1)
    (request,) = rpc.requests
    address = request.reply_to
    assert address.startswith(PREFIX)
    assert len(address) > len(PREFIX)
    assert request.correlation_id == "corr-1"

    method, props, body = rpc.replies[0]
    assert body == b"PING"
    assert props.correlation_id == "corr-1"
    assert props.headers == {"served": True}
    assert (method.consumer_tag, method.redelivered) == ("reply-consumer", False)
    assert (method.exchange, method.routing_key) == ("", address)


def test_many_requests_share_one_address_per_channel(rpc: RPC) -> None:
    rpc.listen()
    for i in range(20):
        rpc.request(f"m{i}".encode(), f"c{i}")
    rpc.wait(20)
    assert [p.correlation_id for _m, p, _b in rpc.replies] == [f"c{i}" for i in range(20)]
    assert [b for _m, _p, b in rpc.replies] == [f"M{i}".encode() for i in range(20)]
    assert len({p.reply_to for p in rpc.requests}) == 1


def test_replies_do_not_use_up_delivery_tags(rpc: RPC) -> None:
    """As in RabbitMQ, a reply carries the channel's next delivery tag without taking it."""
    rpc.listen()
    for i in range(3):
        rpc.request(b"x", str(i))
    rpc.wait(3)
    assert [m.delivery_tag for m, _p, _b in rpc.replies] == [1, 1, 1]
    q = rpc.cch.queue_declare("", exclusive=True).method.queue
    rpc.cch.basic_publish("", q, b"y")
    assert rpc.cch.basic_get(q)[0].delivery_tag == 1
    rpc.request(b"z", "3")
    rpc.wait(4)
    assert rpc.replies[3][0].delivery_tag == 2


def test_channels_get_different_addresses(rpc: RPC) -> None:
    rpc.listen()
    other = rpc.client.channel()
    other_replies = Got()
    other.basic_consume(REPLY_TO, other_replies, auto_ack=True)
    rpc.request(b"a", "1")
    other.basic_publish("", rpc.queue, b"b", BasicProperties(reply_to=REPLY_TO, correlation_id="2"))
    wait_until([rpc.client, rpc.server], lambda: len(rpc.replies) == 1 and len(other_replies) == 1)
    assert rpc.requests[0].reply_to != rpc.requests[1].reply_to
    assert rpc.replies[0][2] == b"A"
    assert other_replies[0][2] == b"B"


def test_reply_to_own_address(rpc: RPC) -> None:
    rpc.listen()
    q = rpc.cch.queue_declare("", exclusive=True).method.queue
    rpc.cch.basic_publish("", q, b"to-self", BasicProperties(reply_to=REPLY_TO))
    _m, props, _b = rpc.cch.basic_get(q, auto_ack=True)
    rpc.cch.basic_publish("", props.reply_to, b"echo")
    rpc.wait(1)
    assert rpc.replies[0][2] == b"echo"


def test_other_reply_to_values_are_not_rewritten(rpc: RPC) -> None:
    rpc.listen()
    q = rpc.cch.queue_declare("", exclusive=True).method.queue
    for value in ("my-own-queue", REPLY_TO + "-not", "amq.rabbitmq.reply-to.explicit"):
        rpc.cch.basic_publish("", q, b"x", BasicProperties(reply_to=value))
        assert rpc.cch.basic_get(q, auto_ack=True)[1].reply_to == value


def test_reply_in_confirm_mode_is_acked(rpc: RPC) -> None:
    rpc.listen()
    q = rpc.cch.queue_declare("", exclusive=True).method.queue
    rpc.cch.basic_publish("", q, b"x", BasicProperties(reply_to=REPLY_TO))
    address = rpc.cch.basic_get(q, auto_ack=True)[1].reply_to
    replier = rpc.server.channel()
    replier.confirm_delivery()
    replier.basic_publish("", address, b"confirmed")  # raises on nack
    rpc.wait(1)
    assert rpc.replies[0][2] == b"confirmed"


# -- refusals -------------------------------------------------------------------------------


def test_reply_consumer_must_be_no_ack(rpc: RPC) -> None:
    text = channel_error(406, rpc.cch.basic_consume, REPLY_TO, Got(), auto_ack=False)
    assert text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"


def test_publish_with_reply_to_needs_a_reply_consumer(rpc: RPC) -> None:
    rpc.request(b"x", "c")
    text = channel_error(406, barrier, rpc.cch)
    assert text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    assert rpc.requests == []


def test_reply_consumer_must_be_on_the_publishing_channel(rpc: RPC) -> None:
    rpc.listen()
    other = rpc.client.channel()
    other.basic_publish("", rpc.queue, b"x", BasicProperties(reply_to=REPLY_TO))
    text = channel_error(406, barrier, other)
    assert text == "PRECONDITION_FAILED - fast reply consumer does not exist"


def test_only_one_reply_consumer_per_channel(rpc: RPC) -> None:
    rpc.listen()
    text = channel_error(406, rpc.cch.basic_consume, REPLY_TO, Got(), auto_ack=True)
    assert text == "PRECONDITION_FAILED - reply consumer already set"


def test_basic_get_on_reply_to_is_404(rpc: RPC) -> None:
    text = channel_error(404, rpc.cch.basic_get, REPLY_TO)
    assert text == f"NOT_FOUND - no queue '{REPLY_TO}' in vhost '/'"


def test_cancelled_reply_consumer(rpc: RPC) -> None:
    tag = rpc.listen()
    rpc.request(b"one", "1")
    rpc.wait(1)
    address = rpc.requests[0].reply_to
    rpc.cch.basic_cancel(tag)
    replier = rpc.server.channel()
    replier.confirm_delivery()
    with pytest.raises(UnroutableError):
        replier.basic_publish("", address, b"late", mandatory=True)
    rpc.request(b"two", "2")
    text = channel_error(406, barrier, rpc.cch)
    assert text == "PRECONDITION_FAILED - fast reply consumer does not exist"


def test_reply_after_requester_channel_closed_is_unroutable(rpc: RPC) -> None:
    rpc.listen()
    rpc.request(b"one", "1")
    rpc.wait(1)
    address = rpc.requests[0].reply_to
    rpc.cch.close()
    replier = rpc.server.channel()
    replier.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        replier.basic_publish("", address, b"late", mandatory=True)
    assert info.value.messages[0].method.reply_code == 312


def test_reply_to_unknown_address_is_unroutable(rpc: RPC) -> None:
    replier = rpc.server.channel()
    replier.confirm_delivery()
    with pytest.raises(UnroutableError):
        replier.basic_publish("", PREFIX + "bogus-token", b"x", mandatory=True)
    replier.basic_publish("", PREFIX + "bogus-token", b"x")  # non-mandatory: dropped, acked


# -- declaring the pseudo-queue -------------------------------------------------------------


@pytest.mark.parametrize("passive", [True, False])
def test_declaring_reply_to_pseudo_queue(rpc: RPC, passive: bool) -> None:
    ok = rpc.cch.queue_declare(REPLY_TO, passive=passive).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)


def test_declaring_reply_address(rpc: RPC) -> None:
    rpc.listen()
    rpc.request(b"x", "1")
    rpc.wait(1)
    address = rpc.requests[0].reply_to
    ok = rpc.server.channel().queue_declare(address, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (address, 0, 1)
    bogus = PREFIX + "bogus-token"
    text = channel_error(404, rpc.server.channel().queue_declare, bogus, passive=True)
    assert text == f"NOT_FOUND - no queue '{bogus}' in vhost '/'"


def test_reply_to_correlates_concurrent_requesters(broker: Any) -> None:
    rpc = RPC(broker)
    second = connect(broker)
    try:
        rpc.listen()
        ch2 = second.channel()
        replies2 = Got()
        ch2.basic_consume(REPLY_TO, replies2, auto_ack=True)
        ids = [str(uuid.uuid4()) for _ in range(10)]
        for i, cid in enumerate(ids):
            if i % 2:
                ch2.basic_publish(
                    "",
                    rpc.queue,
                    cid.encode(),
                    BasicProperties(reply_to=REPLY_TO, correlation_id=cid),
                )
            else:
                rpc.request(cid.encode(), cid)
        conns = [rpc.client, rpc.server, second]
        wait_until(conns, lambda: len(rpc.replies) + len(replies2) == 10)
        for got in (rpc.replies, replies2):
            for _m, props, body in got:
                assert body == props.correlation_id.upper().encode()
        assert {p.correlation_id for _m, p, _b in rpc.replies} == set(ids[0::2])
        assert {p.correlation_id for _m, p, _b in replies2} == set(ids[1::2])
    finally:
        rpc.close()
        second.close()
