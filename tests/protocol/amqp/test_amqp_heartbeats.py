"""AMQP heartbeats, in memory, on the harness's ManualClock.

Through the listener's AMQPProtocol (``Harness.amqp_protocol``), whose timers
these are. The reference is RabbitMQ 3.10.8, observed with tests/rawamqp.py over
a socket, client heartbeat=1 after the handshake:

- a silent client gets a heartbeat every 0.5 s (at 0.5, 1.0, 1.5, 2.0, 2.5 s),
  and the socket closes at 3.0 s, without a connection.close;
- a client that answers every heartbeat until 3.5 s gets them every 0.5 s still,
  and the socket closes at 6.0 s: its receiver checks every interval and gives
  up at the second check in a row with nothing read, 2 to 3 intervals after
  the last frame.

(RabbitMQ's sender checks every half interval and sends when no octet went out
since its previous check, not counting the heartbeat it sent itself.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Harness
from harness.amqp import ProtocolAMQP, assert_still_serving
from pamqp import heartbeat

from warren.core.clock import ManualClock

pytestmark = pytest.mark.timeout(30)


def heartbeats_now(b: Harness, client: ProtocolAMQP) -> int:
    """How many heartbeat frames the broker wrote since the last look (and
    nothing else)."""
    b.pump()  # the flush the timer scheduled
    frames = client.frames_now()
    assert all(ch == 0 and isinstance(f, heartbeat.Heartbeat) for ch, f in frames), frames
    return len(frames)


def test_idle_connection_gets_a_heartbeat_every_half_interval(tmp_path: Path) -> None:
    # RabbitMQ: heartbeats at 0.5, 1.0, 1.5, 2.0, 2.5 s, closed at 3.0 s. Warren
    # sent one per interval (its own heartbeat counted as traffic) and closed at 2.5 s.
    with Harness(tmp_path / "data", heartbeat=1, clock=ManualClock()) as b:
        with b.amqp_protocol() as client:
            client.handshake(heartbeat=1)  # open: the heartbeat timer runs
            assert heartbeats_now(b, client) == 0
            for _ in range(5):
                b.advance(499)
                assert heartbeats_now(b, client) == 0
                b.advance(1)
                assert heartbeats_now(b, client) == 1
            assert len(b.amqp_listener.protocols) == 1
            b.advance(499)
            assert len(b.amqp_listener.protocols) == 1
            b.advance(1)  # 3.0 s: the second check in a row with nothing read
            assert client.frames_until_eof(timeout=5) == []
        assert_still_serving(b)


def test_client_sending_heartbeats_stays_connected(tmp_path: Path) -> None:
    # RabbitMQ: a client answering each heartbeat until 3.5 s still gets one every
    # 0.5 s (its answers are inbound, not outbound), and is closed at 6.0 s.
    with Harness(tmp_path / "data", heartbeat=1, clock=ManualClock()) as b:
        with b.amqp_protocol() as client:
            client.handshake(heartbeat=1)
            for _ in range(7):  # to 3.5 s: well past two missed intervals
                b.advance(500)
                assert heartbeats_now(b, client) == 1
                read = client.conn.octets.recv_oct
                client.send_heartbeat()  # read by the broker before time moves on
                assert client.conn.octets.recv_oct == read + 8
            for _ in range(4):  # 4.0 s (read since 3.0 s), 5.0 s (nothing): still open
                b.advance(500)
                assert heartbeats_now(b, client) == 1
            assert len(b.amqp_listener.protocols) == 1
            b.advance(499)
            assert len(b.amqp_listener.protocols) == 1
            b.advance(1)  # 6.0 s
            assert client.frames_until_eof(timeout=5) == []
        assert_still_serving(b)


def test_traffic_from_the_broker_replaces_its_heartbeats(tmp_path: Path) -> None:
    # What went out since the last check is as good as a heartbeat: none is sent.
    with Harness(tmp_path / "data", heartbeat=1, clock=ManualClock()) as b:
        with b.amqp_protocol() as client:
            client.handshake(heartbeat=1)
            b.advance(500)
            assert heartbeats_now(b, client) == 1
            client.open_channel(1)  # channel.open-ok goes out
            b.advance(500)
            assert heartbeats_now(b, client) == 0
            b.advance(500)
            assert heartbeats_now(b, client) == 1
            client.close()
        assert_still_serving(b)
