"""A connection's publish acknowledgements that wait until their messages are settled.

A QoS 1 or 2 PUBLISH that went to something durable (a durable queue, the
retained store, a persistent session's log) is acknowledged (PUBACK, PUBREC;
and the PUBCOMP that frees a persistent session's packet id) only once the
core settled it (core/session.py's Settlements: synced, held by the in-sync
followers; written out with ``sync = false``). Every other acknowledgement
sent while some wait goes out after them: a client sees its acks in order
(MQTT-4.6.0-2), so the settlements are ordered.

When a full disk made a store drop what it had not written yet, exactly those
publishes are refused: MQTT 5 gets PUBACK or PUBREC with quota exceeded; MQTT
3.1.1, which cannot refuse a publish, is closed, and its client sends the
unacknowledged publishes again when it reconnects.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from warren.core.session import Settlements
from warren.mqtt import properties as P
from warren.mqtt.codec import encode
from warren.mqtt.packets import MQTT_5, PubAck, PubRec

if TYPE_CHECKING:
    from warren.mqtt.connection import MQTTConnection

__all__ = ["SyncedAcks"]

log = logging.getLogger("warren.mqtt")


class SyncedAcks:
    """The acks of one connection still waiting for their messages to be settled."""

    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn
        self._waiting: Settlements[bytes] = conn.client_session.settlements(
            self._synced, self._wake, ordered=True
        )
        # sync = false: settlements wait for the end of the turn's write-out.
        self.write_out_due = False

    def send(self, ack: bytes) -> None:
        """Send ``ack`` after the acks still waiting, or now when none is."""
        if not self._waiting.after_waiting(ack):
            self.conn.send(ack)

    def after_settled(self, ack: bytes, stores: list[Any]) -> None:
        """Send ``ack`` once what went to ``stores`` is settled, after the acks
        before it (at once, in order, when nothing there needs it)."""
        if not self._waiting.add(ack, stores):
            self.send(ack)

    def _wake(self) -> None:
        self.write_out_due = True
        self.conn.on_output()  # the transport takes the output this turn

    def written(self) -> None:
        """The stores were written out (sync = false): settle what waited for it."""
        self.write_out_due = False
        self._waiting.written()

    def _synced(self, batch: list[bytes], ok: bool) -> None:
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
