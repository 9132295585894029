"""The AMQP 0-9-1 connection as a sans-IO state machine.

``feed(bytes)`` hands the bytes to the connection's FrameLoop (amqp/frame_loop.py),
which parses every complete frame in one loop and dispatches it; what the
server has to say accumulates in ``pending`` and the transport is asked once
(``on_output``) to flush it all in a single write. Nothing here touches a
socket or a clock: the asyncio protocol in server.py supplies bytes and ticks.
Channel 0 (start, tune, open, close) is amqp/handshake.py's, with the broker's
BrokerGate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.amqp import handshake, management, spec
from warren.amqp.channel import Channel
from warren.amqp.frame_loop import (
    FrameHandler,
    FrameLoop,
    decode_method,
    unexpected_frame,
    unknown_frame,
)
from warren.amqp.frames import FRAME_HEADER, FRAME_METHOD, HEARTBEAT_FRAME, method_frame
from warren.amqp.handshake import State
from warren.core.errors import (
    BrokerError,
    ChannelError,
    CommandInvalid,
    NotAllowed,
    UnexpectedFrame,
    clip_reply_text,
)
from warren.core.names import shown
from warren.core.session import ChangeMark, ClientSession
from warren.core.stats import Ages, MessageStats, OctetStats

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.users import User
    from warren.core.vhost import VHost
    from warren.node import Node

log = logging.getLogger("warren.amqp")


class AMQPConnection(FrameHandler):
    """One client's AMQP 0-9-1 connection to the broker."""

    def __init__(
        self,
        broker: Node,
        peer: tuple[str, int] | None,
        on_output: Callable[[], None],
        on_close: Callable[[], None],
    ) -> None:
        self.broker = broker
        self.config = broker.config
        self.peer = peer
        self.name = f"{peer[0]}:{peer[1]}" if peer else "local"
        #: The client's session with the core: when answers may go out.
        self.client_session = ClientSession(broker, self)
        # The server side of the socket (set by the transport) and when it was accepted
        # (ms since the epoch), for the management API's connection listing.
        self.local: tuple[str, int] | None = None
        #: The TLS protocol version in use (e.g. "TLSv1.3"), None over plain TCP.
        self.tls_version: str | None = None
        #: The user a verified client certificate names (set by the transport from
        #: the TLS connection, warren.tls.cert_login): None without one, "" when the
        #: certificate has no usable name. Not None: EXTERNAL is offered.
        self.cert_login: str | None = None
        self.connected_at = broker.clock.now_ms()
        self.auth_mechanism = ""
        # Set by the transport: what to do after a close the operator asked for (a
        # deadline for the client's close-ok).
        self.on_forced_close: Callable[[], None] | None = None
        self._on_output = on_output
        self._on_close = on_close
        self.pending: list[bytes] = []
        self.frames = FrameLoop(self, self.config.max_message_size)
        #: The broker's side of the handshake (amqp/handshake.py).
        self.gate = handshake.BrokerGate(self)
        # The broker clock's ms, set by the transport before each feed(): the
        # timestamp of the messages that read carries (0: a publish reads the clock).
        self.now_ms = 0
        #: Bytes in and out (the asyncio layer counts them), for the management API.
        self.octets = OctetStats()
        self.state = State.HEADER
        self.channels: dict[int, Channel] = {}
        self.channel_max = self.config.channel_max
        self.frame_max = self.config.frame_max
        self.heartbeat = self.config.heartbeat
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.user: User | None = None
        self.vhost: VHost | None = None
        self.writable = True
        # Resource alarms (memory, free disk): a publishing connection is blocked (connection.blocked and
        # no more reads) until the alarm clears, as RabbitMQ does.
        self.blocked = False
        self.has_published = False
        self._block_sent = False
        self.reading_control: Callable[[bool], None] | None = None
        #: Set by the transport: process input kept in the buffer (after a hold).
        self.resume_input: Callable[[], None] | None = None
        # Replies to a definitions change waiting for the cluster's followers
        # (hold_replies); no input is processed meanwhile, so replies stay in order.
        self._held: list[bytes] | None = None
        #: Whether this connection's use of global QoS, a deprecated feature, was
        #: logged (once per connection; RabbitMQ logs it once a day).
        self.global_qos_logged = False
        self._received = True
        #: Heartbeat checks (tick): how many, the receiver's in a row with nothing
        #: read, and send_oct at the last one (-1: the first one sends, as RabbitMQ's).
        self._ticks = 0
        self._idle_checks = 0
        self._sent_at_tick = -1
        self.dirty_channels: set[Channel] = set()

    # -- output -------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        held = self._held
        if held is not None:  # behind a held reply: nothing may overtake it
            held.append(data)
            return
        if not self.pending and not self.dirty_channels:
            self._on_output()
        self.pending.append(data)

    def send_many(self, chunks: list[bytes]) -> None:
        held = self._held
        if held is not None:
            held.extend(chunks)
            return
        if not self.pending and not self.dirty_channels:
            self._on_output()
        self.pending.extend(chunks)

    def mark_dirty(self, channel: Channel) -> None:
        """The channel has confirms to coalesce before the next write."""
        if not self.pending and not self.dirty_channels:
            self._on_output()
        self.dirty_channels.add(channel)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.send(method_frame(channel, method))

    def take_output(self) -> list[bytes]:
        """What to write now; flushes coalesced confirms first."""
        if self.dirty_channels:
            if self.vhost is not None:
                # Confirms promise the message reached at least the OS: write out
                # the stores this turn touched before the confirms go out.
                self.vhost.flush_written()
            dirty, self.dirty_channels = self.dirty_channels, set()
            for ch in dirty:
                ch.confirms.flush()
        out, self.pending = self.pending, []
        return out

    # -- input --------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.frames.feed(data)

    @property
    def backlog(self) -> bool:
        """True when feed() stopped at the frame budget with complete frames left over."""
        return self.frames.backlog

    def send_start(self) -> None:
        handshake.send_start(self)

    def holding(self) -> bool:
        """Whether replies are held (a method, not an attribute test: mypy, and so
        mypyc, would take feed()'s early check as true for the rest of it)."""
        return self._held is not None

    def hold_replies(self, mark: ChangeMark, output_mark: int) -> None:
        """Hold the output since ``output_mark`` (a definitions change's reply)
        until the changes made since ``mark`` are durable (the session's rule);
        reading and processing input stop meanwhile, and whatever is sent in
        between (a consumer's basic.cancel after a queue.delete-ok,
        deliveries) queues behind it: nothing overtakes the reply."""
        if self._held is not None or self.state >= State.CLOSED:
            return
        held = self.pending[output_mark:]
        del self.pending[output_mark:]
        self._held = held
        if not self.client_session.when_changes_durable(mark, self._changes_durable):
            self._held = None
            self.pending.extend(held)
            return
        if self._held is not None and self.reading_control is not None:
            self.reading_control(False)

    def _changes_durable(self, ok: bool) -> None:
        self._release_replies()

    def _release_replies(self) -> None:
        held, self._held = self._held, None
        if held is None or self.state >= State.CLOSED:
            return
        if held:
            self.send_many(held)
        if self.reading_control is not None and not self._block_sent:
            self.reading_control(True)
        if self.frames.has_input() and self.resume_input is not None:
            self.resume_input()

    def content_frame(self, ch: int, ftype: int, payload: bytes) -> None:
        channel = self._content_channel(ch, ftype, payload)
        if ftype == FRAME_HEADER:
            channel.publishing.on_header_frame(payload)
        else:
            channel.publishing.on_body_frame(payload)

    def _content_channel(self, ch: int, ftype: int, payload: bytes) -> Channel:
        if not ch:
            raise unexpected_frame(ftype, payload)
        channel = self.channels.get(ch)
        if channel is None:
            # RabbitMQ takes any frame as the start of a channel; content cannot be.
            self._check_channel_count()
            raise UnexpectedFrame("expected method frame, got non method frame instead")
        return channel

    def _check_channel_count(self) -> None:
        # RabbitMQ limits how many channels are open, not the channel number; the
        # close is sent with class/method 0/0, naming no method. Then the user's
        # max-channels, over all of its connections (rabbit_reader's order).
        if self.channel_max and len(self.channels) >= self.channel_max:
            raise NotAllowed(
                f"number of channels opened ({len(self.channels)}) has reached the "
                f"negotiated channel_max ({self.channel_max})"
            )
        if self.user is not None and self.user.limits:
            self.broker.users.check_channel_limit(self.user)

    def method_on_unopened_channel(self, ch: int, payload: bytes) -> None:
        if len(payload) < 4:
            raise unknown_frame(FRAME_METHOD, payload)
        try:
            self._check_channel_count()
        except NotAllowed as exc:
            self.connection_error(exc)
            return
        method = self._decode(payload)
        if not isinstance(method, spec.ChannelOpen):
            raise ChannelError("expected 'channel.open'")
        channel = Channel(self, ch)
        self.channels[ch] = channel
        self.send_method(ch, spec.ChannelOpenOk())

    def _decode(self, payload: bytes) -> spec.Method:
        return decode_method(self.name, payload)

    # -- channel 0: the connection class --------------------------------------------------
    def channel0(self, payload: bytes) -> None:
        handshake.channel0(self, self._decode(payload))

    # -- errors and closing ---------------------------------------------------------------
    def connection_error(self, exc: BrokerError, class_id: int = 0, method_id: int = 0) -> None:
        if self.state >= State.CLOSING:
            return
        if not exc.hard:
            exc = CommandInvalid(exc.reply_text)
        # shown(): a name a client sent may hold bytes that are not UTF-8.
        log.warning("%s: closing connection: %s %s", self.name, exc.code, shown(exc.reply_text))
        if self.state < State.OPEN_WAIT and self.state != State.TUNE_OK:
            self.close_transport()
            return
        self.send_method(
            0,
            spec.ConnectionClose(
                reply_code=exc.code,
                reply_text=clip_reply_text(exc.reply_text),
                class_id=class_id,
                method_id=method_id,
            ),
        )
        self._begin_closing()

    def close(
        self,
        code: int = 320,
        text: str = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
    ) -> None:
        """Server-initiated close (shutdown, management API)."""
        if self.state >= State.CLOSING:
            return
        if self.state < State.OPEN_WAIT:
            self.close_transport()
            return
        self.send_method(
            0, spec.ConnectionClose(reply_code=code, reply_text=text, class_id=0, method_id=0)
        )
        self._begin_closing()

    # -- the management API (warren.node.ClientConnection) --------------------------------
    def info(self) -> dict[str, Any]:
        return management.connection_info(self)

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        return management.channels_info(self, ages)

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        """Each open channel's name, vhost and counts by exchange and queue (the
        metrics' per-channel series)."""
        return management.channel_counts(self)

    def force_close(self, reason: str) -> None:
        """320 CONNECTION_FORCED with the operator's reason, as RabbitMQ's management."""
        self.close(320, clip_reply_text(f"CONNECTION_FORCED - {reason}"))
        if self.on_forced_close is not None:
            self.on_forced_close()

    def _begin_closing(self) -> None:
        self.state = State.CLOSING
        self._release_resources()

    def close_transport(self) -> None:
        if self.state == State.CLOSED:
            return
        self._release_resources()
        self.state = State.CLOSED
        self._on_close()

    def _release_resources(self) -> None:
        """Channels close, unacked messages are requeued, exclusive queues go."""
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            ch.release()
        if self.vhost is not None:
            self.client_session.closed(self, self.vhost)
            self.vhost = None

    def connection_lost(self) -> None:
        """The transport is gone (peer vanished, or we closed it)."""
        if self.state != State.CLOSED:
            if self.state == State.OPEN:
                log.info("%s: client closed the socket without connection.close", self.name)
            self._release_resources()
            self.state = State.CLOSED

    def set_blocked(self, blocked: bool) -> None:
        if blocked == self.blocked:
            return
        self.blocked = blocked
        if blocked:
            if self.has_published:
                self.block_now()
            return
        if self._block_sent:
            self._block_sent = False
            if self.capabilities.get("connection.blocked") and self.state == State.OPEN:
                self.send_method(0, spec.ConnectionUnblocked())
            if self.reading_control is not None:
                self.reading_control(True)

    def block_now(self) -> None:
        """Stop reading from a publisher while the alarm lasts (once per alarm)."""
        if self._block_sent:
            return
        self._block_sent = True
        reason = self.broker.blocked_reason()
        log.info("%s: blocking publisher: %s", self.name, reason)
        if self.capabilities.get("connection.blocked"):
            self.send_method(0, spec.ConnectionBlocked(reason=reason))
        if self.reading_control is not None:
            self.reading_control(False)

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            for ch in list(self.channels.values()):
                ch.resume_delivery()

    def check_consumer_timeouts(self, now: int, default: int) -> None:
        if self.state >= State.CLOSED:
            return
        for ch in list(self.channels.values()):
            if ch.deliveries.unsettled:
                ch.check_consumer_timeout(now, default)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        return [
            (ch.vhost.name, ch.stats)
            for ch in self.channels.values()
            if ch.vhost is not None and not ch.closed
        ]

    # -- heartbeats -------------------------------------------------------------------
    def tick(self) -> bool:
        """Called every heartbeat/2 seconds; False when the peer is considered dead.

        As RabbitMQ's two heartbeaters (checked against 3.10 with heartbeat=1):
        every call is the sender's check, which sends a heartbeat when no octet
        went out since the previous one; the heartbeat itself is not such an
        octet, so an idle connection gets one every half interval. Every other
        call is the receiver's check, which closes the connection at the second
        check in a row with nothing read: 2 to 3 intervals after the last frame.
        """
        if self.state >= State.CLOSED or not self.heartbeat:
            return self.state < State.CLOSED
        self._ticks += 1
        if not self._ticks & 1:
            if self._received or self._block_sent:
                # A blocked connection is not read, so its heartbeats cannot count.
                self._received = False
                self._idle_checks = 0
            else:
                self._idle_checks += 1
                if self._idle_checks >= 2:
                    log.warning(
                        "%s: missed heartbeats from client, timeout: %ss",
                        self.name,
                        self.heartbeat,
                    )
                    self.close_transport()
                    return False
        sent = self.octets.send_oct
        last = self._sent_at_tick
        if self.state == State.OPEN and (sent == last or last < 0):
            self.send(HEARTBEAT_FRAME)
            sent += len(HEARTBEAT_FRAME)  # flushed before the next check
        self._sent_at_tick = sent
        return True
