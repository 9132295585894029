"""One node of a cluster: campaign through etcd, lead or follow, switch when told.

The keys under ``clustering_etcd_prefix`` in etcd:

    <prefix>/leader     the leader's id and addresses (JSON), held by its lease
    <prefix>/isr        the in-sync replica set: node ids, comma-separated
    <prefix>/secret     the shared secret followers present to the leader

A node campaigns when there is no leader and it may lead: it is in the ISR, or
there is no ISR yet (a new cluster). Winning is creating the leader key with
the node's lease (one transaction: only one node can). The leader starts a
broker on its data directory (recovery as after a restart) with a Replicator
as its replication (the broker gives it to its DataDir as the directory's
mirror, and the DataDir's StoreFactory to every store), serves followers on
the clustering port, and keeps its lease alive; when the lease is lost it
stops the broker and starts over as a follower. The others follow the leader
named in the key and watch it: when it goes, they campaign again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from warren.cluster.etcd import EtcdClient, EtcdError
from warren.cluster.follower import HANDSHAKE_TIMEOUT, Follower
from warren.cluster.leader import Replicator
from warren.cluster.proxy import ClientProxy
from warren.cluster.retry import Backoff, Clock, LoopClock
from warren.config import Config
from warren.ready import ready_line
from warren.store.sync import Replication
from warren.tls import etcd_context, replication_contexts

log = logging.getLogger("warren.cluster")


class LeaderBroker(Protocol):
    """What a node needs of the broker it runs while it leads (warren.app's Broker)."""

    replication: Replication | None
    cluster_status: Callable[[], dict[str, Any]] | None
    stream_replicas: Callable[[], list[str]] | None
    stream_protocol_replicas: Callable[[], list[str]] | None

    @property
    def listeners(self) -> Sequence[Any]:
        """Its started listeners (for the ready line)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


BrokerFactory = Callable[[Config], LeaderBroker]


class StreamReads(Protocol):
    """A follower's read-only stream service (amqp/replica_server.py's)."""

    port: int

    async def start(self) -> None: ...

    def applied(self) -> None: ...

    async def stop(self) -> None: ...


#: Makes the service for (config, data directory, "where the leader is").
StreamReadsFactory = Callable[[Config, Path, Callable[[], str]], StreamReads]
#: Where a follower's links to the leader dial ("host:port", "": nowhere) and
#: the TLS client context they verify it with (None: plain TCP).
LeaderLinkTarget = tuple[str, ssl.SSLContext | None]
#: The stream protocol's (stream_protocol/replica_server.py): the same, with
#: "where the leader's stream port is" (as clients are told), the host this
#: node is reached by, and the target of its links to the leader.
StreamProtocolReadsFactory = Callable[
    [Config, Path, Callable[[], str], str, LeaderLinkTarget], StreamReads
]


def node_id_of(data_dir: Path, name: str = "") -> str:
    """This node's id in the cluster, kept in the data directory: ``name`` (``[clustering]
    node_name``) when set, else the one kept there, else a new random one. The id is
    what etcd's in-sync replica set lists: renaming a node makes it a new member,
    which may lead again once it has synced and rejoined the set."""
    path = data_dir / ".node_id"
    try:
        node_id = path.read_text().strip()
    except FileNotFoundError:
        node_id = ""
    if node_id and (not name or name == node_id):
        return node_id
    if node_id:
        log.warning(
            "this node was %s and is now named %s: it joins the cluster as a new member",
            node_id,
            name,
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    node_id = name or secrets.token_hex(6)
    tmp = path.with_name(path.name + ".tmp")  # whole, or not at all (never mirrored)
    tmp.write_text(node_id + "\n")
    os.replace(tmp, path)
    return node_id


class ClusterNode:
    def __init__(
        self,
        config: Config,
        make_broker: BrokerFactory,
        make_stream_reads: StreamReadsFactory | None = None,
        clock: Clock | None = None,
        make_stream_protocol_reads: StreamProtocolReadsFactory | None = None,
    ) -> None:
        self.config = config
        #: Every wait and retry delay of the node goes through it (tests drive it).
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.make_broker = make_broker
        self.make_stream_reads = make_stream_reads
        #: While following with [clustering] stream_read_port set.
        self.stream_reads: StreamReads | None = None
        self.make_stream_protocol_reads = make_stream_protocol_reads
        #: While following with [clustering] stream_protocol_read_port set.
        self.stream_protocol_reads: StreamReads | None = None
        self.root = Path(config.data_dir).resolve()
        self.node_id = node_id_of(self.root, config.clustering_node_name)
        self.prefix = config.clustering_etcd_prefix.rstrip("/")
        self.etcd = EtcdClient(list(config.clustering_etcd_endpoints), tls=etcd_context(config))
        #: [clustering] tls: (server, client) contexts of the replication link.
        self.tls = replication_contexts(config) if config.clustering_tls else None
        self.role = "starting"
        self.leader_info: dict[str, Any] | None = None
        #: The broker while this node leads (None otherwise).
        self.broker: LeaderBroker | None = None
        self.follower: Follower | None = None
        #: Set once the node is asked to stop: it campaigns no more, and a broker
        #: started as the stop came is stopped again at once.
        self._stopping = asyncio.Event()
        self._proxy = ClientProxy(config)
        self.replicator: Replicator | None = None

    @property
    def advertised(self) -> tuple[str, int]:
        uri = self.config.clustering_advertised_uri
        if uri:
            parsed = urlparse(uri)
            return parsed.hostname or "127.0.0.1", parsed.port or self.config.clustering_port
        return self.config.clustering_bind, self.config.clustering_port

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    async def run(self, stop: asyncio.Event) -> None:
        """Lead or follow until ``stop`` is set."""
        self._stopping = stop
        main = asyncio.ensure_future(self._run())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                main.result()  # raises what ended it
        finally:
            main.cancel()
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await main
            await self._stop_leading()
            await self._proxy.stop()
            await self.etcd.close()

    async def _run(self) -> None:
        log.info("cluster node %s, etcd %s", self.node_id, ", ".join(self.etcd.endpoints))
        secret = await self._secret()
        etcd_down = Backoff()
        while True:
            try:
                leader = await self.etcd.get(self._key("leader"))
                seen = self.etcd.revision
                if leader is None:
                    if self._stopping.is_set():
                        return  # a node on its way out does not take the lead
                    if await self._may_lead():
                        lease = await self.etcd.grant(self.config.clustering_lease_ttl)
                        info = self._my_info()
                        holder = await self.etcd.create(
                            self._key("leader"), json.dumps(info), lease
                        )
                        if holder is None:
                            await self._lead(lease, secret)
                            continue
                        await self.etcd.revoke(lease)  # another node won: follow it
                        if holder.value:
                            await self._follow(holder.value, holder.mod_revision, secret)
                        continue
                    self._etcd_back(etcd_down)
                    log.info("not in the in-sync replica set: waiting for a leader")
                    await self._wait_for_change(seen)
                    continue
                self._etcd_back(etcd_down)
                await self._follow(leader.value, leader.mod_revision, secret)
            except EtcdError as exc:
                await self._etcd_retry(etcd_down, exc)

    async def _secret(self) -> str:
        etcd_down = Backoff()
        while True:
            try:
                holder = await self.etcd.create(self._key("secret"), secrets.token_hex(16))
                if holder is None:
                    holder = await self.etcd.get(self._key("secret"))
                if holder is not None and holder.value:
                    self._etcd_back(etcd_down)
                    return holder.value.decode()
            except EtcdError as exc:
                await self._etcd_retry(etcd_down, exc)

    async def _etcd_retry(self, backoff: Backoff, exc: EtcdError) -> None:
        """Wait before the next etcd call; only the first failure in a row is logged."""
        delay = backoff.next()
        if backoff.failures == 1:
            log.warning("etcd: %s; retrying quietly until it answers", exc)
        await self.clock.sleep(delay)

    @staticmethod
    def _etcd_back(backoff: Backoff) -> None:
        if backoff.failures:
            log.info("etcd answers again (after %d failed attempts)", backoff.failures)
        backoff.reset()

    async def _may_lead(self) -> bool:
        isr = await self.etcd.get(self._key("isr"))
        return isr is None or self.node_id in isr.value.decode().split(",")

    def _my_info(self) -> dict[str, Any]:
        host, port = self.advertised
        cfg = self.config
        return {
            "id": self.node_id,
            "replication": f"{host}:{port}",
            "amqp": f"{host}:{cfg.amqp_port}",
            "mqtt": f"{host}:{cfg.mqtt_port}" if cfg.mqtt_port >= 0 else None,
            "stream": f"{host}:{cfg.stream_port}" if cfg.stream_port >= 0 else None,
            "stream_tls": f"{host}:{tls}" if (tls := cfg.stream_tls_listen_port) >= 0 else None,
            "http": f"{host}:{cfg.http_port}" if cfg.http_port >= 0 else None,
        }

    def status(self) -> dict[str, Any]:
        """What the management API (/api/cluster), /metrics and `warren ctl cluster
        status` show of the cluster, as this node sees it."""
        replicator = self.replicator
        out: dict[str, Any] = {
            "enabled": True,
            "node": self.node_id,
            "role": self.role,
            "leader": self.leader_info,
            "etcd_endpoints": self.etcd.endpoints,
            "etcd_prefix": self.prefix,
        }
        if replicator is not None:
            out["position"] = replicator.position
            out["in_sync_replicas"] = sorted({self.node_id} | replicator.isr)
            out["followers"] = replicator.followers()
        if self.follower is not None:
            out["position"] = self.follower.position
        if self.stream_reads is not None:
            out["stream_reads"] = f"{self.advertised[0]}:{self.stream_reads.port}"
        if self.stream_protocol_reads is not None:
            out["stream_protocol_reads"] = self._stream_protocol_address()
        return out

    def _stream_protocol_address(self) -> str:
        """host:port clients reach this node's stream protocol reads by."""
        reads = self.stream_protocol_reads
        if reads is None:
            return ""
        return f"{self.config.stream_advertised_host or self.advertised[0]}:{reads.port}"

    # -- leading ----------------------------------------------------------------------
    async def _lead(self, lease: int, secret: str) -> None:
        log.info("elected leader (node %s)", self.node_id)
        await self._proxy.stop()  # the client ports are the broker's now
        self.role = "leader"
        self.leader_info = self._my_info()
        replicator = Replicator(
            self.root,
            secret,
            isr_changed=functools.partial(self._store_isr, lease=lease),
            max_unsynced_actions=self.config.clustering_max_unsynced_actions,
        )
        server: asyncio.Server | None = None
        try:
            # The leader alone until followers catch up.
            if not await self._store_isr(frozenset(), lease):
                log.error("lost the leader key before storing the in-sync replicas")
                return
            self.broker = broker = self.make_broker(self.config)
            broker.replication = replicator
            self.replicator = replicator
            broker.cluster_status = self.status
            broker.stream_replicas = replicator.stream_replicas
            broker.stream_protocol_replicas = replicator.stream_protocol_replicas
            await broker.start()
            if self._stopping.is_set():
                return  # asked to stop while it started: hand the lead on
            # (TLS through the server, not StreamWriter.start_tls in serve():
            # uvloop's server-side start_tls stalls some handshakes for their
            # whole timeout.)
            server = await asyncio.start_server(
                replicator.serve,
                self.config.clustering_bind,
                self.config.clustering_port,
                ssl=self.tls[0] if self.tls is not None else None,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if self.tls is not None else None,
            )
            log.info("%s", ready_line(broker.listeners, f"leader {self.node_id}"))
            await self._keep_lease(lease)
        finally:
            log.warning("node %s no longer leads", self.node_id)
            if server is not None:
                server.close()
            # A clean stop keeps the lease while the broker stops (its clients are
            # closed, the stores written out) and its last writes reach the
            # followers; only then may one of them be elected. (A lease already
            # lost stays lost: the first refresh ends this.)
            keeper = asyncio.ensure_future(self._keep_lease(lease))
            try:
                await self._stop_leading()
                await replicator.stop_and_flush()
            finally:
                keeper.cancel()
            self.replicator = None
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(lease)
            self.role = "starting"

    async def _keep_lease(self, lease: int) -> None:
        """Refresh the lease until it cannot be: then leadership is over. A refresh
        waits no longer than the lease has left, so a leader cut off from etcd
        steps down about when etcd lets its lease expire, not an HTTP timeout later."""
        ttl = self.config.clustering_lease_ttl
        clock = self.clock
        last_ok = clock.time()
        while True:
            await clock.sleep(ttl / 3)
            left = max(ttl - (clock.time() - last_ok), 0.1)
            try:
                if await self.etcd.keepalive(lease, timeout=left) <= 0:
                    log.error("the leader's etcd lease expired")
                    return
                last_ok = clock.time()
            except EtcdError as exc:
                if clock.time() - last_ok >= ttl:
                    log.error("cannot refresh the leader's etcd lease for %d s: %s", ttl, exc)
                    return
                log.warning("refreshing the etcd lease failed: %s", exc)

    async def _store_isr(self, followers: frozenset[str], lease: int) -> bool:
        """Store the ISR, only while this node's ``lease`` still holds the leader
        key: a leader that lost it (paused or cut off past its lease) could
        otherwise write an ISR of itself alone over its successor's, confirm what
        only it holds, and later be the only node allowed to lead."""
        value = ",".join(sorted({self.node_id} | followers))
        current = await self.etcd.get(self._key("isr"))
        if current is not None and current.value.decode() == value:
            return True
        stored = await self.etcd.replace(
            self._key("isr"),
            current.mod_revision if current is not None else 0,
            value,
            held=(self._key("leader"), lease),
        )
        if not stored:
            leader = await self.etcd.get(self._key("leader"))
            if leader is None or leader.lease != lease:
                log.warning(
                    "not storing the in-sync replicas: this node no longer holds the leader key"
                )
        return stored

    async def _stop_leading(self) -> None:
        broker, self.broker = self.broker, None
        if broker is not None:
            await broker.stop()

    # -- following --------------------------------------------------------------------
    async def _follow(self, raw: bytes, revision: int, secret: str) -> None:
        info = json.loads(raw)
        if info.get("id") == self.node_id:
            # Our own key from before a restart: let its lease run out.
            log.info("the leader key names this node from a previous run; waiting for it to expire")
            await self._wait_for_change(revision)
            return
        self.role = "follower"
        self.leader_info = info
        log.info("following leader %s at %s", info["id"], info["replication"])
        await self._proxy.start(info)
        reads = await self._start_stream_reads(info)
        await self._start_stream_protocol_reads(info)
        watch = asyncio.ensure_future(self._wait_for_change(revision))
        try:
            await self._replicate(info, secret, reads, watch)
            if not watch.cancelled() and watch.exception() is None:
                log.info("leader %s is gone or replaced: looking for the next", info["id"])
        finally:
            watch.cancel()
            # The leader changed or went (or etcd cannot tell): so do the relayed
            # clients. After a replication hiccup with the same leader they stay
            # connected (this method goes on retrying it until the key changes).
            await self._proxy.stop()
            if reads is not None:
                self.stream_reads = None
                await reads.stop()
            protocol_reads, self.stream_protocol_reads = self.stream_protocol_reads, None
            if protocol_reads is not None:
                await protocol_reads.stop()
            self.follower = None
            self.role = "starting"

    async def _replicate(
        self,
        info: dict[str, Any],
        secret: str,
        reads: StreamReads | None,
        watch: asyncio.Future[None],
    ) -> None:
        """Follow the leader ``info`` names until ``watch`` (its etcd key changed)
        is done. A replication session that ends is retried with a back-off, and
        only its end is logged (not every failed attempt): a leader killed keeps
        its key until its lease runs out, and the follower must not log three
        lines a second meanwhile."""
        host, _, port = info["replication"].rpartition(":")
        backoff = Backoff(cap=min(2.0, self.config.clustering_lease_ttl / 2))
        announced = False

        def synced() -> None:
            nonlocal announced
            if reads is not None:
                reads.applied()
            if self.stream_protocol_reads is not None:
                self.stream_protocol_reads.applied()
            if not announced:  # once per leader: the relayed ports now serve its data
                announced = True
                role = f"follower {self.node_id} of {info['id']}"
                log.info("%s", ready_line(self._proxy.listeners, role))

        while not watch.done():
            follower = self.follower = Follower(
                self.root,
                self.node_id,
                secret,
                stream_reads=f"{self.advertised[0]}:{reads.port}" if reads is not None else "",
                on_synced=synced,
                tls=self.tls[1] if self.tls is not None else None,
                stream_protocol_reads=self._stream_protocol_address(),
            )
            task = asyncio.ensure_future(follower.run(host, int(port)))
            try:
                await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if watch.done():
                return
            if follower.synced.is_set():
                backoff.reset()  # it was a working session: its end is news
            delay = backoff.next()
            if backoff.failures == 1:
                error = task.exception() if not task.cancelled() else None
                log.warning(
                    "replication from %s ended: %s; retrying quietly until it answers "
                    "or etcd names another leader",
                    info["id"],
                    error or "closed",
                )
            sleeper = asyncio.ensure_future(self.clock.sleep(delay))
            try:
                await asyncio.wait({sleeper, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()

    async def _start_stream_reads(self, leader: dict[str, Any]) -> StreamReads | None:
        if self.make_stream_reads is None or self.config.clustering_stream_read_port < 0:
            return None
        amqp = str(leader.get("amqp") or "?")
        reads = self.make_stream_reads(self.config, self.root, lambda: f"amqp://{amqp}")
        try:
            await reads.start()
        except OSError as exc:
            log.error(
                "cannot serve stream reads on port %d: %s",
                self.config.clustering_stream_read_port,
                exc,
            )
            return None
        self.stream_reads = reads
        return reads

    async def _start_stream_protocol_reads(self, leader: dict[str, Any]) -> None:
        port = self.config.clustering_stream_protocol_read_port
        if self.make_stream_protocol_reads is None or port < 0:
            return
        stream = str(leader.get("stream") or "")
        stream_tls = str(leader.get("stream_tls") or "")
        # The read service is TLS with [main] tls_cert: its clients are told the
        # leader's TLS port. Its links follow [clustering] tls (docs/clustering.md).
        told = stream_tls if stream_tls and self.config.tls_cert else stream
        link = (stream_tls, self.tls[1]) if self.tls is not None and stream_tls else (stream, None)
        reads = self.make_stream_protocol_reads(
            self.config, self.root, lambda: told, self.advertised[0], link
        )
        try:
            await reads.start()
        except OSError as exc:
            log.error("cannot serve stream protocol reads on port %d: %s", port, exc)
            return
        self.stream_protocol_reads = reads

    async def _wait_for_change(self, revision: int) -> None:
        """Return when the leader key changes after ``revision``."""
        async for _event in self.etcd.watch(self._key("leader"), revision + 1):
            return
