"""The sans-IO AMQP 1.0 connection: bytes in, core calls, bytes out.

`AMQP1Connection.feed(data)` reads frames (frames.py) and acts on them; what
goes to the client is gathered in ``pending`` and announced once through
``on_output``, as MQTT's and AMQP 0-9-1's connections do. No socket and no
clock of its own: ``now_ms`` is set by the caller per read, and the idle
timeout is checked by `tick`.

The connection's own part is the start (protocol headers, the SASL layer:
sasl.py; the open, with RabbitMQ 4's ``vhost:NAME`` hostname), the close, and
the idle timeout. Sessions (begin/end, their windows, links and deliveries)
are session.py's, one per channel. Logins, vhost limits, permissions,
publishing settled after the sync and consuming are the client session's
(core/session.py), shared with every protocol.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from warren import __version__
from warren.amqp1 import sasl
from warren.amqp1.errors import (
    CONNECTION_FORCED,
    FRAME_SIZE_TOO_SMALL,
    FRAMING_ERROR,
    ILLEGAL_STATE,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    RESOURCE_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
    ConnectionError_,
    LinkError,
    error,
)
from warren.amqp1.formats import DecodeError
from warren.amqp1.frames import (
    AMQP_HEADER,
    HEARTBEAT,
    MIN_MAX_FRAME_SIZE,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    FrameReader,
    encode_frame,
)
from warren.amqp1.performatives import (
    SASL_AUTH,
    SASL_OK,
    Begin,
    Close,
    End,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from warren.amqp1.session import Session
from warren.amqp1.types import Symbol
from warren.client_listing import connection_name
from warren.core.session import ClientSession, LoginRefused
from warren.core.stats import Ages, MessageStats, OctetStats
from warren.node import node_name

if TYPE_CHECKING:
    from warren.amqp1.incoming import PublishRun
    from warren.amqp1.links import ManagementFactory
    from warren.core.channel_counts import ChannelCounts
    from warren.core.clock import TimerHandle
    from warren.core.users import User
    from warren.core.vhost import VHost
    from warren.node import Node

__all__ = ["AMQP1Connection"]

log = logging.getLogger("warren.amqp1")

#: The largest frame a client may send before the open frames are exchanged
#: (RabbitMQ 4's initial max frame size).
INITIAL_MAX_FRAME_SIZE: Final = 8192
#: Sessions a connection may have (RabbitMQ 4's session_max_per_connection):
#: channel-max is one less.
SESSION_MAX: Final = 64
#: The shortest idle timeout a client may ask for (RabbitMQ 4's).
MIN_IDLE_TIME_OUT_MS: Final = 1000
#: The RabbitMQ release an AMQP 1.0 client is told at least, when RabbitMQ is
#: announced ([amqp1] announce_rabbitmq: RabbitMQ's own 1.0 clients refuse an
#: older server; [main] rabbitmq_version stays 0-9-1's).
MIN_RABBITMQ_VERSION: Final = "4.1.0"
#: What the open frame offers (link pairs for /management, the anonymous relay).
CAPABILITIES: Final = (Symbol("LINK_PAIR_V1_0"), Symbol("ANONYMOUS-RELAY"))

#: ms a client has to answer this side's close (RabbitMQ 4's CLOSING_TIMEOUT).
CLOSING_TIMEOUT_MS: Final = 30_000

# Connection states, in order.
HEADER: Final = 0  # waiting for the client's protocol header
SASL_INIT: Final = 1  # mechanisms sent, waiting for sasl-init
SASL_DONE: Final = 2  # outcome ok sent, waiting for the AMQP header
OPEN_WAIT: Final = 3  # waiting for open
OPEN: Final = 4
CLOSE_SENT: Final = 5  # this side's close is going out
CLOSED: Final = 6


class AMQP1Connection:
    """One client's AMQP 1.0 connection (any transport); a ClientConnection for the broker."""

    def __init__(
        self,
        node: Node,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
        on_output: Callable[[], None],
        on_close: Callable[[], None],
        transport_name: str = "AMQP 1.0",
        management: ManagementFactory | None = None,
    ) -> None:
        self.node = node
        self.config = node.config
        self.peer = peer
        self.local = local
        self.on_output = on_output
        self.on_close = on_close
        self.transport_name = transport_name
        #: What serves links to ``/management`` (links.py); None: refused.
        self.management = management
        #: The user a verified TLS client certificate names (set by the transport).
        self.cert_login: str | None = None
        #: Pause/resume reading from the socket (a resource alarm).
        self.reading_control: Callable[[bool], None] | None = None
        self.reader = FrameReader(INITIAL_MAX_FRAME_SIZE, expect_header=True)
        self.state = HEADER
        self.octets = OctetStats()
        self.stats = MessageStats()
        self.client_session = ClientSession(node, self)
        self.sessions: dict[int, Session] = {}
        self.pending: list[bytes] = []
        self.user: User | None = None
        self.vhost: VHost | None = None
        self.auth_mechanism = ""
        self.container_id = ""
        self.client_properties: dict[Any, Any] = {}
        self.now_ms = 0
        self.connected_at = node.clock.now_ms()
        self.last_rx_ms = self.connected_at
        self.last_tx_ms = self.connected_at
        #: The largest frame the client takes (its open; 512 until then).
        self.peer_max_frame = MIN_MAX_FRAME_SIZE
        #: The largest frame this side takes, announced in its open.
        self.max_frame = max(MIN_MAX_FRAME_SIZE, self.config.frame_max or 0xFFFFFFFF)
        self.channel_max = SESSION_MAX - 1
        #: ms of silence after which the client is taken for dead (0: never);
        #: half of it is announced, as the spec asks (2.4.5).
        self.idle_timeout = self.config.heartbeat * 1000
        #: The client's idle-time-out (0: none): an empty frame goes out at half of it.
        self.peer_idle_timeout = 0
        self.closed = False
        self.writable = True
        #: A refused login waiting out its delay: input is ignored meanwhile.
        self.refusing = False
        self._opened_vhost = False
        #: Bytes of messages whose transfers are not complete, over all links.
        self.unfinished = 0
        #: One link's transfers of this read, published together (flush_run).
        self.run: PublishRun | None = None
        #: Channels whose session this side ended, until the client's end comes.
        self.ending: set[int] = set()
        #: After this side's close: cuts off a client that never sends its own.
        self._closing_timer: TimerHandle | None = None

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

    def send_frame(self, channel: int, performative: Any) -> None:
        self.send(encode_frame(channel, performative))

    def take_output(self) -> list[bytes]:
        for session in self.sessions.values():
            session.before_output()
        out, self.pending = self.pending, []
        return out

    def feed(self, data: bytes) -> None:
        """Act on the frames ``data`` completes."""
        if self.closed or self.refusing or not data:
            return
        self.last_rx_ms = self.now_ms
        try:
            items = self.reader.feed(data)
        except DecodeError as exc:
            self._fail(exc.condition, str(exc))
            return
        for item in items:
            if self.state >= CLOSED:
                break
            try:
                if isinstance(item, Frame):
                    if self.run is not None and type(item.performative) is not Transfer:
                        self.flush_run()
                    self._frame(item)
                else:
                    self._header(item)
            except ConnectionError_ as exc:
                self.flush_run()
                self._fail(exc.condition, exc.description)
            except DecodeError as exc:
                self.flush_run()
                self._fail(exc.condition, str(exc))
        if self.run is not None:
            self.flush_run()

    def flush_run(self) -> None:
        """Publish the pending run of one link's transfers (incoming.py): at the
        end of a read, and before any other frame or another link's transfer,
        so that everything happens in the order the client sent it."""
        run = self.run
        if run is None:
            return
        self.run = None
        link = run.link
        try:
            link.publish_run(run)
        except LinkError as exc:
            log.info("%s: AMQP 1.0 link '%s' detached: %s", self.name, link.name, exc)
            link.session.detach(link, exc.as_error())

    def _fail(self, condition: str, description: str) -> None:
        """Close the connection for a reason of the client's making."""
        log.warning("%s: AMQP 1.0 connection closed: %s (%s)", self.name, description, condition)
        if self.state < OPEN_WAIT:
            # No AMQP frame may go out before the headers are exchanged.
            self.close_transport()
            return
        if self.state == OPEN_WAIT:
            # A close must follow an open (2.4.1): a minimal one first.
            self.send_frame(0, Open(container_id=self.node.cluster_name))
        self.close(condition, description)

    def close(self, condition: str | None = None, description: str | None = None) -> None:
        """Send close (with an error); the transport closes once it is out."""
        if self.state >= CLOSE_SENT:
            return
        err = error(condition, description) if condition is not None else None
        self.send_frame(0, Close(error=err))
        self.state = CLOSE_SENT
        self._end_sessions()
        # As RabbitMQ 4 (rabbit_amqp_reader:close/2): reading goes on, ignoring all
        # but the client's close, which closes the socket; closed at once, the
        # socket would be reset under our close by frames the client sent before
        # it saw it. A client that never answers is cut off after CLOSING_TIMEOUT_MS.
        self._closing_timer = self.node.clock.call_later(CLOSING_TIMEOUT_MS, self.close_transport)

    def close_transport(self) -> None:
        """The transport closes once the output is written (on_close)."""
        if self.closed:
            return
        self.closed = True
        self.state = CLOSED
        self._cancel_closing_timer()
        self._end_sessions()
        self.on_close()

    def connection_lost(self) -> None:
        """The transport is gone: sessions end (what was delivered and is not
        settled goes back to its queues), the connection leaves the listing."""
        self.closed = True
        self.state = CLOSED
        self._cancel_closing_timer()
        self._end_sessions()
        if self._opened_vhost and self.vhost is not None:
            self._opened_vhost = False
            self.client_session.closed(self, self.vhost)

    def _cancel_closing_timer(self) -> None:
        if self._closing_timer is not None:
            self._closing_timer.cancel()
            self._closing_timer = None

    def _end_sessions(self) -> None:
        sessions, self.sessions = self.sessions, {}
        for session in sessions.values():
            session.ended()

    def tick(self, now_ms: int) -> int:
        """The idle timeout: an empty frame when nothing went out for half the
        client's idle-time-out, the close (amqp:resource-limit-exceeded, as
        RabbitMQ 4) when nothing came in for this side's. The ms until the next
        check (0: none needed)."""
        if self.closed or self.state != OPEN:
            return 0
        due = 0
        if self.idle_timeout:
            deadline = self.last_rx_ms + self.idle_timeout
            if now_ms >= deadline:
                self.now_ms = now_ms
                self._fail(
                    RESOURCE_LIMIT_EXCEEDED,
                    "no frame received from client within idle timeout threshold",
                )
                return 0
            due = deadline - now_ms
        if self.peer_idle_timeout:
            half = self.peer_idle_timeout // 2
            if now_ms - self.last_tx_ms >= half:
                self.now_ms = now_ms
                self.send(HEARTBEAT)
            next_send = self.last_tx_ms + half - now_ms
            due = min(due, next_send) if due else next_send
        return max(due, 1) if due else 0

    # -- headers and SASL -------------------------------------------------------------
    def _header(self, header: bytes) -> None:
        state = self.state
        if state == HEADER and header == SASL_HEADER:
            self.send(SASL_HEADER)
            offered = sasl.mechanisms(self.cert_login, self.config.amqp1_allow_anonymous)
            self.send(
                encode_frame(0, SaslMechanisms(sasl_server_mechanisms=offered), b"", TYPE_SASL)
            )
            self.state = SASL_INIT
        elif state == SASL_DONE and header == AMQP_HEADER:
            self.send(AMQP_HEADER)
            self.state = OPEN_WAIT
        else:
            # RabbitMQ 4 requires SASL: any other header (AMQP's without it
            # first, another version) gets the SASL header back, then the close.
            log.warning("%s: AMQP 1.0 protocol header %r refused", self.name, header)
            self.send(SASL_HEADER)
            self.close_transport()

    def _sasl(self, frame: Frame) -> None:
        init = frame.performative
        if self.state != SASL_INIT or not isinstance(init, SaslInit):
            raise ConnectionError_(ILLEGAL_STATE, f"unexpected SASL frame {init!r:.60}")
        mechanism = str(init.mechanism)
        config = self.config
        secret: str | None
        if mechanism == sasl.PLAIN:
            creds = sasl.credentials(init.initial_response)
            if creds is None:
                self._refuse_login("malformed PLAIN response", 0)
                return
            name, secret = creds
        elif mechanism == sasl.ANONYMOUS and config.amqp1_allow_anonymous:
            name, secret = config.default_user, config.default_password
        elif mechanism == sasl.EXTERNAL and self.cert_login is not None:
            name, secret = self.cert_login, None
        else:
            self._refuse_login(f"unsupported mechanism {mechanism!r}", 0)
            return
        self.auth_mechanism = mechanism
        try:
            self.user = self.client_session.login(
                "amqp10", name, secret, self.peer[0] if self.peer else None
            )
        except LoginRefused as exc:
            self._refuse_login(f"user '{name}': {exc.text}", exc.delay_ms)
            return
        self.send(encode_frame(0, SaslOutcome(code=SASL_OK), b"", TYPE_SASL))
        self.state = SASL_DONE

    def _refuse_login(self, why: str, delay_ms: float) -> None:
        """sasl-outcome auth, then the close; held ``delay_ms`` (repeated guesses slow down)."""
        log.warning("%s: AMQP 1.0 login refused: %s", self.name, why)
        outcome = encode_frame(0, SaslOutcome(code=SASL_AUTH), b"", TYPE_SASL)

        def refuse() -> None:
            if not self.closed:
                self.send(outcome)
                self.close_transport()

        if delay_ms > 0:
            self.refusing = True
            self.node.clock.call_later(delay_ms, refuse)
        else:
            refuse()

    # -- frames -----------------------------------------------------------------------
    def _frame(self, frame: Frame) -> None:
        if frame.type == TYPE_SASL:
            self._sasl(frame)
            return
        state = self.state
        performative = frame.performative
        if state == OPEN:
            if performative is None:
                return  # an empty frame: the client is alive
            if frame.channel == 0 and isinstance(performative, Close):
                self._closed_by_client(performative)
                return
            if isinstance(performative, Open):
                raise ConnectionError_(ILLEGAL_STATE, "a second open")
            self._session_frame(frame)
        elif state == OPEN_WAIT:
            if performative is None:
                return  # an empty frame may come at any time (2.4.5)
            if not isinstance(performative, Open) or frame.channel != 0:
                raise ConnectionError_(ILLEGAL_STATE, "the first frame must be open")
            self._open(performative)
        elif state == CLOSE_SENT:
            if isinstance(performative, Close):
                self.close_transport()
        else:
            raise ConnectionError_(FRAMING_ERROR, "an AMQP frame before the handshake")

    def _open(self, open_: Open) -> None:
        config = self.config
        if open_.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ConnectionError_(
                FRAME_SIZE_TOO_SMALL,
                f"max_frame_size ({open_.max_frame_size}) < minimum maximum frame size "
                f"({MIN_MAX_FRAME_SIZE})",
            )
        idle = open_.idle_time_out or 0
        if 0 < idle < MIN_IDLE_TIME_OUT_MS:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"idle-time-out ({idle} ms) < minimum idle-time-out ({MIN_IDLE_TIME_OUT_MS} ms)",
            )
        hostname = open_.hostname or ""
        vhost_name = hostname[6:] if hostname.startswith("vhost:") else config.default_vhost
        if self.node.at_connection_max():
            raise ConnectionError_(
                RESOURCE_LIMIT_EXCEEDED,
                f"connection refused: node connection limit ({config.max_connections}) is reached",
            )
        try:
            vhost = self.client_session.open(vhost_name)
        except LoginRefused as exc:
            if exc.reason == LoginRefused.NO_VHOST:
                raise ConnectionError_(
                    UNAUTHORIZED_ACCESS,
                    f"AMQP 1.0 connection failed: virtual host '{vhost_name}' does not exist",
                ) from None
            condition = (
                RESOURCE_LIMIT_EXCEEDED if exc.reason == LoginRefused.LIMIT else UNAUTHORIZED_ACCESS
            )
            raise ConnectionError_(condition, exc.text) from None
        self.vhost = vhost
        self.container_id = open_.container_id
        self.client_properties = dict(open_.properties or {})
        self.peer_max_frame = open_.max_frame_size
        self.peer_idle_timeout = idle
        self.channel_max = min(open_.channel_max, SESSION_MAX - 1)
        self.reader.max_frame_size = self.max_frame
        self.send_frame(
            0,
            Open(
                container_id=self.node.cluster_name,
                max_frame_size=self.max_frame,
                channel_max=self.channel_max,
                idle_time_out=self.idle_timeout // 2 or None,
                offered_capabilities=CAPABILITIES,
                properties=self._server_properties(),
            ),
        )
        self.state = OPEN
        self.client_session.opened(self, vhost)
        self._opened_vhost = True
        assert self.user is not None
        log.info(
            "%s: AMQP 1.0 container '%s': user '%s' authenticated with %s, vhost '%s'",
            self.name,
            self.container_id,
            self.user.name,
            self.auth_mechanism,
            vhost.name,
        )

    def _server_properties(self) -> dict[Any, Any]:
        """RabbitMQ 4's open properties, naming Warren; RabbitMQ 4.x only when
        ``[amqp1] announce_rabbitmq`` asks (RabbitMQ's own clients want it)."""
        node = self.node
        if self.config.amqp1_announce_rabbitmq:
            product, version = "RabbitMQ", amqp1_version(self.config.rabbitmq_version)
        else:
            product, version = "Warren", __version__
        return {
            Symbol("product"): product,
            Symbol("version"): version,
            Symbol("platform"): f"Warren {__version__} on Python {platform.python_version()}",
            Symbol("copyright"): "Warren contributors",
            Symbol("information"): f"Warren {__version__}; MIT licence",
            Symbol("cluster_name"): node.cluster_name,
            Symbol("node"): node_name(),
        }

    def _closed_by_client(self, close: Close) -> None:
        if close.error is not None:
            log.info(
                "%s: AMQP 1.0 client closed the connection: %s %s",
                self.name,
                close.error.condition,
                close.error.description or "",
            )
        if self.state < CLOSE_SENT:
            self.send_frame(0, Close())
        self.close_transport()

    def _session_frame(self, frame: Frame) -> None:
        channel = frame.channel
        performative = frame.performative
        session = self.sessions.get(channel)
        if isinstance(performative, Begin):
            if session is not None or channel in self.ending:
                raise ConnectionError_(ILLEGAL_STATE, f"channel {channel} is in use")
            if performative.remote_channel is not None:
                raise ConnectionError_(NOT_ALLOWED, "the broker begins no sessions")
            if channel > self.channel_max:
                raise ConnectionError_(
                    NOT_ALLOWED, f"channel {channel} is above channel-max {self.channel_max}"
                )
            assert self.vhost is not None
            self.sessions[channel] = Session(self, channel, performative, self.vhost)
            return
        if session is None:
            if channel in self.ending:
                # Sent before the client saw this side's end: ignored until its end.
                if isinstance(performative, End):
                    self.ending.discard(channel)
                return
            raise ConnectionError_(ILLEGAL_STATE, f"no session on channel {channel}")
        session.frame(performative, frame.payload)

    def session_ended(self, channel: int, by_us: bool = False) -> None:
        """The session on ``channel`` is over; ``by_us``: this side sent the end
        and the client's is still to come (its channel stays taken until then)."""
        self.sessions.pop(channel, None)
        if by_us:
            self.ending.add(channel)

    # -- ClientConnection (what the broker and the management API use) -----------------
    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            for session in self.sessions.values():
                session.resume()

    def set_blocked(self, blocked: bool) -> None:
        """A resource alarm: publishers get no more credit while it lasts."""
        for session in list(self.sessions.values()):
            session.set_blocked(blocked)

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """Once a second (the broker's timer): deliveries unsettled too long
        are released (session.py)."""
        for session in list(self.sessions.values()):
            session.check_consumer_timeouts(now_ms, default_ms)

    def force_close(self, reason: str) -> None:
        self.close(CONNECTION_FORCED, reason)

    def credential_expired(self) -> None:
        """Its OAuth 2 token expired (core/session.py), RabbitMQ 4's close."""
        self.close(UNAUTHORIZED_ACCESS, "credential expired")

    def internal_error(self, exc: BaseException) -> None:
        log.exception("%s: AMQP 1.0 connection failed", self.name, exc_info=exc)
        self.close(INTERNAL_ERROR, "internal error")

    def info(self) -> dict[str, Any]:
        from warren.amqp1.listing import connection_info

        return connection_info(self)

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        from warren.amqp1.listing import channels_info

        return channels_info(self, ages)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        if self.vhost is None:
            return []
        return [(self.vhost.name, s.stats) for s in self.sessions.values()]

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        return []


def amqp1_version(configured: str) -> str:
    """The RabbitMQ version announced to AMQP 1.0 clients: the configured one
    when it is 4.1 or later, else the first release with what Warren's AMQP 1.0
    offers (RabbitMQ 4.1: its clients enable stream filters from 4.1 on): 0-9-1
    clients may be told 3.x (Celery picks its behaviour by it), 1.0 clients need
    4.0 or later."""
    parts = configured.split(".")
    try:
        version = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except ValueError:
        return MIN_RABBITMQ_VERSION
    return configured if version >= (4, 1) else MIN_RABBITMQ_VERSION
