"""The sans-IO stream protocol connection: bytes in, core calls, bytes out.

`StreamConnection.feed(data)` splits frames (frames.py), decodes them
(commands.py) and acts on them; what goes to the client is gathered in
``pending`` and announced once through ``on_output``, as the AMQP 1.0 and
MQTT connections do. No socket and no clock of its own: the caller sets
``now_ms`` per read and calls `tick` for the heartbeat (server.py, on the
broker's clock).

This module is the connection's own part, in RabbitMQ's order (its
rabbit_stream_reader): PeerProperties, SaslHandshake, SaslAuthenticate (PLAIN,
ANONYMOUS when ``[stream] allow_anonymous``, EXTERNAL with a verified client
certificate), Tune (frame_max and heartbeat: the smaller non-zero of both
sides), Open (the vhost; advertised_host/advertised_port in its answer),
Heartbeat, and Close both ways. Until Open succeeds a frame may be at most
INITIAL_FRAME_MAX bytes. A client that breaks the protocol before Open is
cut off (RabbitMQ's ``failure``); after it, it gets a Close with the code.
The commands of an open connection are control.py's. Logins, vhost limits
and permissions are the client session's (core/session.py).
"""

from __future__ import annotations

import logging
import platform
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from warren import __version__
from warren.client_listing import connection_listing, connection_name
from warren.core.session import ChangeMark, ClientSession, LoginRefused
from warren.core.stats import Ages, MessageStats, OctetStats
from warren.node import node_name
from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import INITIAL_FRAME_MAX, ResponseCode
from warren.stream_protocol.control import ControlPlane
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.messages import RawMessages, StreamMessageCodec
from warren.stream_protocol.single_active import ACTIVE
from warren.stream_protocol.wire import StreamProtocolError

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.clock import TimerHandle
    from warren.core.users import User
    from warren.core.vhost import VHost
    from warren.node import Node

__all__ = ["StreamConnection", "negotiate"]

log = logging.getLogger("warren.stream")

PLAIN: Final = "PLAIN"
ANONYMOUS: Final = "ANONYMOUS"
EXTERNAL: Final = "EXTERNAL"

#: ms a client has to answer this side's Close (RabbitMQ's
#: connection_negotiation_step_timeout).
CLOSING_TIMEOUT_MS: Final = 10_000
#: Heartbeat intervals of silence after which the client is taken for dead
#: (rabbit_heartbeat's receiver, as for AMQP 0-9-1).
MISSED_HEARTBEATS: Final = 2

# Connection states, in order.
STARTING: Final = 0  # PeerProperties, SASL
AUTHENTICATED: Final = 1  # Tune sent, waiting for the client's and for Open
OPEN: Final = 2
CLOSE_SENT: Final = 3  # this side's Close is out, waiting for the answer
CLOSED: Final = 4

_HEARTBEAT: Final = c.Heartbeat().encode()


def negotiate(client: int, server: int) -> int:
    """Tune's rule for frame_max and heartbeat: 0 on one side means "no
    limit", so the other side's value; else the smaller."""
    if client == 0:
        return server
    if server == 0:
        return client
    return min(client, server)


class _Reply:
    """An answer held until the change it reports is durable."""

    __slots__ = ("data", "ready")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.ready = False


class StreamConnection:
    """One client's stream protocol connection; a ClientConnection for the broker."""

    def __init__(
        self,
        node: Node,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
        on_output: Callable[[], None],
        on_close: Callable[[], None],
        transport_name: str = "stream",
        advertised: tuple[str, int] | None = None,
        messages: StreamMessageCodec | None = None,
    ) -> None:
        self.node = node
        self.messages: StreamMessageCodec = messages or RawMessages()
        self.config = node.config
        self.peer = peer
        self.local = local
        self.on_output = on_output
        self.on_close = on_close
        self.transport_name = transport_name
        #: (host, port) told to the client in Open's answer and in Metadata.
        self.advertised = advertised or _advertised(self.config, local)
        #: The user a verified TLS client certificate names (set by the transport).
        self.cert_login: str | None = None
        #: Pause/resume reading from the socket (set by the transport).
        self.reading_control: Callable[[bool], None] | None = None
        self.reader = FrameReader(INITIAL_FRAME_MAX)
        self.state = STARTING
        self.octets = OctetStats()
        self.stats = MessageStats()
        self.client_session = ClientSession(node, self)
        self.control = ControlPlane(self)
        self.pending: list[bytes] = []
        self.user: User | None = None
        self.vhost: VHost | None = None
        self.auth_mechanism = ""
        self.client_properties: dict[str, str] = {}
        self.now_ms = 0
        self.connected_at = node.clock.now_ms()
        self.last_rx_ms = self.connected_at
        self.last_tx_ms = self.connected_at
        #: What this side proposes in Tune, then what was agreed.
        self.frame_max: int = self.config.stream_frame_max
        self.heartbeat: int = self.config.stream_heartbeat
        self.tuned = False
        self.closed = False
        self.writable = True
        #: A refused login waiting out its delay: input is ignored meanwhile.
        self.refusing = False
        #: Not read from during a resource alarm: its silence is not the client's.
        self.paused = False
        self._opened_vhost = False
        self._replies: deque[_Reply] = deque()
        self._closing_timer: TimerHandle | None = None
        self._close_correlation = 0

    # -- the sans-IO surface ----------------------------------------------------------
    @property
    def name(self) -> str:
        return connection_name(self.peer, self.local)

    def send(self, data: bytes) -> None:
        pending = self.pending
        pending.append(data)
        self.last_tx_ms = self.now_ms
        if len(pending) == 1:
            self.on_output()

    def send_command(self, command: c.Command) -> None:
        self.send(command.encode())

    def reply_after(self, mark: ChangeMark, command: c.Command) -> None:
        """Answer ``command`` once the definitions changed since ``mark`` are
        durable, and after the answers held before it."""
        reply = _Reply(command.encode())
        self._replies.append(reply)

        def durable(ok: bool) -> None:
            if not ok:
                log.error("%s: a change could not be synced to disk", self.name)
            reply.ready = True
            self._flush_replies()

        if not self.client_session.when_changes_durable(mark, durable):
            reply.ready = True
            self._flush_replies()

    def reply(self, command: c.Command) -> None:
        """Answer at once, unless answers wait before it (then in turn)."""
        if self._replies:
            reply = _Reply(command.encode())
            reply.ready = True
            self._replies.append(reply)
            self._flush_replies()
        else:
            self.send_command(command)

    def _flush_replies(self) -> None:
        replies = self._replies
        while replies and replies[0].ready:
            data = replies.popleft().data
            if not self.closed:
                self.send(data)

    def take_output(self) -> list[bytes]:
        self.control.before_output()
        out, self.pending = self.pending, []
        return out

    def feed(self, data: bytes) -> None:
        """Act on the frames ``data`` completes."""
        if self.closed or self.refusing or not data:
            return
        self.last_rx_ms = self.now_ms
        try:
            frames = self.reader.feed(data)
        except StreamProtocolError as exc:
            self._protocol_error(exc)
            return
        try:
            for frame in frames:
                if self.closed or self.refusing:
                    return
                try:
                    command = decode_frame(frame)
                except StreamProtocolError as exc:
                    self._protocol_error(exc)
                    return
                try:
                    self._command(command)
                except StreamProtocolError as exc:
                    self._protocol_error(exc)
                    return
        finally:
            # The read's Publish frames, merged into one chunk per stream.
            self.control.publishing.flush()

    def _protocol_error(self, exc: StreamProtocolError) -> None:
        """A frame too large, unknown or malformed: before Open the client is
        cut off; after, it gets a Close with the code (RabbitMQ's texts)."""
        log.warning("%s: stream protocol error: %s", self.name, exc)
        if self.state < OPEN:
            self.close_transport()
        elif exc.code == ResponseCode.FRAME_TOO_LARGE:
            self.close(ResponseCode.FRAME_TOO_LARGE, "frame too large")
        else:
            self.close(exc.code, "unknown frame")

    def close(self, code: int, reason: str) -> None:
        """Send Close; the transport closes once the client answers (or after
        CLOSING_TIMEOUT_MS)."""
        if self.state >= CLOSE_SENT:
            return
        self.state = CLOSE_SENT
        self.control.closed()
        self._close_correlation = 1
        self.send_command(c.Close(1, int(code), reason))
        self._closing_timer = self.node.clock.call_later(CLOSING_TIMEOUT_MS, self.close_transport)

    def close_transport(self) -> None:
        """The transport closes once the output is written (on_close)."""
        if self.closed:
            return
        self.closed = True
        self.state = CLOSED
        self._cancel_closing_timer()
        self.control.closed()
        self.on_close()

    def connection_lost(self) -> None:
        """The transport is gone: publishers and subscriptions go, the
        connection leaves the listing."""
        self.closed = True
        self.state = CLOSED
        self._cancel_closing_timer()
        self.control.closed()
        self._replies.clear()
        if self._opened_vhost and self.vhost is not None:
            self._opened_vhost = False
            self.client_session.closed(self, self.vhost)

    def _cancel_closing_timer(self) -> None:
        if self._closing_timer is not None:
            self._closing_timer.cancel()
            self._closing_timer = None

    def tick(self, now_ms: int) -> int:
        """The heartbeat, once tuned: a Heartbeat frame when nothing went out
        for an interval, the end of the connection when nothing came in for
        MISSED_HEARTBEATS of them. The ms until the next check (0: none)."""
        if self.closed or not self.tuned or not self.heartbeat or self.state >= CLOSE_SENT:
            return 0
        interval = self.heartbeat * 1000
        if self.paused:
            self.last_rx_ms = now_ms
        deadline = self.last_rx_ms + interval * MISSED_HEARTBEATS
        if now_ms >= deadline:
            log.warning("%s: stream connection missed heartbeats, closing", self.name)
            self.close_transport()
            return 0
        self.now_ms = now_ms
        self.control.check_gone()
        if now_ms - self.last_tx_ms >= interval:
            self.send(_HEARTBEAT)
        next_send = self.last_tx_ms + interval - now_ms
        return max(min(deadline - now_ms, next_send), 1)

    # -- dispatch -----------------------------------------------------------------------
    def _command(self, command: c.Command) -> None:
        state = self.state
        if isinstance(command, c.Heartbeat):
            return
        if state == OPEN:
            if isinstance(command, c.Close):
                self._closed_by_client(command)
            elif isinstance(command, (c.Tune, c.TuneResponse, c.Open, c.SaslHandshake)):
                raise StreamProtocolError(f"{type(command).__name__} on an open connection")
            elif isinstance(command, c.PeerProperties):
                raise StreamProtocolError("PeerProperties on an open connection")
            elif isinstance(command, c.SaslAuthenticate):
                self._reauthenticate(command)
            else:
                self.control.handle(command)
            return
        if state == CLOSE_SENT:
            if isinstance(command, c.CloseResponse):
                self.close_transport()
            elif isinstance(command, c.Close):
                self.send_command(c.CloseResponse(command.correlation_id))
                self.close_transport()
            return  # anything else is ignored while closing, as RabbitMQ
        if isinstance(command, c.PeerProperties) and state == STARTING:
            self.client_properties = dict(command.properties)
            self.send_command(
                c.PeerPropertiesResponse(
                    command.correlation_id, ResponseCode.OK, self._server_properties()
                )
            )
        elif isinstance(command, c.SaslHandshake) and state == STARTING:
            self.send_command(
                c.SaslHandshakeResponse(command.correlation_id, ResponseCode.OK, self._mechanisms())
            )
        elif isinstance(command, c.SaslAuthenticate) and state == STARTING:
            self._authenticate(command)
        elif isinstance(command, (c.Tune, c.TuneResponse)) and state == AUTHENTICATED:
            # rstream sends its answer as a request, other clients as a response.
            self.frame_max = negotiate(command.frame_max, self.frame_max)
            self.heartbeat = negotiate(command.heartbeat, self.heartbeat)
            self.tuned = True
        elif isinstance(command, c.Open) and state == AUTHENTICATED:
            self._open(command)
        elif isinstance(command, c.Close):
            self.send_command(c.CloseResponse(command.correlation_id))
            self.close_transport()
        else:
            log.warning(
                "%s: stream protocol %s before the connection is open, closing",
                self.name,
                type(command).__name__,
            )
            self.close_transport()

    # -- handshake ----------------------------------------------------------------------
    def _server_properties(self) -> dict[str, str]:
        return {
            "product": "Warren",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "copyright": "Warren contributors",
            "information": f"Warren {__version__}; MIT licence",
            "cluster_name": self.node.cluster_name,
            "node": node_name(),
        }

    def _mechanisms(self) -> list[str]:
        """The strongest first: EXTERNAL with a verified certificate, PLAIN,
        ANONYMOUS where allowed."""
        offered = [EXTERNAL] if self.cert_login is not None else []
        offered.append(PLAIN)
        if self.config.stream_allow_anonymous:
            offered.append(ANONYMOUS)
        return offered

    def _credentials(self, command: c.SaslAuthenticate) -> tuple[str, str | None] | int:
        """(user, password; None: vouched for by the certificate), or the code to refuse with."""
        mechanism = command.mechanism
        if mechanism == PLAIN:
            parts = command.data.split(b"\x00")
            if len(parts) != 3 or (parts[0] and parts[0] != parts[1]):
                return ResponseCode.SASL_ERROR
            try:
                return parts[1].decode("utf-8"), parts[2].decode("utf-8")
            except UnicodeDecodeError:
                return ResponseCode.SASL_ERROR
        if mechanism == ANONYMOUS and self.config.stream_allow_anonymous:
            return self.config.default_user, self.config.default_password
        if mechanism == EXTERNAL and self.cert_login is not None:
            return self.cert_login, None
        return ResponseCode.SASL_MECHANISM_NOT_SUPPORTED

    def _authenticate(self, command: c.SaslAuthenticate) -> None:
        creds = self._credentials(command)
        if isinstance(creds, int):
            log.warning("%s: stream login refused: mechanism %r", self.name, command.mechanism)
            self._refuse(command.correlation_id, creds, 0)
            return
        name, secret = creds
        try:
            self.user = self.client_session.login(
                "stream", name, secret, self.peer[0] if self.peer else None
            )
        except LoginRefused as exc:
            log.warning("%s: stream login refused: user '%s': %s", self.name, name, exc.text)
            code = (
                ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
                if exc.reason == LoginRefused.LOOPBACK
                else ResponseCode.AUTHENTICATION_FAILURE
            )
            self._refuse(command.correlation_id, code, exc.delay_ms)
            return
        self.auth_mechanism = command.mechanism
        self.state = AUTHENTICATED
        self.send_command(c.SaslAuthenticateResponse(command.correlation_id))
        self.send_command(c.Tune(self.frame_max, self.heartbeat))

    def _refuse(self, correlation_id: int, code: int, delay_ms: float) -> None:
        """The refusal, then the end of the connection; held ``delay_ms``
        (repeated guesses slow down)."""
        answer = c.SaslAuthenticateResponse(correlation_id, int(code)).encode()

        def refuse() -> None:
            if not self.closed:
                self.send(answer)
                self.close_transport()

        if delay_ms > 0:
            self.refusing = True
            self.node.clock.call_later(delay_ms, refuse)
        else:
            refuse()

    def _reauthenticate(self, command: c.SaslAuthenticate) -> None:
        """A client renewing its secret: the same mechanism and user, or refused."""
        if command.mechanism != self.auth_mechanism:
            self._refuse(command.correlation_id, ResponseCode.SASL_CANNOT_CHANGE_MECHANISM, 0)
            return
        creds = self._credentials(command)
        if isinstance(creds, int):
            self._refuse(command.correlation_id, creds, 0)
            return
        assert self.user is not None
        if self.user.from_token:
            # An OAuth 2 token's user: the new token must name the same user
            # (the name the client sends is not it); its scopes and expiry replace.
            why = self.client_session.update_secret(creds[1] or "")
            if why is not None:
                log.warning("%s: secret update refused: %s", self.name, why)
                self._refuse(command.correlation_id, ResponseCode.AUTHENTICATION_FAILURE, 0)
                return
            self.send_command(c.SaslAuthenticateResponse(command.correlation_id))
            return
        if creds[0] != self.user.name:
            self._refuse(command.correlation_id, ResponseCode.SASL_CANNOT_CHANGE_USERNAME, 0)
            return
        try:
            self.client_session.login(
                "stream", creds[0], creds[1], self.peer[0] if self.peer else None
            )
        except LoginRefused as exc:
            self._refuse(command.correlation_id, ResponseCode.AUTHENTICATION_FAILURE, exc.delay_ms)
            return
        self.send_command(c.SaslAuthenticateResponse(command.correlation_id))

    def _open(self, command: c.Open) -> None:
        vhost_name = command.virtual_host
        refused = ""
        vhost: VHost | None = None
        if self.node.at_connection_max():
            refused = f"node connection limit ({self.config.max_connections}) is reached"
        elif not self.node.rate_limits.allow_connection(self.peer[0] if self.peer else None):
            refused = f"connection_rate_limit ({self.config.connection_rate_limit}/s) is reached"
        else:
            try:
                vhost = self.client_session.open(vhost_name)
            except LoginRefused as exc:
                refused = exc.text
        if vhost is None:
            log.warning("%s: opening stream connection failed: %s", self.name, refused)
            self.send_command(
                c.OpenResponse(command.correlation_id, ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE)
            )
            self.close_transport()
            return
        self.vhost = vhost
        self.state = OPEN
        host, port = self.advertised
        self.send_command(
            c.OpenResponse(
                command.correlation_id,
                ResponseCode.OK,
                {"advertised_host": host, "advertised_port": str(port)},
            )
        )
        # Authenticated and authorized: the agreed frame_max from now on.
        self.reader.frame_max = self.frame_max
        self.client_session.opened(self, vhost)
        self._opened_vhost = True
        assert self.user is not None
        log.info(
            "%s: stream connection: user '%s' authenticated with %s, vhost '%s'",
            self.name,
            self.user.name,
            self.auth_mechanism,
            vhost.name,
        )

    def _closed_by_client(self, command: c.Close) -> None:
        log.info(
            "%s: stream client closed the connection: %s %s",
            self.name,
            command.code,
            command.reason,
        )
        self.send_command(c.CloseResponse(command.correlation_id))
        self.close_transport()

    def stream_gone(self, stream: str) -> None:
        """A stream of this vhost was deleted (by any stream connection)."""
        if not self.closed and self.state == OPEN:
            self.control.stream_gone(stream)

    # -- ClientConnection (what the broker and the management API use) -----------------
    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable and not self.closed:
            self.control.delivering.resume()

    def set_blocked(self, blocked: bool) -> None:
        """A resource alarm: new publishers are refused while it lasts, and a
        connection with publishers is not read from (RabbitMQ blocks its
        publishing connections the same way)."""
        self.control.blocked = blocked
        control = self.reading_control
        if control is None or self.closed:
            return
        if not blocked:
            self.paused = False
            control(True)
        elif self.control.publishers:
            self.paused = True
            control(False)

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """Stream protocol consumers have no acknowledgements to time out."""

    def force_close(self, reason: str) -> None:
        """Closed by the broker (the management API, a vhost deleted, shutdown):
        an open connection's client hears a Close, and the transport closes
        without waiting for its answer, as RabbitMQ ends such a connection at
        once (rstream's tests wait for the socket to close)."""
        if self.state >= OPEN:
            self.close(ResponseCode.OK, reason)
        self.close_transport()

    def internal_error(self, exc: BaseException) -> None:
        log.exception("%s: stream connection failed", self.name, exc_info=exc)
        if self.state < OPEN:
            self.close_transport()
        else:
            self.close(ResponseCode.INTERNAL_ERROR, "internal error")

    def info(self) -> dict[str, Any]:
        named = self.client_properties.get("connection_name")
        return connection_listing(
            self,
            "stream",
            self.heartbeat,
            auth_mechanism=self.auth_mechanism,
            channel_max=0,
            channels=0,
            client_properties=dict(self.client_properties),
            frame_max=self.frame_max,
            publishers=len(self.control.publishers),
            subscriptions=len(self.control.subscriptions),
            **({"user_provided_name": named} if named else {}),
        )

    def publishers_info(self) -> list[dict[str, Any]]:
        """Its publishers as rabbitmq_stream_management lists them (without
        ``connection_details``, which the management API adds)."""
        vhost = self.vhost.name if self.vhost is not None else ""
        return [
            {
                "confirmed": p.confirmed,
                "errored": p.errored,
                "published": p.published,
                "publisher_id": p.publisher_id,
                "queue": {"name": p.stream, "vhost": vhost},
                "reference": p.reference,
            }
            for p in self.control.publishers.values()
        ]

    def consumers_info(self) -> list[dict[str, Any]]:
        """Its subscriptions as rabbitmq_stream_management lists them: a single
        active consumer's ``active`` and ``activity_status`` (``single_active``,
        ``waiting``), ``offset`` the last record delivered, ``offset_lag`` the
        records of the stream it has not been sent yet."""
        vhost = self.vhost.name if self.vhost is not None else ""
        members = self.control.delivering.members
        out = []
        for sub in self.control.subscriptions.values():
            entry = members.get(sub.subscription_id)
            active = entry is None or entry[1].state == ACTIVE
            sac_status = "single_active" if active else "waiting"
            status = "up" if entry is None else sac_status
            stream = sub.queue.stream
            last = stream.next_offset - 1
            if last < stream.first_offset:
                lag = 0  # an empty stream
            elif sub.consumed:
                lag = max(0, last - sub.last_offset)
            else:
                lag = max(0, last - sub.start + 1)
            out.append(
                {
                    "active": active,
                    "activity_status": status,
                    "consumed": sub.consumed,
                    "credits": sub.credit,
                    "offset": sub.last_offset,
                    "offset_lag": lag,
                    "properties": dict(sub.properties),
                    "queue": {"name": sub.stream, "vhost": vhost},
                    "subscription_id": sub.subscription_id,
                }
            )
        return out

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        return []

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        """Its counters, as an MQTT connection's: no channels, one stream of counts."""
        return [(self.vhost.name, self.stats)] if self.vhost is not None else []

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        return []


def _advertised(config: Any, local: tuple[str, int] | None) -> tuple[str, int]:
    """``[stream] advertised_host``/``advertised_port``, else the address the
    client reached (RabbitMQ: the host name and the listener's port)."""
    host = config.stream_advertised_host or (local[0] if local else "localhost")
    port = config.stream_advertised_port or (local[1] if local else 5552)
    return str(host), int(port)
