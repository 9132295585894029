"""What unfinished MQTT packets may hold: a budget of bytes across all connections.

A PUBLISH may announce up to the Maximum Packet Size (128 MiB by default) and
then arrive slowly, or never: until it is complete its bytes are kept. Each
connection is also held to a time limit ([mqtt] packet_timeout, connection.py);
this bounds the memory. Every connection reports the bytes its decoder holds
as they change; when the sum goes over ``[mqtt] partial_packet_memory``, the
connection holding the most is closed (MQTT 5: DISCONNECT 0x97 Quota exceeded),
so a client announcing huge packets loses its own connection, never the
broker's memory or another client's service.
"""

from __future__ import annotations

import logging
from typing import Protocol

__all__ = ["UnfinishedPackets"]

log = logging.getLogger("warren.mqtt")


class Holder(Protocol):
    """A connection as the budget sees it."""

    @property
    def name(self) -> str: ...

    client_id: str

    def announced(self) -> int:
        """The size its unfinished packet's header announced (0: not known yet)."""
        ...

    def over_budget(self, reason: str) -> None:
        """Close it (it then reports 0 bytes held)."""
        ...


class UnfinishedPackets:
    """Bytes held in unfinished packets, by connection, against one budget."""

    def __init__(self, budget: int) -> None:
        #: Bytes all connections may hold together; 0: no limit.
        self.budget = budget
        #: Bytes held now.
        self.total = 0
        self._held: dict[Holder, int] = {}

    def changed(self, holder: Holder, held: int) -> None:
        """``holder`` now holds ``held`` bytes of an unfinished packet."""
        old = self._held.pop(holder, 0)
        if held:
            self._held[holder] = held
        self.total += held - old
        budget = self.budget
        while budget and self.total > budget and self._held:
            victim = max(self._held, key=self._held.__getitem__)
            size = self._held.pop(victim)
            total = self.total
            self.total -= size
            log.warning(
                "%s: MQTT client '%s' closed: its unfinished packet holds %d bytes "
                "(of %d announced), and unfinished packets held %d bytes in all, over "
                "[mqtt] partial_packet_memory (%d)",
                victim.name,
                victim.client_id,
                size,
                victim.announced(),
                total,
                budget,
            )
            victim.over_budget(
                f"unfinished packets over the broker's limit ({budget} bytes); "
                f"this one held {size}"
            )

    def held(self, holder: Holder) -> int:
        return self._held.get(holder, 0)
