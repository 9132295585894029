"""An MQTT CONNECT: authentication, the session taken over or resumed, CONNACK.

The first packet of every connection, so never on the per-message path:
MQTTConnection (connection.py) hands it here and carries on with the packets
after it. A refusal is answered with RabbitMQ's reason codes (3.1.1's return
codes for 3.1.1 clients) and, after failed logins, held back (core/auth_guard.py).

MQTT 5's enhanced authentication is there for one method, TOKEN_METHOD: the
CONNECT's Authentication Data is an OAuth 2 access token (core/oauth2.py), and
an AUTH packet with reason 0x19 (Re-authenticate) and a new token replaces it
on the open connection (reauthenticate), as AMQP's connection.update-secret.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from warren.core.session import LoginRefused
from warren.core.users import WRITE, User
from warren.mqtt import properties as P
from warren.mqtt.codec import MAX_PACKET_SIZE, encode
from warren.mqtt.errors import ProtocolViolation
from warren.mqtt.packets import MQTT_5, Auth, ConnAck, Connect, PubRel
from warren.mqtt.session import MAX_AWAITING_RELEASE, NEVER_EXPIRES, Session, queue_name
from warren.mqtt.topics import too_long

if TYPE_CHECKING:
    from warren.config import Config
    from warren.core.vhost import VHost
    from warren.mqtt.connection import MQTTConnection

__all__ = ["MAX_UNAUTHENTICATED_PACKET", "TOKEN_METHOD", "before_connect", "reauthenticate"]

log = logging.getLogger("warren.mqtt")

#: Largest CONNECT accepted before the client is authenticated (RabbitMQ's
#: max_packet_size_unauthenticated).
MAX_UNAUTHENTICATED_PACKET = 65536
#: Room for a PUBLISH's topic and properties above max_message_size.
PACKET_OVERHEAD = 65536 + 16
#: The Authentication Method whose data is an OAuth 2 access token (the name
#: Azure Event Grid's MQTT broker gives it).
TOKEN_METHOD = "OAUTH2-JWT"
#: Longest client id: the session queue's name must fit an AMQP shortstr.
MAX_CLIENT_ID_BYTES = 255 - len(queue_name(""))

_V3_CONNACK = {
    P.UNSUPPORTED_PROTOCOL_VERSION: P.V311_UNACCEPTABLE_PROTOCOL_VERSION,
    P.CLIENT_IDENTIFIER_NOT_VALID: P.V311_IDENTIFIER_REJECTED,
    P.BAD_USER_NAME_OR_PASSWORD: P.V311_BAD_USER_NAME_OR_PASSWORD,
    P.NOT_AUTHORIZED: P.V311_NOT_AUTHORIZED,
    P.SERVER_UNAVAILABLE: P.V311_SERVER_UNAVAILABLE,
    P.CONNECTION_RATE_EXCEEDED: P.V311_SERVER_UNAVAILABLE,
    P.QUOTA_EXCEEDED: P.V311_NOT_AUTHORIZED,  # RabbitMQ's mapping (limits reached)
}


def max_packet_size(config: Config) -> int:
    """The largest packet accepted after CONNECT, as MQTT 5 clients are told
    (CONNACK's Maximum Packet Size): a message of max_message_size with its topic
    and properties, within what unfinished packets may hold in all (unfinished.py)
    and what the protocol can express."""
    limit = min(config.max_message_size + PACKET_OVERHEAD, MAX_PACKET_SIZE)
    if config.mqtt_partial_packet_memory:
        limit = min(limit, config.mqtt_partial_packet_memory)
    return limit


def before_connect(conn: MQTTConnection, pkt: object) -> None:
    """The packet before the session exists: a CONNECT, accepted or refused."""
    if not isinstance(pkt, Connect):
        raise ProtocolViolation(P.PROTOCOL_ERROR, "the first packet must be CONNECT")
    conn.level = pkt.protocol_level
    code = _connect(conn, pkt)
    if code:
        log.warning(
            "%s: MQTT CONNECT of client '%s' refused (reason 0x%02x)",
            conn.name,
            pkt.client_id,
            code,
        )
        if conn.level == MQTT_5:
            connack = encode(ConnAck(False, code), MQTT_5)
        else:
            connack = encode(ConnAck(False, _V3_CONNACK.get(code, P.V311_NOT_AUTHORIZED)))
        delay, conn.refusal_delay = conn.refusal_delay, 0.0
        if delay > 0:
            # Held (core/auth_guard.py): repeated guesses slow down. Nothing more is
            # read from this client meanwhile.
            conn.refusing = True
            conn.node.clock.call_later(delay, lambda: _refuse(conn, connack))
        else:
            _refuse(conn, connack)


#: How each refusal of a login is worded (MQTT 5 reason codes; 3.1.1's from them).
_REFUSALS = {
    LoginRefused.BLOCKED: P.CONNECTION_RATE_EXCEEDED,
    LoginRefused.CREDENTIALS: P.BAD_USER_NAME_OR_PASSWORD,
    LoginRefused.LOOPBACK: P.NOT_AUTHORIZED,
    LoginRefused.NO_VHOST: P.NOT_AUTHORIZED,
    LoginRefused.LIMIT: P.QUOTA_EXCEEDED,
    LoginRefused.NO_ACCESS: P.NOT_AUTHORIZED,
}


def _login(
    conn: MQTTConnection, username: str | None, password: bytes | None
) -> tuple[User, VHost] | int:
    """(user, vhost), or the MQTT 5 reason code refusing the CONNECT. The checks
    are the client session's (core/session.py), as for every protocol; MQTT's
    are the names: ``vhost:user`` or ``[mqtt] vhost``, the default user for an
    anonymous CONNECT where allowed, and a verified TLS client certificate's
    user (warren.tls.cert_login) for a CONNECT without a user name and
    without a password (RabbitMQ's mqtt.ssl_cert_login)."""
    config = conn.state.config
    vhost_name = config.mqtt_vhost
    secret: str | None
    if username is None and conn.cert_login is not None:
        name, secret = conn.cert_login, None
    elif username is None:
        if not config.mqtt_allow_anonymous:
            log.warning("MQTT login refused: no user name and anonymous logins disabled")
            return P.BAD_USER_NAME_OR_PASSWORD
        name, secret = config.default_user, config.default_password
    else:
        name = username
        if ":" in username:
            vhost_name, name = username.split(":", 1)
        try:
            secret = (password or b"").decode("utf-8")
        except UnicodeDecodeError:
            return P.BAD_USER_NAME_OR_PASSWORD
    session = conn.client_session
    attempt = "mqtt50" if conn.level == MQTT_5 else "mqtt311"
    try:
        user = session.login(attempt, name, secret, conn.peer[0] if conn.peer else None)
        vhost = session.open(vhost_name)
    except LoginRefused as exc:
        log.warning("MQTT login refused for user '%s': %s", name, exc.text)
        conn.refusal_delay = exc.delay_ms
        return _REFUSALS[exc.reason]
    return user, vhost


def _refuse(conn: MQTTConnection, connack: bytes) -> None:
    if not conn.closed:
        conn.send(connack)
        conn.close()


def _connect(conn: MQTTConnection, pkt: Connect) -> int:
    """Act on CONNECT; a non-zero MQTT 5 reason code refuses it."""
    v5 = conn.level == MQTT_5
    props = pkt.properties
    conn.problem_information = props.get(P.REQUEST_PROBLEM_INFORMATION, 1) == 1
    method = props.get(P.AUTHENTICATION_METHOD)
    username, password = pkt.username, pkt.password
    if method is not None:
        if method != TOKEN_METHOD or conn.node.oauth2 is None:
            return P.BAD_AUTHENTICATION_METHOD
        data = props.get(P.AUTHENTICATION_DATA)
        # The token in the data (else the password); the user name may only name the vhost.
        password = data if isinstance(data, bytes) else password
        username = username or ""
    client_id = pkt.client_id
    assigned = None
    if not client_id:
        if not pkt.clean_start and not v5:
            return P.CLIENT_IDENTIFIER_NOT_VALID
        client_id = assigned = "warren-" + secrets.token_hex(8)
    if len(client_id.encode("utf-8", "surrogateescape")) > MAX_CLIENT_ID_BYTES:
        return P.CLIENT_IDENTIFIER_NOT_VALID
    if conn.node.at_connection_max():
        log.warning(
            "%s: MQTT connection refused: max_connections (%d) reached",
            conn.name,
            conn.state.config.max_connections,
        )
        return P.QUOTA_EXCEEDED
    if not conn.node.rate_limits.allow_connection(conn.peer[0] if conn.peer else None):
        log.warning(
            "%s: MQTT connection refused: connection_rate_limit (%d/s) reached",
            conn.name,
            conn.state.config.connection_rate_limit,
        )
        return P.QUOTA_EXCEEDED
    auth = _login(conn, username, password)
    if isinstance(auth, int):
        return auth
    user, vhost = auth
    vhost_name = vhost.name
    config = conn.state.config
    if pkt.will is not None and not conn.allowed(WRITE, "exchange"):
        return P.NOT_AUTHORIZED
    if pkt.will is not None and too_long(pkt.will.topic):
        return P.TOPIC_NAME_INVALID
    conn.user = user
    # Session expiry: 3.1.1's clean session flag, or MQTT 5's interval (capped).
    if v5:
        asked = props.get(P.SESSION_EXPIRY_INTERVAL, 0)
        assert isinstance(asked, int)
        expiry = min(asked, config.mqtt_max_session_expiry) if asked else 0
    else:
        asked = expiry = 0 if pkt.clean_start else NEVER_EXPIRES
    conn.state.take_over(vhost_name, client_id, conn)
    conn.vhost = vhost
    conn.client_id = client_id
    stored = None if pkt.clean_start else conn.state.stored_session(vhost_name, client_id)
    if stored is None:
        # A clean start ends whatever was kept (queue, subscriptions, QoS 2 state).
        if conn.state.stored_session(vhost_name, client_id) is not None or pkt.clean_start:
            conn.state.discard_session(vhost, client_id)
        session = Session(client_id, vhost_name, expiry)
    else:
        session = stored
        session.expiry = expiry
        session.disconnected_at = None
    conn.session = session
    if not session.persistent:
        conn.state.sessions(vhost_name).forget(client_id)
    # Keep alive, receive maximum, sizes, aliases.
    conn.keepalive = pkt.keep_alive
    connack: P.Properties = {}
    if config.mqtt_max_keepalive and (
        not conn.keepalive or conn.keepalive > config.mqtt_max_keepalive
    ):
        conn.keepalive = config.mqtt_max_keepalive
        if v5:
            connack[P.SERVER_KEEP_ALIVE] = conn.keepalive
    receive_max = props.get(P.RECEIVE_MAXIMUM, 65535)
    assert isinstance(receive_max, int)
    client_max = props.get(P.MAXIMUM_PACKET_SIZE)
    alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
    conn.delivery.start(
        vhost,
        session,
        client_id,
        conn.level,
        window=min(receive_max, config.mqtt_prefetch),
        client_max_packet=client_max if isinstance(client_max, int) else 0,
        alias_max_out=alias_max if isinstance(alias_max, int) else 0,
    )
    conn.publishing.alias_max_in = config.mqtt_topic_alias_maximum if v5 else 0
    conn.decoder.max_packet_size = max_packet_size(config)
    conn.will = pkt.will
    if v5:
        if assigned is not None:
            connack[P.ASSIGNED_CLIENT_IDENTIFIER] = assigned
        if asked != expiry:
            connack[P.SESSION_EXPIRY_INTERVAL] = expiry
        if conn.publishing.alias_max_in:
            connack[P.TOPIC_ALIAS_MAXIMUM] = conn.publishing.alias_max_in
        connack[P.MAXIMUM_PACKET_SIZE] = conn.decoder.max_packet_size
        connack[P.RECEIVE_MAXIMUM] = MAX_AWAITING_RELEASE
        if method is not None:
            connack[P.AUTHENTICATION_METHOD] = method
            conn.auth_method = TOKEN_METHOD
    conn.send(encode(ConnAck(stored is not None, 0, connack), conn.level))
    conn.client_session.opened(conn, vhost)  # counted against the limits, listed
    log.debug(
        "%s: MQTT %s client '%s' connected as '%s' to vhost '%s' (session %s)",
        conn.name,
        "5" if v5 else "3.1.1",
        client_id,
        user.name,
        vhost_name,
        "resumed" if stored is not None else "new",
    )
    if session.persistent:
        conn.state.sessions(vhost_name).save(session)
    # Resume: outgoing QoS 2 releases first, then the queued messages.
    for pid in sorted(session.released):
        conn.send(encode(PubRel(pid), conn.level))
    conn.subscriptions.attach_consumers()
    return 0


def reauthenticate(conn: MQTTConnection, pkt: Auth) -> None:
    """An AUTH after CONNECT (MQTT 5 section 4.12.1): a new token for the
    connection's user, with the CONNECT's method. Accepted: its scopes and
    expiry replace the old ones and AUTH 0x00 answers; refused: DISCONNECT 0x87
    (Not authorized). Without the CONNECT's method, a protocol error."""
    method = pkt.properties.get(P.AUTHENTICATION_METHOD)
    if conn.auth_method is None or method != conn.auth_method:
        raise ProtocolViolation(
            P.PROTOCOL_ERROR, "AUTH without the CONNECT's authentication method"
        )
    if pkt.reason_code != P.RE_AUTHENTICATE:
        raise ProtocolViolation(P.PROTOCOL_ERROR, "AUTH: only re-authentication is expected")
    data = pkt.properties.get(P.AUTHENTICATION_DATA)
    try:
        token = data.decode("utf-8") if isinstance(data, bytes) else ""
    except UnicodeDecodeError:
        token = ""
    why = conn.client_session.update_secret(token)
    if why is not None:
        log.warning("%s: MQTT re-authentication refused: %s", conn.name, why)
        conn.disconnect(P.NOT_AUTHORIZED, "re-authentication refused")
        return
    conn.publishing.permissions_changed()
    log.debug("%s: MQTT client '%s' re-authenticated", conn.name, conn.client_id)
    conn.send(encode(Auth(P.SUCCESS, {P.AUTHENTICATION_METHOD: method}), MQTT_5))
