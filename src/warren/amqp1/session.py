"""An AMQP 1.0 session (part 2, 2.5.5-2.5.6, 2.7.2): its windows, links and deliveries.

One per channel of a connection (connection.py). What is the session's is
the transfer numbering and the windows (incoming: 400 transfers, opened again
half way, as RabbitMQ 4), the links by handle (attach/detach, handle-max),
the flow frames' session fields, and the dispositions both ways: the
client's settle what this side delivered, this side's answer what the
client published once the client session's Settlements say it is settled
(core/session.py). A link is incoming.py's (the client publishes),
outgoing.py's (it consumes) or links.py's ``/management`` pair.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from warren.amqp1.errors import (
    HANDLE_IN_USE,
    ILLEGAL_STATE,
    INVALID_FIELD,
    NOT_ALLOWED,
    UNATTACHED_HANDLE,
    WINDOW_VIOLATION,
    LinkError,
    SessionError,
    error,
)
from warren.amqp1.frames import TransferEncoder, transfer_frames
from warren.amqp1.incoming import IncomingLink
from warren.amqp1.links import ManagementPair, is_management, validate_attach
from warren.amqp1.outgoing import OutgoingLink
from warren.amqp1.performatives import (
    RECEIVER,
    SENDER,
    UINT_MAX,
    Accepted,
    Attach,
    Begin,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Modified,
    Received,
    Rejected,
    Released,
    Transfer,
)
from warren.core.stats import MessageStats

if TYPE_CHECKING:
    from warren.amqp1.connection import AMQP1Connection
    from warren.core.vhost import VHost

__all__ = ["Session"]

log = logging.getLogger("warren.amqp1")

#: Transfers the client may send before the window is opened again (RabbitMQ 4's
#: max_incoming_window); it is, half way.
MAX_INCOMING_WINDOW: Final = 400
#: Links a session may have (RabbitMQ 4's link_max_per_session): handle-max is one less.
LINK_MAX: Final = 256
_SEQ: Final = 1 << 32

Link = IncomingLink | OutgoingLink


class Session:
    """One session: its links by handle, windows and deliveries."""

    def __init__(self, conn: AMQP1Connection, channel: int, begin: Begin, vhost: VHost) -> None:
        self.conn = conn
        self.channel = channel
        self.vhost = vhost
        #: The session's counters, as an AMQP channel's.
        self.stats = MessageStats()
        self.next_incoming_id = begin.next_outgoing_id
        self.blocked = bool(conn.node.alarms)
        self.incoming_window = 0 if self.blocked else MAX_INCOMING_WINDOW
        self.next_outgoing_id = 0
        self.remote_incoming_window = begin.incoming_window
        self.remote_outgoing_window = begin.outgoing_window
        self.handle_max = min(begin.handle_max, LINK_MAX - 1)
        self.links: dict[int, Link] = {}
        #: Links whose attach declared something (a v1 ``/queue/Q``) not yet
        #: durable: their answer waits, and so do the client's frames on them.
        self.unanswered: dict[int, list[tuple[Any, bytes]]] = {}
        self.pairs: dict[str, ManagementPair] = {}
        #: Handles this side detached whose client's detach has not come yet.
        self.detaching: set[int] = set()
        self.next_delivery_id = 0
        #: This side's unsettled deliveries: delivery-id -> (link, its delivery
        #: tag, its number among the session's unsettled deliveries: ``sent``).
        self.outgoing: dict[int, tuple[OutgoingLink, int, int]] = {}
        #: Unsettled deliveries sent so far (never wraps: the consumer timeout's).
        self.sent = 0
        # The consumer timeout's marks, once a check: (``sent`` then, the time).
        self._marks: deque[tuple[int, int]] = deque()
        #: The client's unsettled publishes waiting to be settled: delivery-id -> link.
        self.unconfirmed: dict[int, IncomingLink] = {}
        #: Publishes accepted at once, answered together at the end of the turn.
        self._accepted: list[int] = []
        self.settlements = conn.client_session.settlements(self._settled, self._wake, ordered=False)
        self._write_out_due = False
        #: Its links' transfer encoders by handle (a reused handle keeps its own).
        self._encoders: dict[int, TransferEncoder] = {}
        self.ended_ = False
        conn.send_frame(
            channel,
            Begin(
                remote_channel=channel,
                next_outgoing_id=self.next_outgoing_id,
                incoming_window=self.incoming_window,
                outgoing_window=UINT_MAX,
                handle_max=self.handle_max,
            ),
        )

    # -- frames in ----------------------------------------------------------------------
    def frame(self, performative: Any, payload: bytes | memoryview) -> None:
        """A frame of this session's channel; a SessionError ends the session."""
        if self.unanswered and not isinstance(performative, Attach):
            # A frame on a link whose attach is not answered yet: after the answer
            # (looked at only while one is waiting: not on every transfer).
            waiting = self.unanswered.get(getattr(performative, "handle", None))  # type: ignore[arg-type]
            if waiting is not None:
                waiting.append((performative, bytes(payload)))
                return
        try:
            if isinstance(performative, Transfer):
                self._transfer(performative, payload)
            elif isinstance(performative, Flow):
                self._flow(performative)
            elif isinstance(performative, Disposition):
                self._disposition(performative)
            elif isinstance(performative, Attach):
                self._attach(performative)
            elif isinstance(performative, Detach):
                self._detach(performative)
            elif isinstance(performative, End):
                self.conn.send_frame(self.channel, End())
                self.ended()
            else:
                raise SessionError(ILLEGAL_STATE, f"unexpected {type(performative).__name__}")
        except SessionError as exc:
            self.conn.flush_run()  # the transfers before the error are published
            self.end(exc.as_error())

    def _link(self, handle: int | None) -> Link:
        link = self.links.get(handle) if handle is not None else None
        if link is None:
            raise SessionError(UNATTACHED_HANDLE, f"no link of handle {handle}")
        return link

    def _attach(self, attach: Attach) -> None:
        handle = attach.handle
        if handle > self.handle_max:
            raise SessionError(
                NOT_ALLOWED, f"link handle {handle} is above handle-max {self.handle_max}"
            )
        if handle in self.links or handle in self.detaching:
            raise SessionError(HANDLE_IN_USE, f"link handle {handle} is in use")
        link: Link
        link = IncomingLink(self, attach) if attach.role == SENDER else OutgoingLink(self, attach)
        self.links[handle] = link
        client_session = self.conn.client_session
        mark = client_session.change_mark()
        try:
            validate_attach(attach)
            if is_management(attach):
                link.attach_management(attach)
            else:
                link.attach(attach)
        except LinkError as exc:
            # As RabbitMQ 4: the attach answered with a null terminus, then detached.
            log.info("%s: AMQP 1.0 link '%s' refused: %s", self.conn.name, attach.name, exc)
            self.send(link.reply_attach(attach, refused=True))
            self.detach(link, exc.as_error())
            return
        reply = link.reply_attach(attach, refused=False)
        # A queue the attach declared (v1 /queue/Q) is durable before the answer,
        # as 0-9-1's declare-ok and the /management node's replies wait.
        self.unanswered[handle] = []
        if not client_session.when_changes_durable(mark, lambda ok: self._answer(link, reply, ok)):
            self._answer(link, reply, True)

    def _answer(self, link: Link, reply: Attach, ok: bool) -> None:
        """Answer ``link``'s attach and start it, then take the frames the client
        sent on it meanwhile."""
        waiting = self.unanswered.pop(link.handle, None)
        if waiting is None or self.ended_ or self.links.get(link.handle) is not link:
            return
        if not ok:
            log.error("%s: a queue an attach declared could not be synced", self.conn.name)
        self.send(reply)
        link.start()
        for performative, payload in waiting:
            if self.ended_:
                break
            self.frame(performative, payload)
        if waiting:
            self.conn.flush_run()  # a read's run is published at its end: these too

    def _detach(self, detach: Detach) -> None:
        if detach.handle in self.detaching:
            self.detaching.discard(detach.handle)  # the answer to this side's detach
            return
        link = self._link(detach.handle)
        self.links.pop(detach.handle, None)
        link.detached()
        self.send(Detach(handle=detach.handle, closed=detach.closed))

    def detach(self, link: Link, err: Error | None) -> None:
        """Detach ``link`` from this side (closed), with ``err``."""
        if self.links.get(link.handle) is link:
            del self.links[link.handle]
            link.detached()
            self.detaching.add(link.handle)
            self.send(Detach(handle=link.handle, closed=True, error=err))

    def _transfer(self, transfer: Transfer, payload: bytes | memoryview) -> None:
        # Session flow control, "receiving a transfer" (2.5.6).
        self.next_incoming_id = (self.next_incoming_id + 1) % _SEQ
        self.remote_outgoing_window -= 1
        self.incoming_window -= 1
        if self.incoming_window < 0:
            raise SessionError(WINDOW_VIOLATION, "incoming window violation")
        if self.incoming_window <= MAX_INCOMING_WINDOW // 2 and not self.blocked:
            self.incoming_window = MAX_INCOMING_WINDOW
            self.send(self.flow())
        if transfer.handle in self.detaching:
            return  # sent before the client saw this side's detach
        link = self._link(transfer.handle)
        if not isinstance(link, IncomingLink):
            raise SessionError(ILLEGAL_STATE, f"a transfer on sending link {link.handle}")
        try:
            link.transfer(transfer, payload)
        except LinkError as exc:
            log.info("%s: AMQP 1.0 link '%s' detached: %s", self.conn.name, link.name, exc)
            self.detach(link, exc.as_error())

    def _flow(self, flow: Flow) -> None:
        # "Receiving a flow" (2.5.6).
        seq = flow.next_incoming_id if flow.next_incoming_id is not None else 0
        window = (seq + flow.incoming_window - self.next_outgoing_id) % _SEQ
        # Negative (transfers crossed the flow): none until the next flow.
        self.remote_incoming_window = 0 if window >= 1 << 31 else window
        self.remote_outgoing_window = flow.outgoing_window
        if flow.handle is None:
            if flow.echo:
                self.send(self.flow())
            self.resume()
            return
        if flow.handle in self.detaching:
            return
        link = self._link(flow.handle)
        try:
            link.flow(flow)
        except LinkError as exc:
            self.detach(link, exc.as_error())
        self.resume()

    def _disposition(self, disposition: Disposition) -> None:
        if disposition.role != RECEIVER:
            return  # the client settles its own publishes: this side settled first
        first = disposition.first
        last = disposition.last if disposition.last is not None else first
        outgoing = self.outgoing
        if (last - first) % _SEQ >= len(outgoing):
            ids = [i for i in outgoing if _within(i, first, last)]
        else:
            ids = [(first + i) % _SEQ for i in range((last - first) % _SEQ + 1)]
        state = disposition.state
        if isinstance(state, Received):
            return  # not an outcome
        if state is not None and not isinstance(state, (Accepted, Rejected, Released, Modified)):
            raise SessionError(INVALID_FIELD, f"Unrecognised state: {state!r:.60} in DISPOSITION")
        if not disposition.settled and state is None:
            return
        by_link: dict[int, tuple[OutgoingLink, list[int]]] = {}
        for delivery_id in ids:
            entry = outgoing.pop(delivery_id, None)
            if entry is None:
                continue
            link, tag, _ = entry
            by_link.setdefault(id(link), (link, []))[1].append(tag)
        for link, tags in by_link.values():
            link.settle(tags, state)
        if not disposition.settled and ids:
            # The client waits for this side to settle (rcv-settle-mode first).
            self.send(Disposition(role=SENDER, first=first, last=last, settled=True, state=state))

    # -- frames out ---------------------------------------------------------------------
    def send(self, performative: Any) -> None:
        self.conn.send_frame(self.channel, performative)

    def flow(self, **link: Any) -> Flow:
        """A flow frame with the session's fields (and ``link``'s)."""
        return Flow(
            next_incoming_id=self.next_incoming_id,
            incoming_window=max(0, self.incoming_window),
            next_outgoing_id=self.next_outgoing_id,
            outgoing_window=UINT_MAX,
            **link,
        )

    def can_send(self) -> bool:
        """Whether a transfer may go out now (the client's window, the transport)."""
        return self.remote_incoming_window > 0 and self.conn.writable and not self.ended_

    def send_transfer(self, handle: int, tag: bytes, settled: bool, payload: bytes) -> int:
        """A message to the client on link ``handle``, in as many frames as its
        max-frame-size needs; its delivery-id."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) % _SEQ
        conn = self.conn
        encoder = self._encoders.get(handle)
        if encoder is None:
            encoder = self._encoders[handle] = TransferEncoder(self.channel, handle)
        frame = encoder.frame(delivery_id, tag, settled, payload, conn.peer_max_frame)
        if frame is not None:
            self.next_outgoing_id = (self.next_outgoing_id + 1) % _SEQ
            self.remote_incoming_window -= 1
            conn.send(frame)
            return delivery_id
        transfer = Transfer(
            handle=handle,
            delivery_id=delivery_id,
            delivery_tag=tag,
            message_format=0,
            settled=settled,
        )
        frames = transfer_frames(self.channel, transfer, payload, conn.peer_max_frame)
        n = len(frames)
        self.next_outgoing_id = (self.next_outgoing_id + n) % _SEQ
        self.remote_incoming_window -= n
        for data in frames:
            conn.send(data)
        return delivery_id

    def send_transfers(
        self, handle: int, tags: list[bytes], settled: bool, payloads: list[bytes]
    ) -> int:
        """send_transfer for a run of messages on link ``handle``, written in one
        piece; the first's delivery-id (the others follow it)."""
        conn = self.conn
        encoder = self._encoders.get(handle)
        if encoder is None:
            encoder = self._encoders[handle] = TransferEncoder(self.channel, handle)
        max_frame = conn.peer_max_frame
        first = delivery_id = self.next_delivery_id
        parts: list[bytes] = []
        for tag, payload in zip(tags, payloads, strict=True):
            frame = encoder.frame(delivery_id, tag, settled, payload, max_frame)
            if frame is not None:
                parts.append(frame)
            else:
                transfer = Transfer(
                    handle=handle,
                    delivery_id=delivery_id,
                    delivery_tag=tag,
                    message_format=0,
                    settled=settled,
                )
                parts += transfer_frames(self.channel, transfer, payload, max_frame)
            delivery_id = (delivery_id + 1) % _SEQ
        self.next_delivery_id = delivery_id
        n = len(parts)
        self.next_outgoing_id = (self.next_outgoing_id + n) % _SEQ
        self.remote_incoming_window -= n
        conn.send(b"".join(parts))
        return first

    def accept_now(self, delivery_id: int) -> None:
        """A publish settled at once: accepted with the others of this turn."""
        if not self._accepted:
            self.conn.on_output()
        self._accepted.append(delivery_id)

    def disposition(self, delivery_id: int, state: Any) -> None:
        """Settle the client's publish ``delivery_id`` with ``state`` now."""
        self.send(Disposition(role=RECEIVER, first=delivery_id, settled=True, state=state))

    def before_output(self) -> None:
        """End of the turn: write out what waits for it (``sync = false``) and
        answer the publishes accepted meanwhile, in ranges."""
        if self._write_out_due:
            self._write_out_due = False
            self.vhost.flush_written()
            self.settlements.written()
        if self._accepted:
            ids, self._accepted = self._accepted, []
            self._send_ranges(ids, Accepted())

    def _send_ranges(self, ids: list[int], state: Any) -> None:
        ids.sort()
        start = prev = ids[0]
        for i in ids[1:]:
            if i != prev + 1:
                self.send(
                    Disposition(role=RECEIVER, first=start, last=prev, settled=True, state=state)
                )
                start = i
            prev = i
        self.send(Disposition(role=RECEIVER, first=start, last=prev, settled=True, state=state))

    def _wake(self) -> None:
        self._write_out_due = True
        self.conn.on_output()

    def _settled(self, batch: list[int], ok: bool) -> None:
        """Publishes the core settled (synced, held by the followers): accepted;
        refused when their store lost them (a full disk)."""
        if self.ended_:
            return
        links: dict[int, IncomingLink] = {}
        for delivery_id in batch:
            link = self.unconfirmed.pop(delivery_id, None)
            if link is not None:
                link.unconfirmed -= 1
                links[id(link)] = link
        if ok:
            self._send_ranges(list(batch), Accepted())
        else:
            log.warning(
                "%s: %d publishes could not be stored (disk full?): rejected",
                self.conn.name,
                len(batch),
            )
            refused = Rejected(error("amqp:resource-limit-exceeded", "could not store the message"))
            self._send_ranges(list(batch), refused)
        for link in links.values():
            link.maybe_grant_credit()

    def check_consumer_timeouts(self, now: int, default: int) -> None:
        """Deliveries the client has not settled within the consumer timeout
        (its queue's ``x-consumer-timeout``, else ``default``; 0: none) go back
        to their queue, and the client hears they are released (a disposition
        this side sends unsettled), as RabbitMQ 4 does; the link stays.

        No clock read per delivery: each check records a mark (deliveries sent
        so far, the time), and a delivery is at least as old as the first mark
        taken after it, so it is released at most one check late."""
        outgoing = self.outgoing
        marks = self._marks
        if not outgoing:
            marks.clear()
            return
        if not marks or marks[-1][0] < self.sent:
            marks.append((self.sent, now))
        oldest = min(entry[2] for entry in outgoing.values())
        while len(marks) > 1 and marks[1][0] < oldest:
            marks.popleft()  # taken before every delivery still unsettled
        counts = [m[0] for m in marks]
        expired: list[tuple[int, OutgoingLink, int]] = []
        for delivery_id, (link, tag, number) in outgoing.items():
            i = bisect.bisect_left(counts, number)
            if i == len(counts):
                continue  # sent after the last mark
            queue = link.queue
            timeout = default
            if queue is not None and queue.consumer_timeout is not None:
                timeout = queue.consumer_timeout
            if timeout and now - marks[i][1] >= timeout:
                expired.append((delivery_id, link, tag))
        if not expired:
            return
        log.warning(
            "%s: %d deliveries not settled within the consumer timeout: released",
            self.conn.name,
            len(expired),
        )
        for delivery_id, link, tag in sorted(expired, key=lambda e: e[0]):
            del outgoing[delivery_id]
            link.settle([tag], Released())
            self.send(Disposition(role=SENDER, first=delivery_id, state=Released()))

    # -- the session's life ------------------------------------------------------------
    def resume(self) -> None:
        """Room opened (a flow, a writable transport): sending links deliver again."""
        for link in self.links.values():
            if isinstance(link, OutgoingLink):
                link.resume()

    def set_blocked(self, blocked: bool) -> None:
        """A resource alarm: no more credit or window for publishers meanwhile."""
        if blocked == self.blocked:
            return
        self.blocked = blocked
        if not blocked:
            self.incoming_window = MAX_INCOMING_WINDOW
            self.send(self.flow())
            for link in list(self.links.values()):
                if isinstance(link, IncomingLink):
                    link.maybe_grant_credit()

    def end(self, err: Error | None) -> None:
        """End the session from this side, with ``err``."""
        if self.ended_:
            return
        log.info(
            "%s: AMQP 1.0 session %d ended: %s",
            self.conn.name,
            self.channel,
            err.description if err is not None else "",
        )
        self.conn.send_frame(self.channel, End(error=err))
        self.ended(by_us=True)

    def ended(self, by_us: bool = False) -> None:
        """The session is over: its links detach (what they delivered and is not
        settled goes back to its queues). ``by_us``: this side's end, the
        client's to come."""
        if self.ended_:
            return
        self.ended_ = True
        self.unanswered.clear()
        links, self.links = self.links, {}
        for link in links.values():
            link.detached()
        self.outgoing.clear()
        self.unconfirmed.clear()
        self.conn.session_ended(self.channel, by_us)

    def management_pair(self, name: str) -> ManagementPair:
        """The ``/management`` link pair of link name ``name`` (made at its first
        link), with one more link on it."""
        pair = self.pairs.get(name)
        if pair is None:
            factory = self.conn.management
            assert factory is not None
            pair = ManagementPair(factory, self.conn.client_session, self.vhost)
            self.pairs[name] = pair
        pair.links += 1
        return pair

    def pair_link_gone(self, name: str, pair: ManagementPair) -> None:
        """A link of ``pair`` detached: the pair ends with its last link."""
        pair.links -= 1
        if pair.links <= 0:
            pair.closed = True
            if self.pairs.get(name) is pair:
                del self.pairs[name]


def _within(i: int, first: int, last: int) -> bool:
    """Whether serial number ``i`` is in ``first .. last`` (RFC 1982, wrapping)."""
    return (i - first) % _SEQ <= (last - first) % _SEQ
