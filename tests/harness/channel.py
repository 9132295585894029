"""pika's BlockingConnection and BlockingChannel calls, as far as Warren's
tests use them, over an AMQPFrames connection: MemoryAMQP in memory (or
RawAMQP on a socket), every frame encoded and decoded by pamqp.

So a test written with pika for what the broker answers (reply codes, texts,
routing, confirms, returns) moves onto the harness with its assertions as
they were: ``channel_error(406, ch.queue_declare, "q", arguments=...)`` reads
the same. A broker's channel.close raises ChannelClosed (answered with
close-ok, as pika does), its connection.close ConnectionClosed; a mandatory
message returned to a confirming channel raises Unroutable, a nack Nacked.
Anything the broker sends that a call does not expect is an AssertionError,
never skipped.

Differences from pika a test may meet: field tables are pamqp's encoding (an
int goes as the smallest type that holds it, pika sends 32 or 64 bits), and
a call waits for its reply only, so a delivery is read when a call or
``next_delivery`` reads past it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from pamqp import body, commands, header, heartbeat
from rawamqp import AMQPFrames, Frame, body_frame, header_frame, method_frame

if TYPE_CHECKING:
    from harness.broker import Harness

Properties = commands.Basic.Properties


class Message(NamedTuple):
    """A delivered, got or returned message: its method, properties and body
    (pika's ReturnedMessage's names; unpacks as pika's callback arguments)."""

    method: Any
    properties: Properties
    body: bytes


class Method:
    """A synchronous call's reply as pika returns it: ``.method`` is the
    broker's reply (pamqp's, with the spec's field names, as pika's)."""

    def __init__(self, channel_number: int, method: Any) -> None:
        self.channel_number = channel_number
        self.method = method

    def __repr__(self) -> str:
        return f"Method({self.channel_number}, {self.method!r})"


class Closed(Exception):
    """The broker closed the channel or the connection: its code and text."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"({reply_code}, {reply_text!r})")
        self.reply_code = reply_code
        self.reply_text = reply_text


class ChannelClosed(Closed):
    """channel.close from the broker (pika's ChannelClosedByBroker)."""


class ConnectionClosed(Closed):
    """connection.close from the broker (pika's ConnectionClosedByBroker, and
    ProbableAccessDeniedError when it comes at connection.open)."""


class Unroutable(Exception):
    """A mandatory message came back before its confirm (pika's UnroutableError)."""

    def __init__(self, returned: list[Message]) -> None:
        super().__init__(f"{len(returned)} message(s) returned")
        self.messages = returned


class Nacked(Exception):
    """The broker nacked a confirmed publish (pika's NackError)."""


def channel_error(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``fn(*args, **kwargs)`` gets the channel closed with ``code``; the reply
    text (pikahelp.channel_error's shape)."""
    with pytest.raises(ChannelClosed) as info:
        fn(*args, **kwargs)
    assert info.value.reply_code == code, info.value
    return info.value.reply_text


def connection_error(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``fn(*args, **kwargs)`` gets the connection closed with ``code``; the text."""
    with pytest.raises(ConnectionClosed) as info:
        fn(*args, **kwargs)
    assert info.value.reply_code == code, info.value
    return info.value.reply_text


class Connection:
    """An open AMQP connection: channels, and the frames read for them."""

    def __init__(
        self,
        frames: AMQPFrames,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
    ) -> None:
        """The handshake on ``frames``: ConnectionClosed when the broker refuses
        the login or the vhost (at start-ok or at connection.open)."""
        self.frames = frames
        self.channels: dict[int, Channel] = {}
        self.closed: ConnectionClosed | None = None
        self.blocked: list[Any] = []  # connection.blocked and unblocked, in order
        self._numbers = itertools.count(1)
        #: Frames already taken from the transport (pump), read before any more.
        self._pending: list[tuple[int, Frame]] = []
        frames.start_ok(user, password)
        tune = self._connection_reply(commands.Connection.Tune)
        self.frame_max = int(tune.frame_max)
        frames.tune_ok(tune.channel_max, tune.frame_max, 0)
        frames.open(vhost)
        self._connection_reply(commands.Connection.OpenOk)

    @property
    def is_open(self) -> bool:
        return self.closed is None and not self.frames.eof

    def channel(self, channel_number: int | None = None) -> Channel:
        """A new channel (the next free number unless given)."""
        number = channel_number if channel_number is not None else next(self._numbers)
        while channel_number is None and number in self.channels:
            number = next(self._numbers)
        ch = self.channels[number] = Channel(self, number)
        ch.call(commands.Channel.Open(), commands.Channel.OpenOk)
        return ch

    def close(self) -> None:
        if self.is_open:
            self.frames.send_method(
                0,
                commands.Connection.Close(
                    reply_code=200, reply_text="bye", class_id=0, method_id=0
                ),
            )
            while self.is_open:
                ch, frame = self._next_frame()
                if ch == 0 and isinstance(frame, commands.Connection.CloseOk):
                    break
                self._dispatch(ch, frame)
        self.frames.close_socket()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------
    def _connection_reply(self, cls: type[Any]) -> Any:
        while True:
            ch, frame = self._next_frame()
            if isinstance(frame, heartbeat.Heartbeat):
                continue
            if ch == 0 and isinstance(frame, commands.Connection.Close):
                self._closed_by_broker(frame)
            assert ch == 0 and isinstance(frame, cls), (ch, frame)
            return frame

    def _closed_by_broker(self, close: commands.Connection.Close) -> None:
        # A refused login is closed without waiting for close-ok (as RabbitMQ's).
        if not self.frames.eof:
            self.frames.send_method(0, commands.Connection.CloseOk())
        self.closed = ConnectionClosed(int(close.reply_code or 0), close.reply_text)
        raise self.closed

    def read_one(self) -> None:
        """Read one frame (with its content) and give it to its channel."""
        if self.closed is not None:
            raise self.closed
        ch, frame = self._next_frame()
        self._dispatch(ch, frame)

    def pump(self) -> None:
        """Read what the broker has written by the time its loop has nothing
        left to do (Harness.settle), and no more: to show that nothing else
        arrives, where pika's test ran its I/O loop for a while. In memory only."""
        frames: Any = self.frames
        frames.harness.settle()
        self._pending.extend(frames.frames_now())
        while self._pending:
            self.read_one()

    def _next_frame(self) -> tuple[int, Frame]:
        if self._pending:
            return self._pending.pop(0)
        return self.frames.read_frame()

    def _dispatch(self, ch: int, frame: Frame) -> None:
        if isinstance(frame, heartbeat.Heartbeat):
            return
        if ch == 0:
            if isinstance(frame, commands.Connection.Close):
                self._closed_by_broker(frame)
            if isinstance(frame, (commands.Connection.Blocked, commands.Connection.Unblocked)):
                self.blocked.append(frame)
                return
            raise AssertionError(f"unexpected {frame!r} on channel 0")
        channel = self.channels.get(ch)
        assert channel is not None, f"{frame!r} on channel {ch}, which is not open"
        if isinstance(frame, (commands.Basic.Deliver, commands.Basic.Return, commands.Basic.GetOk)):
            message = Message(frame, *self._content(ch))
            if isinstance(frame, commands.Basic.Deliver):
                callback = channel.callbacks.get(str(frame.consumer_tag))
                if callback is not None:
                    callback(channel, *message)
                else:
                    channel.deliveries.append(message)
            elif isinstance(frame, commands.Basic.Return):
                channel.returned.append(message)
            else:
                channel.replies.append(message)
        elif isinstance(frame, commands.Channel.Close):
            self.frames.send_method(ch, commands.Channel.CloseOk())
            channel.closed = ChannelClosed(int(frame.reply_code or 0), frame.reply_text)
        elif isinstance(frame, (commands.Basic.Ack, commands.Basic.Nack)) and channel.confirming:
            channel.confirms.append(frame)
        elif isinstance(frame, commands.Basic.Cancel):
            channel.cancelled.append(str(frame.consumer_tag))
        else:
            channel.replies.append(frame)

    def _content(self, ch: int) -> tuple[Properties, bytes]:
        got_ch, hdr = self._next_frame()
        assert got_ch == ch and isinstance(hdr, header.ContentHeader), (got_ch, hdr)
        data = b""
        while len(data) < hdr.body_size:
            got_ch, part = self._next_frame()
            assert got_ch == ch and isinstance(part, body.ContentBody), (got_ch, part)
            data += part.value
        return hdr.properties, data


class Channel:
    """One channel, with pika's BlockingChannel's calls and results."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.channel_number = number
        self.closed: ChannelClosed | None = None
        self.replies: list[Any] = []
        self.deliveries: list[Message] = []
        self.returned: list[Message] = []
        self.cancelled: list[str] = []  # consumer tags the broker cancelled
        self.confirms: list[Any] = []
        self.callbacks: dict[str, Callable[[Channel, Any, Properties, bytes], Any]] = {}
        self.confirming = False
        self._published = 0  # publish sequence number, in confirm mode
        self._tags = itertools.count(1)

    @property
    def is_open(self) -> bool:
        return self.closed is None and self.connection.is_open

    def call(self, method: Any, reply: type[Any]) -> Any:
        """Send ``method`` and wait for its ``reply`` (ChannelClosed instead, if
        the broker closes the channel)."""
        self._check()
        self.connection.frames.send_method(self.channel_number, method)
        return self._reply(reply)

    def _method(self, method: Any, reply: type[Any]) -> Method:
        return Method(self.channel_number, self.call(method, reply))

    def _check(self) -> None:
        if self.closed is not None:
            raise self.closed
        if self.connection.closed is not None:
            raise self.connection.closed

    def _reply(self, cls: type[Any]) -> Any:
        while not self.replies:
            self._check()
            self.connection.read_one()
        got = self.replies.pop(0)
        method = got.method if isinstance(got, Message) else got
        assert isinstance(method, cls), f"expected {cls.__name__}, got {method!r}"
        return got

    # -- queues and exchanges ------------------------------------------------------------
    def queue_declare(
        self,
        queue: str = "",
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        return self._method(
            commands.Queue.Declare(
                queue=queue,
                passive=passive,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
            ),
            commands.Queue.DeclareOk,
        )

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False) -> Method:
        method = commands.Queue.Delete(queue=queue, if_unused=if_unused, if_empty=if_empty)
        return self._method(method, commands.Queue.DeleteOk)

    def queue_purge(self, queue: str) -> Method:
        return self._method(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk)

    def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        method = commands.Queue.Bind(
            queue=queue,
            exchange=exchange,
            routing_key=queue if routing_key is None else routing_key,
            arguments=arguments,
        )
        return self._method(method, commands.Queue.BindOk)

    def queue_unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        method = commands.Queue.Unbind(
            queue=queue,
            exchange=exchange,
            routing_key=queue if routing_key is None else routing_key,
            arguments=arguments,
        )
        return self._method(method, commands.Queue.UnbindOk)

    def exchange_declare(
        self,
        exchange: str,
        exchange_type: str = "direct",
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        method = commands.Exchange.Declare(
            exchange=exchange,
            exchange_type=exchange_type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        return self._method(method, commands.Exchange.DeclareOk)

    def exchange_delete(self, exchange: str, if_unused: bool = False) -> Method:
        method = commands.Exchange.Delete(exchange=exchange, if_unused=if_unused)
        return self._method(method, commands.Exchange.DeleteOk)

    def exchange_bind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        method = commands.Exchange.Bind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        return self._method(method, commands.Exchange.BindOk)

    def exchange_unbind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> Method:
        method = commands.Exchange.Unbind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        return self._method(method, commands.Exchange.UnbindOk)

    def barrier(self) -> None:
        """A round trip: what was sent before it has been handled (pikahelp's)."""
        self.exchange_declare("amq.direct", passive=True)

    # -- basic ---------------------------------------------------------------------------
    def confirm_delivery(self) -> None:
        self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.confirming = True

    def basic_qos(self, prefetch_count: int = 0, global_qos: bool = False) -> None:
        method = commands.Basic.Qos(prefetch_count=prefetch_count, global_=global_qos)
        self.call(method, commands.Basic.QosOk)

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Properties | None = None,
        mandatory: bool = False,
    ) -> None:
        """Publish; in confirm mode wait for the confirm (Unroutable when the
        message came back first, Nacked for a nack), as pika's BlockingChannel."""
        self._check()
        n = self.channel_number
        method = commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory
        )
        data = method_frame(n, method) + header_frame(n, len(body), properties)
        room = self.connection.frame_max - 8
        for at in range(0, len(body), room):
            data += body_frame(n, body[at : at + room])
        self.connection.frames.send(data)
        if not self.confirming:
            return
        self._published += 1
        tag = self._published
        while True:
            self._check()
            for confirm in self.confirms:
                if confirm.delivery_tag == tag or (confirm.multiple and confirm.delivery_tag > tag):
                    self.confirms.remove(confirm)
                    if isinstance(confirm, commands.Basic.Nack):
                        raise Nacked(f"publish {tag} nacked")
                    if self.returned:
                        returned, self.returned = self.returned, []
                        raise Unroutable(returned)
                    return
            self.connection.read_one()

    def basic_get(
        self, queue: str, auto_ack: bool = False
    ) -> tuple[commands.Basic.GetOk | None, Properties | None, bytes | None]:
        """(get-ok, properties, body), or three Nones for get-empty."""
        self._check()
        method = commands.Basic.Get(queue=queue, no_ack=auto_ack)
        self.connection.frames.send_method(self.channel_number, method)
        while not self.replies:
            self._check()
            self.connection.read_one()
        got = self.replies.pop(0)
        if isinstance(got, commands.Basic.GetEmpty):
            return None, None, None
        assert isinstance(got, Message) and isinstance(got.method, commands.Basic.GetOk), got
        return got.method, got.properties, got.body

    def basic_consume(
        self,
        queue: str,
        on_message_callback: Callable[[Channel, Any, Properties, bytes], Any] | None = None,
        auto_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        """A consumer. Its deliveries go to ``on_message_callback`` as they are
        read (pika calls it from its I/O loop; here whichever call reads the
        delivery does), or without one collect in ``deliveries`` (next_delivery)."""
        tag = consumer_tag or f"ctag{self.channel_number}.{next(self._tags)}"
        method = commands.Basic.Consume(
            queue=queue,
            consumer_tag=tag,
            no_ack=auto_ack,
            exclusive=exclusive,
            arguments=arguments,
        )
        tag = str(self.call(method, commands.Basic.ConsumeOk).consumer_tag)
        if on_message_callback is not None:
            self.callbacks[tag] = on_message_callback
        return tag

    def basic_cancel(self, consumer_tag: str) -> None:
        self.call(commands.Basic.Cancel(consumer_tag=consumer_tag), commands.Basic.CancelOk)
        self.callbacks.pop(consumer_tag, None)

    def next_delivery(self) -> Message:
        """The next delivery to this channel's consumers (read until one comes)."""
        while not self.deliveries:
            self._check()
            self.connection.read_one()
        return self.deliveries.pop(0)

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self._check()
        method = commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple)
        self.connection.frames.send_method(self.channel_number, method)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._check()
        method = commands.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple, requeue=requeue)
        self.connection.frames.send_method(self.channel_number, method)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self._check()
        method = commands.Basic.Reject(delivery_tag=delivery_tag, requeue=requeue)
        self.connection.frames.send_method(self.channel_number, method)

    def close(self) -> None:
        if self.is_open:
            method = commands.Channel.Close(
                reply_code=200, reply_text="bye", class_id=0, method_id=0
            )
            self.call(method, commands.Channel.CloseOk)
            self.closed = ChannelClosed(200, "closed by the client")


def drain(ch: Channel, queue: str) -> list[bytes]:
    """Every body basic.get (auto-ack) finds in ``queue``, in order (pikahelp's)."""
    bodies = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None or body is None:
            return bodies
        bodies.append(body)


def ready_count(ch: Channel, queue: str) -> int:
    """The queue's ready messages, as a passive queue.declare reports them."""
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def wait_until(conn: Connection, predicate: Callable[[], bool]) -> None:
    """Read frames (calling consumers' callbacks) until ``predicate()`` holds
    (pikahelp.wait_until's shape; each read waits for the broker's output, up
    to the connection's timeout, never for a span of time)."""
    while not predicate():
        conn.read_one()


class Session:
    """pikahelp.Session's shape in memory: one connection with a channel
    (``conn``, ``ch``), queues and exchanges declared with unique names. Nothing
    to clean up: each test has a broker of its own."""

    def __init__(self, harness: Harness) -> None:
        self.broker = harness
        self.conn = harness.amqp_connection()
        self.ch = self.conn.channel()

    def connect(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> Connection:
        """Another connection."""
        return self.broker.amqp_connection(user, password, vhost)

    def reopen(self) -> Channel:
        """A fresh default channel after a channel error closed the previous one."""
        self.ch = self.conn.channel()
        return self.ch

    def queue(self, name: str | None = None, **kwargs: Any) -> str:
        """Declare a queue (by default with a unique name) on ``ch``."""
        return str(self.ch.queue_declare(name or uniq(), **kwargs).method.queue)

    def exchange(self, type_: str = "direct", name: str | None = None, **kwargs: Any) -> str:
        """Declare an exchange (by default with a unique name) on ``ch``."""
        name = name or uniq(type_)
        self.ch.exchange_declare(name, type_, **kwargs)
        return name


def uniq(prefix: str = "q") -> str:
    """A name no other test uses: ``test-<prefix>-<random hex>`` (pikahelp.uniq's)."""
    return f"test-{prefix}-{uuid.uuid4().hex[:10]}"
