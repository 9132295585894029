"""What AMQP 1.0 links share, and the hook the ``/management`` node plugs into.

A dynamic source or target with the ``temporary-queue`` capability is a new
exclusive queue of the connection's, deleted with the link (RabbitMQ 4's
temporary queues, which its clients use for replies): :func:`temporary_queue`.
RabbitMQ 3.x's v1 addresses (addresses.py) add two: ``/queue/Q`` declares its
queue (:func:`v1_queue`) and a source on an exchange consumes a new queue
bound to it (:func:`v1_exchange_queue`).

What RabbitMQ 4 refuses of a link, before its terminus is looked at, is
:func:`validate_attach`'s: resuming a link (an attach carrying unsettled
state) and rcv-settle-mode second on a link whose sender does not settle
first.

RabbitMQ 4's HTTP-over-AMQP management (declare, bind, delete, purge, ...)
runs on a link pair (OASIS "Link Pair" 1.0, the LINK_PAIR_V1_0 capability):
the client attaches a sending link with target ``/management`` and a
receiving link with source ``/management`` under the same link name; every
request message on the first is answered on the second. The links and their
credit are this package's; what a request does is the management node's
(amqp1/management_node.py), behind this small interface:

- :data:`ManagementFactory` is given to the connection (amqp1/server.py wires
  it): called once per link pair with the client session (the user,
  permissions, change marks), the vhost and a ``later`` callable, it returns
  a :data:`ManagementHandler`;
- the handler gets each request as a decoded message and returns the reply
  messages (usually one), which go to the client on the pair's receiving
  link, pre-settled, as its credit allows. A reply that must wait (a
  declare's, until the change is durable: ClientSession.when_changes_durable)
  is returned as none and given to ``later`` when it may go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from warren.amqp1.addresses import Address, queue_address
from warren.amqp1.errors import (
    INVALID_FIELD,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
    LinkError,
)
from warren.amqp1.formats import SYM8
from warren.amqp1.message import AmqpMessage, encode_message
from warren.amqp1.performatives import (
    RCV_SECOND,
    SND_SETTLED,
    Attach,
    DeleteOnClose,
    Released,
    Source,
    Target,
)
from warren.amqp1.types import Array, Symbol
from warren.core.errors import AccessRefused, BrokerError
from warren.core.users import CONFIGURE, READ, WRITE, UserStore

if TYPE_CHECKING:
    from warren.amqp1.outgoing import OutgoingLink
    from warren.core.queue import Queue
    from warren.core.session import ClientSession
    from warren.core.vhost import VHost

__all__ = [
    "MANAGEMENT_ADDRESS",
    "MAX_MANAGEMENT_CREDIT",
    "ManagementFactory",
    "ManagementHandler",
    "ManagementPair",
    "ReplyLater",
    "is_management",
    "temporary_queue",
    "terminus_address",
    "v1_exchange_queue",
    "v1_queue",
    "validate_attach",
]

MANAGEMENT_ADDRESS: Final = "/management"
#: The credit a management request link is given (RabbitMQ 4's).
MAX_MANAGEMENT_CREDIT: Final = 8

#: One link pair's request handler: a request in, the replies out.
ManagementHandler = Callable[[AmqpMessage], list[AmqpMessage]]
#: Sends a reply that had to wait (see the module docstring).
ReplyLater = Callable[[AmqpMessage], None]
#: Makes a link pair's handler, from the connection's client session, its vhost
#: and the pair's ReplyLater.
ManagementFactory = Callable[["ClientSession", "VHost", ReplyLater], ManagementHandler]


def terminus_address(terminus: Any) -> Any:
    """A source's or target's address (None: none, or no terminus)."""
    if isinstance(terminus, (Source, Target)):
        return terminus.address
    return None


TEMPORARY_QUEUE: Final = Symbol("temporary-queue")
_LINK_DETACH: Final = Symbol("link-detach")
_MOVE: Final = Symbol("move")


def temporary_queue(
    terminus: Source | Target, vhost: VHost, owner: object
) -> tuple[Queue, Source | Target]:
    """A dynamic terminus: a new exclusive queue of ``owner``'s (the connection),
    server-named as a 0-9-1 queue.declare of "" is (no configure check), and the
    terminus to answer with, its address the queue's. LinkError for a dynamic
    terminus without the temporary-queue capability (RabbitMQ 4's only kind here)."""
    if TEMPORARY_QUEUE not in (terminus.capabilities or ()):
        raise LinkError(NOT_IMPLEMENTED, "dynamic terminus without the temporary-queue capability")
    try:
        queue = vhost.declare_queue("", durable=False, exclusive=True, owner=owner)
    except BrokerError as exc:  # the vhost's max-queues
        raise LinkError(RESOURCE_LIMIT_EXCEEDED, exc.text) from None
    properties = {
        Symbol("lifetime-policy"): DeleteOnClose(),
        Symbol("supported-dist-modes"): Array(SYM8, (_MOVE,)),
    }
    reply: Source | Target
    if isinstance(terminus, Source):
        reply = Source(
            address=queue_address(queue.name),
            expiry_policy=_LINK_DETACH,
            dynamic=True,
            dynamic_node_properties=properties,
            distribution_mode=_MOVE,
            default_outcome=Released(),
            outcomes=terminus.outcomes,
            capabilities=(TEMPORARY_QUEUE,),
        )
    else:
        reply = Target(
            address=queue_address(queue.name),
            expiry_policy=_LINK_DETACH,
            dynamic=True,
            dynamic_node_properties=properties,
            capabilities=(TEMPORARY_QUEUE,),
        )
    return queue, reply


#: terminus-durability (3.5.5): configuration and unsettled-state make a v1
#: ``/queue/Q`` a durable queue, none (the default) a transient one.
_DURABLE_TERMINUS: Final = (1, 2)


def validate_attach(attach: Attach) -> None:
    """What RabbitMQ 4 refuses of any attach (amqp:not-implemented): resuming
    a link, i.e. an ``unsettled`` map with entries or ``incomplete-unsettled``
    (2.6.13; an empty map is a fresh link), and rcv-settle-mode second unless
    the sender settles first (snd-settle-mode settled, when the receiver's
    mode does not matter: 2.7.3)."""
    if attach.unsettled or attach.incomplete_unsettled:
        raise LinkError(NOT_IMPLEMENTED, "Link recovery not supported")
    if attach.rcv_settle_mode == RCV_SECOND and attach.snd_settle_mode != SND_SETTLED:
        raise LinkError(NOT_IMPLEMENTED, "rcv-settle-mode second not supported")


def v1_queue(
    address: Address, terminus: Source | Target, vhost: VHost, session: ClientSession
) -> None:
    """A v1 ``/queue/Q`` (or bare ``Q``): declare the queue when it does not
    exist, as RabbitMQ 4 (and 3.x) do: classic, durable when the terminus is
    (configuration or unsettled-state), neither exclusive nor auto-delete. The
    user needs configure permission on it even when it exists (RabbitMQ 4
    declares either way); an existing queue is taken as it is, and the caller
    goes on as for a ``/queues/Q`` address."""
    name = address.name
    try:
        session.check(CONFIGURE, "queue", name)
        if name not in vhost.queues:
            vhost.declare_queue(name, durable=terminus.durable in _DURABLE_TERMINUS)
    except AccessRefused as exc:  # no configure permission, or a reserved amq. name
        raise LinkError(UNAUTHORIZED_ACCESS, exc.text) from None
    except BrokerError as exc:  # the vhost's max-queues, a store that failed
        raise LinkError(RESOURCE_LIMIT_EXCEEDED, exc.text) from None


def v1_exchange_queue(
    address: Address, vhost: VHost, session: ClientSession, owner: object
) -> Queue:
    """A v1 source on an exchange (``/exchange/X/key``, ``/exchange/X``: key "",
    ``/topic/key``: amq.topic): a new server-named queue bound to the exchange
    with the key, which the link consumes. The exchange must exist
    (amqp:not-found); the user needs what a 0-9-1 declare and bind would:
    configure and write on the queue, read on the exchange and, on a topic
    exchange, a topic permission to read the key. RabbitMQ 4 (and 3.x) declare
    a queue that outlives the link, under a name the client is never told;
    Warren's is exclusive to the connection and deleted with the link, as a
    dynamic source's temporary queue is (OutgoingLink.detached)."""
    exchange = vhost.exchanges.get(address.name)
    if exchange is None:
        raise LinkError(NOT_FOUND, f"no exchange '{address.name}' in vhost '{vhost.name}'")
    key = address.routing_key or ""
    user = session.user
    assert user is not None, "the session has logged in"
    try:
        session.check(READ, "exchange", exchange.name)
        if exchange.type == "topic" and user.topic_permissions:
            variables = {"username": user.name, "vhost": vhost.name}
            UserStore.check_topic(user, vhost.name, exchange.name, key, READ, variables)
    except AccessRefused as exc:
        raise LinkError(UNAUTHORIZED_ACCESS, exc.text) from None
    try:
        queue = vhost.declare_queue("", durable=False, exclusive=True, owner=owner)
    except BrokerError as exc:  # the vhost's max-queues
        raise LinkError(RESOURCE_LIMIT_EXCEEDED, exc.text) from None
    try:
        session.check(CONFIGURE, "queue", queue.name)
        session.check(WRITE, "queue", queue.name)
        vhost.bind(exchange, queue, key)
    except BrokerError as exc:
        vhost.delete_queue(queue.name, owner=owner)
        # RabbitMQ 4: a refused permission is unauthorized-access, a binding
        # that fails "Attach refused" (invalid-field).
        condition = UNAUTHORIZED_ACCESS if isinstance(exc, AccessRefused) else INVALID_FIELD
        raise LinkError(condition, exc.text) from None
    return queue


def is_management(attach: Attach) -> bool:
    """Whether ``attach`` is one of a ``/management`` link pair."""
    terminus = attach.target if attach.role is False else attach.source
    return terminus_address(terminus) == MANAGEMENT_ADDRESS


class ManagementPair:
    """One link pair to the management node: requests in, replies queued for
    the receiving link until it has credit."""

    __slots__ = ("closed", "handler", "links", "replies", "sender")

    def __init__(self, factory: ManagementFactory, session: ClientSession, vhost: VHost) -> None:
        self.sender: OutgoingLink | None = None
        #: Encoded replies waiting for the receiving link's credit.
        self.replies: deque[bytes] = deque()
        #: Its links attached (Session.management_pair counts them).
        self.links = 0
        #: Both links are gone: a late reply is dropped.
        self.closed = False
        self.handler = factory(session, vhost, self.reply)

    def request(self, message: AmqpMessage) -> None:
        """A request: its replies go out as the receiving link allows."""
        for reply in self.handler(message):
            self.reply(reply)

    def reply(self, message: AmqpMessage) -> None:
        """One reply, now or once the receiving link has credit."""
        if self.closed:
            return
        self.replies.append(encode_message(message))
        if self.sender is not None:
            self.sender.send_replies()
