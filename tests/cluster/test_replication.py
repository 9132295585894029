"""Replication in one process over real sockets: a broker leads with a
Replicator as its replication (which its DataDir hands every store as the
mirror), a Follower keeps another directory a copy; confirms wait for the
follower's fsync, and a broker started on the follower's directory serves
what the leader had."""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import trustme
from conftest import BrokerThread, new_event_loop
from mqttclient import Client as MQTTClient

from warren import Config
from warren.cluster.follower import Follower
from warren.cluster.leader import Replicator, index_files
from warren.tls import replication_contexts

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Leader:
    def __init__(
        self, data_dir: Path, tls: ssl.SSLContext | None = None, **settings: Any
    ) -> None:
        self.data_dir = data_dir
        self.replicator = Replicator(data_dir, "s3cret")
        config = Config(
            data_dir=str(data_dir),
            amqp_port=0,
            http_port=0,
            mqtt_port=0, stream_port=0, prometheus_port=0,
            auth_failure_delay=0,
            **settings,
        )
        self.thread = BrokerThread(config)
        self.thread.broker.replication = self.replicator
        self.thread.start()
        server = self.thread.run(
            asyncio.start_server(self.replicator.serve, "127.0.0.1", 0, ssl=tls)
        )
        self.server = server
        self.port = server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.thread.stop()


class FollowerThread:
    def __init__(
        self,
        data_dir: Path,
        node_id: str,
        port: int,
        secret: str = "s3cret",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.loop = new_event_loop()
        self.follower = Follower(data_dir, node_id, secret, tls=tls)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.task = asyncio.run_coroutine_threadsafe(
            self.follower.run("127.0.0.1", port), self.loop
        )

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    lead = Leader(tmp_path / "leader")
    try:
        yield lead
    finally:
        lead.stop()


def _files(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in index_files(root)}


def _publish(port: int, queue: str, count: int, start: int = 0) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(start, start + count):
            ch.basic_publish("", queue, b"m%d" % i, PERSISTENT)


def test_a_follower_copies_the_directory_and_confirms_wait_for_it(
    leader: Leader, tmp_path: Path
) -> None:
    _publish(leader.thread.port, "q", 100)  # before any follower: confirmed at once
    follower = FollowerThread(tmp_path / "follower", "f1", leader.port)
    try:
        follower.run(follower.follower.synced.wait())
        # Once synced and acked, it joins the ISR: confirms now wait for it.
        _publish(leader.thread.port, "q", 100, start=100)
        assert leader.thread.call(lambda: leader.replicator.isr) == frozenset({"f1"})
        with pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", leader.thread.port)
        ) as conn:
            ch = conn.channel()
            for _ in range(50):
                method, _props, _body = ch.basic_get("q")
                assert method is not None
                ch.basic_ack(method.delivery_tag)
        _stop_and_compare(leader, follower, tmp_path)
    finally:
        follower.stop()

    # The follower's directory, as a broker's: 200 published, 50 acked.
    promoted = BrokerThread(
        Config(data_dir=str(tmp_path / "follower"), amqp_port=0, http_port=-1, mqtt_port=-1, stream_port=-1, prometheus_port=-1)
    ).start()
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", promoted.port)) as conn:
            ch = conn.channel()
            assert ch.queue_declare("q", passive=True).method.message_count == 150
            method, _props, body = ch.basic_get("q", auto_ack=True)
            assert body == b"m50"
    finally:
        promoted.stop()


def _stop_and_compare(leader: Leader, follower: FollowerThread, tmp_path: Path) -> None:
    """Stop the leader's broker cleanly, wait for the follower to have all it
    wrote (a clean stop writes the acks and what was delivered out: they
    replicate too), then check both directories hold the same bytes."""
    leader.thread.run(leader.thread.broker.stop())
    position = leader.thread.call(lambda: leader.replicator.position)
    follower.run(follower.follower.wait_position(position))
    assert _files(tmp_path / "follower") == _files(tmp_path / "leader")


def _node_tls(tmp_path: Path, ca: trustme.CA, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A node's [clustering] tls contexts, with a certificate ``ca`` issued for 127.0.0.1."""
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    ca_file = tmp_path / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = Config(
        data_dir=str(tmp_path),
        tls_cert=str(cert),
        tls_key=str(key),
        tls_ca_cert=str(ca_file),
        clustering_tls=True,
    )
    return replication_contexts(config)


def test_replication_over_mutual_tls_takes_only_certified_followers(tmp_path: Path) -> None:
    ca = trustme.CA()
    server, _ = _node_tls(tmp_path, ca, "leader")
    _, client = _node_tls(tmp_path, ca, "follower")
    other_ca = trustme.CA()
    # Trusts only another CA: refuses the leader. Trusts the leader's CA but has
    # another CA's certificate, or none: the leader refuses it.
    _, stranger = _node_tls(tmp_path, other_ca, "stranger")
    impostor = ssl.create_default_context(cafile=str(tmp_path / "leader-ca.pem"))
    impostor.load_cert_chain(tmp_path / "stranger.pem", tmp_path / "stranger.key")
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "leader-ca.pem"))
    lead = Leader(tmp_path / "leader", tls=server)
    try:
        _publish(lead.thread.port, "q", 20)
        for name, tls in (("stranger", stranger), ("impostor", impostor), ("anon", anonymous)):
            intruder = FollowerThread(tmp_path / name, name, lead.port, tls=tls)
            try:
                with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                    intruder.task.result(30)
            finally:
                intruder.stop()
            assert not (tmp_path / name / "vhosts").exists()
        assert lead.thread.call(lambda: lead.replicator.links) == []
        follower = FollowerThread(tmp_path / "follower", "f1", lead.port, tls=client)
        try:
            follower.run(follower.follower.synced.wait())
            _publish(lead.thread.port, "q", 20, start=20)  # confirmed once f1 has them
            assert lead.thread.call(lambda: lead.replicator.isr) == frozenset({"f1"})
            _stop_and_compare(lead, follower, tmp_path)
        finally:
            follower.stop()
    finally:
        lead.stop()


def test_a_wrong_secret_is_refused(leader: Leader, tmp_path: Path) -> None:
    follower = FollowerThread(tmp_path / "follower", "f1", leader.port, secret="wrong")
    try:
        with pytest.raises(ConnectionError, match="wrong clustering secret"):
            follower.task.result(30)
    finally:
        follower.stop()


def _wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.005)


def _http_put_queue(port: int, name: str) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/queues/%2F/{name}",
        data=b'{"durable": true}',
        method="PUT",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status in (201, 204)


def _amqp_declare(port: int, name: str) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.queue_declare(name, durable=True)
        # The same connection goes on working after the held reply.
        ch.queue_declare(name, passive=True)


def _mqtt_subscribe(port: int, name: str) -> None:
    # A persistent session's QoS 1 subscription: a durable queue and a stored session.
    client = MQTTClient(port, client_id=name, clean=False)
    client.connect()
    try:
        client.subscribe("t/#", qos=1)
    finally:
        client.close()


@pytest.mark.parametrize("via", ["amqp", "http", "mqtt"])
def test_a_declare_is_answered_once_the_follower_holds_it(
    leader: Leader, tmp_path: Path, via: str
) -> None:
    follower = FollowerThread(tmp_path / "follower", "f1", leader.port)
    gate = threading.Event()
    try:
        follower.run(follower.follower.synced.wait())
        _publish(leader.thread.port, "warm", 1)  # the follower is in the ISR now
        assert leader.thread.call(lambda: leader.replicator.isr) == frozenset({"f1"})
        # The follower's loop stops: it can neither apply nor acknowledge.
        follower.loop.call_soon_threadsafe(gate.wait, 30)
        seen: list[bool] = []

        def declare() -> None:
            if via == "amqp":
                _amqp_declare(leader.thread.port, "declared")
            elif via == "http":
                _http_put_queue(leader.thread.http_port, "declared")
            else:
                _mqtt_subscribe(leader.thread.mqtt_port, "declared")
            # Read the follower's copy the moment the reply arrived.
            seen.append(any(b"declared" in data for data in _files(tmp_path / "follower").values()))

        client = threading.Thread(target=declare)
        client.start()
        # The leader made the change and waits for the follower to acknowledge it.
        _wait_for(
            lambda: bool(leader.thread.call(lambda: leader.replicator._waiters)),
            "the declare's reply to wait for the follower",
        )
        assert client.is_alive() and not seen
        gate.set()
        client.join(30)
        assert seen == [True]
    finally:
        gate.set()
        follower.stop()


def test_a_followers_copy_reuses_spare_segment_files_as_the_leader_does(tmp_path: Path) -> None:
    """A fully acknowledged segment kept as a spare and reused (renamed) on the
    leader is renamed on the follower too: the follower's copy reuses its own
    file (its blocks written), and both directories hold the same files."""
    data_dir = tmp_path / "leader"
    lead = Leader(data_dir, segment_size=65536)
    follower = FollowerThread(tmp_path / "follower", "f1", lead.port)
    body = b"x" * 8000
    try:
        follower.run(follower.follower.synced.wait())
        _publish_bodies(lead.thread.port, "q", [body] * 40)
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lead.thread.port)) as conn:
            ch = conn.channel()
            for _ in range(20):
                method, _props, _body = ch.basic_get("q")
                assert method is not None
                ch.basic_ack(method.delivery_tag)
            ch.queue_declare("q", passive=True)  # the acks were taken
        _publish_bodies(lead.thread.port, "q", [body])  # a sync round: the spares' own
        position = lead.thread.call(lambda: lead.replicator.position)
        follower.run(follower.follower.wait_position(position))
        spares = {p.name: p.stat().st_ino for p in (tmp_path / "follower").rglob("spare.*")}
        assert len(spares) == 2
        _publish_bodies(lead.thread.port, "q", [body] * 40)  # into the spares
        position = lead.thread.call(lambda: lead.replicator.position)
        follower.run(follower.follower.wait_position(position))
        reused = {p.stat().st_ino for p in (tmp_path / "follower").rglob("msgs.*")}
        assert set(spares.values()) <= reused
        _stop_and_compare(lead, follower, tmp_path)
    finally:
        follower.stop()
        lead.stop()


def _publish_bodies(port: int, queue: str, bodies: list[bytes]) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", queue, b, PERSISTENT)
