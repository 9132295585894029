"""What MQTT's and AMQP 1.0's protocols share about a client's life (warren/
batched_protocol.py): a listener's OpenClients closed together at shutdown,
end_connection's logged failure, the socket addresses; and the connection name
and listing fields both give the management API (warren/client_listing.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from warren.batched_protocol import OpenClients, end_connection, socket_addresses
from warren.client_listing import connection_name


class Client:
    """A protocol whose connection ends a loop turn after close(), or never."""

    def __init__(self, clients: OpenClients[Client], ends: bool = True) -> None:
        self.clients = clients
        self.ends = ends
        self.told = 0

    def close(self) -> None:
        self.told += 1
        if self.ends:
            asyncio.get_running_loop().call_soon(self.clients.discard, self)


def test_close_all_tells_each_client_and_waits_until_their_connections_are_lost() -> None:
    async def body() -> None:
        clients: OpenClients[Client] = OpenClients()
        a, b = Client(clients), Client(clients)
        clients.add(a)
        clients.add(b)
        assert len(clients) == 2 and a in clients
        await clients.close_all()
        assert (a.told, b.told) == (1, 1)
        assert len(clients) == 0 and list(clients) == []

    asyncio.run(asyncio.wait_for(body(), 10))


def test_close_all_gives_up_on_a_client_that_never_goes_after_its_timeout() -> None:
    async def body() -> None:
        clients: OpenClients[Client] = OpenClients()
        stuck, gone = Client(clients, ends=False), Client(clients)
        clients.add(stuck)
        clients.add(gone)
        await clients.close_all(timeout=0)
        assert list(clients) == [stuck]
        clients.discard(stuck)  # its connection_lost, late: nothing waits for it any more
        assert len(clients) == 0
        await clients.close_all()  # none open: returns at once

    asyncio.run(asyncio.wait_for(body(), 10))


class Conn:
    name = "10.0.0.1:5000 -> 10.0.0.2:5672"

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.lost = 0

    def connection_lost(self) -> None:
        self.lost += 1
        if self.fails:
            raise RuntimeError("boom")


def test_end_connection_logs_a_failure_instead_of_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.client_lifecycle")
    end_connection(None, log, "cleanup failed")  # a client that never got a connection
    quiet, failing = Conn(fails=False), Conn(fails=True)
    with caplog.at_level(logging.ERROR, logger=log.name):
        end_connection(quiet, log, "cleanup failed")
        end_connection(failing, log, "cleanup failed")
    assert (quiet.lost, failing.lost) == (1, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "10.0.0.1:5000 -> 10.0.0.2:5672: cleanup failed"
    ]
    assert caplog.records[0].exc_info is not None


class Transport(asyncio.BaseTransport):
    def __init__(self, extra: dict[str, Any]) -> None:
        super().__init__(extra)


def test_socket_addresses_and_the_connection_name() -> None:
    tcp = Transport({"peername": ("10.0.0.1", 5000), "sockname": ("10.0.0.2", 1883)})
    peer, local = socket_addresses(tcp)
    assert (peer, local) == (("10.0.0.1", 5000), ("10.0.0.2", 1883))
    assert connection_name(peer, local) == "10.0.0.1:5000 -> 10.0.0.2:1883"
    ipv6 = Transport({"peername": ("::1", 5000, 0, 0), "sockname": ("::1", 5672, 0, 0)})
    assert socket_addresses(ipv6) == (("::1", 5000), ("::1", 5672))
    unix = Transport({"peername": "", "sockname": "/tmp/sock"})
    assert socket_addresses(unix) == (None, None)
    assert connection_name(None, None) == "local -> local"
