"""RabbitMQ 4's ``/management`` node: declare, bind, purge and delete over AMQP 1.0.

RabbitMQ 4's clients manage queues, exchanges and bindings by "HTTP over
AMQP 1.0" on a link pair (a sender to target ``/management`` and a receiver
from source ``/management``, one link name): each request message names a
path in ``to`` (``/queues/:queue``, ``/exchanges/:exchange``, ``/bindings``
...), the method in ``subject`` (GET, PUT, POST, DELETE), ``$me`` in
``reply-to`` and carries its parameters as an amqp-value map; the reply has
the status code in ``subject`` ("200", "201", "204", "400", "404", "409" ...),
the request's message-id as its correlation-id and a map (or the error's
description) as its amqp-value. The paths, bodies, status codes and texts are
RabbitMQ 4's (rabbit_amqp_management), checked in its order; the paths are
read by management_paths.py.

The node knows no transport: the connection makes one per link pair and
passes each request message to :meth:`ManagementNode.request` with a
callback for the reply. Declarations go through the vhost as AMQP 0-9-1's do
(amqp/declarations.py), permissions through the client session, and a reply
is only given once the change is durable (the session's rule); replies keep
the order of their requests. As in RabbitMQ 4, a permission refusal is no
reply: :class:`ManagementError` (amqp:unauthorized-access) tells the
connection to end the session.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from warren.amqp1.errors import ConnectionError_, SessionError
from warren.amqp1.field_values import read_headers, to_table
from warren.amqp1.formats import STR8
from warren.amqp1.links import ManagementHandler
from warren.amqp1.management_paths import (
    BadPath,
    args_hash,
    binding_location,
    parse_binding_segment,
    parse_target,
    route,
    unquote,
)
from warren.amqp1.message import (
    AmqpMessage,
    AmqpValue,
    ApplicationProperties,
    Properties,
    decode_sections,
)
from warren.amqp1.types import Array, UInt, ULong
from warren.core.destination import EXCHANGE, QUEUE
from warren.core.errors import (
    AccessRefused,
    BrokerError,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    QueueLimitReached,
    QueueTypeRefused,
    ResourceError,
)
from warren.core.exchange import Binding, Exchange, exchange_class
from warren.core.queue import Queue
from warren.core.session import ClientSession
from warren.core.table_tags import decode_arguments, encode_arguments, wire_type
from warren.core.users import CONFIGURE, READ, WRITE, UserStore, check_routing_argument
from warren.core.vhost import VHost
from warren.queue_replicas import quorum_members, replicas

__all__ = [
    "UNAUTHORIZED_ACCESS",
    "INVALID_FIELD",
    "ManagementError",
    "ManagementNode",
    "decode_request",
]

log = logging.getLogger("warren.amqp1.management")

#: The conditions a ManagementError ends the session with.
UNAUTHORIZED_ACCESS: Final = "amqp:unauthorized-access"
INVALID_FIELD: Final = "amqp:invalid-field"

_DEFAULT_EXCHANGE_TEXT: Final = "operation not permitted on the default exchange"


class ManagementError(SessionError):
    """A request the node answers by ending the session (RabbitMQ 4 does so for
    a permission refusal): ``condition`` and ``description`` are the end's error."""


class _Status(Exception):
    """A request answered with an error status and its description."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _Pending:
    """A reply waiting for its change to be durable, or for those before it."""

    __slots__ = ("message", "ready", "reply")

    def __init__(self, message: AmqpMessage, reply: Callable[[AmqpMessage], None]) -> None:
        self.message = message
        self.reply = reply
        self.ready = False


def decode_request(payload: bytes | bytearray | memoryview) -> AmqpMessage:
    """A request transfer's message. Unlike a published message it may have no
    body section: RabbitMQ's clients send a GET or DELETE without one (Qpid
    Proton encodes no section for a None body), which counts as a null body.
    Raises codec.DecodeError for what is not message sections."""
    message = AmqpMessage()
    for section in decode_sections(payload):
        if isinstance(section, Properties):
            message.properties = section
        elif isinstance(section, AmqpValue):
            message.body.append(section)
    return message


# -- bodies -----------------------------------------------------------------------------
def _body(message: AmqpMessage) -> Any:
    """The request's amqp-value (None: none, or a null one)."""
    for section in message.body:
        if isinstance(section, AmqpValue):
            return section.value
    return None


def _fields(body: Any, what: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """A declaration's map: known keys, booleans as booleans, ``arguments`` as a
    core argument table; 400 on anything else (RabbitMQ 4's "bad ... property")."""
    if not isinstance(body, dict):
        raise _Status("400", f"bad {what} body: a map is expected")
    out = dict(defaults)
    for key, value in body.items():
        if not isinstance(key, str) or key not in defaults:
            raise _Status("400", f"bad {what} property {key!r}")
        if key == "arguments":
            value = _arguments(value)
        elif not isinstance(value, type(defaults[key])):
            raise _Status("400", f"bad {what} property {key!r}: {value!r}")
        elif isinstance(value, str):
            value = str(value)  # a symbol as the plain text it stands for
        out[key] = value
    return out


def _arguments(value: Any) -> dict[str, Any]:
    """An AMQP 1.0 map of arguments as the core's table, typed as RabbitMQ 4
    converts them to 0-9-1 (mapping.py's header rules)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Status("400", f"unsupported arguments {value!r}")
    for key in value:
        if not isinstance(key, str):
            raise _Status("400", f"unsupported argument {key!r}")
    table, _ = decode_arguments(to_table(value.items()))
    return table


def _arguments_out(arguments: dict[str, Any]) -> dict[str, Any]:
    """The core's argument table as RabbitMQ 4 shows it over AMQP 1.0."""
    if not arguments:
        return {}
    return {key: value for key, _tag, value in read_headers(encode_arguments(arguments), 0)}


def _resource(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's words for a resource in its texts."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def _no_cr_lf(name: str) -> None:
    if "\n" in name or "\r" in name:
        raise _Status(
            "400", f"Bad name '{name}': line feed and carriage return characters not allowed"
        )


class ManagementNode:
    """The ``/management`` node of one link pair (see the module docstring).

    ``session``: the connection's client session (logged in, its vhost open);
    ``owner``: the owner of the exclusive queues it declares (the session's
    owner, the connection, unless given); ``node_name``: the one node a
    queue's ``leader`` and ``replicas`` name, else ``cluster`` (the node's
    cluster_status) tells them, as the HTTP API's (queue_replicas.py).
    """

    def __init__(
        self,
        session: ClientSession,
        vhost: VHost,
        owner: object | None = None,
        node_name: str | None = None,
        cluster: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.session = session
        self.vhost = vhost
        self.owner = session.owner if owner is None else owner
        self.node_name = node_name
        self.cluster = cluster
        user = session.user
        assert user is not None, "the session has logged in"
        self.user = user
        self._topic_variables = {"username": user.name, "vhost": vhost.name}
        self._pending: deque[_Pending] = deque()
        self._closed = False

    # -- requests -----------------------------------------------------------------------
    def request(self, message: AmqpMessage, reply: Callable[[AmqpMessage], None]) -> None:
        """Carry out one request and ``reply`` once its change is durable, after
        the replies to the requests before it (at once, before this returns,
        when nothing waits). Raises ManagementError when the session must end
        instead (a permission refused, a request that is not one: no ``to`` or
        ``subject``, a ``reply-to`` other than ``$me``)."""
        props = message.properties
        if props is None or not isinstance(props.to, str) or not isinstance(props.subject, str):
            raise ManagementError(INVALID_FIELD, "a management request needs 'to' and 'subject'")
        if props.reply_to != "$me":
            raise ManagementError(INVALID_FIELD, "a management request's reply-to must be '$me'")
        mark = self.session.change_mark()
        try:
            status, body = self._handle(props.subject, props.to, _body(message))
        except BadPath as exc:
            status, body = "400", exc.text
        except _Status as exc:
            status, body = exc.status, exc.text
        if not status.startswith("2"):
            log.warning("request %s %s failed: %s", props.subject, props.to, body)
        response = AmqpMessage(
            properties=Properties(subject=status, correlation_id=props.message_id),
            application_properties=ApplicationProperties({"http:response": "1.1"}),
            body=[AmqpValue(body)],
        )
        pending = _Pending(response, reply)
        self._pending.append(pending)
        if not self.session.when_changes_durable(mark, lambda ok: self._durable(pending, ok)):
            pending.ready = True
            self._flush()

    def close(self) -> None:
        """The link pair is gone: replies still waiting are dropped."""
        self._closed = True
        self._pending.clear()

    def _durable(self, pending: _Pending, ok: bool) -> None:
        if not ok:
            log.error("management request: a change could not be synced to disk")
        pending.ready = True
        self._flush()

    def _flush(self) -> None:
        queue = self._pending
        while queue and queue[0].ready and not self._closed:
            done = queue.popleft()
            done.reply(done.message)

    def _handle(self, method: str, target: str, body: Any) -> tuple[str, Any]:
        segments, query = parse_target(target)
        resource = route(segments)
        if resource is None:
            raise _Status("404", f"no such resource: {target}")
        if resource == "tokens":
            if method != "PUT":
                raise _Status("405", f"method {method} not allowed on {target}")
            return self._set_token(body)
        handler = _HANDLERS.get((resource, method))
        if handler is None:
            raise _Status("405", f"method {method} not allowed on {target}")
        return handler(self, segments[1:], query, body)

    def _set_token(self, body: Any) -> tuple[str, Any]:
        """RabbitMQ 4's token refresh: a new OAuth 2 token for the connection
        (core/session.py's update_secret). Refused, the connection closes
        (amqp:unauthorized-access), as RabbitMQ 4 closes it."""
        if not isinstance(body, bytes):
            raise _Status("400", "the token must be binary")
        why = self.session.update_secret(body.decode("utf-8", "replace"))
        if why is not None:
            raise ConnectionError_(UNAUTHORIZED_ACCESS, f"credential update failed: {why}")
        return "204", None

    # -- permissions --------------------------------------------------------------------
    def _check(self, kind: str, resource_type: str, name: str) -> None:
        """The session's permission check; a refusal ends the session (RabbitMQ 4)."""
        try:
            self.session.check(kind, resource_type, name)
        except AccessRefused as exc:
            raise ManagementError(UNAUTHORIZED_ACCESS, f"{kind} {exc.text}") from None

    def _check_any(self, resource_type: str, name: str) -> None:
        """Any of read, write and configure (a passive declare's check)."""
        for kind in (READ, WRITE):
            if self.session.allowed(kind, resource_type, name):
                return
        self._check(CONFIGURE, resource_type, name)

    def _check_routing_arg(
        self, resource_type: str, name: str, arguments: dict[str, Any], key: str
    ) -> None:
        """A dead-letter or alternate exchange argument of a new queue or exchange:
        a string (RabbitMQ 4's 400 otherwise), then the core's rule
        (core/users.py's check_routing_argument: read on it, write on the
        exchange it names)."""
        if arguments.get(key) is None:
            return
        kind = wire_type(arguments, key)
        if kind != "longstr":
            raise _Status("400", f"invalid type '{kind}' for arg '{key}'")
        check_routing_argument(self._check, resource_type, name, arguments)

    def _check_topic(self, source: Exchange | None, key: str) -> None:
        if source is not None and source.type == "topic" and self.user.topic_permissions:
            try:
                UserStore.check_topic(
                    self.user, self.vhost.name, source.name, key, READ, self._topic_variables
                )
            except AccessRefused as exc:
                raise ManagementError(UNAUTHORIZED_ACCESS, f"{READ} {exc.text}") from None

    # -- queues -------------------------------------------------------------------------
    def queue_info(self, q: Queue) -> dict[str, Any]:
        """A queue as RabbitMQ 4 describes it (GET and PUT /queues/:queue): a
        quorum queue's leader and members as the HTTP API reports them, another
        queue's the node that serves it (the cluster's leader)."""
        name = self.node_name
        where: dict[str, Any] = (
            replicas(self.cluster)
            if name is None
            else {"leader": name, "members": [name], "online": [name]}
        )
        if q.queue_type == "quorum":
            where = quorum_members(q, where)
        else:
            where["members"] = [where["leader"]]
        return {
            "leader": where["leader"],
            "message_count": ULong(q.message_count),
            "consumer_count": UInt(q.consumer_count),
            "name": q.name,
            "vhost": self.vhost.name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "exclusive": q.exclusive,
            "type": q.queue_type,
            "arguments": _arguments_out(q.arguments),
            "replicas": Array(STR8, tuple(where["members"])),
        }

    def _get_queue(self, segments: list[str], query: dict[str, str], body: Any) -> tuple[str, Any]:
        name = unquote(segments[0])
        self._check_any(QUEUE, name)
        q = self.vhost.queues.get(name)
        if q is None:
            raise _Status("404", f"{_resource(QUEUE, name, self.vhost.name)} not found")
        return "200", self.queue_info(q)

    def _put_queue(self, segments: list[str], query: dict[str, str], body: Any) -> tuple[str, Any]:
        name, vhost = unquote(segments[0]), self.vhost
        spec = _fields(
            body, "queue", {"durable": True, "exclusive": False, "auto_delete": False,
                            "arguments": {}}
        )  # fmt: skip
        durable, exclusive, auto_delete = spec["durable"], spec["exclusive"], spec["auto_delete"]
        arguments = spec["arguments"]
        if vhost.default_queue_type is not None:
            arguments = vhost.metadata.with_default_type(durable, exclusive, auto_delete, arguments)
        if not name:
            raise _Status("400", "declare queue with empty name not allowed")
        _no_cr_lf(name)
        if name.startswith("amq."):
            raise _Status(
                "403", f"{_resource(QUEUE, name, vhost.name)} starts with reserved prefix 'amq.'"
            )
        self._check(CONFIGURE, QUEUE, name)
        existed = name in vhost.queues
        if not existed:
            self._check_routing_arg(QUEUE, name, arguments, "x-dead-letter-exchange")
        try:
            q = vhost.declare_queue(
                name,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
                owner=self.owner,
            )
        except QueueLimitReached as exc:
            raise _Status("403", exc.text) from None
        except QueueTypeRefused as exc:  # the queue type's own refusal
            raise _Status("400", exc.text) from None
        except BrokerError as exc:
            raise _failed(exc, precondition="409") from None
        return ("200" if existed else "201"), self.queue_info(q)

    def _purge_queue(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        name = unquote(segments[0])
        self._check(READ, QUEUE, name)
        try:
            count = self.vhost.get_queue(name, self.owner).purge()
        except NotImplemented_:  # a stream
            raise _Status(
                "400", f"purge not supported by {_resource(QUEUE, name, self.vhost.name)}"
            ) from None
        except BrokerError as exc:
            raise _failed(exc) from None
        return "200", {"message_count": ULong(count)}

    def _delete_queue(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        name = unquote(segments[0])
        _no_cr_lf(name)
        self._check(CONFIGURE, QUEUE, name)
        try:
            count = self.vhost.delete_queue(name, owner=self.owner)
        except BrokerError as exc:
            raise _failed(exc) from None
        return "200", {"message_count": ULong(count)}

    # -- exchanges ----------------------------------------------------------------------
    def _put_exchange(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        name, vhost = unquote(segments[0]), self.vhost
        spec = _fields(
            body, "exchange", {"type": "direct", "durable": True, "auto_delete": False,
                               "internal": False, "arguments": {}}
        )  # fmt: skip
        type_, arguments = spec["type"], spec["arguments"]
        if exchange_class(type_) is None:
            raise _Status("400", f"unknown exchange type '{type_}'")
        if name == "":
            raise _Status("403", _DEFAULT_EXCHANGE_TEXT)
        self._check(CONFIGURE, EXCHANGE, name)
        if name not in vhost.exchanges:
            _no_cr_lf(name)
            if name.startswith("amq."):
                raise _Status(
                    "403",
                    f"{_resource(EXCHANGE, name, vhost.name)} starts with reserved prefix 'amq.'",
                )
            self._check_routing_arg(EXCHANGE, name, arguments, "alternate-exchange")
        try:
            vhost.declare_exchange(
                name,
                type_,
                durable=spec["durable"],
                auto_delete=spec["auto_delete"],
                internal=spec["internal"],
                arguments=arguments,
            )
        except BrokerError as exc:
            raise _failed(exc, precondition="409") from None
        return "204", None

    def _delete_exchange(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        name = unquote(segments[0])
        _no_cr_lf(name)
        if name == "":
            raise _Status("403", _DEFAULT_EXCHANGE_TEXT)
        if name.startswith("amq."):
            raise _Status(
                "403",
                f"{_resource(EXCHANGE, name, self.vhost.name)} starts with reserved prefix 'amq.'",
            )
        self._check(CONFIGURE, EXCHANGE, name)
        try:
            self.vhost.delete_exchange(name)
        except BrokerError as exc:
            raise _failed(exc) from None
        return "204", None

    # -- bindings -----------------------------------------------------------------------
    def _binding_checks(self, source: str, kind: str, destination: str, key: str) -> None:
        """RabbitMQ 4's checks of a binding's ends: not the default exchange, no
        CR or LF, write on the destination, read on the source (and its topic)."""
        for end_kind, end in ((EXCHANGE, source), (kind, destination)):
            if end_kind == EXCHANGE and end == "":
                raise _Status("403", _DEFAULT_EXCHANGE_TEXT)
            _no_cr_lf(end)
        self._check(WRITE, kind, destination)
        self._check(READ, EXCHANGE, source)
        self._check_topic(self.vhost.exchanges.get(source), key)

    def _bindings_between(self, source: str, kind: str, destination: str) -> list[Binding]:
        src = self.vhost.exchanges.get(source)
        if src is None:
            return []
        return [
            b
            for b in src.bindings.values()
            if b.destination_kind == kind and b.destination.name == destination
        ]

    def _post_binding(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        if not isinstance(body, dict):
            raise _Status("400", "bad binding body: a map is expected")
        fields: dict[str, Any] = {"binding_key": "", "arguments": {}}
        for key, value in body.items():
            if key == "arguments":
                fields[key] = _arguments(value)
            elif key in ("source", "destination_queue", "destination_exchange", "binding_key"):
                if not isinstance(value, str):
                    raise _Status("400", f"bad binding field {key!r}: {value!r}")
                fields[key] = str(value)  # a symbol as plain text
            else:
                raise _Status("400", f"bad binding field {key!r}")
        if "source" not in fields:
            raise _Status("400", "a binding needs a 'source'")
        if "destination_queue" in fields:
            kind, destination = QUEUE, fields["destination_queue"]
        elif "destination_exchange" in fields:
            kind, destination = EXCHANGE, fields["destination_exchange"]
        else:
            raise _Status("400", "a binding needs a 'destination_queue' or 'destination_exchange'")
        source, key, arguments = fields["source"], fields["binding_key"], fields["arguments"]
        self._binding_checks(source, kind, destination, key)
        vhost = self.vhost
        try:  # the core's order, as queue.bind and exchange.bind take it
            if kind == QUEUE:
                vhost.bind_queue(source, destination, key, arguments, self.owner)
            else:
                src = vhost.get_exchange(source)
                vhost.bind(src, vhost.get_exchange(destination), key, arguments)
        except BrokerError as exc:
            raise _binding_failed(exc) from None
        return "204", None

    def _delete_binding(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        source, kind, destination, key, digest = parse_binding_segment(segments[0])
        self._binding_checks(source, kind, destination, key)
        for binding in self._bindings_between(source, kind, destination):
            if binding.routing_key == key and args_hash(binding.arguments) == digest:
                try:
                    if kind == QUEUE:
                        self.vhost.get_queue(destination, self.owner)  # exclusive: 400
                    self.vhost.unbind(binding.source, binding.destination, key, binding.arguments)
                except BrokerError as exc:
                    raise _binding_failed(exc) from None
                break
        return "204", None

    def _get_bindings(
        self, segments: list[str], query: dict[str, str], body: Any
    ) -> tuple[str, Any]:
        if "src" not in query or "key" not in query:
            raise _Status("400", f"missing 'src' or 'key' in query: {query}")
        if "dste" in query:
            kind, destination = EXCHANGE, query["dste"]
        elif "dstq" in query:
            kind, destination = QUEUE, query["dstq"]
        else:
            raise _Status("400", f"missing 'dste' or 'dstq' in query: {query}")
        source, key = query["src"], query["key"]
        self._binding_checks(source, kind, destination, key)
        found = [
            b for b in self._bindings_between(source, kind, destination) if b.routing_key == key
        ]
        return "200", [
            {
                "source": b.source.name,
                f"destination_{kind}": b.destination.name,
                "binding_key": b.routing_key,
                "arguments": _arguments_out(b.arguments),
                "location": binding_location(b),
            }
            for b in found
        ]


def _failed(exc: BrokerError, precondition: str = "400") -> _Status:
    """A core refusal as RabbitMQ 4's status: 403 (the core's access rules),
    404, ``precondition`` for 406 (409 where a declaration is not equivalent),
    503 when a definition could not be stored, else 400."""
    if isinstance(exc, AccessRefused):
        return _Status("403", exc.text)
    if isinstance(exc, NotFound):
        return _Status("404", exc.text)
    if isinstance(exc, PreconditionFailed):
        return _Status(precondition, exc.text)
    if isinstance(exc, ResourceError):
        return _Status("503", exc.text)
    return _Status("400", exc.text)


def _binding_failed(exc: BrokerError) -> _Status:
    """A binding refused by the core: 400 whatever the reason (a missing end
    too), as RabbitMQ 4 answers; 503 when it could not be stored."""
    return _Status("503" if isinstance(exc, ResourceError) else "400", exc.text)


Handler = Callable[[ManagementNode, list[str], dict[str, str], Any], tuple[str, Any]]


_HANDLERS: dict[tuple[str, str], Handler] = {
    ("queue", "GET"): ManagementNode._get_queue,
    ("queue", "PUT"): ManagementNode._put_queue,
    ("queue", "DELETE"): ManagementNode._delete_queue,
    ("messages", "DELETE"): ManagementNode._purge_queue,
    ("exchange", "PUT"): ManagementNode._put_exchange,
    ("exchange", "DELETE"): ManagementNode._delete_exchange,
    ("bindings", "POST"): ManagementNode._post_binding,
    ("bindings", "GET"): ManagementNode._get_bindings,
    ("binding", "DELETE"): ManagementNode._delete_binding,
}


def management_handler(
    session: ClientSession, vhost: VHost, later: Callable[[AmqpMessage], None]
) -> ManagementHandler:
    """links.py's ManagementFactory: one node per link pair, every reply given to
    ``later`` (a declare's waits until the change is durable; the others go at
    once, in request order)."""
    # The broker (warren.node.Node) behind the session: its cluster, if any.
    node = ManagementNode(session, vhost, cluster=getattr(session.host, "cluster_status", None))

    def handle(request: AmqpMessage) -> list[AmqpMessage]:
        node.request(request, later)
        return []

    return handle
