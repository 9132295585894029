"""A channel's basic.ack, nack, reject and recover in AMQP terms.

How deliveries are settled (credit back, the queues' acks, requeues and
drops, the refill, what a close gives back) is the core's: the channel's
delivery stream (core/deliveries.py's Deliveries). What is AMQP's is kept
here: a transaction holds the settlements until tx.commit (their deliveries
keep their prefetch slots meanwhile, as in RabbitMQ) and tx.rollback makes
them unacked again; a run of single acks or rejects read at once
(amqp/ack_scan.py) that the stream cannot settle as a range goes frame by
frame, exactly as the frames would have gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp.ack_scan import REJECT_IDS
from warren.core.unsettled import Unsettled

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.core.deliveries import Deliveries

_ACK_IDS = b"\x00\x3c\x00\x50"  # basic.ack: class 60, method 80

#: An ack, nack or reject a transaction holds until commit: (tag, delivery,
#: "ack" or "reject", requeue).
TxAck = tuple[int, Unsettled, str, bool]


class Settlement:
    """One channel's acknowledgements: transactions, and runs read at once."""

    __slots__ = ("channel", "deliveries", "tx_acks")

    def __init__(self, channel: Channel, deliveries: Deliveries) -> None:
        self.channel = channel
        self.deliveries = deliveries
        #: In a transaction: the acks, nacks and rejects waiting for tx.commit.
        self.tx_acks: list[TxAck] = []

    # -- basic.ack, nack, reject, recover -----------------------------------------------
    def ack_like(self, tag: int, multiple: bool, requeue: bool | None) -> None:
        """basic.ack (requeue None), basic.nack or basic.reject of ``tag``."""
        deliveries = self.deliveries
        if not self.channel.tx:
            if requeue is None:
                deliveries.ack(tag, multiple)
            else:
                deliveries.reject(tag, multiple, requeue)
            return
        if requeue is not None:
            deliveries.check_reject(tag, multiple)
        taken, runs = deliveries.take(tag, multiple)
        kind = "ack" if requeue is None else "reject"
        for run in runs:
            taken.extend(run.entries())
        taken.sort(key=lambda item: item[0])
        for t, entry in taken:
            self.tx_acks.append((t, entry, kind, bool(requeue)))

    def ack_range(self, first: int, n: int) -> None:
        """basic.ack of tags ``first .. first + n - 1`` (n frames, multiple=false,
        one after the other in a read): settled together when the delivery
        stream can (Deliveries.ack_range); else frame by frame, exactly as the
        frames would have gone (an unknown tag closes the channel there)."""
        if not self.deliveries.ack_range(first, n):
            ch = self.channel
            for tag in range(first, first + n):
                ch.on_method_frame(_ACK_IDS + tag.to_bytes(8, "big") + b"\x00")

    def reject_range(self, first: int, n: int, ids: bytes, bits: int) -> None:
        """basic.reject (``ids`` REJECT_IDS) or basic.nack with multiple clear
        (NACK_IDS) of tags ``first .. first + n - 1``, n frames with the flags
        octet ``bits``, one after the other in a read: settled together when
        the delivery stream can (Deliveries.reject_range); else frame by frame."""
        requeue = bool(bits & (1 if ids == REJECT_IDS else 2))
        if not self.deliveries.reject_range(first, n, requeue):
            ch = self.channel
            flags = bytes((bits,))
            for tag in range(first, first + n):
                ch.on_method_frame(ids + tag.to_bytes(8, "big") + flags)

    # -- transactions -------------------------------------------------------------------
    def commit(self, acks: list[TxAck]) -> None:
        """tx.commit: settle the acks the transaction held, in the order they came."""
        settle = self.deliveries.settle
        for tag, entry, kind, requeue in acks:
            settle([(tag, entry)], [], None if kind == "ack" else requeue)

    def rollback(self) -> None:
        """tx.rollback: the acks held make those deliveries unacked again, in tag
        order. Their prefetch slots were never given back (see ack_like)."""
        acks, self.tx_acks = self.tx_acks, []
        if acks:
            self.deliveries.unsettled.restore(
                [(tag, entry) for tag, entry, _kind, _requeue in acks]
            )

    def held(self) -> list[Unsettled]:
        """The deliveries the transaction holds (a closing channel gives them back)."""
        acks, self.tx_acks = self.tx_acks, []
        return [entry for _tag, entry, _kind, _requeue in acks]
