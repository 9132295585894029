"""What AMQP 1.0 links share, and the hook the ``/management`` node plugs into.

A dynamic source or target with the ``temporary-queue`` capability is a new
exclusive queue of the connection's, deleted with the link (RabbitMQ 4's
temporary queues, which its clients use for replies): :func:`temporary_queue`.

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

from warren.amqp1.addresses import queue_address
from warren.amqp1.errors import NOT_IMPLEMENTED, RESOURCE_LIMIT_EXCEEDED, LinkError
from warren.amqp1.formats import SYM8
from warren.amqp1.message import AmqpMessage, encode_message
from warren.amqp1.performatives import Attach, DeleteOnClose, Released, Source, Target
from warren.amqp1.types import Array, Symbol
from warren.core.errors import BrokerError

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
