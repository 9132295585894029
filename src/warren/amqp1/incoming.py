"""A link on which the AMQP 1.0 client publishes (it is the sender, this side the receiver).

The target is an address (addresses.py: RabbitMQ 4's v2 forms and 3.x's v1
ones), or null: the anonymous terminus, where each message's ``to`` says where
it goes. The exchange (or queue) must exist (v1's ``/queue/Q`` is declared
when absent: links.v1_queue) and the user may write to it,
checked once at the attach (for each message on the anonymous terminus).
Credit is granted as RabbitMQ 4 grants it: 170, topped up once half is
used while fewer than 170 publishes wait to be settled. A message may span
transfer frames (``more``; ``aborted`` drops it) up to ``max_message_size``.

Each message is decoded (message.py), converted to the core's format
(mapping.to_core) and published through the vhost as MQTT's PUBLISH is. The
client learns the outcome if it did not settle the transfer: accepted once
the client session's Settlements say the message is settled (on disk, held
by the followers), released when no queue took it, rejected when a queue
refused it (its max length), as RabbitMQ 4 answers.

The hot path is batch-oriented, as AMQP 0-9-1's publish runs: the complete
one-frame messages a socket read holds for one link with a fixed target
(simple properties) wait in a `PublishRun`, published together at the end of
the read or before any other frame (Queue.publish_run: one store write, or
all handed to the queue's consumer; one settlement batch for the answers,
accepted in ranges); credit is topped up once per run. What the core does
not take as a run goes one by one, in order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from warren.amqp1.addresses import Address, AddressError, parse_target, parse_to
from warren.amqp1.errors import (
    DECODE_ERROR,
    ILLEGAL_STATE,
    MESSAGE_SIZE_EXCEEDED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LIMIT_EXCEEDED,
    TRANSFER_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
    LinkError,
    error,
)
from warren.amqp1.formats import DecodeError
from warren.amqp1.links import (
    MAX_MANAGEMENT_CREDIT,
    ManagementPair,
    temporary_queue,
    terminus_address,
    v1_queue,
)
from warren.amqp1.management_node import decode_request
from warren.amqp1.mapping import keep_native, to_core
from warren.amqp1.message import AmqpMessage, decode_message
from warren.amqp1.performatives import (
    RCV_FIRST,
    RECEIVER,
    Attach,
    Flow,
    Rejected,
    Released,
    Target,
    Transfer,
)
from warren.amqp1.types import Described
from warren.core.errors import AccessRefused, BrokerError
from warren.core.message import Message, MessageRun
from warren.core.users import WRITE

if TYPE_CHECKING:
    from warren.amqp1.session import Session
    from warren.core.exchange import Exchange
    from warren.core.store import MessageStore

__all__ = ["IncomingLink", "MAX_LINK_CREDIT", "PublishRun"]

log = logging.getLogger("warren.amqp1")

#: A transaction coordinator's descriptor (part 4, 4.5.1), code and name.
_COORDINATOR: Final = (0x30, "amqp:coordinator:list")
#: The credit a publishing link is given (RabbitMQ 4's max_link_credit): topped
#: up to it half way, while fewer publishes than it wait to be settled.
MAX_LINK_CREDIT: Final = 170
_SEQ: Final = 1 << 32
#: The most messages a run holds before it is published (one socket read's worth).
MAX_RUN: Final = 256


class PublishRun:
    """One link's complete one-frame messages of a socket read, converted to the
    core's format and waiting to be published together (IncomingLink.publish_run):
    all settled or all unsettled, each with simple properties (no expiration,
    reply-to or CC/BCC header: core.message.MessageRun's). Also the RawRun of
    their MessageRun."""

    __slots__ = ("link", "settled", "ids", "props", "bodies")

    def __init__(self, link: IncomingLink, settled: bool) -> None:
        self.link = link
        self.settled = settled
        self.ids: list[int] = []
        self.props: list[bytes] = []
        self.bodies: list[bytes] = []

    def __len__(self) -> int:
        return len(self.ids)

    def properties(self, i: int) -> bytes:
        return self.props[i]

    def body(self, i: int) -> bytes:
        return self.bodies[i]


class IncomingLink:
    """One link the client publishes on."""

    def __init__(self, session: Session, attach: Attach) -> None:
        self.session = session
        self.handle = attach.handle
        self.name = attach.name
        self.delivery_count = attach.initial_delivery_count or 0
        self.credit = 0
        self.max_credit = MAX_LINK_CREDIT
        #: Its publishes waiting to be settled (Session.unconfirmed).
        self.unconfirmed = 0
        #: The target (None: the anonymous terminus).
        self.address: Address | None = None
        self.exchange: Exchange | None = None
        self.routing_key: str | None = None
        self.target: Any = attach.target
        #: A dynamic target's queue (deleted with the link); "" for none.
        self.temporary = ""
        self.pair: ManagementPair | None = None
        # A message over several transfers: its delivery-id, settled, parts.
        self._parts: list[bytes] = []
        self._size = 0
        self._delivery_id: int | None = None
        self._settled = False
        self._refusals = 0

    # -- attach -------------------------------------------------------------------------
    def attach(self, attach: Attach) -> None:
        """Check the target: LinkError refuses the link."""
        if not isinstance(attach.target, Target):
            if isinstance(attach.target, Described) and attach.target.descriptor in _COORDINATOR:
                raise LinkError(NOT_IMPLEMENTED, "transactions are not supported")
            raise LinkError(ILLEGAL_STATE, "a sending link needs a target")
        session = self.session
        if attach.target.dynamic:
            queue, self.target = temporary_queue(attach.target, session.vhost, session.conn)
            self.temporary = queue.name
            self.address = Address("queue", queue.name)
            self.exchange, self.routing_key = self._resolve(self.address)
            return
        address = terminus_address(attach.target)
        if address is not None and not isinstance(address, str):
            raise LinkError("amqp:invalid-field", f"target address {address!r:.60}")
        try:
            parsed = parse_target(address)
        except AddressError as exc:
            raise LinkError(exc.condition, exc.description) from None
        if parsed is not None:
            if parsed.declare:
                v1_queue(parsed, attach.target, session.vhost, session.conn.client_session)
            self.exchange, self.routing_key = self._resolve(parsed)
        self.address = parsed

    def attach_management(self, attach: Attach) -> None:
        session = self.session
        if session.conn.management is None:
            raise LinkError(NOT_FOUND, "the /management node is not available")
        self.pair = session.management_pair(attach.name)
        self.max_credit = MAX_MANAGEMENT_CREDIT

    def _resolve(self, address: Address) -> tuple[Exchange, str | None]:
        """The exchange and routing key of ``address``; LinkError when the
        exchange or queue does not exist or the user may not write to it."""
        vhost = self.session.vhost
        if address.kind == "exchange":
            exchange = vhost.exchanges.get(address.name)
            if exchange is None:
                raise LinkError(NOT_FOUND, f"no exchange '{address.name}' in vhost '{vhost.name}'")
            key = address.routing_key
        else:
            if address.name not in vhost.queues:
                raise LinkError(NOT_FOUND, f"no queue '{address.name}' in vhost '{vhost.name}'")
            exchange = vhost.default_exchange
            key = address.name
        try:
            self.session.conn.client_session.check(WRITE, "exchange", exchange.name)
        except AccessRefused as exc:
            raise LinkError(UNAUTHORIZED_ACCESS, exc.text) from None
        return exchange, key

    def reply_attach(self, attach: Attach, refused: bool) -> Attach:
        """As RabbitMQ 4 answers: rcv-settle-mode first (a sender that settles
        first may ask for second: it makes no difference), the client's on a
        refusal, which carries no max-message-size."""
        if refused:
            return Attach(
                name=attach.name,
                handle=self.handle,
                role=RECEIVER,
                snd_settle_mode=attach.snd_settle_mode,
                rcv_settle_mode=attach.rcv_settle_mode,
                source=attach.source,
                target=None,
            )
        return Attach(
            name=attach.name,
            handle=self.handle,
            role=RECEIVER,
            snd_settle_mode=attach.snd_settle_mode,
            rcv_settle_mode=RCV_FIRST,
            source=attach.source,
            target=self.target,
            max_message_size=self.session.conn.config.max_message_size,
        )

    def start(self) -> None:
        """Attached: the first credit."""
        self.maybe_grant_credit()

    def _drop_parts(self) -> None:
        """Forget an unfinished message (aborted, or the link gone)."""
        if self._parts:
            self.session.conn.unfinished -= sum(len(p) for p in self._parts)
        self._parts = []
        self._size = 0
        self._delivery_id = None

    def detached(self) -> None:
        conn = self.session.conn
        run = conn.run
        if run is not None and run.link is self:
            # What came before the detach (or the error detaching it) is published.
            conn.run = None
            try:
                self.publish_run(run, grant=False)
            except LinkError as exc:
                log.info("%s: AMQP 1.0 link '%s': %s", conn.name, self.name, exc)
        self._drop_parts()
        if self.temporary:
            self.session.vhost.delete_queue(self.temporary, owner=self.session.conn)
            self.temporary = ""
        if self.pair is not None:
            self.session.pair_link_gone(self.name, self.pair)
            self.pair = None

    # -- credit -------------------------------------------------------------------------
    def flow(self, flow: Flow) -> None:
        """The client's flow: its echo asks for this link's state."""
        if flow.echo:
            self._send_credit()

    def maybe_grant_credit(self) -> None:
        """Top the credit up once half is used, while fewer than the credit wait
        to be settled (RabbitMQ 4's rule); none during a resource alarm."""
        session = self.session
        if session.blocked or session.ended_:
            return
        top = self.max_credit
        if self.credit <= top // 2 and self.unconfirmed < top:
            self.credit = top
            self._send_credit()

    def _send_credit(self) -> None:
        session = self.session
        session.send(
            session.flow(
                handle=self.handle, delivery_count=self.delivery_count, link_credit=self.credit
            )
        )

    # -- transfers ----------------------------------------------------------------------
    def transfer(self, transfer: Transfer, payload: bytes | memoryview) -> None:
        """One transfer frame: a message once its last frame is in. A complete
        one-frame message to a fixed target joins the connection's pending run
        (published at the end of the read, or before anything else happens);
        anything else publishes that run first, then goes on its own."""
        conn = self.session.conn
        if (
            self.routing_key is not None
            and not transfer.more
            and not transfer.aborted
            and self._delivery_id is None
            and transfer.delivery_id is not None
            and self.pair is None
        ):
            self._collect(transfer.delivery_id, bool(transfer.settled), payload)
            return
        if conn.run is not None:
            conn.flush_run()
        if transfer.aborted:
            self._drop_parts()
            return
        if self._delivery_id is None:
            if transfer.delivery_id is None:
                raise LinkError(ILLEGAL_STATE, "a first transfer without a delivery-id")
            if self.credit <= 0:
                raise LinkError(TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
            self._delivery_id = transfer.delivery_id
            self._settled = bool(transfer.settled)
        conn = self.session.conn
        self._size += len(payload)
        limit = conn.config.max_message_size
        if self._size > limit:
            raise LinkError(
                MESSAGE_SIZE_EXCEEDED,
                f"message size ({self._size} bytes) > maximum ({limit} bytes)",
            )
        if transfer.more:
            # What a connection's unfinished messages hold, all links together,
            # stays within one message of the largest size.
            if conn.unfinished + len(payload) > limit:
                raise LinkError(
                    TRANSFER_LIMIT_EXCEEDED,
                    f"unfinished messages on this connection over {limit} bytes",
                )
            conn.unfinished += len(payload)
            self._parts.append(bytes(payload))
            return
        self._parts.append(bytes(payload))
        conn.unfinished -= self._size - len(payload)
        data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        delivery_id = self._delivery_id
        settled = self._settled or bool(transfer.settled)
        self._parts = []
        self._size = 0
        self._delivery_id = None
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _SEQ
        try:
            # A management request may have no body section (a GET, a DELETE).
            message = decode_message(data) if self.pair is None else decode_request(data)
        except DecodeError as exc:
            raise LinkError(DECODE_ERROR, f"cannot decode the message: {exc}") from None
        if self.pair is not None:
            if not settled:
                self.session.accept_now(delivery_id)
            self.pair.request(message)
        else:
            self._publish(message, delivery_id, settled)
        self.maybe_grant_credit()

    def _publish(self, message: AmqpMessage, delivery_id: int, settled: bool) -> None:
        session = self.session
        conn = session.conn
        exchange, key = self.exchange, self.routing_key
        if self.address is None:
            to = message.properties.to if message.properties is not None else None
            try:
                exchange, key = self._resolve(parse_to(to))
            except (AddressError, LinkError) as exc:
                # The anonymous terminus: the delivery is refused, the link stays
                # (OASIS anonterm's routing errors, RabbitMQ 4's choice).
                if settled:
                    raise LinkError(exc.condition, exc.description) from None
                session.disposition(delivery_id, Rejected(error(exc.condition, exc.description)))
                return
        assert exchange is not None
        if key is None:
            # A v1 target without a routing key: the message's subject.
            props = message.properties
            key = (props.subject if props is not None else None) or ""
        properties, body = to_core(message)
        native = keep_native(message, properties, body)
        msg = Message(exchange.name, key, properties, body, conn.now_ms or None, native)
        self._check_user(message)
        self._route(exchange, msg, delivery_id, settled)

    def _check_user(self, message: AmqpMessage) -> None:
        """A message's user-id must be the user's, unless they may impersonate."""
        user = self.session.conn.user
        if user is not None and message.properties is not None:
            claimed = message.properties.user_id
            impersonating = claimed is not None and claimed != user.name.encode()
            if impersonating and "impersonator" not in user.tags:
                assert claimed is not None
                raise LinkError(
                    UNAUTHORIZED_ACCESS,
                    f"user_id property set to '{claimed.decode('utf-8', 'replace')}' "
                    f"but authenticated user was '{user.name}'",
                )

    def _route(self, exchange: Exchange, msg: Message, delivery_id: int, settled: bool) -> None:
        """Publish one message; the client learns the outcome unless it settled."""
        session = self.session
        stats = session.stats
        stats.publish += 1
        durable: list[Any] | None = None if settled else []
        try:
            routed = session.vhost.router.publish(exchange, msg, durable)
        except BrokerError as exc:
            raise LinkError(PRECONDITION_FAILED, exc.text) from None
        if routed == 0:
            stats.drop_unroutable += 1
            if not settled:
                session.disposition(delivery_id, Released())
            return
        if settled:
            return
        if routed < 0:
            session.disposition(
                delivery_id,
                Rejected(
                    error(RESOURCE_LIMIT_EXCEEDED, "a queue refused the message (max length)")
                ),
            )
            return
        if session.settlements.add(delivery_id, durable):
            self.unconfirmed += 1
            session.unconfirmed[delivery_id] = self
        else:
            session.accept_now(delivery_id)

    # -- runs ---------------------------------------------------------------------------
    def _collect(self, delivery_id: int, settled: bool, payload: bytes | memoryview) -> None:
        """A complete one-frame message to this link's fixed target: checked,
        counted against the credit and converted now (an error detaches the
        link once what came before is published), published with its run."""
        session = self.session
        conn = session.conn
        run = conn.run
        if run is not None and (run.link is not self or run.settled != settled):
            conn.flush_run()
            run = None
        if self.credit <= 0:
            raise LinkError(TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
        limit = conn.config.max_message_size
        if len(payload) > limit:
            raise LinkError(
                MESSAGE_SIZE_EXCEEDED,
                f"message size ({len(payload)} bytes) > maximum ({limit} bytes)",
            )
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _SEQ
        try:
            message = decode_message(payload)
        except DecodeError as exc:
            raise LinkError(DECODE_ERROR, f"cannot decode the message: {exc}") from None
        self._check_user(message)
        properties, body = to_core(message)
        native = keep_native(message, properties, body)
        flags = properties[0] if properties else 0
        if native is not None or flags & 0x03 or (flags & 0x20 and b"CC" in properties):
            # Its original form kept (a publish run carries none), an expiration,
            # a reply-to or a CC/BCC header (0x01, 0x02, 0x20 of the flags' high
            # byte): routed on its own.
            if run is not None:
                conn.flush_run()
            assert self.exchange is not None and self.routing_key is not None
            msg = Message(
                self.exchange.name, self.routing_key, properties, body, conn.now_ms or None, native
            )
            self._route(self.exchange, msg, delivery_id, settled)
            self.maybe_grant_credit()
            return
        if run is None:
            run = conn.run = PublishRun(self, settled)
        run.ids.append(delivery_id)
        run.props.append(properties)
        run.bodies.append(body)
        if len(run.ids) >= MAX_RUN:
            conn.flush_run()

    def publish_run(self, run: PublishRun, grant: bool = True) -> None:
        """A run's messages, published together where the core takes them at
        once (one queue, which stores them in one write or hands them all to its
        consumer: Queue.publish_run), answered together (one settlement batch,
        accepted in ranges); the rest one by one, in order, as they would have
        been. LinkError: a message the core refused (the link detaches)."""
        session = self.session
        conn = session.conn
        exchange, key = self.exchange, self.routing_key
        assert exchange is not None and key is not None
        n = len(run)
        now = conn.now_ms or conn.node.clock.now_ms()
        first = Message(exchange.name, key, run.props[0], run.bodies[0], now)
        took = 0
        queues = session.vhost.router.route_run(exchange, first) if n > 1 else None
        if queues is not None and len(queues) == 1:
            durable: list[MessageStore] = []
            lost: list[int] = []
            mrun = MessageRun(exchange.name, key, first.exchange_and_key(), run, now)
            try:
                took = queues[0].publish_run(mrun, None if run.settled else durable, lost)
            except BrokerError as exc:
                raise LinkError(PRECONDITION_FAILED, exc.text) from None
            if took:
                exchange.stats.count_publishes(took, 1)
                session.stats.publish += took
                if not run.settled:
                    self._answer_run(run.ids[:took], durable, lost)
        for i in range(took, n):
            msg = first if i == 0 else Message(exchange.name, key, run.props[i], run.bodies[i], now)
            self._route(exchange, msg, run.ids[i], run.settled)
        if grant:
            self.maybe_grant_credit()

    def _answer_run(self, ids: list[int], durable: list[MessageStore], lost: list[int]) -> None:
        """Unsettled publishes a queue took as a run: accepted once settled (one
        settlement batch entry), rejected for those its store lost meanwhile."""
        session = self.session
        if lost:
            gone = set(lost)
            refused = Rejected(error(RESOURCE_LIMIT_EXCEEDED, "could not store the message"))
            for i in sorted(gone):
                session.disposition(ids[i], refused)
            ids = [d for i, d in enumerate(ids) if i not in gone]
            if not ids:
                return
        if session.settlements.add_many(ids, durable):
            self.unconfirmed += len(ids)
            unconfirmed = session.unconfirmed
            for delivery_id in ids:
                unconfirmed[delivery_id] = self
        else:
            for delivery_id in ids:
                session.accept_now(delivery_id)
