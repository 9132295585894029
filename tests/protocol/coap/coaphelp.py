"""CoAP test helpers: a broker with its CoAP listener on an ephemeral UDP port,
and a raw UDP client whose answers aiocoap's codec decodes (the oracle)."""

from __future__ import annotations

import socket
from typing import Any

from aiocoap.message import Message as Oracle

from warren.coap import codec as C

HOST = "127.0.0.1"
TIMEOUT = 10.0


def coap_port(broker: Any) -> int:
    """The CoAP listener's port of a started broker (WarrenBroker or BrokerThread)."""
    listener = broker.broker.listener("coap")
    assert listener is not None, "the broker has no CoAP listener"
    return int(listener.port)


class Raw:
    """A UDP socket speaking CoAP by hand: what a client library would hide."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(TIMEOUT)
        self.mid = 0x100

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, (HOST, self.port))

    def request(
        self,
        code: int,
        path: str,
        *,
        mtype: int = C.CON,
        token: bytes = b"tk",
        query: tuple[str, ...] = (),
        options: list[tuple[int, bytes]] | None = None,
        payload: bytes = b"",
    ) -> int:
        """Send a request; its message id."""
        self.mid += 1
        opts = [(C.URI_PATH, p.encode()) for p in path.strip("/").split("/")]
        opts += [(C.URI_QUERY, q.encode()) for q in query]
        opts += options or []
        self.send(C.encode(C.CoAPMessage(mtype, code, self.mid, token, opts, payload)))
        return self.mid

    def receive(self, timeout: float = TIMEOUT) -> Oracle:
        self.sock.settimeout(timeout)
        data, _ = self.sock.recvfrom(65536)
        return Oracle.decode(data)

    def nothing(self, timeout: float = 0.3) -> bool:
        try:
            self.receive(timeout)
        except TimeoutError:
            return True
        return False

    def answer(self, mid: int, mtype: int = C.ACK) -> None:
        """An empty ACK (or RST) for our peer's message ``mid``."""
        self.send(C.encode(C.CoAPMessage(mtype, C.EMPTY, mid)))

    def close(self) -> None:
        self.sock.close()
