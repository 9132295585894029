"""RabbitMQ 4's /management node (warren.amqp1.management_node) driven in memory.

A :class:`NodePair` stands for one management link pair of a connection
logged in to the harness broker: requests are built and encoded by
python-qpid-proton (as RabbitMQ's Python client builds them), decoded by
warren.amqp1's management_node.decode_request, and the node's replies encoded
by Warren and decoded by proton again. No link and no connection: what the
node answers, not how the links carry it.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.broker import Harness
from warren.amqp1.management_node import (
    UNAUTHORIZED_ACCESS,
    ManagementError,
    ManagementNode,
    decode_request,
)
from warren.amqp1.message import AmqpMessage, encode_message
from warren.core.session import ClientSession
from warren.core.vhost import VHost

proton = pytest.importorskip("proton")

__all__ = ["NODE", "NodePair", "restricted", "restricted_again"]

NODE = "warren@test"


class Owner:
    """The connection the link pair belongs to (owner of its exclusive queues)."""

    name = "a test's AMQP 1.0 connection"


class NodePair:
    """A management link pair: requests in, replies (proton-decoded) out."""

    def __init__(
        self, harness: Harness, user: str = "guest", password: str = "guest", vhost: str = "/"
    ) -> None:
        self.harness = harness
        self.owner = Owner()
        session = ClientSession(harness.broker, self.owner)
        session.login("amqp10", user, password, "127.0.0.1")
        self.vhost: VHost = session.open(vhost)
        self.node = ManagementNode(session, self.vhost, node_name=NODE)
        assert self.node.owner is self.owner  # the session's
        self.replies: list[proton.Message] = []
        self._ids = itertools.count(1)

    def send(
        self, method: str, path: str, body: Any = None, message_id: Any = None, **props: Any
    ) -> Any:
        """Send one request (proton's encoding, as RabbitMQ's client sends it:
        no body section for None); its message-id."""
        if message_id is None:
            message_id = f"req-{next(self._ids)}"
        fields: dict[str, Any] = {"address": path, "subject": method, "reply_to": "$me"}
        fields.update(props)
        message = proton.Message(id=message_id, body=body, inferred=False, **fields)
        request = decode_request(message.encode())
        self.harness.call(lambda: self.node.request(request, self._replied))
        return message_id

    def _replied(self, reply: AmqpMessage) -> None:
        decoded = proton.Message()
        decoded.decode(encode_message(reply))
        self.replies.append(decoded)

    def request(self, method: str, path: str, body: Any = None) -> proton.Message:
        """One request and its reply, once the broker has settled."""
        message_id = self.send(method, path, body)
        self.harness.settle()
        assert len(self.replies) == 1
        reply = self.replies.pop()
        assert reply.correlation_id == message_id
        assert reply.properties == {"http:response": "1.1"}
        return reply

    def status(self, method: str, path: str, body: Any = None) -> tuple[str, Any]:
        reply = self.request(method, path, body)
        return reply.subject, reply.body

    def refused(self, method: str, path: str, body: Any = None) -> str:
        """A request that ends the session: the error's description."""
        with pytest.raises(ManagementError) as refused:
            self.send(method, path, body)
        assert refused.value.condition == UNAUTHORIZED_ACCESS
        assert self.replies == []
        return refused.value.description


def restricted(harness: Harness, configure: str, write: str, read: str) -> NodePair:
    """A pair of user 'u' with these permissions on '/'."""

    def add() -> None:
        harness.broker.users.add_user("u", "p")
        harness.broker.users.set_permissions("u", "/", configure, write, read)

    harness.call(add)
    return NodePair(harness, "u", "p")


def restricted_again(harness: Harness, configure: str, write: str, read: str) -> NodePair:
    """New permissions for 'u' (a new pair: the session caches its answers)."""
    harness.call(lambda: harness.broker.users.set_permissions("u", "/", configure, write, read))
    return NodePair(harness, "u", "p")
