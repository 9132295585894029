"""An AMQP1Connection driven in memory, with Qpid Proton's protocol engine as the client.

Proton's engine (``proton.Connection``, ``proton.Transport``, ``proton.SASL``)
is a complete AMQP 1.0 client that exchanges bytes with whatever the test
wires it to: here the broker's sans-IO connection, on the harness's loop. The
test uses proton's own endpoint API (sessions, senders, receivers, deliveries,
dispositions) and reads proton's view of what the broker did; `pump` moves
the bytes both ways and runs the broker's loop until neither side has more.
``raw`` connections skip proton for a test that writes its own bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import proton

from warren.amqp1.connection import AMQP1Connection

if TYPE_CHECKING:
    from harness.broker import Harness


class MemoryAMQP1:
    """The broker's side: one AMQP1Connection on the harness broker, its output
    gathered as a transport would write it, and whether it asked to close."""

    def __init__(
        self,
        harness: Harness,
        peer: tuple[str, int] = ("127.0.0.1", 45000),
        management: Any = None,
        cert_login: str | None = None,
    ) -> None:
        self.harness = harness
        self.close_asked = False
        self.lost = False
        self.conn: AMQP1Connection = harness.call(
            lambda: AMQP1Connection(
                harness.broker,
                peer,
                ("127.0.0.1", 5672),
                lambda: None,
                self._on_close,
                management=management,
            )
        )
        self.conn.cert_login = cert_login

    def _on_close(self) -> None:
        self.close_asked = True

    def feed(self, data: bytes) -> None:
        conn = self.conn

        def feed() -> None:
            conn.now_ms = self.harness.broker.clock.now_ms()
            conn.feed(data)

        self.harness.call(feed)

    def take(self) -> bytes:
        """What the connection wrote; once it asked to close and its output is
        out, the transport is lost (as a socket's close)."""
        out = self.harness.call(self.conn.take_output)
        data = b"".join(out)
        if self.close_asked and not self.lost:
            self.lost = True
            self.harness.call(self.conn.connection_lost)
        return data

    def exchange(self, data: bytes) -> bytes:
        """Feed ``data``, run the loop, return the answer."""
        if data:
            self.feed(data)
        self.harness.settle()
        return self.take()


class ProtonClient:
    """Proton's engine on one side, the broker's connection on the other."""

    def __init__(
        self,
        harness: Harness,
        user: str | None = "guest",
        password: str | None = "guest",
        mechs: str | None = "PLAIN",
        hostname: str | None = "vhost:/",
        container: str = "proton-test",
        idle_timeout: float | None = None,
        max_frame_size: int | None = None,
        **broker: Any,
    ) -> None:
        self.harness = harness
        self.broker = MemoryAMQP1(harness, **broker)
        self.connection = proton.Connection()
        self.connection.container = container
        if hostname is not None:
            self.connection.hostname = hostname
        self.transport = proton.Transport()
        if max_frame_size is not None:
            self.transport.max_frame_size = max_frame_size
        if idle_timeout is not None:
            self.transport.idle_timeout = idle_timeout
        if mechs is not None:
            sasl = self.transport.sasl()
            sasl.allowed_mechs(mechs)
            sasl.allow_insecure_mechs = True
            if user is not None:
                self.connection.user = user
            if password is not None:
                self.connection.password = password
        self.transport.bind(self.connection)
        self.collector = proton.Collector()
        self.connection.collect(self.collector)
        self.events: list[proton.Event] = []
        #: Everything the broker wrote, for tests that look at the bytes.
        self.received = bytearray()

    @property
    def conn(self) -> AMQP1Connection:
        return self.broker.conn

    def pump(self, rounds: int = 50, ready_only: bool = False) -> None:
        """Move bytes both ways and run the broker's loop until neither side moves
        (``ready_only``: without waiting for a file sync round in flight)."""
        transport = self.transport
        run = self.harness.run_ready if ready_only else self.harness.settle
        for _ in range(rounds):
            moved = False
            pending = transport.pending()
            if pending > 0:
                data = transport.peek(pending)
                transport.pop(pending)
                if not self.broker.lost:
                    self.broker.feed(data)
                moved = True
            run()
            out = self.broker.take()
            if out:
                self.received += out
                self._push(out)
                moved = True
            elif self.broker.lost and transport.capacity() >= 0:
                transport.close_tail()
                moved = True
            while (event := self.collector.peek()) is not None:
                self.events.append(event)
                self.collector.pop()
            if not moved:
                return

    def _push(self, data: bytes) -> None:
        """Into proton's transport, as much at a time as it has room for."""
        transport = self.transport
        view = memoryview(data)
        while view:
            room = transport.capacity()
            if room <= 0:
                return  # closed for input
            transport.push(bytes(view[:room]))
            view = view[room:]

    def open(self) -> ProtonClient:
        self.connection.open()
        self.pump()
        return self

    def session(self) -> proton.Session:
        session = self.connection.session()
        session.open()
        self.pump()
        return session

    def sender(
        self,
        address: str | None,
        session: proton.Session | None = None,
        settled: bool = False,
        name: str = "sender",
    ) -> proton.Sender:
        session = session or self.session()
        sender = session.sender(name)
        if address is not None:
            sender.target.address = address
        if settled:
            sender.snd_settle_mode = proton.Link.SND_SETTLED
        sender.open()
        self.pump()
        return sender

    def receiver(
        self,
        address: str,
        session: proton.Session | None = None,
        credit: int = 0,
        settled: bool = False,
        name: str = "receiver",
        configure: Callable[[proton.Receiver], None] | None = None,
    ) -> proton.Receiver:
        session = session or self.session()
        receiver = session.receiver(name)
        receiver.source.address = address
        if settled:
            receiver.snd_settle_mode = proton.Link.SND_SETTLED
        if configure is not None:
            configure(receiver)
        receiver.open()
        if credit:
            receiver.flow(credit)
        self.pump()
        return receiver

    def send(
        self, sender: proton.Sender, message: proton.Message, tag: str | None = None
    ) -> proton.Delivery:
        """One message on ``sender`` (pre-settled on a settled link)."""
        tag = tag or f"t{len(self.events)}-{id(message)}"
        delivery = sender.delivery(tag)
        sender.send(message.encode())
        sender.advance()
        if sender.snd_settle_mode == proton.Link.SND_SETTLED:
            delivery.settle()
        self.pump()
        return delivery

    def receive(self, receiver: proton.Receiver) -> list[tuple[proton.Delivery, proton.Message]]:
        """The complete deliveries waiting on ``receiver``, decoded."""
        got = []
        while (delivery := receiver.current) is not None and not delivery.partial:
            data = receiver.recv(delivery.pending)
            receiver.advance()
            message = proton.Message()
            message.decode(data)
            got.append((delivery, message))
        return got

    def settle(self, delivery: proton.Delivery, outcome: int = proton.Delivery.ACCEPTED) -> None:
        delivery.update(outcome)
        delivery.settle()
        self.pump()

    def close(self) -> None:
        self.connection.close()
        self.pump()

    @property
    def remote_condition(self) -> proton.Condition | None:
        return self.connection.remote_condition
