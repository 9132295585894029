"""A link on which the AMQP 1.0 client consumes (it is the receiver, this side the sender).

The source is a queue (``/queues/:q``, or a v1 form naming one: ``/queue/Q``
declares it when absent) the user may read, or, v1, an exchange: the link
consumes a new queue of its own bound to it (links.py). Consuming and
settling are the client session's (core/deliveries.py): each link has its
own delivery stream, so a detach puts back what it delivered and the client
did not settle, and the session's close and the
connection's do too. What is AMQP 1.0's is the credit: the client's flow gives
it (link-credit, delivery-count; drain: send what there is, then give the
rest up), and a queue delivers only while the link has some and the
client's session window is open (``can_take``). ``snd-settle-mode`` settled
means pre-settled deliveries (the queue forgets them as they go: auto-ack);
otherwise each waits for the client's disposition: accepted acks it,
rejected drops it (dead-lettered where its queue says so), released
requeues it, modified requeues it (counted as a failed delivery with
delivery-failed) or, undeliverable-here, drops it, as RabbitMQ 4's
settle_op_from_outcome reads them.

A dynamic source with the temporary-queue capability consumes a new
exclusive queue, deleted with the link (links.py). The link property
``rabbitmq:priority`` is the consumer's priority. A
stream queue's consumer reads the source's filters as RabbitMQ 4.1 does
(filters.py): where to start (``rabbitmq:stream-offset-spec``), the
``x-stream-filter-value`` values and the property filters; the attach's
answer carries those applied.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from typing import TYPE_CHECKING, Any, Final

from warren.amqp1.addresses import AddressError, parse_source
from warren.amqp1.errors import (
    ILLEGAL_STATE,
    INVALID_FIELD,
    NOT_FOUND,
    RESOURCE_DELETED,
    RESOURCE_LOCKED,
    UNAUTHORIZED_ACCESS,
    LinkError,
    error,
)
from warren.amqp1.filters import stream_filters
from warren.amqp1.links import (
    ManagementPair,
    temporary_queue,
    terminus_address,
    v1_exchange_queue,
    v1_queue,
)
from warren.amqp1.mapping import for_delivery, from_core
from warren.amqp1.message import AmqpMessage
from warren.amqp1.performatives import (
    SENDER,
    SND_SETTLED,
    SND_UNSETTLED,
    Accepted,
    Attach,
    Flow,
    Modified,
    Rejected,
    Released,
    Source,
)
from warren.core.consumer import Consumer
from warren.core.errors import AccessRefused, BrokerError, NotFound, ResourceLocked
from warren.core.queue_arguments import is_stream
from warren.core.stats import count_delivery
from warren.core.stream_queue import StreamQueue
from warren.core.users import READ

if TYPE_CHECKING:
    from warren.amqp1.session import Session
    from warren.core.consumer import MessageFilter
    from warren.core.deliveries import Deliveries
    from warren.core.message import Message, MessageRun
    from warren.core.queue import Queue
    from warren.core.store import StoredRun

__all__ = ["AMQP1Consumer", "OutgoingLink"]

log = logging.getLogger("warren.amqp1")

_SEQ: Final = 1 << 32
_TAG = struct.Struct(">Q").pack
#: Unsettled deliveries a stream consumer is allowed (streams need a limit).
STREAM_CREDIT_LIMIT: Final = 256


class AMQP1Consumer(Consumer):
    """A sending link's consumer of its queue."""

    __slots__ = ("link",)

    def __init__(
        self, link: OutgoingLink, queue: Queue, no_ack: bool, arguments: dict[str, Any]
    ) -> None:
        super().__init__(
            link.deliveries,
            f"amqp1-{link.name}",
            queue,
            no_ack,
            priority=link.priority,
            arguments=arguments,
        )
        self.link = link

    def can_take(self) -> bool:
        link = self.link
        return link.credit > 0 and not link.closed and link.session.can_send()

    def credit_limit(self) -> int:
        return STREAM_CREDIT_LIMIT

    def message_filter(self) -> MessageFilter | None:
        return self.link.message_filter

    def no_ack_credit(self, n: int) -> int:
        """A pre-settled link takes no more of a run than its credit and the
        client's session window allow (the rest stays in the queue)."""
        link = self.link
        return max(0, min(n, link.credit, link.session.remote_incoming_window))

    def run_credit(self, n: int) -> int:
        """How many of a publish run's messages the queue may store in one write
        and hand over (Queue.publish_run): what the link's credit and the
        client's session window allow."""
        link = self.link
        return max(0, min(n, link.credit, link.session.remote_incoming_window))

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        self.link.deliver(self, seq, msg, redelivered)

    def deliver_run(self, run: MessageRun, start: int, stop: int, step: int = 1) -> None:
        self.link.deliver_run(self, run, range(start, stop, step), None)

    def deliver_stored_run(self, run: MessageRun, start: int, stop: int, stored: StoredRun) -> None:
        self.link.deliver_run(self, run, range(start, stop), stored)

    def cancelled(self) -> None:
        """The queue was deleted: the link detaches (amqp:resource-deleted)."""
        link = self.link
        if self.deliveries.cancelled(link.name, self):
            link.session.detach(
                link, error(RESOURCE_DELETED, f"queue '{self.queue.name}' was deleted")
            )


class OutgoingLink:
    """One link the client consumes on."""

    def __init__(self, session: Session, attach: Attach) -> None:
        self.session = session
        self.handle = attach.handle
        self.name = attach.name
        self.delivery_count = 0
        self.credit = 0
        self.closed = False
        self.no_ack = attach.snd_settle_mode == SND_SETTLED
        self.queue: Queue | None = None
        self.consumer: AMQP1Consumer | None = None
        self.pair: ManagementPair | None = None
        self._draining = False
        #: The consumer's priority: the link property ``rabbitmq:priority``.
        self.priority = 0
        #: The source the attach's answer carries (None: the client's): a dynamic
        #: source's queue (the link's own, temporary), or the filters applied.
        self.source: Any = None
        self.temporary = False
        self._arguments: dict[str, Any] = {}
        #: A stream consumer's property filters (filters.py).
        self.message_filter: MessageFilter | None = None
        #: The link's delivery stream in the client session (core/deliveries.py).
        self.deliveries: Deliveries = session.conn.client_session.deliveries(session.stats)

    # -- attach -------------------------------------------------------------------------
    def attach(self, attach: Attach) -> None:
        """Check the source: LinkError refuses the link."""
        source = attach.source
        if source is None:
            # A null source asks this side for the link's (recovering a link,
            # 2.6.3): RabbitMQ 4 has none to offer.
            raise LinkError(INVALID_FIELD, "Attach refused: source_required")
        if not isinstance(source, Source):
            raise LinkError(ILLEGAL_STATE, "a receiving link needs a source")
        session = self.session
        vhost = session.vhost
        if source.dynamic:
            queue, self.source = temporary_queue(source, vhost, session.conn)
            self.temporary = True
            self.queue = queue
            return
        address = terminus_address(source)
        if address is not None and not isinstance(address, str):
            raise LinkError("amqp:invalid-field", f"source address {address!r:.60}")
        try:
            parsed = parse_source(address)
        except AddressError as exc:
            raise LinkError(exc.condition, exc.description) from None
        client_session = session.conn.client_session
        if parsed.kind == "exchange":
            # v1: a new queue bound to the exchange, the link's own.
            self.queue = v1_exchange_queue(parsed, vhost, client_session, session.conn)
            self.temporary = True
            name = self.queue.name
        else:
            if parsed.declare:
                v1_queue(parsed, source, vhost, client_session)
            name = parsed.name
        try:
            queue = vhost.get_queue(name, owner=session.conn)
        except NotFound as exc:
            raise LinkError(NOT_FOUND, exc.text) from None
        except ResourceLocked as exc:
            raise LinkError(RESOURCE_LOCKED, exc.text) from None
        try:
            client_session.check(READ, "queue", queue.name)
        except AccessRefused as exc:
            raise LinkError(UNAUTHORIZED_ACCESS, exc.text) from None
        self.queue = queue
        priority = (attach.properties or {}).get("rabbitmq:priority")
        if isinstance(priority, int) and not isinstance(priority, bool):
            self.priority = priority
        if source.filter is not None:
            # Only a stream applies filters; the answer says which ("the sending
            # endpoint sets the filter actually in place", 3.5.3).
            applied: dict[Any, Any] = {}
            if is_stream(queue.arguments):
                filters = stream_filters(source.filter)
                self._arguments.update(filters.arguments)
                self.message_filter = filters.predicate
                applied = filters.applied
            self.source = dataclasses.replace(source, filter=applied)

    def attach_management(self, attach: Attach) -> None:
        session = self.session
        if session.conn.management is None:
            raise LinkError(NOT_FOUND, "the /management node is not available")
        pair = session.management_pair(attach.name)
        pair.sender = self
        self.pair = pair
        self.no_ack = True

    def reply_attach(self, attach: Attach, refused: bool) -> Attach:
        """As RabbitMQ 4 answers: the client's settle modes echoed on a refusal;
        otherwise snd-settle-mode settled or unsettled (mixed is taken as
        unsettled) and the client's rcv-settle-mode (validate_attach lets
        second through only with settled)."""
        if refused:
            snd_settle_mode = attach.snd_settle_mode
        else:
            snd_settle_mode = SND_SETTLED if self.no_ack else SND_UNSETTLED
        return Attach(
            name=attach.name,
            handle=self.handle,
            role=SENDER,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=attach.rcv_settle_mode,
            source=None if refused else self.source or attach.source,
            target=attach.target,
            initial_delivery_count=self.delivery_count,
        )

    def start(self) -> None:
        """Attached: consume (the queue delivers once the client gives credit)."""
        queue = self.queue
        if queue is None:
            return
        consumer = AMQP1Consumer(self, queue, self.no_ack, self._arguments)
        try:
            self.deliveries.consume(self.name, consumer)
        except BrokerError as exc:
            self.session.detach(self, error(RESOURCE_LOCKED, exc.text))
            return
        self.consumer = consumer

    def detached(self) -> None:
        """Detached, or its session ended: what it delivered and the client did
        not settle goes back to its queue."""
        if self.closed:
            return
        self.closed = True
        self.deliveries.close()
        if self.temporary and self.queue is not None:
            # Its queue goes with it (what was not settled went back to it first).
            self.session.vhost.delete_queue(self.queue.name, owner=self.session.conn)
        pair = self.pair
        if pair is not None:
            pair.sender = None
            self.session.pair_link_gone(self.name, pair)
            self.pair = None

    # -- credit -------------------------------------------------------------------------
    def flow(self, flow: Flow) -> None:
        """The client's credit: link-credit counted from its delivery-count
        (2.6.7); drain asks for what there is, then the rest is given up."""
        if flow.link_credit is not None:
            rcv_count = flow.delivery_count if flow.delivery_count is not None else 0
            self.credit = max(0, (rcv_count + flow.link_credit - self.delivery_count) % _SEQ)
            if self.credit > 1 << 31:
                self.credit = 0  # behind this side's count: none
        if flow.drain and not self._draining:
            self._draining = True
            self.resume()
            # After the queues' delivery passes of this turn.
            self.session.vhost.call_soon(self._drained)
        elif flow.echo:
            self._send_flow()
        if self.pair is not None:
            self.send_replies()
        else:
            self.resume()

    def _drained(self) -> None:
        if not self._draining or self.closed:
            return
        queue, consumer = self.queue, self.consumer
        if isinstance(queue, StreamQueue) and consumer is not None and queue.scanning(consumer):
            # Its filter's scan goes on in the next pass: RabbitMQ's drain waits for it.
            self.session.vhost.call_soon(self._drained)
            return
        self._draining = False
        self.delivery_count = (self.delivery_count + self.credit) % _SEQ
        self.credit = 0
        self._send_flow(drain=True)

    def _send_flow(self, drain: bool = False) -> None:
        session = self.session
        available = (
            self.queue.message_count
            if self.queue is not None
            else len(self.pair.replies if self.pair is not None else ())
        )
        session.send(
            session.flow(
                handle=self.handle,
                delivery_count=self.delivery_count,
                link_credit=self.credit,
                available=available,
                drain=drain,
            )
        )

    def resume(self) -> None:
        if self.credit > 0 and not self.closed:
            if self.pair is not None:
                self.send_replies()
            else:
                self.deliveries.resume()

    # -- deliveries ---------------------------------------------------------------------
    def deliver(self, consumer: AMQP1Consumer, seq: int, msg: Message, redelivered: bool) -> None:
        """One queue message to the client: a transfer (pre-settled for a
        no-ack link), kept unsettled under its delivery-id otherwise."""
        session = self.session
        queue = consumer.queue
        count_delivery(session.stats, queue.stats, consumer.no_ack, redelivered)
        amqp = from_core(msg.properties, msg.body, msg.native)
        payload = for_delivery(
            amqp,
            msg.exchange,
            msg.routing_key,
            delivery_count=_take_delivery_count(amqp),
            redelivered=redelivered,
        )
        deliveries = self.deliveries
        tag = deliveries.next_tag()
        if not consumer.no_ack:
            deliveries.track(tag, queue, seq, msg, consumer)
        delivery_id = session.send_transfer(self.handle, _TAG(tag), consumer.no_ack, payload)
        if not consumer.no_ack:
            session.sent += 1
            session.outgoing[delivery_id] = (self, tag, session.sent)
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _SEQ

    def deliver_run(
        self,
        consumer: AMQP1Consumer,
        run: MessageRun,
        indexes: range,
        stored: StoredRun | None,
    ) -> None:
        """A publish run's messages to the client at once (Queue.publish_run,
        within the link's credit: no_ack_credit, run_credit): counted once,
        tracked as one unsettled run (``stored``: the queue stored them; None:
        pre-settled), their transfers written in one piece."""
        session = self.session
        queue = consumer.queue
        n = len(indexes)
        if stored is None:
            session.stats.deliver_no_ack += n
            queue.stats.deliver_no_ack += n
        else:
            session.stats.deliver += n
            queue.stats.deliver += n
        deliveries = self.deliveries
        first_tag = deliveries.next_tags(n)
        if stored is not None:
            deliveries.track_run(first_tag, queue, stored, consumer, sum(stored.sizes))
        exchange, key = run.exchange, run.routing_key
        payloads = []
        for i in indexes:
            msg = run.message(i)
            amqp = from_core(msg.properties, msg.body)
            count = _take_delivery_count(amqp)
            payloads.append(for_delivery(amqp, exchange, key, delivery_count=count))
        tags = [_TAG(first_tag + j) for j in range(n)]
        first_id = session.send_transfers(self.handle, tags, stored is None, payloads)
        if stored is not None:
            outgoing = session.outgoing
            sent = session.sent
            for j in range(n):
                sent += 1
                outgoing[(first_id + j) % _SEQ] = (self, first_tag + j, sent)
            session.sent = sent
        self.credit -= n
        self.delivery_count = (self.delivery_count + n) % _SEQ

    def send_replies(self) -> None:
        """A management link: the replies waiting, as its credit allows."""
        pair = self.pair
        if pair is None:
            return
        session = self.session
        replies = pair.replies
        while replies and self.credit > 0 and session.can_send():
            payload = replies.popleft()
            session.send_transfer(self.handle, _TAG(self.deliveries.next_tag()), True, payload)
            self.credit -= 1
            self.delivery_count = (self.delivery_count + 1) % _SEQ

    def settle(self, tags: list[int], state: Any) -> None:
        """The client's outcome for deliveries ``tags`` (RabbitMQ 4's
        settle_op_from_outcome); no state: released, the default outcome."""
        deliveries = self.deliveries
        if deliveries.closed:
            return
        if isinstance(state, Accepted):
            n = len(tags)
            if n > 1:
                first = min(tags)
                if max(tags) - first == n - 1 and deliveries.ack_range(first, n):
                    return  # every tag of first .. first + n - 1 (distinct): in one call
            taken: list[Any] = []
            runs: list[Any] = []
            for tag in tags:
                t, r = deliveries.take(tag, False)
                taken += t
                runs += r
            deliveries.settle(taken, runs, None)
            return
        if isinstance(state, Rejected):
            requeue, explicit = False, True
        elif isinstance(state, Modified):
            if state.undeliverable_here:
                requeue, explicit = False, True
            else:
                requeue, explicit = True, bool(state.delivery_failed)
        else:  # Released, or no outcome
            assert state is None or isinstance(state, Released)
            requeue, explicit = True, False
        for tag in tags:
            try:
                deliveries.reject(tag, False, requeue, explicit)
            except BrokerError as exc:
                # A queue that takes no rejects (a stream): the delivery is done.
                log.debug("%s: %s", self.session.conn.name, exc.text)
                deliveries.ack(tag, False)


def _take_delivery_count(msg: AmqpMessage) -> int:
    """The count a queue with a delivery limit gave a redelivery (its
    ``x-delivery-count`` header, which from_core made an annotation), taken out
    for the header's delivery-count: RabbitMQ 4 shows its delivery_count
    annotation to a 1.0 consumer there (mc_amqp), not as an annotation."""
    annotations = msg.message_annotations
    if annotations is None:
        return 0
    count = annotations.content.pop("x-delivery-count", None)
    if not annotations.content:
        msg.message_annotations = None
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 2**32:
        return count
    return 0
