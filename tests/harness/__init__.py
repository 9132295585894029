"""The in-memory test harness: a broker with no listeners on a loop the test
drives, and its protocol connections fed bytes directly (h11's and wsproto's
way of testing a state machine), with independent decoders as the oracle.

    def test_x(harness: Harness) -> None:
        amqp = harness.amqp()          # an AMQPConnection, RawAMQP's interface
        amqp.handshake()
        amqp.open_channel(1)

A module's fixture is ``broker = harness_fixture(sync=False)`` (fixtures.py);
``harness.amqp_client(channels)`` is a connection with the handshake done;
``harness.amqp_connection()`` one with pika's calls (channel.py), for tests
moved from pika with their assertions; ``harness.http()`` the management
API's application in memory (management.py), answers parsed by http.client.

No socket, no listener and no thread: what a test checks is the protocol's
behaviour, and what only a socket shows (real clients, TLS, WebSocket,
backpressure, kill -9) stays in the socket tests.
"""

from harness.amqp import MemoryAMQP, ProtocolAMQP
from harness.broker import Harness
from harness.channel import (
    Channel,
    ChannelClosed,
    Connection,
    ConnectionClosed,
    Session,
    channel_error,
    connection_error,
    wait_until,
)
from harness.fixtures import harness_fixture
from harness.management import MemoryHTTP
from harness.mqtt import MemoryMQTT, RawMQTT

__all__ = [
    "Channel",
    "ChannelClosed",
    "Connection",
    "ConnectionClosed",
    "Harness",
    "MemoryAMQP",
    "MemoryHTTP",
    "MemoryMQTT",
    "ProtocolAMQP",
    "RawMQTT",
    "Session",
    "channel_error",
    "connection_error",
    "harness_fixture",
    "wait_until",
]
