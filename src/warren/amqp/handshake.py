"""The AMQP connection's states and its opening handshake, on channel 0.

connection.start, start-ok (the login: PLAIN, AMQPLAIN or a client
certificate's EXTERNAL), tune / tune-ok (frame_max, channel_max, heartbeat
within the server's limits) and open: the one handshake of every AMQP
listener, functions of a :class:`HandshakeConnection` called once per
connection. What differs between servers is the connection's :class:`Gate`:
the broker's (:class:`BrokerGate`: RabbitMQ's product and version announced,
since clients choose behaviour by them; failed logins slowed down by the auth
guard; the vhost's and the user's limits) and a cluster follower's read-only
stream service's (amqp/replica.py).
"""

from __future__ import annotations

import enum
import logging
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from warren import __version__
from warren.amqp import spec
from warren.amqp.auth import MECHANISMS, MECHANISMS_WITH_EXTERNAL, parse_credentials
from warren.core.errors import ChannelError, CommandInvalid, NotAllowed
from warren.core.session import LoginRefused

if TYPE_CHECKING:
    from warren.amqp.connection import AMQPConnection
    from warren.core.users import User

log = logging.getLogger("warren.amqp")

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


class State(enum.IntEnum):
    HEADER = 0
    START_OK = 1
    TUNE_OK = 2
    OPEN_WAIT = 3
    OPEN = 4
    CLOSING = 5  # we sent connection.close and wait for close-ok
    CLOSED = 6


class Gate(Protocol):
    """The server side of a handshake: what it announces, who may log in, where."""

    def server_properties(self) -> dict[str, Any]: ...

    def mechanisms(self) -> bytes: ...

    def limits(self) -> tuple[int, int, int]:
        """channel_max, frame_max, heartbeat offered in connection.tune (0: none)."""
        ...

    def login(
        self, mechanism: str, creds: tuple[str, str] | None, external: bool, refusal: str
    ) -> User | None:
        """The user, or None when refused (the gate has refused, now or later)."""
        ...

    def open_vhost(self, name: str) -> bool:
        """Check and take the vhost; raises NotAllowed; False: the gate closed the connection."""
        ...

    def opened(self) -> None:
        """The connection is open (after the state changed, before open-ok)."""
        ...

    def update_secret(self, secret: str) -> str | None:
        """Take a new token (connection.update-secret): None when taken, else why not."""
        ...


class HandshakeConnection(Protocol):
    """What the handshake reads and sets on a connection."""

    name: str
    peer: tuple[str, int] | None
    state: State
    user: User | None
    cert_login: str | None
    client_properties: dict[str, Any]
    capabilities: dict[str, Any]
    auth_mechanism: str
    channel_max: int
    frame_max: int
    heartbeat: int

    @property
    def gate(self) -> Gate: ...

    def send_method(self, channel: int, method: spec.Method) -> None: ...

    def close_transport(self) -> None: ...


def send_start(conn: HandshakeConnection) -> None:
    """connection.start, after the protocol header."""
    conn.state = State.START_OK
    conn.send_method(
        0,
        spec.ConnectionStart(
            version_major=0,
            version_minor=9,
            server_properties=conn.gate.server_properties(),
            mechanisms=conn.gate.mechanisms(),
            locales=b"en_US",
        ),
    )


def start_ok(conn: HandshakeConnection, method: spec.ConnectionStartOk) -> None:
    """The login; connection.tune, or a refusal (403) as RabbitMQ sends it."""
    conn.client_properties = method.client_properties or {}
    caps = conn.client_properties.get("capabilities")
    conn.capabilities = caps if isinstance(caps, dict) else {}
    mechanism = method.mechanism
    conn.auth_mechanism = mechanism
    external = mechanism == "EXTERNAL" and conn.cert_login is not None
    if mechanism not in ("PLAIN", "AMQPLAIN") and not external:
        log.warning("%s: unsupported auth mechanism %r", conn.name, mechanism)
        refuse_login(conn, f"unsupported authentication mechanism '{mechanism}'", send_close=True)
        return
    creds = None if external else parse_credentials(mechanism, bytes(method.response))
    refusal = (
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile."
    )
    user = conn.gate.login(mechanism, creds, external, refusal)
    if user is None:
        return
    conn.user = user
    conn.state = State.TUNE_OK
    channel_max, frame_max, heartbeat = conn.gate.limits()
    conn.send_method(
        0, spec.ConnectionTune(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
    )


def refuse_login_later(
    conn: HandshakeConnection,
    delay_ms: float,
    text: str,
    call_later: Callable[[float, Callable[[], None]], object],
) -> None:
    """Refuse after ``delay_ms`` (core/auth_guard.py): repeated guesses slow down.
    ``call_later``: a clock's (core/clock.py), in ms."""
    if delay_ms <= 0:
        refuse_login(conn, text)
        return
    conn.state = State.CLOSING  # nothing more is read from this client
    call_later(delay_ms, lambda: refuse_login(conn, text))


def refuse_login(conn: HandshakeConnection, text: str, send_close: bool = False) -> None:
    if send_close or conn.capabilities.get("authentication_failure_close"):
        conn.send_method(
            0,
            spec.ConnectionClose(
                reply_code=403, reply_text=f"ACCESS_REFUSED - {text}", class_id=0, method_id=0
            ),
        )
    conn.close_transport()


def tune_ok(conn: HandshakeConnection, method: spec.ConnectionTuneOk) -> None:
    """The client's limits, within the server's (530 beyond them)."""
    server_ch, server_max, _heartbeat = conn.gate.limits()
    frame_max = method.frame_max
    if frame_max and frame_max < 4096:
        raise NotAllowed(f"frame_max={frame_max} < 4096 min size")
    if server_max and (frame_max == 0 or frame_max > server_max):
        raise NotAllowed(f"frame_max={frame_max} > {server_max} max size")
    conn.frame_max = frame_max
    channel_max = method.channel_max
    if server_ch and (channel_max == 0 or channel_max > server_ch):
        raise NotAllowed(f"channel_max={channel_max} > {server_ch} max size")
    conn.channel_max = channel_max
    conn.heartbeat = method.heartbeat
    conn.state = State.OPEN_WAIT


def open_vhost(conn: HandshakeConnection, method: spec.ConnectionOpen) -> None:
    """connection.open: the gate checks limits and access; open-ok."""
    assert conn.user is not None
    name = method.virtual_host
    if not conn.gate.open_vhost(name):
        return
    conn.state = State.OPEN
    conn.gate.opened()
    conn.send_method(0, spec.ConnectionOpenOk())
    log.info("%s: connection opened, user '%s', vhost '%s'", conn.name, conn.user.name, name)


def update_secret(conn: HandshakeConnection, method: spec.ConnectionUpdateSecret) -> None:
    """A new access token for the open connection (RabbitMQ's texts): 530 when refused."""
    secret = method.new_secret
    text = secret.decode("utf-8", "replace") if isinstance(secret, bytes) else str(secret)
    why = conn.gate.update_secret(text)
    if why is not None:
        log.error("%s: secret update was refused: %s", conn.name, why)
        raise NotAllowed("New secret was refused by one of the backends")
    log.info("%s: user updated secret, reason: %s", conn.name, method.reason)
    conn.send_method(0, spec.ConnectionUpdateSecretOk())


def channel0(conn: HandshakeConnection, method: spec.Method) -> None:
    """A method on channel 0: the handshake's steps in order, close and close-ok."""
    state = conn.state
    if state == State.CLOSING:
        if isinstance(method, spec.ConnectionCloseOk):
            conn.close_transport()
        elif isinstance(method, spec.ConnectionClose):
            conn.send_method(0, spec.ConnectionCloseOk())
        return
    if isinstance(method, spec.ConnectionClose):
        log.info(
            "%s: client closed the connection (%s %s)",
            conn.name,
            method.reply_code,
            method.reply_text,
        )
        conn.send_method(0, spec.ConnectionCloseOk())
        conn.close_transport()
        return
    if state == State.START_OK and isinstance(method, spec.ConnectionStartOk):
        start_ok(conn, method)
    elif state == State.TUNE_OK and isinstance(method, spec.ConnectionTuneOk):
        tune_ok(conn, method)
    elif state == State.OPEN_WAIT and isinstance(method, spec.ConnectionOpen):
        open_vhost(conn, method)
    elif state == State.OPEN and isinstance(method, spec.ConnectionCloseOk):
        raise ChannelError("unexpected method in connection state running")
    elif state == State.OPEN and isinstance(method, spec.ConnectionUpdateSecret):
        update_secret(conn, method)
    elif state == State.OPEN and isinstance(
        method, spec.ConnectionBlocked | spec.ConnectionUnblocked
    ):
        pass  # a client may tell us it is blocked; nothing to do
    elif state == State.OPEN:
        # RabbitMQ's answer to any other method on channel 0 of an open connection.
        raise ChannelError("unexpected method in connection state running")
    else:
        raise CommandInvalid(f"unexpected method {method.NAME} on channel 0")


class BrokerGate:
    """The broker's side of the handshake (one per connection)."""

    def __init__(self, conn: AMQPConnection) -> None:
        self.conn = conn

    def server_properties(self) -> dict[str, Any]:
        conn = self.conn
        props: dict[str, Any] = {
            # Clients pick behaviour by product and version: kombu/Celery use
            # basic.qos(global=true) only for RabbitMQ >= 3.3, whose reinterpreted
            # qos semantics Warren implements. Announcing anything else makes
            # Celery's ETA tasks stall a prefetch-1 worker, so Warren identifies as
            # the RabbitMQ release of [main] rabbitmq_version (the one the
            # management API announces too), and names itself in the remaining fields.
            "product": "RabbitMQ",
            "version": conn.broker.config.rabbitmq_version,
            "platform": f"Warren {__version__} on Python {platform.python_version()}",
            "copyright": "Warren contributors",
            "information": f"Warren {__version__}, an AMQP 0-9-1 broker; MIT licence",
            "warren_version": __version__,
            "cluster_name": conn.broker.cluster_name,
            "capabilities": SERVER_CAPABILITIES,
        }
        replicas = conn.broker.stream_replicas
        if replicas is not None:
            # Where stream readers (the Spark data source) may read from instead.
            props["warren_stream_replicas"] = list(replicas())
        return props

    def mechanisms(self) -> bytes:
        return MECHANISMS if self.conn.cert_login is None else MECHANISMS_WITH_EXTERNAL

    def limits(self) -> tuple[int, int, int]:
        config = self.conn.config
        return config.channel_max, config.frame_max, config.heartbeat

    def login(
        self, mechanism: str, creds: tuple[str, str] | None, external: bool, refusal: str
    ) -> User | None:
        """The client session's login (core/session.py), worded as RabbitMQ's 403."""
        conn = self.conn
        password: str | None
        if external:
            # No password: the verified certificate vouches for the user (RabbitMQ's
            # EXTERNAL ignores the start-ok response).
            username, password = conn.cert_login or "", None
        elif creds is not None:
            username, password = creds
        else:
            username, password = "?", ""  # a response that holds no credentials
        host = conn.peer[0] if conn.peer else None
        try:
            return conn.client_session.login("amqp091", username, password, host)
        except LoginRefused as exc:
            if exc.reason == LoginRefused.LOOPBACK:
                log.warning("%s: user '%s' can only connect via localhost", conn.name, username)
                refuse_login(conn, exc.text)
                return None
            if exc.reason == LoginRefused.BLOCKED:
                log.warning(
                    "%s: login refused unchecked: too many failed logins from %s", conn.name, host
                )
            else:
                log.warning(
                    "%s: login refused for user '%s' with %s: %s",
                    conn.name,
                    username or "?",
                    mechanism,
                    exc.text,
                )
            refuse_login_later(conn, exc.delay_ms, refusal, conn.broker.clock.call_later)
            return None

    def update_secret(self, secret: str) -> str | None:
        return self.conn.client_session.update_secret(secret)

    def open_vhost(self, name: str) -> bool:
        """The client session's checks (limits, then access, in RabbitMQ's order),
        refused with 530; then max_connections."""
        conn = self.conn
        assert conn.user is not None
        try:
            vhost = conn.client_session.open(name)
        except LoginRefused as exc:
            if exc.reason == LoginRefused.NO_VHOST:
                log.warning("%s: vhost '%s' not found", conn.name, name)
            elif exc.reason == LoginRefused.NO_ACCESS:
                log.warning(
                    "%s: user '%s' has no access to vhost '%s'", conn.name, conn.user.name, name
                )
            raise NotAllowed(exc.text) from None
        if conn.broker.at_connection_max():
            # Handshakes begun below max_connections may not take it beyond.
            log.warning(
                "%s: closing: max_connections (%d) reached", conn.name, conn.config.max_connections
            )
            conn.close_transport()
            return False
        conn.vhost = vhost
        return True

    def opened(self) -> None:
        conn = self.conn
        assert conn.vhost is not None
        conn.client_session.opened(conn, conn.vhost)
