"""Errors the core raises; each carries the AMQP reply code a client observes.

The codes are AMQP's because RabbitMQ compatibility is defined in those terms;
other protocols (MQTT, HTTP) map them to their own replies.
"""

from __future__ import annotations


def clip_reply_text(text: str) -> str:
    """A reply text as RabbitMQ sends it: over 255 octets, cut to 252 plus '...'.

    The cut falls on a character boundary and undecodable bytes become U+FFFD,
    so every client can decode the short string as UTF-8.
    """
    raw = text.encode("utf-8", "replace")
    if len(raw) <= 255:
        return raw.decode("utf-8")
    return raw[:252].decode("utf-8", "ignore") + "..."


class BrokerError(Exception):
    """A refused operation. ``hard`` errors close the whole connection."""

    code = 541
    name = "INTERNAL_ERROR"
    hard = False

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    @property
    def reply_text(self) -> str:
        return f"{self.name} - {self.text}"


class AccessRefused(BrokerError):
    code = 403
    name = "ACCESS_REFUSED"


class NotFound(BrokerError):
    code = 404
    name = "NOT_FOUND"


class ResourceLocked(BrokerError):
    code = 405
    name = "RESOURCE_LOCKED"


class PreconditionFailed(BrokerError):
    code = 406
    name = "PRECONDITION_FAILED"


class QueueLimitReached(PreconditionFailed):
    """A new queue beyond the vhost's max-queues (AMQP: 406; MQTT: a quota)."""


class QueueTypeRefused(PreconditionFailed):
    """A queue type refusing what a declaration asks of it (a stream that is
    auto-delete, exclusive or not durable...): 406 over AMQP 0-9-1 as the
    argument checks are, but RabbitMQ 4's management node tells them apart
    (400, where an argument check is 409)."""


class FrameError(BrokerError):
    code = 501
    name = "FRAME_ERROR"
    hard = True


class CommandInvalid(BrokerError):
    code = 503
    name = "COMMAND_INVALID"
    hard = True


class ChannelError(BrokerError):
    code = 504
    name = "CHANNEL_ERROR"
    hard = True


class UnexpectedFrame(BrokerError):
    code = 505
    name = "UNEXPECTED_FRAME"
    hard = True


class ResourceError(BrokerError):
    """The server lacks a resource to carry the method out (a full or failing
    disk where a definition must be stored)."""

    code = 506
    name = "RESOURCE_ERROR"
    hard = True


class NotAllowed(BrokerError):
    code = 530
    name = "NOT_ALLOWED"
    hard = True


class NotImplemented_(BrokerError):
    code = 540
    name = "NOT_IMPLEMENTED"
    hard = True


class InternalError(BrokerError):
    code = 541
    name = "INTERNAL_ERROR"
    hard = True
