"""The AMQP 0-9-1 connection as a sans-IO state machine.

``feed(bytes)`` parses every complete frame in one loop and dispatches it; what
the server has to say accumulates in ``pending`` and the transport is asked
once (``on_output``) to flush it all in a single write. Nothing here touches a
socket or a clock: the asyncio protocol in server.py supplies bytes and ticks.
The opening handshake on channel 0 (start, tune, open) is amqp/handshake.py's.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.amqp import handshake, management, spec
from warren.amqp.ack_scan import ACK_FRAME_SIZE, ACK_IDS, NACK_IDS, REJECT_IDS, scan_acks
from warren.amqp.channel import Channel
from warren.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    method_frame,
    unpack_frame_header,
)
from warren.amqp.handshake import State
from warren.amqp.publish_run import scan as scan_publishes
from warren.core.codec_errors import DecodeError, UnknownMethod
from warren.core.erlang_format import binary_w, frame_octets, last_column, tagged_tuple_p
from warren.core.errors import (
    BrokerError,
    ChannelError,
    CommandInvalid,
    FrameError,
    InternalError,
    NotAllowed,
    NotImplemented_,
    UnexpectedFrame,
    clip_reply_text,
)
from warren.core.names import MALFORMED_SHORTSTR, is_valid_utf8, shown
from warren.core.session import ChangeMark, ClientSession
from warren.core.stats import Ages, MessageStats, OctetStats

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.users import User
    from warren.core.vhost import VHost
    from warren.node import Node

log = logging.getLogger("warren.amqp")


# Frames handled per feed() call. A 256 KiB read holds ~3,000 small publishes:
# handling them all in one go holds the loop for tens of milliseconds while
# consumers' acks and the delivery passes wait. Leftover bytes are handled on
# the next loop turn (the protocol stops reading meanwhile), like an Erlang
# process giving up the scheduler after its reductions.
FRAME_BUDGET = 512
_unpack_method_ids = struct.Struct(">HH").unpack_from

# The pre-0-9-1 header of AMQP 0-9 ('AMQP' 1 1 0 9): RabbitMQ treats it as 0-9-1.
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"

# Module globals: an identity test against them is cheaper than State.X per frame.
_OPEN = State.OPEN
_CLOSED = State.CLOSED
_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40
# Single acks (rejects, nacks) a run (amqp/ack_scan.py) may take per frame of the
# budget, and how many of them count as one frame against it: settling them is
# one call.
_ACKS_PER_FRAME = 8
_SINGLE_SETTLE_IDS = (ACK_IDS, REJECT_IDS, NACK_IDS)


class _UnknownFrame(FrameError):
    """A frame-level 501: the close names no method, even for a method frame."""


class _UnexpectedFrame(UnexpectedFrame):
    """A frame-level 505: the close names no method, even for a method frame."""


#: The short string fields of each method but basic.publish (whose exchange and
#: routing key RabbitMQ takes as bytes): the ones checked to be UTF-8.
_SHORTSTRS: dict[type[spec.Method], tuple[str, ...]] = {
    cls: names
    for cls in spec.METHODS.values()
    if cls is not spec.BasicPublish
    and (names := tuple(name for name, kind in cls.FIELDS if kind == "shortstr"))
}


def _unknown_frame(ftype: int, payload: bytes) -> FrameError:
    """RabbitMQ's 501 for a frame it cannot make sense of (its type, its size)."""
    return _UnknownFrame(f"{frame_octets(ftype, bytes(payload))}: unknown_frame")


def _unexpected_frame(ftype: int, payload: bytes) -> UnexpectedFrame:
    """RabbitMQ's 505 for a well-formed frame where none of its kind may come."""
    return _UnexpectedFrame(frame_octets(ftype, bytes(payload)))


class AMQPConnection:
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
        self.connected_at = int(time.time() * 1000)
        self.auth_mechanism = ""
        # Set by the transport: what to do after a close the operator asked for (a
        # deadline for the client's close-ok).
        self.on_forced_close: Callable[[], None] | None = None
        self._on_output = on_output
        self._on_close = on_close
        self.pending: list[bytes] = []
        # Input not handled yet: _buf from _buf_at on (a read is kept whole while
        # FRAME_BUDGET splits it over loop turns, not copied again at each turn).
        self._buf = b""
        self._buf_at = 0
        # True when feed() stopped at FRAME_BUDGET with complete frames left over.
        self.backlog = False
        # Milliseconds since the epoch, set by the transport before each feed(): the
        # timestamp of the messages that read carries (0: Message reads the clock).
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
        self._sent = True
        self._idle_ticks = 0
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
        if out:
            self._sent = True
        return out

    # -- input --------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.state >= State.CLOSED:
            return
        self._received = True
        pos = 0
        if self._buf:
            if not data:  # the rest of an earlier read (drain_backlog): no copy
                data, pos = self._buf, self._buf_at
            elif self._buf_at:
                data = self._buf[self._buf_at :] + data
            else:
                data = self._buf + data
            self._buf = b""
            self._buf_at = 0
        if self._held is not None:
            self._buf, self._buf_at = data, pos  # processed once the held replies are out
            return
        if self.state == State.HEADER:
            if len(data) < 8 and (
                PROTOCOL_HEADER.startswith(data) or PROTOCOL_HEADER_0_9.startswith(data)
            ):
                self._buf = data
                return
            if data[:8] != PROTOCOL_HEADER and data[:8] != PROTOCOL_HEADER_0_9:
                log.warning("%s: bad protocol header %r, closing", self.name, bytes(data[:8]))
                self.send(PROTOCOL_HEADER)
                self.close_transport()
                return
            data = data[8:]
            handshake.send_start(self)
        n = len(data)
        ftype, payload = 0, b""
        budget = FRAME_BUDGET
        self.backlog = False
        channels = self.channels
        try:
            while n - pos >= 7:
                if not budget:
                    # The rest waits for the next loop turn (see FRAME_BUDGET).
                    self.backlog = True
                    break
                budget -= 1
                start = pos
                ftype, ch, size = unpack_frame_header(data, pos)
                end = pos + 7 + size
                # RabbitMQ lets a payload reach frame_max itself (8 octets over the
                # limit: a frequent client mistake) and reports the limit as
                # frame_max - 8.
                if size > self.frame_max and self.frame_max:
                    text = frame_octets(ftype, b"") + ": "
                    ftype = 0  # a frame-level error: no method ids in the close
                    limits = (str(size), str(self.frame_max - 8))
                    tail = tagged_tuple_p("frame_too_large", *limits, column=last_column(text))
                    raise FrameError(text + tail)
                if end >= n:
                    break
                if data[end] != 0xCE:
                    text = frame_octets(ftype, bytes(data[pos + 7 : end])) + ": "
                    ftype = 0
                    marker = tagged_tuple_p(
                        "invalid_frame_end_marker", str(data[end]), column=last_column(text)
                    )
                    raise FrameError(text + marker)
                payload = data[pos + 7 : end]
                pos = end + 1
                if self.state is _OPEN and ch:
                    # The common case first: content and methods on an open channel.
                    channel = channels.get(ch)
                    if channel is not None:
                        if ftype == FRAME_BODY:
                            channel.on_body_frame(payload)
                            continue
                        if ftype == FRAME_METHOD:
                            if payload[:4] == _PUBLISH_IDS and channel.takes_publish_run():
                                # Whole messages to one exchange at once (one routing
                                # key, or several outside a transaction:
                                # amqp/publish_run.py); None: one by one.
                                run = scan_publishes(
                                    data,
                                    start,
                                    self.frame_max,
                                    self.config.max_message_size,
                                    budget // 3 + 1,
                                    not channel.tx,
                                )
                                if run is not None:
                                    channel.publish_run(run)
                                    pos = run.end
                                    budget = max(0, budget - 3 * len(run) + 1)
                                    if self.state is _CLOSED:
                                        pos = n
                                        break
                                    continue
                            method_ids = payload[:4]
                            if (
                                size == ACK_FRAME_SIZE - 8
                                and method_ids in _SINGLE_SETTLE_IDS
                                and channel.takes_ack_run()
                            ):
                                # Single acks (or rejects, or nacks) with consecutive
                                # tags and the same flags, settled at once.
                                count, first, run_end = scan_acks(
                                    data, start, budget * _ACKS_PER_FRAME + 1
                                )
                                if count > 1:
                                    if method_ids == ACK_IDS:
                                        channel.settlement.ack_range(first, count)
                                    else:
                                        channel.settlement.reject_range(
                                            first, count, bytes(method_ids), payload[12]
                                        )
                                    pos = run_end
                                    budget = max(0, budget - count // _ACKS_PER_FRAME)
                                    if self.state is _CLOSED:
                                        pos = n
                                        break
                                    continue
                            channel.on_method_frame(payload)
                            if self.state is _CLOSED:
                                pos = n
                                break
                            if self.holding():
                                break
                            continue
                        if ftype == FRAME_HEADER and len(payload) >= 12:
                            channel.on_header_frame(payload)
                            continue
                if self.state == State.CLOSING:
                    # Only connection.close-ok (or close) matters once we have closed.
                    if ftype == FRAME_METHOD and ch == 0:
                        self._channel0(payload)
                    continue
                if ch and self.state != State.OPEN:
                    # RabbitMQ: nothing but channel 0 before connection.open-ok.
                    raise _unexpected_frame(ftype, payload)
                if ftype == FRAME_METHOD:
                    if ch:
                        channel = self.channels.get(ch)
                        if channel is not None:
                            channel.on_method_frame(payload)
                        else:
                            self._method_on_unopened_channel(ch, payload)
                    else:
                        self._channel0(payload)
                elif ftype == FRAME_HEADER:
                    if len(payload) < 12:  # not even class, weight and body size
                        raise _unknown_frame(ftype, payload)
                    self._content_frame(ch, ftype, payload).on_header_frame(payload)
                elif ftype == FRAME_BODY:
                    self._content_frame(ch, ftype, payload).on_body_frame(payload)
                elif ftype == FRAME_HEARTBEAT:
                    if payload:
                        raise _unknown_frame(ftype, payload)
                    if ch:
                        raise _unexpected_frame(ftype, payload)
                else:
                    raise _unknown_frame(ftype, payload)
                if self.state == State.CLOSED:
                    pos = n
                    break
                if self.holding():
                    break
        except BrokerError as exc:
            # Like RabbitMQ, name the method being handled when the error came from one.
            ids = (0, 0)
            frame_level = isinstance(exc, _UnknownFrame | _UnexpectedFrame)
            if ftype == FRAME_METHOD and len(payload) >= 4 and not frame_level:
                ids = _unpack_method_ids(payload)
            self.connection_error(exc, *ids)
            pos = n
        except Exception:
            log.exception("%s: internal error while handling a frame", self.name)
            self.connection_error(InternalError("internal error"))
            pos = n
        if pos < n:
            self._buf, self._buf_at = data, pos

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
        if self._buf and self.resume_input is not None:
            self.resume_input()

    def _content_frame(self, ch: int, ftype: int, payload: bytes) -> Channel:
        if not ch:
            raise _unexpected_frame(ftype, payload)
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

    def _method_on_unopened_channel(self, ch: int, payload: bytes) -> None:
        if len(payload) < 4:
            raise _unknown_frame(FRAME_METHOD, payload)
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
        if len(payload) < 4:
            raise _unknown_frame(FRAME_METHOD, payload)
        try:
            method = spec.decode_method(payload)
        except UnknownMethod as exc:
            # RabbitMQ's connection crashes here and drops the socket without a word.
            raise NotImplemented_(
                f"unknown method class {exc.class_id} method {exc.method_id}"
            ) from None
        except DecodeError as exc:
            # RabbitMQ answers undecodable method arguments with 501 "cannot decode"
            # and the arguments' octets; the reason goes to the log.
            log.info("%s: cannot decode a method frame: %s", self.name, exc)
            raise FrameError(f"cannot decode {binary_w(bytes(payload[4:]))}") from None
        fields = _SHORTSTRS.get(type(method))
        if fields is not None:
            for field in fields:
                value: str = getattr(method, field)
                if not value.isascii() and not is_valid_utf8(value):
                    # As RabbitMQ: every short string but basic.publish's must be UTF-8
                    # (names, routing keys, tags), or the connection is closed.
                    raise _UnknownFrame(MALFORMED_SHORTSTR)
        return method

    # -- channel 0: the connection class --------------------------------------------------
    def _channel0(self, payload: bytes) -> None:
        method = self._decode(payload)
        state = self.state
        if state == State.CLOSING:
            if isinstance(method, spec.ConnectionCloseOk):
                self.close_transport()
            elif isinstance(method, spec.ConnectionClose):
                self.send_method(0, spec.ConnectionCloseOk())
            return
        if isinstance(method, spec.ConnectionClose):
            log.info(
                "%s: client closed the connection (%s %s)",
                self.name,
                method.reply_code,
                method.reply_text,
            )
            self.send_method(0, spec.ConnectionCloseOk())
            self.close_transport()
            return
        if state == State.START_OK and isinstance(method, spec.ConnectionStartOk):
            handshake.start_ok(self, method)
        elif state == State.TUNE_OK and isinstance(method, spec.ConnectionTuneOk):
            handshake.tune_ok(self, method)
        elif state == State.OPEN_WAIT and isinstance(method, spec.ConnectionOpen):
            handshake.open_vhost(self, method)
        elif state == State.OPEN and isinstance(method, spec.ConnectionCloseOk):
            raise ChannelError("unexpected method in connection state running")
        elif state == State.OPEN and isinstance(method, spec.ConnectionUpdateSecret):
            self.send_method(0, spec.ConnectionUpdateSecretOk())
        elif state == State.OPEN and isinstance(
            method, spec.ConnectionBlocked | spec.ConnectionUnblocked
        ):
            pass  # a client may tell us it is blocked; nothing to do
        elif state == State.OPEN:
            # RabbitMQ's answer to any other method on channel 0 of an open connection.
            raise ChannelError("unexpected method in connection state running")
        else:
            raise CommandInvalid(f"unexpected method {method.NAME} on channel 0")

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
            if ch.unacked:
                ch.check_consumer_timeout(now, default)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        return [
            (ch.vhost.name, ch.stats)
            for ch in self.channels.values()
            if ch.vhost is not None and not ch.closed
        ]

    # -- heartbeats -------------------------------------------------------------------
    def tick(self) -> bool:
        """Called every heartbeat/2 seconds; False when the peer is considered dead."""
        if self.state >= State.CLOSED or not self.heartbeat:
            return self.state < State.CLOSED
        if self._received or self._block_sent:
            # A blocked connection is not read, so its heartbeats cannot count.
            self._received = False
            self._idle_ticks = 0
        else:
            self._idle_ticks += 1
            if self._idle_ticks >= 4:  # two heartbeat intervals with nothing from the peer
                log.warning(
                    "%s: missed heartbeats from client, timeout: %ss", self.name, self.heartbeat
                )
                self.close_transport()
                return False
        if not self._sent and self.state == State.OPEN:
            self.send(HEARTBEAT_FRAME)
        self._sent = False
        return True
