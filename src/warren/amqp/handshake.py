"""The AMQP connection's states and its opening handshake, on channel 0.

connection.start (what Warren announces: RabbitMQ's product and version, since
clients choose behaviour by them), start-ok (the login: PLAIN, AMQPLAIN or a
client certificate's EXTERNAL, failures slowed down by the auth guard), tune-ok
(frame_max, channel_max, heartbeat) and open (the vhost's and the user's limits,
access). Functions of the connection, called once per connection.
"""

from __future__ import annotations

import enum
import logging
import platform
from typing import TYPE_CHECKING

from warren import __version__
from warren.amqp import spec
from warren.amqp.auth import MECHANISMS, MECHANISMS_WITH_EXTERNAL, parse_credentials
from warren.core.errors import NotAllowed
from warren.core.session import LoginRefused

if TYPE_CHECKING:
    from warren.amqp.connection import AMQPConnection

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


def send_start(conn: AMQPConnection) -> None:
    """connection.start, after the protocol header."""
    conn.state = State.START_OK
    props = {
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
    conn.send_method(
        0,
        spec.ConnectionStart(
            version_major=0,
            version_minor=9,
            server_properties=props,
            mechanisms=MECHANISMS if conn.cert_login is None else MECHANISMS_WITH_EXTERNAL,
            locales=b"en_US",
        ),
    )


def start_ok(conn: AMQPConnection, method: spec.ConnectionStartOk) -> None:
    """The login; connection.tune, or a refusal (403) as RabbitMQ sends it."""
    conn.client_properties = method.client_properties or {}
    caps = conn.client_properties.get("capabilities")
    conn.capabilities = caps if isinstance(caps, dict) else {}
    mechanism = method.mechanism
    conn.auth_mechanism = mechanism
    external = mechanism == "EXTERNAL" and conn.cert_login is not None
    if mechanism not in ("PLAIN", "AMQPLAIN") and not external:
        log.warning("%s: unsupported auth mechanism %r", conn.name, mechanism)
        _refuse_login(conn, f"unsupported authentication mechanism '{mechanism}'", send_close=True)
        return
    creds = None if external else parse_credentials(mechanism, bytes(method.response))
    refusal = (
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile."
    )
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
        user = conn.client_session.login("amqp091", username, password, host)
    except LoginRefused as exc:
        if exc.reason == LoginRefused.BLOCKED:
            log.warning(
                "%s: login refused unchecked: too many failed logins from %s", conn.name, host
            )
        elif exc.reason == LoginRefused.CREDENTIALS:
            log.warning(
                "%s: login refused for user '%s' with %s: %s",
                conn.name,
                username or "?",
                mechanism,
                exc.text,
            )
        else:  # loopback only
            log.warning("%s: user '%s' can only connect via localhost", conn.name, username)
            _refuse_login(conn, exc.text)
            return
        _refuse_login_later(conn, exc.delay, refusal)
        return
    conn.user = user
    conn.state = State.TUNE_OK
    conn.send_method(
        0,
        spec.ConnectionTune(
            channel_max=conn.config.channel_max,
            frame_max=conn.config.frame_max,
            heartbeat=conn.config.heartbeat,
        ),
    )


def _refuse_login_later(conn: AMQPConnection, delay: float, text: str) -> None:
    """Refuse after ``delay`` seconds (core/auth_guard.py): repeated guesses slow down."""
    if delay <= 0:
        _refuse_login(conn, text)
        return
    conn.state = State.CLOSING  # nothing more is read from this client
    conn.broker.call_later(delay, lambda: _refuse_login(conn, text))


def _refuse_login(conn: AMQPConnection, text: str, send_close: bool = False) -> None:
    if send_close or conn.capabilities.get("authentication_failure_close"):
        conn.send_method(
            0,
            spec.ConnectionClose(
                reply_code=403, reply_text=f"ACCESS_REFUSED - {text}", class_id=0, method_id=0
            ),
        )
    conn.close_transport()


def tune_ok(conn: AMQPConnection, method: spec.ConnectionTuneOk) -> None:
    """The client's limits, within the server's (530 beyond them)."""
    frame_max = method.frame_max
    if frame_max and frame_max < 4096:
        raise NotAllowed(f"frame_max={frame_max} < 4096 min size")
    server_max = conn.config.frame_max
    if server_max and (frame_max == 0 or frame_max > server_max):
        raise NotAllowed(f"frame_max={frame_max} > {server_max} max size")
    conn.frame_max = frame_max
    channel_max = method.channel_max
    server_ch = conn.config.channel_max
    if server_ch and (channel_max == 0 or channel_max > server_ch):
        raise NotAllowed(f"channel_max={channel_max} > {server_ch} max size")
    conn.channel_max = channel_max
    conn.heartbeat = method.heartbeat
    conn.state = State.OPEN_WAIT


def open_vhost(conn: AMQPConnection, method: spec.ConnectionOpen) -> None:
    """connection.open: limits and access checked in RabbitMQ's order."""
    assert conn.user is not None
    name = method.virtual_host
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
        return
    conn.vhost = vhost
    conn.state = State.OPEN
    conn.client_session.opened(conn, vhost)
    conn.send_method(0, spec.ConnectionOpenOk())
    log.info("%s: connection opened, user '%s', vhost '%s'", conn.name, conn.user.name, name)
