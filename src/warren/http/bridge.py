"""The HTTP bridge: publish and consume over plain HTTP (docs/http-bridge.md).

Served on the management API's port under ``/bridge/``, a prefix of its own:
the ``/api/`` space is RabbitMQ's and its clients (rabbitmqadmin, the UI)
expect nothing else there, while the bridge answers in its own shapes (a raw
body in, 201/202 out, ids to ack). Requests log in as the API's do (basic auth,
the same users), but need no management tag: a program that only has HTTP is
a client like an AMQP one, and needs the permissions an AMQP client would
(write on the exchange to publish, read on the queue to consume).

Publishing answers once the messages are durable, as a publisher confirm
(core/commit.py): 201 routed, 202 unroutable. Consuming is a bridge consumer
(bridge_consumer.py): long-polls or an SSE stream take its messages, acks and
nacks settle them by id.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import HttpVersion11, web

from warren.core.commit import NOT_STORED, NotStored
from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.properties import decode_properties
from warren.core.session import ClientSession
from warren.core.users import READ, WRITE, User, UserStore
from warren.core.vhost_routing import REJECTED_BY_QUEUE
from warren.http.api_objects import _payload, _properties, _properties_json
from warren.http.bodies import TOO_LARGE, BodyBudget, read_body
from warren.http.bridge_consumer import BridgeSubscription, Delivered
from warren.http.common import new_name
from warren.http.replies import ApiError, dumps, from_broker_error, json_response

if TYPE_CHECKING:
    from warren.core.vhost import VHost
    from warren.node import Node

log = logging.getLogger("warren.http")

__all__ = ["Bridge"]

PREFIX = "/bridge/"
#: Property headers: X-Warren-<name> -> the basic property (strings unless said).
_HEADER_PROPERTIES = {
    "content-encoding": "content_encoding",
    "delivery-mode": "delivery_mode",
    "priority": "priority",
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "expiration": "expiration",
    "message-id": "message_id",
    "timestamp": "timestamp",
    "type": "type",
    "app-id": "app_id",
}
_INTEGER_PROPERTIES = ("delivery_mode", "priority", "timestamp")
_HEADER = "x-warren-header-"
#: A consumer's defaults and bounds (a request may ask for less or more, within them;
#: the visibility timeout's, the long-poll's wait and the consumers per user are
#: settings: config_edges.py).
DEFAULT_PREFETCH, MAX_PREFETCH = 10, 1000
DEFAULT_IDLE_S, MAX_IDLE_S = 60, 3600
#: An SSE stream's comment line, so that a dropped client is noticed.
HEARTBEAT_MS = 15_000

Authenticate = Callable[[web.Request], Awaitable[User]]


def _error(status: int, reason: str) -> ApiError:
    return ApiError(
        status,
        {
            400: "bad_request",
            403: "access_refused",
            404: "not_found",
            409: "conflict",
            413: "too_large",
            429: "too_many",
            503: "unavailable",
        }.get(status, "error"),
        reason,
    )


class _Call:
    """One authenticated bridge request."""

    def __init__(self, request: web.Request, node: Node, user: User, parts: list[str]) -> None:
        self.request = request
        self.node = node
        self.user = user
        self.parts = parts

    def vhost(self, name: str) -> VHost:
        vhost = self.node.vhosts.get(name)
        if vhost is None:
            raise _error(404, f"no vhost '{name}'")
        if name not in self.user.permissions:
            raise _error(403, f"user '{self.user.name}' has no access to vhost '{name}'")
        return vhost

    def check(self, vhost: str, kind: str, resource: str, name: str) -> None:
        perm = self.user.permissions.get(vhost)
        if perm is None or not perm.allows(kind, name):
            raise _error(403, f"{kind} access to {resource} '{name}' in vhost '{vhost}' refused")


class Bridge:
    """The ``/bridge/`` routes of the HTTP listener, and the consumers they made."""

    def __init__(self, node: Node, authenticate: Authenticate, budget: BodyBudget) -> None:
        self.node = node
        self.authenticate = authenticate
        self.budget = budget
        self.consumers: dict[str, BridgeSubscription] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route(
            "*", PREFIX + r"{tail:[\s\S]*}", self.handle, expect_handler=self.expect
        )

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` (curl's for a body over 1 KiB): a body over the
        limit is refused before the client sends it."""
        if request.version != HttpVersion11:
            return None
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
        length = request.content_length
        if length is not None and length > self.node.config.http_bridge_max_body_size:
            refusal = self._too_large().response()
            # The body will not come: the connection closes after the answer, and
            # nothing waits (aiohttp's lingering close) for a body to skip.
            refusal.force_close()
            request.content.feed_eof()
            return refusal
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response's own bytes come after
        return None

    def _too_large(self) -> ApiError:
        limit = self.node.config.http_bridge_max_body_size
        return _error(413, f"the body is over the {limit} bytes allowed")

    def close_all(self) -> None:
        for sub in list(self.consumers.values()):
            sub.close()
        self.consumers.clear()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return exc.response()
        except BrokerError as exc:  # a refusal is 403 here (the API's is RabbitMQ's 401)
            refusal = _error(403, exc.text) if exc.code == 403 else from_broker_error(exc)
            return refusal.response()
        except (asyncio.CancelledError, web.HTTPException):
            raise
        except Exception:
            log.exception("HTTP bridge: %s %s failed", request.method, request.path)
            return _error(500, "internal error").response()
        finally:
            self.budget.release(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0][len(PREFIX) :]
        parts = [unquote(p) for p in path.split("/")]
        user = await self.authenticate(request)
        call = _Call(request, self.node, user, parts)
        method, kind = request.method, parts[0]
        if kind == "exchanges" and len(parts) == 3 and method == "POST":
            return await self.publish_exchange(call)
        if kind == "topics" and len(parts) >= 3 and method == "POST":
            return await self.publish_topic(call)
        if kind == "queues" and len(parts) == 4 and parts[3] == "consumers" and method == "POST":
            return await self.create_consumer(call)
        if kind == "consumers" and len(parts) == 2 and method == "DELETE":
            self._consumer(call).close()
            return web.Response(status=204)
        if kind == "consumers" and len(parts) == 3:
            action = (method, parts[2])
            if action == ("GET", "messages"):
                return await self.long_poll(call)
            if action == ("GET", "events"):
                return await self.events(call)
            if action == ("POST", "ack"):
                return await self.settle(call, ack=True)
            if action == ("POST", "nack"):
                return await self.settle(call, ack=False)
        raise _error(404, "no such bridge resource")

    async def _body(self, request: web.Request) -> bytes:
        """The body within the bridge's limit: 413 over it."""
        try:
            raw = await read_body(self.node.config, self.budget, request)
        except ApiError as exc:
            if exc.reason == TOO_LARGE:
                raise self._too_large() from None
            raise
        return bytes(raw)

    async def _json(self, request: web.Request) -> dict[str, Any]:
        raw = await self._body(request)
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise _error(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise _error(400, "the body is not a JSON object")
        return data

    # -- publishing -----------------------------------------------------------------------
    async def publish_exchange(self, call: _Call) -> web.StreamResponse:
        vhost = call.vhost(call.parts[1])
        name = call.parts[2] or "amq.default"
        exchange = vhost.exchanges.get("" if name == "amq.default" else name)
        if exchange is None:
            raise _error(404, f"no exchange '{name}' in vhost '{vhost.name}'")
        if exchange.internal:
            raise _error(403, f"exchange '{name}' is internal")
        call.check(vhost.name, WRITE, "exchange", exchange.name)
        return await self._publish(call, vhost, exchange, None)

    async def publish_topic(self, call: _Call) -> web.StreamResponse:
        """To an MQTT topic: the MQTT exchange, the topic as MQTT maps it ('/' to '.')."""
        vhost = call.vhost(call.parts[1])
        topic = "/".join(call.parts[2:])
        if not topic or "+" in topic or "#" in topic:
            raise _error(400, f"'{topic}' is not an MQTT topic name")
        exchange = vhost.exchanges.get(self.node.config.mqtt_exchange)
        if exchange is None:
            raise _error(404, f"no exchange '{self.node.config.mqtt_exchange}'")
        call.check(vhost.name, WRITE, "exchange", exchange.name)
        return await self._publish(call, vhost, exchange, topic.replace("/", "."))

    async def _publish(
        self, call: _Call, vhost: VHost, exchange: Any, topic_key: str | None
    ) -> web.StreamResponse:
        request = call.request
        fmt = request.query.get("format", "raw")
        body = await self._body(request)
        if fmt == "raw":
            messages = [self._raw_message(request, body, topic_key is not None)]
        elif fmt == "envelope":
            messages = [_envelope(_json_value(body))]
        elif fmt == "jsonl":
            lines = [line for line in body.split(b"\n") if line.strip()]
            messages = [_envelope(_json_value(line)) for line in lines]
        else:
            raise _error(400, f"unknown format '{fmt}' (raw, envelope, jsonl)")
        if self.node.alarms:  # as AMQP publishers are blocked: come back later
            raise ApiError(503, "unavailable", "a resource alarm is on", {"Retry-After": "5"})
        now = self.node.clock.now_ms()
        built: list[Message] = []
        for key, props, payload in messages:
            if topic_key is not None:
                key = topic_key
            key = new_name("routing_key", key)
            if exchange.type == "topic" and call.user.topic_permissions:
                UserStore.check_topic(call.user, vhost.name, exchange.name, key, WRITE)
            claimed = decode_properties(props).user_id
            if claimed is not None and claimed != call.user.name:  # AMQP's rule
                raise _error(403, f"user_id property '{claimed}' is not the user")
            built.append(Message(exchange.name, key, props, payload, now))
        what = f"HTTP bridge publish by user '{call.user.name}'"
        commit = ClientSession(self.node, call.user).commit(vhost, what)
        outcomes = []
        for msg in built:
            routed = commit.publish(exchange, msg)
            vhost.base_stats.publish += 1
            if not routed:
                vhost.base_stats.drop_unroutable += 1
            outcomes.append(
                "rejected" if routed == REJECTED_BY_QUEUE else "routed" if routed else "unroutable"
            )
        try:
            await commit.stored()
        except NotStored:
            raise _error(503, f"not stored: {NOT_STORED}") from None
        if fmt == "jsonl":
            return json_response({"outcomes": outcomes})
        outcome = outcomes[0]
        if outcome == "rejected":
            raise _error(409, "a queue refused the message (its length limit)")
        return json_response(
            {"routed": outcome == "routed"}, status=201 if outcome == "routed" else 202
        )

    @staticmethod
    def _raw_message(request: web.Request, body: bytes, to_topic: bool) -> tuple[str, bytes, bytes]:
        """The body as the payload, the properties from the X-Warren-* headers; on
        an MQTT topic persistent unless they say otherwise (MQTT subscribers see
        QoS 1: the answer waited as a PUBACK does)."""
        props: dict[str, Any] = {"delivery_mode": 2} if to_topic else {}
        if request.content_type and "Content-Type" in request.headers:
            props["content_type"] = request.headers["Content-Type"]
        headers: dict[str, Any] = {}
        for name, value in request.headers.items():
            lower = name.lower()
            if lower.startswith(_HEADER):
                headers[lower[len(_HEADER) :]] = value
            elif lower.startswith("x-warren-") and lower[9:] in _HEADER_PROPERTIES:
                key = _HEADER_PROPERTIES[lower[9:]]
                if key in _INTEGER_PROPERTIES:
                    try:
                        props[key] = int(value)
                    except ValueError:
                        raise _error(400, f"{name} must be an integer") from None
                else:
                    props[key] = value
        if headers:
            props["headers"] = headers
        key = request.headers.get("X-Warren-Routing-Key", "")
        return key, _properties(props), body

    # -- consuming ------------------------------------------------------------------------
    async def create_consumer(self, call: _Call) -> web.StreamResponse:
        vhost = call.vhost(call.parts[1])
        name = call.parts[2]
        try:  # another connection's exclusive queue is locked, as over AMQP
            queue = vhost.get_queue(name)
        except BrokerError as exc:
            raise _error(404 if exc.code == 404 else 409, exc.text) from None
        call.check(vhost.name, READ, "queue", name)
        options = await self._json(call.request)
        for gone in [s for s in self.consumers.values() if s.closed]:
            del self.consumers[gone.id]
        config = self.node.config
        mine = sum(1 for s in self.consumers.values() if s.user == call.user.name)
        if 0 < config.http_bridge_max_consumers_per_user <= mine:
            raise _error(429, f"user '{call.user.name}' has {mine} bridge consumers already")
        prefetch = _bounded(options, "prefetch", DEFAULT_PREFETCH, 1, MAX_PREFETCH)
        most = config.http_bridge_max_visibility_timeout
        default = min(config.http_bridge_visibility_timeout, most)
        visibility = _bounded(options, "visibility_timeout", default, 1, most)
        idle = _bounded(options, "idle_timeout", DEFAULT_IDLE_S, 1, MAX_IDLE_S)
        sub = BridgeSubscription(
            self.node,
            self.node.clock,
            vhost,
            queue,
            call.user.name,
            prefetch,
            visibility * 1000,
            idle * 1000,
        )
        self.consumers[sub.id] = sub
        return json_response(
            {
                "id": sub.id,
                "queue": name,
                "vhost": vhost.name,
                "prefetch": prefetch,
                "visibility_timeout": visibility,
                "idle_timeout": idle,
                "url": f"{PREFIX}consumers/{sub.id}",
            },
            status=201,
        )

    def _admitted(self, call: _Call) -> BridgeSubscription:
        """The consumer of a long-poll or SSE request: one at a time, at most
        REQUESTS_PER_SECOND started (429 beyond)."""
        sub = self._consumer(call)
        if sub.busy:
            raise _error(409, "a request of this consumer is under way")
        if not sub.admit():
            raise ApiError(
                429, "too_many", "too many requests of this consumer", {"Retry-After": "1"}
            )
        return sub

    def _consumer(self, call: _Call) -> BridgeSubscription:
        sub = self.consumers.get(call.parts[1])
        if sub is not None and sub.closed:
            del self.consumers[sub.id]
            sub = None
        if sub is None or sub.user != call.user.name:
            # Consumers live in the node's memory: after a restart (or a close, an
            # idle timeout) the client makes a new one; its unsettled messages
            # went back to the queue.
            raise ApiError(
                404,
                "consumer_not_found",
                f"no bridge consumer '{call.parts[1]}': it was closed, idle longer than "
                "its idle_timeout, or the broker restarted since; create a new one with "
                "POST /bridge/queues/{vhost}/{queue}/consumers",
            )
        sub.touch()
        return sub

    async def long_poll(self, call: _Call) -> web.StreamResponse:
        """Up to ``max`` messages, waiting up to ``wait`` seconds for the first."""
        query = call.request.query
        most = _bounded(query, "max", 1, 1, MAX_PREFETCH)
        wait = _bounded(query, "wait", 0, 0, call.node.config.http_bridge_max_wait)
        encoding = _encoding(query)
        sub = self._admitted(call)
        sub.busy = True
        try:
            sub.want(most)
            await sub.wait(wait * 1000)
            transport = call.request.transport
            # A client gone while it waited: what came stays ready for the next poll.
            gone = transport is None or transport.is_closing()
            taken = [] if gone else sub.take(most)
        finally:
            sub.demand = 0
            sub.busy = False
            sub.touch()
        return json_response([_message(item, encoding) for item in taken])

    async def events(self, call: _Call) -> web.StreamResponse:
        """Server-Sent Events: each message an event (id: its id) as it comes, up to
        the prefetch unacked; a dropped connection closes the consumer."""
        encoding = _encoding(call.request.query)
        sub = self._admitted(call)
        sub.busy = True
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(call.request)
            while not sub.closed:
                sub.want(sub.consumer.prefetch_count)
                await sub.wait(HEARTBEAT_MS)
                transport = call.request.transport
                if transport is None or transport.is_closing():
                    break
                chunk = b"".join(
                    b"id: %d\nevent: message\ndata: %s\n\n"
                    % (item[0], dumps(_message(item, encoding)).encode())
                    for item in sub.take(len(sub.ready))
                )
                await response.write(chunk or b": keepalive\n\n")
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            sub.busy = False
            sub.close()
            self.consumers.pop(sub.id, None)
        return response

    async def settle(self, call: _Call, ack: bool) -> web.StreamResponse:
        sub = self._consumer(call)
        body = await self._json(call.request)
        ids = body.get("ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise _error(400, "ids must be a list of message ids")
        requeue = None if ack else bool(body.get("requeue", True))
        unknown = sub.settle(ids, requeue)
        return json_response({"settled": len(ids) - len(unknown), "unknown": unknown})


def _json_value(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise _error(400, "not JSON") from None


def _envelope(value: Any) -> tuple[str, bytes, bytes]:
    """A JSON envelope: routing_key, properties, payload, payload_encoding."""
    if not isinstance(value, dict):
        raise _error(400, "an envelope is a JSON object")
    payload = value.get("payload", "")
    encoding = value.get("payload_encoding", "string")
    if not isinstance(payload, str):
        raise _error(400, "payload must be a string")
    if encoding == "string":
        raw = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _error(400, "payload is not base64") from None
    else:
        raise _error(400, f"unknown payload_encoding '{encoding}' (string, base64)")
    return str(value.get("routing_key", "")), _properties(value.get("properties") or {}), raw


def _bounded(source: Any, key: str, default: int, low: int, high: int) -> int:
    value = source.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _error(400, f"{key} must be an integer") from None
    if isinstance(value, bool) or not low <= number <= high:
        raise _error(400, f"{key} must be from {low} to {high}")
    return number


def _encoding(query: Any) -> str:
    encoding = query.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise _error(400, "encoding is auto or base64")
    return str(encoding)


def _message(item: Delivered, encoding: str) -> dict[str, Any]:
    tag, msg, redelivered = item
    payload, used = _payload(msg.body, encoding, None)
    return {
        "id": tag,
        "exchange": msg.exchange,
        "routing_key": msg.routing_key,
        "redelivered": redelivered,
        "properties": _properties_json(msg.properties),
        "payload": payload,
        "payload_encoding": used,
    }
