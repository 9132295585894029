"""Observations (RFC 7641): a CoAP client's subscription to a topic filter.

``GET /ps/<filter>`` with Observe 0 makes one: a server-named queue
(``coap-subscription-<id>``, not durable, auto-delete: it goes with the
observation's consumer; exclusive would tie it to a connection, which CoAP
has not) bound to the MQTT exchange with the filter's MQTT binding key, as an MQTT
subscription's queue is, and a core consumer on it (coap/consumer.py). Each
message becomes a 2.05 notification under the request's token with the next
Observe number. At QoS 1 (the default; ``?qos=0`` asks for 0) a message
published at QoS 1 goes confirmable, one in flight at a time, and is settled
through the core when the client ACKs it; an RST or running out of resends
puts it back in its queue (the core's reject, requeue) and ends the
observation, as RFC 7641 4.5 has a server forget a client that does not
answer. QoS 0 messages go non-confirmable, acknowledged in the core at the
end of the loop turn; a non-confirmable stream to a client that went away is
caught by making a notification confirmable at least once a day. The
observation ends (its queue deleted) on a deregistration (Observe 1), an
RST, a timeout, a new registration of the same token, or at shutdown.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from warren.coap import codec as C
from warren.coap.blockwise import MAX_SZX
from warren.coap.consumer import CoAPConsumer
from warren.coap.mapping import content_format, message_qos
from warren.core.session import ClientSession
from warren.core.stats import MessageStats, count_delivery

if TYPE_CHECKING:
    from collections.abc import Callable

    from warren.coap.blockwise import Resource
    from warren.coap.endpoint import Address, Endpoint, Outcome
    from warren.core.message import Message
    from warren.core.queue import Queue
    from warren.core.vhost import VHost

__all__ = ["Observation", "QUEUE_PREFIX"]

log = logging.getLogger("warren.coap")

QUEUE_PREFIX = "coap-subscription-"
#: A non-confirmable notification goes confirmable once this long after the
#: last confirmed one (RFC 7641 4.5: at least every 24 hours).
CONFIRM_EVERY_MS = 24 * 3600 * 1000
_OBSERVE_MAX = 1 << 24


class Observation:
    """One observer (address and token) of one topic filter."""

    def __init__(
        self,
        endpoint: Endpoint,
        addr: Address,
        token: bytes,
        session: ClientSession,
        vhost: VHost,
        topic_filter: str,
        qos: int,
        ended: Callable[[Observation], None],
    ) -> None:
        self.endpoint = endpoint
        self.addr = addr
        self.token = token
        self.vhost = vhost
        self.topic_filter = topic_filter
        self.qos = qos
        self._ended = ended
        self.name = f"CoAP observer {addr[0]}:{addr[1]} of '{topic_filter}'"
        self.queue_name = QUEUE_PREFIX + secrets.token_urlsafe(12)
        self.stats = MessageStats()
        self.deliveries = session.deliveries(self.stats, retire=vhost.base_stats)
        self.closed = False
        #: The delivery tag of the confirmable notification awaiting its ACK.
        self.in_flight: int | None = None
        self.observe = 1
        self._confirmed_ms = endpoint.clock.now_ms()
        self._acks: list[int] = []
        self.consumer: CoAPConsumer | None = None
        #: The observed URI's options: a large notification's later blocks are
        #: asked for with them (blockwise.py).
        self.resource: Resource = ()
        #: The block size (SZX) of large notifications: what the registration's
        #: Block2 asked for, else the largest (blockwise.asked_szx).
        self.block_szx = MAX_SZX

    def start(self, queue: Queue) -> None:
        """Consume ``queue`` (declared and bound by the caller)."""
        self.consumer = CoAPConsumer(
            self, self.deliveries, self.queue_name, queue, no_ack=self.qos == 0
        )
        self.deliveries.consume(self.queue_name, self.consumer)

    def next_observe(self) -> bytes:
        """The next Observe number (24 bits, wrapping)."""
        self.observe = (self.observe + 1) % _OBSERVE_MAX
        return C.encode_uint(self.observe)

    # -- the consumer's side ------------------------------------------------------------
    def ready(self) -> bool:
        return not self.closed and self.in_flight is None

    def deliver(self, consumer: CoAPConsumer, seq: int, msg: Message, redelivered: bool) -> None:
        qos, media = message_qos(msg.properties)
        options = [(C.OBSERVE, self.next_observe())]
        fmt = content_format(media)
        if fmt is not None:
            options.append((C.CONTENT_FORMAT, C.encode_uint(fmt)))
        count_delivery(self.stats, consumer.queue.stats, consumer.no_ack, redelivered)
        now = self.endpoint.clock.now_ms()
        confirm = (qos > 0 and self.qos > 0) or now - self._confirmed_ms >= CONFIRM_EVERY_MS
        if consumer.no_ack:
            done: Callable[[Outcome], None] = self._no_ack_done
        else:
            tag = self.deliveries.next_tag()
            self.deliveries.track(tag, consumer.queue, seq, msg, consumer)
            if confirm:
                self.in_flight = tag
                done = lambda outcome: self._settled(tag, outcome)  # noqa: E731
            else:
                self._ack_soon(tag)
                done = self._no_ack_done
        self.endpoint.notify(
            self.addr,
            self.token,
            C.CONTENT,
            options,
            msg.body,
            confirm,
            done,
            self.resource,
            self.block_szx,
        )

    def _ack_soon(self, tag: int) -> None:
        """A non-confirmable notification's message: acked at the end of the turn
        (not within the queue's delivery)."""
        if not self._acks:
            self.vhost.call_soon(self._apply_acks)
        self._acks.append(tag)

    def _apply_acks(self) -> None:
        acks, self._acks = self._acks, []
        if self.closed:
            return
        for tag in acks:
            self.deliveries.ack(tag, False)

    def _settled(self, tag: int, outcome: Outcome) -> None:
        if self.in_flight == tag:
            self.in_flight = None
        if self.closed:
            return
        if outcome == "ack":
            self._confirmed_ms = self.endpoint.clock.now_ms()
            self.deliveries.ack(tag, False)  # the queue delivers the next one
            return
        self.deliveries.reject(tag, False, requeue=True, explicit=False)
        log.info("%s: notification %s, observation ended", self.name, outcome)
        self.end()

    def _no_ack_done(self, outcome: Outcome) -> None:
        if outcome == "ack":
            self._confirmed_ms = self.endpoint.clock.now_ms()
        elif not self.closed:
            log.info("%s: notification %s, observation ended", self.name, outcome)
            self.end()

    def queue_gone(self) -> None:
        self.consumer = None
        self.end()

    # -- the end ----------------------------------------------------------------------
    def end(self) -> None:
        """Cancel the consumer (what it holds goes back), delete the queue."""
        if self.closed:
            return
        self.closed = True
        self._apply_acks_now()
        self.deliveries.close()
        try:  # gone with its consumer (auto-delete), unless it never had one
            self.vhost.delete_queue(self.queue_name)
        except Exception:  # the vhost is going away: its queues with it
            log.debug("%s: deleting its queue failed", self.name, exc_info=True)
        self._ended(self)

    def _apply_acks_now(self) -> None:
        acks, self._acks = self._acks, []
        for tag in acks:
            self.deliveries.ack(tag, False)
