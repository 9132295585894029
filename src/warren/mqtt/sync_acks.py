"""A connection's publish acknowledgements that wait for the disk sync.

A QoS 1 or 2 PUBLISH that went to something durable (a durable queue, the
retained store, a persistent session's log) is acknowledged (PUBACK, PUBREC;
and the PUBCOMP that frees a persistent session's packet id) only once the
group sync (store/sync.py) made it durable. Every other acknowledgement sent
while some wait goes out after them: a client sees its acks in order.

They wait in batches, one GroupSync callback per batch: a batch holds the acks
of one write generation (store/disk_budget.py) to one set of stores, so when a
full disk made a store drop what it had not written yet, exactly those
publishes are refused (amqp/confirms.py's way): MQTT 5 gets PUBACK or PUBREC
with quota exceeded; MQTT 3.1.1, which cannot refuse a publish, is closed, and
its client sends the unacknowledged publishes again when it reconnects.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from warren.mqtt import properties as P
from warren.mqtt.codec import encode
from warren.mqtt.packets import MQTT_5, PubAck, PubRec

if TYPE_CHECKING:
    from warren.mqtt.connection import MQTTConnection

__all__ = ["SyncedAcks"]

log = logging.getLogger("warren.mqtt")


class SyncedAcks:
    """The acks of one connection still waiting for a sync, in batches."""

    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn
        # The newest batch still waiting (None: nothing waits), its write
        # generation and its stores.
        self._batch: list[bytes] | None = None
        self._gen = -1
        self._stores: list[Any] = []

    def send(self, ack: bytes) -> None:
        """Send ``ack`` after the acks still waiting, or now when none is."""
        batch = self._batch
        if batch is not None:
            batch.append(ack)  # goes out with the newest batch: acks keep their order
        else:
            self.conn.send(ack)

    def after_sync(self, ack: bytes, stores: list[Any], syncer: Any) -> None:
        """Send ``ack`` once ``stores`` are synced, after the acks before it."""
        gen = syncer.gen
        batch = self._batch
        if batch is None or self._gen != gen or stores != self._stores:
            new: list[bytes] = [ack]
            self._batch = new
            self._gen = gen
            self._stores = stores
            syncer.after_sync(stores, lambda ok: self._synced(new, ok))
        else:
            batch.append(ack)

    def _synced(self, batch: list[bytes], ok: bool) -> None:
        if self._batch is batch:
            self._batch = None
        conn = self.conn
        if conn.closed:
            return
        if ok:
            for ack in batch:
                conn.send(ack)
        elif conn.level == MQTT_5:
            log.warning(
                "%s: %d publishes could not be stored (disk full?): refused (quota exceeded)",
                conn.name,
                len(batch),
            )
            for ack in batch:
                conn.send(self._refused(ack))
        else:
            # MQTT 3.1.1 cannot refuse a publish: close, and the client sends its
            # unacknowledged publishes again when it reconnects.
            log.warning(
                "%s: %d publishes could not be stored (disk full?): closing, the "
                "client sends them again",
                conn.name,
                len(batch),
            )
            conn.disconnect(P.UNSPECIFIED_ERROR, "could not store the message")

    def _refused(self, ack: bytes) -> bytes:
        """The MQTT 5 refusal (quota exceeded) of a PUBACK or PUBREC an ack was."""
        pid = (ack[2] << 8) | ack[3]
        if len(ack) > 4 and ack[4] >= 0x80:
            return ack  # refused already
        if ack[0] >> 4 == 4:
            return encode(PubAck(pid, P.QUOTA_EXCEEDED), MQTT_5)
        session = self.conn.session
        if session is not None:
            session.awaiting_release.discard(pid)  # no PUBREL comes for a refusal
        return encode(PubRec(pid, P.QUOTA_EXCEEDED), MQTT_5)
