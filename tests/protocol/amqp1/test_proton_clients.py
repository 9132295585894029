"""python-qpid-proton against the embedded broker over real sockets: the
scenarios of proton's examples (simple send and receive with the blocking API
and with the reactor, request/response), settlement both ways, consumer
credit, the four outcomes, SASL, vhosts and the refusals RabbitMQ 4
gives (a missing queue, no permission, dynamic nodes, transactions). TLS:
test_amqp1_tls.py.

A scenario that takes ``peer`` runs against RabbitMQ 3.10's rabbitmq_amqp1_0
plugin as well (tests/amqp1_peers.py): its behaviour is the reference there. One
that takes ``broker`` is Warren's alone, and says why: RabbitMQ 4 changed the
behaviour (its docs, https://www.rabbitmq.com/docs/amqp, are the reference),
or the scenario needs the broker's insides. docs/amqp1.md, "Which RabbitMQ is
the reference", has the list.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote

import pika
import pytest
from amqp1_peers import Peer

proton = pytest.importorskip("proton")
from proton import Delivery, Message, Terminus, symbol  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import AtMostOnce, Container, LinkOption  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached, SendException  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


def connect(broker: Any, user: str = "guest", password: str = "guest", vhost: str = "/"):
    return BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user=user,
        password=password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host=f"vhost:{vhost}",
        timeout=10,
    )


def declare(broker: Any, name: str, vhost: str = "/", **arguments: Any) -> None:
    params = pika.URLParameters(broker.url)
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    try:
        conn.channel().queue_declare(name, durable=True, arguments=arguments or None)
    finally:
        conn.close()


def depth(broker: Any, name: str, vhost: str = "/") -> tuple[int, int]:
    """The queue's ready and unacknowledged message counts."""

    def counts() -> tuple[int, int]:
        queue = broker.broker.vhosts[vhost].queues[name]
        return queue.message_count, queue.unacked

    return broker.call(counts)


def refusal(info: pytest.ExceptionInfo[Any]) -> str:
    return str(info.value)


# -- simple send and receive ---------------------------------------------------------------


class _Send(MessagingHandler):
    """proton's examples/simple_send.py: send ``count`` messages, close once all
    are accepted."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.sent = self.accepted = 0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            self.url, allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="vhost:/"
        )
        event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(id=self.sent, body={"sequence": self.sent}, durable=True))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            event.connection.close()


class _Receive(MessagingHandler):
    """proton's examples/simple_recv.py: take ``count`` messages, then close."""

    def __init__(self, url: str, address: str, count: int, prefetch: int = 10) -> None:
        super().__init__(prefetch=prefetch)
        self.url, self.address, self.count = url, address, count
        self.bodies: list[Any] = []

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            self.url, allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="vhost:/"
        )
        event.container.create_receiver(conn, self.address)

    def on_message(self, event: Any) -> None:
        self.bodies.append(event.message.body)
        if len(self.bodies) == self.count:
            event.connection.close()


def _url(broker: Any) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}"


def test_reactor_simple_send_and_receive(peer: Peer) -> None:
    peer.declare("examples")
    send = _Send(_url(peer), peer.queue("examples"), 250)  # more than one round of credit
    Container(send).run()
    assert send.accepted == 250
    peer.check_depth("examples", 250, 0)
    receive = _Receive(_url(peer), peer.queue("examples"), 250)
    Container(receive).run()
    assert receive.bodies == [{"sequence": i} for i in range(250)]
    peer.check_depth("examples", 0, 0)


def test_blocking_presettled_and_unsettled_sends(peer: Peer) -> None:
    peer.declare("settle")
    conn = connect(peer)
    try:
        unsettled = conn.create_sender(peer.queue("settle"))
        delivery = unsettled.send(Message(body="unsettled"))
        assert delivery.remote_state == Delivery.ACCEPTED and delivery.settled
        presettled = conn.create_sender(
            peer.queue("settle"), name="presettled", options=AtMostOnce()
        )
        delivery = presettled.send(Message(body="pre-settled"))
        assert delivery.remote_state == 0  # no outcome comes back
        receiver = conn.create_receiver(peer.queue("settle"), options=AtMostOnce())
        bodies = [receiver.receive(timeout=10).body for _ in range(2)]
        assert bodies == ["unsettled", "pre-settled"]
        peer.check_depth("settle", 0, 0)  # pre-settled deliveries: forgotten
    finally:
        conn.close()


def test_large_message_spans_transfer_frames(peer: Peer) -> None:
    """A message over max-frame-size goes as a multi-frame transfer both ways."""
    peer.declare("large")
    body = bytes(range(256)) * 4096  # 1 MiB
    conn = connect(peer)
    try:
        sender = conn.create_sender(peer.queue("large"))
        assert sender.send(Message(body=body)).remote_state == Delivery.ACCEPTED
        receiver = conn.create_receiver(peer.queue("large"))
        assert receiver.receive(timeout=10).body == body
        receiver.accept()
    finally:
        conn.close()


def test_unsettled_deliveries_return_when_the_connection_closes(peer: Peer) -> None:
    """Delivered, not settled, then the connection goes: the message is ready
    again, and the next delivery of it is not the first acquirer."""
    peer.declare("back")
    conn = connect(peer)
    try:
        conn.create_sender(peer.queue("back")).send(Message(body="kept"))
        message = conn.create_receiver(peer.queue("back")).receive(timeout=10)
        assert (message.body, message.first_acquirer) == ("kept", True)
    finally:
        conn.close()
    conn = connect(peer)
    try:
        receiver = conn.create_receiver(peer.queue("back"))
        again = receiver.receive(timeout=10)
        assert (again.body, again.first_acquirer) == ("kept", False)
        receiver.accept()
    finally:
        conn.close()


def test_unroutable_message_is_released(broker) -> None:
    """RabbitMQ 4's docs (https://www.rabbitmq.com/docs/amqp#outcomes): released
    when no queue took the message. 3.10's plugin publishes without mandatory
    and accepts it."""
    conn = connect(broker)
    try:
        sender = conn.create_sender("/exchanges/amq.direct/nowhere")
        with pytest.raises(SendException) as info:
            sender.send(Message(body="no queue is bound"))
        assert info.value.state == Delivery.RELEASED
    finally:
        conn.close()


# -- request/response ----------------------------------------------------------------------


class _Server(MessagingHandler):
    """proton's examples/server.py: answer ``count`` requests to their reply-to
    over the anonymous relay, then close. Without the relay (RabbitMQ 3.10's
    plugin refuses a null target), a sender per reply-to address, as proton's
    older examples did."""

    def __init__(
        self, url: str, count: int, requests: str = "/queues/requests", relay: bool = True
    ) -> None:
        super().__init__()
        self.url, self.count, self.requests, self.relay = url, count, requests, relay
        self.ready = threading.Event()
        self.senders: dict[str, Any] = {}

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(
            self.url, allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="vhost:/"
        )
        event.container.create_receiver(self.conn, self.requests)
        if self.relay:
            self.senders[""] = event.container.create_sender(self.conn, None)

    def on_link_opened(self, event: Any) -> None:
        if event.link.is_receiver:
            self.ready.set()

    def on_message(self, event: Any) -> None:
        request = event.message
        reply = Message(body=request.body.upper(), correlation_id=request.correlation_id)
        if self.relay:
            reply.address = request.reply_to
            self.senders[""].send(reply)
        else:
            if request.reply_to not in self.senders:
                self.senders[request.reply_to] = event.container.create_sender(
                    self.conn, request.reply_to
                )
            self.senders[request.reply_to].send(reply)
        self.count -= 1
        if self.count == 0:
            event.connection.close()


def test_request_response_with_reply_to(peer: Peer) -> None:
    peer.declare("requests")
    peer.declare("replies")
    server = _Server(_url(peer), 3, peer.queue("requests"), relay=peer.anonymous_relay)
    thread = threading.Thread(target=Container(server).run, daemon=True)
    thread.start()
    assert server.ready.wait(10)
    conn = connect(peer)
    try:
        sender = conn.create_sender(peer.queue("requests"))
        replies = conn.create_receiver(peer.queue("replies"))
        for i, text in enumerate(["one", "two", "three"]):
            sender.send(Message(body=text, reply_to=peer.queue("replies"), correlation_id=f"r-{i}"))
            reply = replies.receive(timeout=10)
            replies.accept()
            assert (reply.body, reply.correlation_id) == (text.upper(), f"r-{i}")
    finally:
        conn.close()
    thread.join(10)
    assert not thread.is_alive()


def test_dynamic_receiver_is_refused_as_rabbitmq_4_does(broker) -> None:
    """RabbitMQ 4 creates a dynamic source only for the capabilities
    temporary-queue and rabbitmq:volatile-queue, which proton does not ask for
    by itself; without them: amqp:not-implemented
    (rabbit_amqp_session:ensure_source). 4's behaviour is the reference: 3.10's
    plugin refused every dynamic source, ending the session, not the link."""
    conn = connect(broker)
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver(None, dynamic=True)
        assert "amqp:not-implemented" in refusal(info)
        declare(broker, "after")
        conn.create_sender("/queues/after").send(Message(body="the connection goes on"))
    finally:
        conn.close()


class _TemporaryQueue(LinkOption):
    def apply(self, link: Any) -> None:
        link.source.capabilities.put_object(symbol("temporary-queue"))


def test_request_response_with_a_dynamic_reply_queue(broker) -> None:
    """proton's examples/client.py: replies come to a dynamic receiver's
    address, here a temporary queue (RabbitMQ 4's capability: its docs,
    https://www.rabbitmq.com/docs/amqp, are the reference); the queue goes
    with the link."""
    declare(broker, "requests")
    server = _Server(_url(broker), 2)
    thread = threading.Thread(target=Container(server).run, daemon=True)
    thread.start()
    assert server.ready.wait(10)
    conn = connect(broker)
    try:
        replies = conn.create_receiver(None, dynamic=True, options=_TemporaryQueue())
        address = replies.link.remote_source.address
        assert address.startswith("/queues/")
        name = unquote(address.removeprefix("/queues/"))
        assert broker.call(lambda: name in broker.broker.vhosts["/"].queues)
        sender = conn.create_sender("/queues/requests")
        for i, text in enumerate(["ping", "pong"]):
            sender.send(Message(body=text, reply_to=address, correlation_id=f"c-{i}"))
            reply = replies.receive(timeout=10)
            replies.accept()
            assert (reply.body, reply.correlation_id) == (text.upper(), f"c-{i}")
        replies.close()
        assert broker.call(lambda: name not in broker.broker.vhosts["/"].queues)
    finally:
        conn.close()
    thread.join(10)
    assert not thread.is_alive()


class _Coordinator(LinkOption):
    def apply(self, link: Any) -> None:
        link.target.type = Terminus.COORDINATOR


def test_transaction_coordinator_is_refused_as_rabbitmq_4_does(broker) -> None:
    """RabbitMQ 4 has no transaction coordinator: the attach is answered and
    detached with amqp:not-implemented (rabbit_amqp_session:validate_attach;
    4's behaviour is the reference, 3.10's plugin had none either)."""
    conn = connect(broker)
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_sender(None, options=_Coordinator())
        assert "amqp:not-implemented" in refusal(info)
    finally:
        conn.close()


# -- credit and outcomes -------------------------------------------------------------------


class _Credit(MessagingHandler):
    """A receiver that gives 2 credits, then drains: the broker sends what its
    credit allows and no more, and a drain empties the queue. Without
    ``drain``, 3 more credits take the rest."""

    def __init__(self, url: str, peer: Peer, drain: bool = True) -> None:
        super().__init__(prefetch=0)
        self.url, self.peer, self.drain = url, peer, drain
        self.bodies: list[Any] = []
        self.depth_after_two: tuple[int, int | None] | None = None
        self.drained = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            self.url, allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="vhost:/"
        )
        self.receiver = event.container.create_receiver(conn, self.peer.queue("credit"))

    def on_link_opened(self, event: Any) -> None:
        event.receiver.flow(2)

    def on_message(self, event: Any) -> None:
        self.bodies.append(event.message.body)
        if len(self.bodies) == 2:
            # Settled (auto_accept) as the handler returns: the broker keeps 3 ready.
            self.depth_after_two = self.peer.depth("credit")
            if self.drain:
                event.receiver.drain(10)
            else:
                event.receiver.flow(3)
        elif len(self.bodies) == 5 and not self.drain:
            event.connection.close()

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_receiver and self.depth_after_two is not None and not link.drain_mode:
            return
        if link.is_receiver and self.depth_after_two is not None and link.credit == 0:
            self.drained = True
            event.connection.close()


def test_consumer_credit_and_drain(peer: Peer) -> None:
    """Credit: 3.10's plugin is the reference. Drain: the spec and RabbitMQ 4
    (Warren alone): Debian's 3.10.8 drains a classic queue into a channel crash
    (function_clause on send_drained; fixed in 3.10.9, rabbitmq-server commit
    3bb32737ee) and answers a quorum queue's drain with the drained flow
    before the transfers it drained."""
    peer.declare("credit")
    conn = connect(peer)
    try:
        sender = conn.create_sender(peer.queue("credit"))
        for i in range(5):
            sender.send(Message(body=i))
    finally:
        conn.close()
    receiver = _Credit(_url(peer), peer, drain=peer.is_warren)
    Container(receiver).run()
    peer.check_depth("credit", 0, 0)
    assert receiver.depth_after_two is not None
    assert receiver.depth_after_two[0] == 3
    if peer.is_warren:
        assert receiver.depth_after_two == (3, 2)
        assert receiver.drained
    assert receiver.bodies == [0, 1, 2, 3, 4]


def test_accept_removes_the_message(peer: Peer) -> None:
    peer.declare("acc")
    conn = connect(peer)
    try:
        conn.create_sender(peer.queue("acc")).send(Message(body="a"))
        receiver = conn.create_receiver(peer.queue("acc"))
        message = receiver.receive(timeout=10)
        # 3.10's plugin sends no delivery-count (null: proton's 0).
        assert (message.body, message.first_acquirer, message.delivery_count) == ("a", True, 0)
        peer.check_depth("acc", 0, 1)
        receiver.accept()
        # The accept went out before this send: the broker has settled it.
        conn.create_sender(peer.queue("acc"), name="fence").send(Message(body="fence"))
        peer.check_depth("acc", 1, 0)
    finally:
        conn.close()


def test_reject_dead_letters(peer: Peer) -> None:
    peer.declare("dlq")
    peer.declare("work", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    conn = connect(peer)
    try:
        conn.create_sender(peer.queue("work")).send(Message(body="poison"))
        receiver = conn.create_receiver(peer.queue("work"))
        assert receiver.receive(timeout=10).body == "poison"
        receiver.reject()
        dead = conn.create_receiver(peer.queue("dlq")).receive(timeout=10)
        assert dead.body == "poison"
        if peer.is_warren:
            # RabbitMQ 4's x-opt-deaths annotation (4.0's docs: the dead-letter
            # guide's "Dead-Lettered Messages"); 3.10's plugin gives a 1.0
            # consumer no x-death at all.
            (death,) = dead.annotations["x-opt-deaths"]
            assert (death["queue"], death["reason"], death["count"]) == ("work", "rejected", 1)
        peer.check_depth("work", 0, 0)
    finally:
        conn.close()


def test_release_redelivers(peer: Peer) -> None:
    peer.declare("rel")
    conn = connect(peer)
    try:
        conn.create_sender(peer.queue("rel")).send(Message(body="again"))
        receiver = conn.create_receiver(peer.queue("rel"))
        assert receiver.receive(timeout=10).body == "again"
        receiver.release(delivered=False)
        again = receiver.receive(timeout=10)
        # Released is not a failed delivery: the count stays (RabbitMQ 4; 3.10
        # sends none), the redelivery is not the first acquirer (3.10 too).
        assert (again.body, again.first_acquirer, again.delivery_count) == ("again", False, 0)
        receiver.accept()
    finally:
        conn.close()


def _modify_three_times(broker: Any, name: str) -> list[tuple[bool, int]]:
    """Modified with delivery-failed three times: (first-acquirer, delivery-count)
    of each delivery of the one message."""
    conn = connect(broker)
    seen: list[tuple[bool, int]] = []
    try:
        conn.create_sender(f"/queues/{name}").send(Message(body="failing"))
        receiver = conn.create_receiver(f"/queues/{name}")
        for _ in range(3):
            message = receiver.receive(timeout=10)
            assert message.body == "failing"
            seen.append((message.first_acquirer, message.delivery_count))
            receiver.fetcher.unsettled[0].local.failed = True
            receiver.release(delivered=True)  # modified, delivery-failed
        message = receiver.receive(timeout=10)
        seen.append((message.first_acquirer, message.delivery_count))
        receiver.accept()
    finally:
        conn.close()
    return seen


def test_modified_delivery_failed_redelivers_from_a_classic_queue(broker) -> None:
    """RabbitMQ 4's classic queues requeue and keep no delivery count: the
    redeliveries say only that they are not the first acquirer. 4's docs are
    the reference (https://www.rabbitmq.com/docs/amqp#outcomes,
    https://www.rabbitmq.com/blog/2024/10/11/modified-outcome): 3.10's plugin
    knows no modified outcome (the session ends, amqp:invalid-field)."""
    declare(broker, "mod")
    assert _modify_three_times(broker, "mod") == [(True, 0), (False, 0), (False, 0), (False, 0)]


def test_modified_delivery_failed_counts_in_a_quorum_queue(broker) -> None:
    """A quorum queue counts failed deliveries: the header's delivery-count
    (RabbitMQ 4's delivery_count annotation, mc_amqp:update_header_from_anns)."""
    declare(broker, "qmod", **{"x-queue-type": "quorum"})
    assert _modify_three_times(broker, "qmod") == [(True, 0), (False, 1), (False, 2), (False, 3)]


# -- SASL, vhosts, refusals (TLS: test_amqp1_tls.py) -----------------------------------------------------------


def test_wrong_password_is_refused(peer: Peer) -> None:
    with pytest.raises(proton.ConnectionException) as info:
        connect(peer, password="wrong")
    assert "amqp:unauthorized-access" in refusal(info)


def test_vhost_from_the_hostname(broker) -> None:
    def add() -> None:
        broker.broker.add_vhost("v1")
        broker.broker.users.set_permissions("guest", "v1")

    broker.call(add)
    declare(broker, "inside", vhost="v1")
    conn = connect(broker, vhost="v1")
    try:
        conn.create_sender("/queues/inside").send(Message(body="in v1"))
    finally:
        conn.close()
    assert depth(broker, "inside", vhost="v1") == (1, 0)
    with pytest.raises(proton.ConnectionException) as info:
        connect(broker, vhost="nowhere")
    assert "amqp:unauthorized-access" in refusal(info)


def test_missing_queue_is_not_found(broker) -> None:
    """RabbitMQ 4's refusals (https://www.rabbitmq.com/docs/amqp#addresses: the
    queue or exchange must exist). 3.10's plugin attached a sender to a missing
    /amq/queue/Q (its messages went nowhere) and ended the session on a
    receiver's."""
    conn = connect(broker)
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_sender("/queues/missing")
        assert "amqp:not-found" in refusal(info)
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver("/queues/missing")
        assert "amqp:not-found" in refusal(info)
    finally:
        conn.close()


def test_no_permission_is_unauthorized_access(broker) -> None:
    def add() -> None:
        broker.broker.users.add_user("limited", "secret")
        broker.broker.users.set_permissions("limited", "/", "^none$", "^none$", "^none$")

    broker.call(add)
    declare(broker, "guarded")
    conn = connect(broker, user="limited", password="secret")
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_sender("/queues/guarded")
        assert "amqp:unauthorized-access" in refusal(info)
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver("/queues/guarded")
        assert "amqp:unauthorized-access" in refusal(info)
    finally:
        conn.close()
