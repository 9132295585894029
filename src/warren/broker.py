"""The broker: owns the core (vhosts, users), the store and a list of listeners.

It knows no protocol: listeners (warren.node.Listener) are given to it, and
warren.app assembles the standard ones. The AMQP listener, an HTTP listener
and any other see the broker through warren.node.Node. Its start and stop
sequence (broker_lifecycle.py) and its periodic work (broker_timers.py) are
parts it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from warren import sampling
from warren.alarms import ResourceAlarms
from warren.broker_lifecycle import BrokerLifecycle
from warren.broker_timers import BrokerTimers
from warren.config import Config
from warren.core.auth_guard import AuthGuard
from warren.core.clock import Clock, LoopClock
from warren.core.errors import NotFound, ResourceError
from warren.core.events import Events
from warren.core.names import warn_undecodable
from warren.core.rate_limits import RateLimits
from warren.core.runtime_parameters import ParameterComponent, ValidationFailed
from warren.core.stats import GaugeStats, MessageStats, RateSampler
from warren.core.users import UserStore
from warren.core.vhost import VHost
from warren.definitions_export import export_definitions
from warren.definitions_import import import_definitions
from warren.metrics.history import AuthAttempts, Retired, protocol_label
from warren.node_stats import NODE_GAUGES
from warren.oauth2_backend import oauth2_backend
from warren.store import damage
from warren.store.layout import DataDir
from warren.store.orphans import report as report_orphans
from warren.store.orphans import sweep
from warren.store.sync import GroupSync, Replication
from warren.store.users_file import load_users, save_users
from warren.store_factory import StoreFactory
from warren.tls import TLSContexts

if TYPE_CHECKING:
    from warren.core.policies import Policy
    from warren.node import ClientConnection, Listener
    from warren.webhooks import Webhooks

log = logging.getLogger("warren")

#: What a connection event tells of the connection (its info()'s keys, as
#: RabbitMQ's connection.created carries them).
_CONNECTION_EVENT_KEYS = ("name", "user", "vhost", "protocol", "peer_host", "peer_port", "node")


def _connection_event(conn: ClientConnection) -> dict[str, Any]:
    info = conn.info()
    return {key: info[key] for key in _CONNECTION_EVENT_KEYS if key in info}


def _remove_trees(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


class Broker:
    """The core, the store and the listeners it is given, started and stopped together.

    ``warren.Broker`` (warren.app) is this with the standard listeners:
    ``async with warren.Broker(Config(amqp_port=0)) as broker:`` serves until
    the block exits; ``broker.amqp_port`` is the port actually bound.
    """

    def __init__(
        self,
        config: Config | None = None,
        listeners: Sequence[Listener] = (),
        *,
        clock: Clock | None = None,
        **overrides: Any,
    ) -> None:
        #: The one clock (core/clock.py): every TTL, expiry, delay, timeout,
        #: heartbeat and rate of the broker, its vhosts and its connections.
        #: Tests give a ManualClock (here or set before start()).
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.config = config if config is not None else Config()
        for key, value in overrides.items():
            setattr(self.config, key, value)
        self.config.validate()
        #: Loaded from the data directory by start().
        self.users = UserStore()
        self.vhosts: dict[str, VHost] = {}
        self.listeners: list[Listener] = list(listeners)
        self.connections: set[ClientConnection] = set()
        self.connections_opened = 0
        self.connections_closed = 0
        #: What closed connections and deleted vhosts counted, and login attempts
        #: (the Prometheus metrics' counters only grow: warren/metrics).
        self.retired = Retired()
        self.auth_attempts = AuthAttempts()
        config = self.config
        self.rate_limits = RateLimits(
            self.clock,
            config.connection_rate_limit,
            config.publish_rate_limit,
            config.max_subscriptions_per_client,
            config.connection_rate_limit
            if config.http_connection_rate_limit is None
            else config.http_connection_rate_limit,
        )
        self.cluster_name = f"warren@{socket.gethostname()}"
        #: The cluster's permanent id (store/cluster_id.py), read or made at start.
        self.cluster_id = ""
        #: The free-disk and memory alarms, and the writers' disk budget.
        root = Path(self.config.data_dir).resolve()
        self.resource_alarms = ResourceAlarms(
            self.config, root, self._block_publishers, self._flush_written
        )
        #: The data directory, with the disk budget; start() gives it the mirror.
        self.layout = DataDir(root, self.resource_alarms.budget)
        #: Every store and log the vhosts get, made from the data directory.
        self.stores = StoreFactory(self.layout, self.config, lambda: self.syncer)
        #: Raised resource alarms ("memory", "disk"); while any is, publishing
        #: connections are blocked (connection.blocked), as RabbitMQ's are.
        self.alarms: set[str] = self.resource_alarms.raised
        self.syncer: GroupSync | None = None
        #: Clustering's replication (cluster/leader.py's Replicator), set before
        #: start(): confirms then also wait for the in-sync followers.
        self.replication: Replication | None = None
        #: Set with it: the cluster's state for the management API and /metrics.
        self.cluster_status: Callable[[], dict[str, Any]] | None = None
        #: Set with it: host:port of the in-sync followers' read-only stream
        #: services, which AMQP's connection.start announces to readers.
        self.stream_replicas: Callable[[], list[str]] | None = None
        #: Set with it: host:port of their stream protocol read services, the
        #: streams' replicas in the stream protocol's Metadata.
        self.stream_protocol_replicas: Callable[[], list[str]] | None = None
        #: Runtime-parameter components beyond policies and limits, by name
        #: ("shovel", ...): warren.app registers the standard ones.
        self.parameter_components: dict[str, ParameterComponent] = {}
        #: The whole broker's message counters (the overview's message_stats).
        self.stats = MessageStats()
        #: Every queue's lengths summed (the overview's queue_totals), and the
        #: node's figures (node_stats.py), set and sampled with the rates.
        self.queue_totals = GaugeStats(3)
        self.node_figures = GaugeStats(len(NODE_GAUGES))
        self.rate_sampler = RateSampler(
            self.config.sample_retention_basic, self.config.sample_retention_global
        )
        self.tls = TLSContexts(self.config)
        self.auth_guard = AuthGuard(
            self.config.auth_failure_delay,
            self.config.auth_failures_per_minute,
            self.clock,
        )
        #: Access tokens as passwords ([oauth2]); None when not configured.
        self.oauth2 = oauth2_backend(self.config, self.clock)
        #: Called with a vhost's name as it is deleted (Node.vhost_deleted).
        self.vhost_deleted: list[Callable[[str], None]] = []
        #: Observers of its events (core/events.py: queue.created, alarm.set ...),
        #: shared by its vhosts and resource alarms: the webhooks listen there.
        self.events = Events()
        self.resource_alarms.events = self.events
        #: The webhook targets' status (GET /api/webhooks, the metrics); None: none.
        self.webhook_status: Callable[[], list[dict[str, Any]]] | None = None
        #: The webhook targets (warren.app's broker makes them); None: no webhooks.
        self.webhooks: Webhooks | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Resource alarms, consumer timeouts and rate sampling, on timers.
        self.timers = BrokerTimers(self)
        #: The start and stop sequence.
        self.lifecycle = BrokerLifecycle(self, self._open_vhost)

    def reload_tls(self) -> None:
        """Read the TLS certificate and key again (SIGHUP): new connections get them,
        open ones are not disturbed; a bad pair is logged and the old one kept."""
        try:
            if self.tls.reload():
                log.info("TLS certificate reloaded from %s", self.config.tls_cert)
        except OSError as exc:
            log.error("TLS certificate not reloaded, the old one stays: %s", exc)

    def listener(self, name: str) -> Listener | None:
        """The listener of that protocol (``amqp``, ``http``), None when there is none."""
        return next((lst for lst in self.listeners if lst.name == name), None)

    @property
    def amqp_port(self) -> int:
        """The AMQP port bound; 0 before the start or without an AMQP listener."""
        amqp = self.listener("amqp")
        return amqp.port if amqp is not None else 0

    @property
    def data_dir(self) -> Path:
        return self.layout.root

    # -- vhosts and users ---------------------------------------------------------------
    def add_vhost(self, name: str) -> VHost:
        """The vhost of that name, made (and stored in vhosts.json) if it is new.
        A new vhost that cannot be stored is not made: ResourceError, nothing left."""
        assert self._loop is not None, "the broker must be started first"
        vhost = self.vhosts.get(name)
        if vhost is not None:
            return vhost
        new = not self.layout.has_vhost_dir(name)
        try:
            vhost = self._open_vhost(name)
            self.vhosts[name] = vhost
            self.layout.save_vhosts(list(self.vhosts))
            self.events.emit("vhost.created", {"name": name})
        except OSError as exc:
            log.error("cannot store vhost '%s': %s", name, exc)
            if vhost is not None and self.vhosts.pop(name, None) is not None:
                vhost.close()
            if new:  # what was made of it goes: the next start would find it
                _remove_trees(self.layout.detach_vhost_dirs(name))
            raise ResourceError(f"cannot store vhost '{name}': {exc.strerror or exc}") from None
        return vhost

    def _open_vhost(self, name: str) -> VHost:
        """A vhost with its definitions log, its durable objects restored and its
        directory swept (store/orphans.py); DamagedFile refuses it."""
        assert self._loop is not None
        policy = self.config.damaged_metadata
        definitions = self.stores.definitions_log(name)
        vhost = VHost(
            name,
            self._loop.call_soon,
            self.stores.queue_store,
            definitions,
            clock=self.clock,
            exchange_store_factory=self.stores.exchange_store,
            stream_store_factory=self.stores.stream_store,
        )
        vhost.key_logs = self.stores.key_log
        vhost.events = self.events
        vhost.exchange_key_logs = self.stores.exchange_key_log
        vhost.router.write_budget = self.resource_alarms.budget
        try:
            problems = vhost.lifecycle.restore_definitions()
            warn_undecodable(vhost)  # names kept from before they were refused
            if problems and policy != damage.SET_ASIDE:
                raise damage.refusal(definitions.path, "; ".join(problems))
            # Set aside: skipped, but left in the log, where they still claim
            # their queues' directories (each is logged by the vhost).
            directory = definitions.path.parent
            live, deleted = definitions.live, definitions.deleted
            orphans = sweep(name, directory, live, deleted, self.layout.mirror)
            if orphans:
                report_orphans(definitions.path, orphans, policy)
        except BaseException:
            vhost.close()
            raise
        return vhost

    # -- runtime parameters of components (shovels, federation upstreams) ---------------
    def set_parameter(self, vhost_name: str, component: str, name: str, value: Any) -> None:
        """Validate, store and apply a component's parameter (ValidationFailed with
        RabbitMQ's texts; an unknown component is refused as RabbitMQ refuses it)."""
        vhost = self.get_vhost(vhost_name)
        comp = self.parameter_components.get(component)
        if comp is None:
            raise ValidationFailed([f"component {component} not found"])
        value = comp.validate(vhost_name, name, value)
        vhost.parameters.put(component, name, value)
        comp.apply(vhost_name, name, value)

    def clear_parameter(self, vhost_name: str, component: str, name: str) -> bool:
        """Forget a component's parameter (and stop what it runs); whether it existed."""
        vhost = self.get_vhost(vhost_name)
        if not vhost.parameters.drop(component, name):
            return False
        comp = self.parameter_components.get(component)
        if comp is not None:
            comp.apply(vhost_name, name, None)
        return True

    def apply_stored_parameters(self) -> None:
        """Run the components' parameters the vhosts hold (at start)."""
        for vhost in self.vhosts.values():
            for component, name, value in vhost.parameters.items():
                comp = self.parameter_components.get(component)
                if comp is None:
                    log.warning(
                        "vhost '%s': parameter %s/%s kept but not run: no component '%s'",
                        vhost.name,
                        component,
                        name,
                        component,
                    )
                    continue
                try:
                    comp.apply(vhost.name, name, value)
                except Exception:
                    log.exception("vhost '%s': cannot start %s '%s'", vhost.name, component, name)

    def delete_vhost(self, name: str) -> None:
        """Close the vhost's connections, delete its queues and exchanges, drop every
        permission on it and its files (renamed away now, removed off the loop)."""
        vhost = self.get_vhost(name)
        vhost.deleted = True
        for component, param, _value in vhost.parameters.items():
            self.clear_parameter(name, component, param)
        for conn in list(self.connections):
            if conn.info().get("vhost") == name:
                conn.force_close(f"vhost '{name}' is deleted")
        for queue in list(vhost.queues):
            vhost.delete_queue(queue)
        for exchange in list(vhost.exchanges):
            if exchange and not exchange.startswith("amq."):
                vhost.delete_exchange(exchange)
        for forget in list(self.vhost_deleted):
            try:
                forget(name)
            except Exception:
                log.exception("vhost '%s': forgetting it failed", name)
        vhost.close()
        self.retired.vhost_deleted(vhost)
        del self.vhosts[name]
        # Its directories go before vhosts.json forgets it: a start finds a vhost
        # by its directory too (DataDir.load_vhosts).
        doomed = self.layout.detach_vhost_dirs(name)
        try:
            self.layout.save_vhosts(list(self.vhosts))
        except OSError as exc:  # its directories are gone: the next start knows
            log.error("cannot write %s: %s", self.layout.vhosts_file, exc)
        self.users.forget_vhost(name)
        with contextlib.suppress(ResourceError):  # permissions on a gone vhost: harmless
            self.save_users()
        if doomed and self._loop is not None:
            self._loop.run_in_executor(None, _remove_trees, doomed)
        log.info("vhost '%s' deleted", name)
        self.events.emit("vhost.deleted", {"name": name})

    def save_users(self) -> None:
        """Write the users out; when that fails (a full disk) the users in memory
        go back to what the file holds, and ResourceError says why: a change
        that cannot be stored does not take effect."""
        try:
            save_users(self.users, self.layout.users_file, self.layout.mirror)
        except OSError as exc:
            log.error("cannot store the users in %s: %s", self.layout.users_file, exc)
            try:
                self.users.users = load_users(
                    self.layout.users_file, mirror=self.layout.mirror
                ).users
            except Exception:
                log.exception("cannot read back %s", self.layout.users_file)
            raise ResourceError(f"cannot store the users: {exc.strerror or exc}") from None

    # -- policies, limits, definitions (run on the broker's loop) -------------------------
    def get_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise NotFound(f"Virtual host '{name}' does not exist")
        return vhost

    def set_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        return self.get_vhost(vhost).set_policy(name, pattern, definition, priority, apply_to)

    def clear_policy(self, vhost: str, name: str) -> None:
        self.get_vhost(vhost).clear_policy(name)

    def set_operator_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        return self.get_vhost(vhost).set_operator_policy(
            name, pattern, definition, priority, apply_to
        )

    def clear_operator_policy(self, vhost: str, name: str) -> None:
        self.get_vhost(vhost).clear_operator_policy(name)

    def policies(self, vhost: str) -> list[Policy]:
        return self.get_vhost(vhost).policies

    def operator_policies(self, vhost: str) -> list[Policy]:
        return self.get_vhost(vhost).operator_policies

    def set_vhost_limits(self, vhost: str, limits: dict[str, Any]) -> None:
        self.get_vhost(vhost).set_limits(limits)

    def clear_vhost_limits(self, vhost: str, name: str | None = None) -> None:
        self.get_vhost(vhost).clear_limits(name)

    def import_definitions(self, data: dict[str, Any]) -> None:
        """Apply RabbitMQ-format definitions (DefinitionsError names what is wrong)."""
        import_definitions(self, data)

    def export_definitions(self) -> dict[str, Any]:
        """Users, vhosts, permissions, limits, policies, queues, exchanges and
        bindings in RabbitMQ's export format."""
        return export_definitions(self)

    # -- start and stop (broker_lifecycle.py) ----------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.oauth2 is not None:
            await self.oauth2.start()
        await self.lifecycle.start(self._loop)

    async def stop(self) -> None:
        """Stop every listener (each closes its clients as its protocol does at
        shutdown; AMQP: 320 CONNECTION_FORCED), then close the store."""
        await self.lifecycle.stop()
        if self.oauth2 is not None:
            await self.oauth2.stop()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def connection_opened(self, conn: ClientConnection) -> None:
        self.connections.add(conn)
        self.connections_opened += 1
        if conn.user is not None:
            self.users.count_connection(conn.user.name, 1)
        if self.alarms:
            conn.set_blocked(True)
        if self.events:
            self.events.emit("connection.created", _connection_event(conn))

    def connection_closed(self, conn: ClientConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.connections_closed += 1
            self.retired.connection_closed(conn, protocol_label(conn.info().get("protocol", "")))
            if conn.user is not None:
                self.users.count_connection(conn.user.name, -1)
            if self.events:
                self.events.emit("connection.closed", _connection_event(conn))

    def at_connection_max(self) -> bool:
        cap = self.config.max_connections
        return bool(cap) and len(self.connections) >= cap

    # -- what the timers (broker_timers.py) and the resource alarms call ------------------
    def sample_stats(self, now_s: float) -> int:
        """Sample the rates and history of every queue, exchange, channel,
        connection, vhost and the broker at ``now_s`` (seconds since the epoch), at
        once; how many were sampled (warren/sampling.py)."""
        return sampling.sample_now(self, now_s)

    def _block_publishers(self, blocked: bool) -> None:
        for conn in list(self.connections):
            conn.set_blocked(blocked)

    def _flush_written(self) -> None:
        for vhost in self.vhosts.values():
            vhost.flush_written()

    # -- what Node shows of the alarms (warren/alarms.py) ---------------------------------
    @property
    def disk_alarm(self) -> bool:
        return self.resource_alarms.disk

    @property
    def mem_alarm(self) -> bool:
        return self.resource_alarms.memory

    @property
    def mem_used(self) -> int:
        return self.resource_alarms.mem_used

    @property
    def mem_limit(self) -> int:
        return self.resource_alarms.mem_limit

    def blocked_reason(self) -> str:
        return self.resource_alarms.blocked_reason()
