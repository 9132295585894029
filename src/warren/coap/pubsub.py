"""CoAP requests on the MQTT topic space: ``/ps/<topic>`` (docs/coap.md).

- ``POST`` (or ``PUT``) ``/ps/<topic>`` publishes the payload to the MQTT
  exchange under the topic's MQTT routing key (core/mqtt_topics.py), as an
  MQTT PUBLISH: a confirmable request at QoS 1, answered 2.04 only once the
  message is settled (stored and synced, the client session's commit, as a
  PUBACK waits), a non-confirmable one at QoS 0, answered at once.
  ``?retain=true`` also keeps it as the topic's retained message.
- ``GET /ps/<filter>`` with Observe 0 subscribes (coap/observe.py); without
  Observe it answers the newest retained message the filter matches, or 4.04.

Every request logs in: ``?u=<user>&p=<password>`` in its query (EMQX's CoAP
gateway's form), else ``[coap] anonymous_user`` if set, through
the client session (failed logins slowed and counted as every protocol's),
and every action is checked against the user's permissions and topic
permissions as MQTT's is. Requests per source address per second are
limited (core/rate_limits.py's per-address window), before any password is
checked.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from warren.coap import codec as C
from warren.coap.blockwise import asked_szx, resource_key
from warren.coap.clients import CoAPClients
from warren.coap.mapping import content_format, message_qos, publish_properties
from warren.coap.observe import Observation
from warren.core.commit import NotStored
from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.mqtt_topics import (
    is_valid_topic_filter,
    is_valid_topic_name,
    mqtt_to_amqp,
    too_long,
)
from warren.core.session import ClientSession, LoginRefused
from warren.core.users import CONFIGURE, READ, WRITE, User, UserStore
from warren.core.vhost_routing import REJECTED_BY_QUEUE

if TYPE_CHECKING:
    from warren.coap.endpoint import Address, Endpoint
    from warren.core.exchange import Exchange
    from warren.core.rate_limits import RateLimits
    from warren.core.vhost import VHost
    from warren.node import Node

__all__ = ["PubSub", "RetainedTopics"]

log = logging.getLogger("warren.coap")

#: How long a checked user name and password are taken as valid for the same
#: source address (ms of the node clock): a password hash per request would
#: cost more than the request.
LOGIN_CACHE_MS = 60_000
_LOGIN_CACHE_MAX = 1024
#: Max-Age (s) of a 5.03 for a resource alarm, as the HTTP bridge's Retry-After.
_RETRY_S = 5


class RetainedTopics(Protocol):
    """MQTT's retained messages, given by the composition root (warren.app):
    a protocol package never imports another."""

    def latest(self, vhost: str, topic_filter: str, now_ms: int) -> tuple[bytes, bytes] | None:
        """(payload, AMQP properties) of the newest retained message the filter matches."""
        ...

    def put(
        self, vhost: str, topic: str, payload: bytes, qos: int, properties: bytes, now_ms: int
    ) -> object | None:
        """Retain a message on ``topic`` (an empty payload clears it, as MQTT's);
        the store it was written to, for a QoS 1 answer to wait for its sync
        (None: not kept on disk)."""
        ...


class _Refused(Exception):
    def __init__(
        self,
        code: int,
        text: str,
        options: list[tuple[int, bytes]] | None = None,
        delay_ms: float = 0.0,
    ) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.options = options or []
        #: How long to hold the answer (a failed login's, core/auth_guard.py).
        self.delay_ms = delay_ms


class _Owner:
    """Who a request's client session is, for the log."""

    def __init__(self, name: str) -> None:
        self.name = name


class PubSub:
    """The ``/ps`` resources of one CoAP listener."""

    def __init__(
        self,
        node: Node,
        endpoint: Endpoint,
        limits: RateLimits,
        retained: RetainedTopics | None,
        local: tuple[str, int] | None = None,
        peer_user: Callable[[Address], str | None] | None = None,
    ) -> None:
        self.node = node
        #: The user DTLS authenticated ``addr`` as (its PSK identity), if any.
        self.peer_user = peer_user
        self.config = node.config
        self.endpoint = endpoint
        self.limits = limits
        self.retained = retained
        #: Open observations by (address, token).
        self.observations: dict[tuple[Address, bytes], Observation] = {}
        self._logins: dict[tuple[str, str, str], tuple[int, User]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Source addresses that logged in, listed as connections (clients.py).
        self.clients = CoAPClients(node, local, self._observations_of)

    # -- requests -------------------------------------------------------------------------
    def request(self, req: C.CoAPMessage, addr: Address) -> None:
        """The endpoint's handler: every request is answered, never raises."""
        try:
            self._request(req, addr)
        except _Refused as exc:
            if exc.delay_ms > 0:  # a failed login's answer is held
                refused = exc
                self.node.clock.call_later(
                    refused.delay_ms,
                    lambda: self._reply(req, addr, refused.code, refused.text, refused.options),
                )
            else:
                self._reply(req, addr, exc.code, exc.text, exc.options)
        except Exception:
            log.exception("CoAP: a request from %s failed", addr)
            self._reply(req, addr, C.INTERNAL_SERVER_ERROR, "internal error")

    def _reply(
        self,
        req: C.CoAPMessage,
        addr: Address,
        code: int,
        text: str,
        options: list[tuple[int, bytes]] | None = None,
    ) -> None:
        """An error answer: its text as the diagnostic payload (RFC 7252 5.5.2),
        logged at most a line a second (endpoint.log_limited)."""
        if code >= C.BAD_REQUEST:
            self.endpoint.log_limited(
                logging.INFO,
                "CoAP: %s from %s refused: %d.%02d %s",
                _method(req),
                addr,
                code >> 5,
                code & 31,
                text,
            )
        self.endpoint.reply(req, addr, code, options or [], text.encode())

    def _request(self, req: C.CoAPMessage, addr: Address) -> None:
        if not self.limits.allow_connection(str(addr[0])):
            raise _Refused(
                C.TOO_MANY_REQUESTS, "too many requests", [(C.MAX_AGE, C.encode_uint(1))]
            )
        try:
            path = [p.decode("utf-8") for p in req.all(C.URI_PATH)]
            query = dict(_query_item(q.decode("utf-8")) for q in req.all(C.URI_QUERY))
        except UnicodeDecodeError:
            raise _Refused(C.BAD_REQUEST, "Uri-Path and Uri-Query must be UTF-8") from None
        if not path or path[0] != "ps":
            raise _Refused(C.NOT_FOUND, "no such resource (try /ps/<topic>)")
        topic = "/".join(path[1:])
        if not topic:
            raise _Refused(C.BAD_REQUEST, "no topic: /ps/<topic>")
        if req.code in (C.POST, C.PUT):
            self._publish(req, addr, topic, query)
        elif req.code == C.GET:
            self._get(req, addr, topic, query)
        else:
            raise _Refused(C.METHOD_NOT_ALLOWED, "POST or PUT to publish, GET to observe")

    def _login(self, query: dict[str, str], addr: Address) -> tuple[ClientSession, VHost]:
        """The request's client session, logged in and open in ``[coap] vhost``."""
        host = str(addr[0])
        session = ClientSession(self.node, _Owner(f"CoAP client {host}:{addr[1]}"))
        username, password = query.get("u"), query.get("p")
        peer_user = self.peer_user(addr) if self.peer_user is not None else None
        try:
            if peer_user is not None:  # DTLS's PSK identity vouches, as a certificate
                if username not in (None, peer_user):
                    raise _Refused(C.UNAUTHORIZED, "?u= is not the DTLS PSK identity")
                self._check_password(session, host, peer_user, None)
            elif username is None:
                anonymous = self.config.coap_anonymous_user
                if not anonymous:
                    raise _Refused(C.UNAUTHORIZED, "credentials required (?u=<user>&p=<password>)")
                session.login("coap", anonymous, None, host)
            else:
                self._check_password(session, host, username, password or "")
            # A listed client is one of the connections the max-connections
            # limits count: its own next request is not one more.
            session.open(self.config.coap_vhost, counted=self._listed(addr, session))
        except LoginRefused as exc:
            code = C.FORBIDDEN if exc.reason == LoginRefused.NO_ACCESS else C.UNAUTHORIZED
            if exc.reason in (LoginRefused.LIMIT, LoginRefused.NO_VHOST):
                code = C.SERVICE_UNAVAILABLE
            raise _Refused(code, exc.text, delay_ms=exc.delay_ms) from None
        vhost = self.node.vhosts[self.config.coap_vhost]
        if not self.clients.seen(addr, session, vhost):
            raise _Refused(
                C.SERVICE_UNAVAILABLE,
                "the node's connection limit is reached",
                [(C.MAX_AGE, C.encode_uint(_RETRY_S))],
            )
        return session, vhost

    def _listed(self, addr: Address, session: ClientSession) -> bool:
        """Whether ``addr`` is a client listed with the session's user already."""
        client = self.clients.by_addr.get(addr)
        user = session.user
        return (
            client is not None
            and client.user is not None
            and user is not None
            and (client.user.name == user.name)
        )

    def _check_password(
        self, session: ClientSession, host: str, username: str, password: str | None
    ) -> None:
        """Log in (None: DTLS's identity vouches), a login kept for LOGIN_CACHE_MS."""
        # The password's digest, not the password, is kept.
        digest = "psk" if password is None else hashlib.sha256(password.encode()).hexdigest()
        key = (host, username, digest)
        now = self.node.clock.now_ms()
        cached = self._logins.get(key)
        if cached is not None and cached[0] > now:
            user = cached[1]
            if user.expires_ms is None or user.expires_ms > now:  # an access token's expiry
                session.user = user
                return
        session.login("coap", username, password, host)
        assert session.user is not None
        if len(self._logins) >= _LOGIN_CACHE_MAX:
            self._logins = {k: v for k, v in self._logins.items() if v[0] > now}
            if len(self._logins) >= _LOGIN_CACHE_MAX:
                self._logins.clear()
        self._logins[key] = (now + LOGIN_CACHE_MS, session.user)

    def _exchange(self, vhost: VHost) -> Exchange:
        exchange = vhost.exchanges.get(self.config.mqtt_exchange)
        if exchange is None:
            raise _Refused(C.SERVICE_UNAVAILABLE, f"no exchange '{self.config.mqtt_exchange}'")
        return exchange

    # -- publishing -----------------------------------------------------------------------
    def _publish(
        self, req: C.CoAPMessage, addr: Address, topic: str, query: dict[str, str]
    ) -> None:
        limit = self.config.coap_max_payload
        if len(req.payload) > limit:  # blocks are put together before (blockwise.py)
            raise _Refused(
                C.REQUEST_ENTITY_TOO_LARGE,
                f"payload over {limit} bytes",
                [(C.SIZE1, C.encode_uint(limit))],
            )
        if not is_valid_topic_name(topic) or too_long(topic):
            raise _Refused(C.BAD_REQUEST, f"'{topic}' is not an MQTT topic name")
        session, vhost = self._login(query, addr)
        exchange = self._exchange(vhost)
        key = mqtt_to_amqp(topic)
        self._check(session, WRITE, "exchange", exchange.name)
        self._check_topic(session, vhost, exchange, key, WRITE)
        if self.node.alarms:
            raise _Refused(
                C.SERVICE_UNAVAILABLE,
                "a resource alarm is on",
                [(C.MAX_AGE, C.encode_uint(_RETRY_S))],
            )
        raw_format = req.option(C.CONTENT_FORMAT)
        fmt = C.decode_uint(raw_format) if raw_format is not None else None
        qos = 1 if req.mtype == C.CON else 0
        retain = query.get("retain", "").lower() in ("1", "true")
        props = publish_properties(qos, fmt, retain)
        now = self.node.clock.now_ms()
        msg = Message(exchange.name, key, props, req.payload, now)
        retained_log = None
        if retain and self.retained is not None:
            retained_log = self.retained.put(vhost.name, topic, req.payload, qos, props, now)
        stats = vhost.base_stats
        stats.publish += 1
        if not qos:
            if not vhost.router.publish(exchange, msg, None):
                stats.drop_unroutable += 1
            self.endpoint.reply(req, addr, C.CHANGED)
            return
        assert session.user is not None
        commit = session.commit(vhost, f"CoAP publish by user '{session.user.name}'")
        routed = commit.publish(exchange, msg)
        if not routed:
            stats.drop_unroutable += 1
        task = asyncio.ensure_future(
            self._settled(session, commit, routed, retained_log, req, addr)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settled(
        self,
        session: ClientSession,
        commit: Any,
        routed: int,
        retained_log: object | None,
        req: C.CoAPMessage,
        addr: Address,
    ) -> None:
        """A confirmable publish is answered once its message is settled (and,
        retained, the retained store synced, as MQTT's PUBACK waits for both)."""
        try:
            await commit.stored()
            if retained_log is not None:
                synced: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                if session.when_synced([retained_log], synced.set_result) and not await synced:
                    raise NotStored("the retained message could not be stored")
        except NotStored as exc:
            self._reply(req, addr, C.SERVICE_UNAVAILABLE, exc.text)
            return
        except Exception:
            log.exception("CoAP: a publish from %s failed", addr)
            self._reply(req, addr, C.INTERNAL_SERVER_ERROR, "internal error")
            return
        if routed == REJECTED_BY_QUEUE:
            self._reply(req, addr, C.SERVICE_UNAVAILABLE, "a queue refused the message")
        else:
            self.endpoint.reply(req, addr, C.CHANGED)

    # -- reading and observing ------------------------------------------------------------
    def _get(
        self, req: C.CoAPMessage, addr: Address, topic_filter: str, query: dict[str, str]
    ) -> None:
        if topic_filter.startswith("$share/") or not is_valid_topic_filter(topic_filter):
            raise _Refused(C.BAD_REQUEST, f"'{topic_filter}' is not an MQTT topic filter")
        raw = req.option(C.OBSERVE)
        observe = C.decode_uint(raw) if raw is not None else None
        old = self.observations.get((addr, req.token))
        if old is not None and observe in (0, 1):  # re-registered, or deregistered
            old.end()
        session, vhost = self._login(query, addr)
        exchange = self._exchange(vhost)
        key = mqtt_to_amqp(topic_filter)
        self._check(session, READ, "exchange", exchange.name)
        self._check_topic(session, vhost, exchange, key, READ)
        latest = None
        if self.retained is not None:
            latest = self.retained.latest(vhost.name, topic_filter, self.node.clock.now_ms())
        options: list[tuple[int, bytes]] = []
        payload = b""
        if latest is not None:
            payload = latest[0]
            fmt = content_format(message_qos(latest[1])[1])
            if fmt is not None:
                options.append((C.CONTENT_FORMAT, C.encode_uint(fmt)))
        if observe != 0:
            if latest is None:
                raise _Refused(C.NOT_FOUND, f"no retained message on '{topic_filter}'")
            self.endpoint.reply(req, addr, C.CONTENT, options, payload)
            return
        obs = self._observe(req, addr, session, vhost, exchange, topic_filter, key, query)
        options.append((C.OBSERVE, C.encode_uint(obs.observe)))
        self.endpoint.reply(req, addr, C.CONTENT, options, payload)

    def _observe(
        self,
        req: C.CoAPMessage,
        addr: Address,
        session: ClientSession,
        vhost: VHost,
        exchange: Exchange,
        topic_filter: str,
        key: str,
        query: dict[str, str],
    ) -> Observation:
        if len(self.observations) >= self.config.coap_max_observations:
            raise _Refused(C.SERVICE_UNAVAILABLE, "too many observations on this node")
        host = addr[0]
        held = sum(1 for a, _ in self.observations if a[0] == host)
        if not self.node.rate_limits.allow_subscription(held):
            raise _Refused(C.TOO_MANY_REQUESTS, "too many observations from this address")
        qos = 0 if query.get("qos") == "0" else 1
        obs = Observation(
            self.endpoint, addr, req.token, session, vhost, topic_filter, qos, self._ended
        )
        obs.resource = resource_key(req)
        obs.block_szx = asked_szx(req)
        for kind in (CONFIGURE, WRITE, READ):
            self._check(session, kind, "queue", obs.queue_name)
        queue = vhost.declare_queue(obs.queue_name, durable=False, auto_delete=True)
        try:
            vhost.bind(exchange, queue, key)
            obs.start(queue)
        except BaseException:
            obs.end()
            raise
        self.observations[(addr, req.token)] = obs
        return obs

    def _observations_of(self, addr: Address) -> list[Observation]:
        return [obs for (a, _), obs in self.observations.items() if a == addr]

    def _ended(self, obs: Observation) -> None:
        if self.observations.get((obs.addr, obs.token)) is obs:
            del self.observations[(obs.addr, obs.token)]

    # -- permissions ----------------------------------------------------------------------
    @staticmethod
    def _check(session: ClientSession, kind: str, resource: str, name: str) -> None:
        if not session.allowed(kind, resource, name):
            raise _Refused(C.FORBIDDEN, f"{kind} access to {resource} '{name}' refused")

    @staticmethod
    def _check_topic(
        session: ClientSession, vhost: VHost, exchange: Exchange, key: str, kind: str
    ) -> None:
        user = session.user
        assert user is not None
        if user.topic_permissions and exchange.type == "topic":
            try:
                UserStore.check_topic(user, vhost.name, exchange.name, key, kind)
            except BrokerError as exc:
                raise _Refused(C.FORBIDDEN, exc.text) from None

    def close(self) -> None:
        """Shutdown: every observation ends, pending publishes are dropped unanswered."""
        for task in self._tasks:
            task.cancel()
        for obs in list(self.observations.values()):
            obs.end()
        self.clients.close()


def _query_item(item: str) -> tuple[str, str]:
    name, _, value = item.partition("=")
    return name, value


def _method(req: C.CoAPMessage) -> str:
    return {C.GET: "GET", C.POST: "POST", C.PUT: "PUT", C.DELETE: "DELETE"}.get(
        req.code, f"code {req.code >> 5}.{req.code & 31:02d}"
    )
