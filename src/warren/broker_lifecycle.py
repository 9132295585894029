"""The broker's start and stop: in which order its parts come up and go down.

:class:`BrokerLifecycle` is a part the broker (broker.py) holds; it sees the
broker through :class:`LifecycleHost`. A start binds every listener's ports
first (listening, accepting nothing: bound_port.py), so that a port in use
refuses it before anything else; then it reads the definitions files
and the data directory (users, vhosts with their definitions and stores;
store/damage.py decides what damaged metadata does) and checks the
definitions against it; only then does it write (the cluster id, a new
directory's default vhost and user, the users and vhosts files) and apply the
definitions, so a refused start leaves the data directory as it was. Then it
starts the timers and the listeners, the management API last, and finally the
components' stored parameters (shovels may connect to the listeners). A start
that fails undoes what it did. A stop goes the other way: timers, components,
listeners, the last disk syncs, then every store sealed, synced and closed at
once, and what was delivered recorded for the next start.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from warren import __version__, build_description
from warren.definitions_document import DefinitionsError, read_definitions
from warren.definitions_import import Known, checked_import
from warren.node import Node
from warren.store import cluster_id, damage
from warren.store.sync import GroupSync, sync_all
from warren.store.users_file import load_users, migrate_from_mgmt

if TYPE_CHECKING:
    from warren.alarms import ResourceAlarms
    from warren.broker_timers import BrokerTimers
    from warren.core.vhost import VHost
    from warren.node import Listener
    from warren.store.layout import DataDir
    from warren.store.sync import Replication
    from warren.store_factory import StoreFactory

__all__ = ["BrokerLifecycle", "LifecycleHost"]

log = logging.getLogger("warren")


class LifecycleHost(Node, Protocol):
    """What the start and stop need of the broker beyond a Node: its data
    directory, stores, alarms, timers and replication."""

    layout: DataDir
    stores: StoreFactory
    resource_alarms: ResourceAlarms
    timers: BrokerTimers
    replication: Replication | None

    def apply_stored_parameters(self) -> None: ...


def _raise_fd_limit() -> None:
    """Every queue that has been written to keeps its write segment open: lift the
    soft descriptor limit to the hard one so thousands of queues fit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit: %s", exc)


class BrokerLifecycle:
    """The broker's start and stop sequence, and whether it is started."""

    def __init__(self, host: LifecycleHost, open_vhost: Callable[[str], VHost]) -> None:
        self.host = host
        #: Makes a vhost from its directory (its definitions restored, swept).
        self._open_vhost = open_vhost
        self.started = False
        self._taken_marks: dict[Path, int] | None = None  # as the last stop left them
        #: What _restore found for _first_writes: a new directory, and whether
        #: it gets the default vhost and user.
        self._new = False
        self._seed = False

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        host = self.host
        host.clock.attach(loop)
        host.auth_guard.clock = host.clock  # in case another was set after __init__
        host.resource_alarms.loop = loop
        _raise_fd_limit()
        # Every listener's ports bound first (listening, accepting nothing): a
        # port in use refuses the start before the data dir is touched.
        await self._bind_ports()
        try:
            await self._start_bound(loop)
        except BaseException:
            await self._stop_listeners()
            raise

    async def _stop_listeners(self) -> None:
        """Stop every listener, started or only bound (its stop closes what it
        bound and did not serve; a second stop does nothing)."""
        for listener in reversed(self.host.listeners):
            try:
                await listener.stop()
            except Exception:
                log.exception("stopping the %s listener failed", listener.name)

    async def _bind_ports(self) -> None:
        """Bind every listener's ports; on a failure close those bound and raise
        (bound_port.BindError names the listener and the port). A listener
        without bind_ports binds when it starts."""
        bound: list[Listener] = []
        try:
            for listener in self.host.listeners:
                bind_ports = getattr(listener, "bind_ports", None)
                if bind_ports is not None:
                    bind_ports(self.host)
                    bound.append(listener)
        except BaseException:
            for listener in reversed(bound):
                await listener.stop()
            raise

    async def _start_bound(self, loop: asyncio.AbstractEventLoop) -> None:
        """The start once the ports are bound: the data dir, then serving."""
        host = self.host
        # Read before the data dir is touched: a file that cannot be read refuses
        # the start with nothing changed.
        definitions = host.config.load_definitions
        documents = read_definitions(definitions) if definitions else []
        host.layout.prepare()
        # Clustering's replication hears of every change to the directory from here
        # on (store/mirror.py): each store is given it as it is made.
        host.layout.mirror = host.replication
        try:
            self._restore(loop)
            # Every file checked against what was read, before anything is
            # written: a refused start leaves the data dir as it was.
            imports = self._check_definitions(documents)
            self._first_writes()
        except BaseException:
            self._abort_start()
            raise
        try:
            for file, apply in imports:
                log.info("importing definitions from %s", file)
                apply()
        except BaseException:
            # What only applying finds (a disk that is full, say): the entries
            # before it are applied, as the management API's import leaves them.
            self._close_store()
            raise
        host.timers.start(loop)
        self.started = True
        try:
            # The management API starts last: once it answers, every listener is up
            # (`warren ctl await-startup` relies on it). Until its listener starts,
            # a client waits in its port's backlog.
            for listener in sorted(host.listeners, key=lambda lst: lst.name == "http"):
                await listener.start(host)
        except BaseException:
            await self._stop_listeners()  # its clients gone before the stores close
            host.timers.stop()
            self._close_store()
            self.started = False
            raise
        host.apply_stored_parameters()  # shovels may connect to the listeners
        log.info(
            "Warren %s (%s) started: %s, data dir %s",
            __version__,
            build_description(),
            ", ".join(f"{lst.name} port {lst.port}" for lst in host.listeners) or "no listeners",
            host.layout.root,
        )

    def _restore(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the data directory: users, vhosts, their definitions and stores.
        Damaged metadata refuses the start or is set aside (store/damage.py). What
        a first start writes waits for _first_writes."""
        host = self.host
        config, layout = host.config, host.layout
        policy = config.damaged_metadata
        new = self._new = layout.is_new
        host.users = load_users(layout.users_file, policy, layout.mirror, migrate=False)
        if not new and not layout.users_file.exists():
            problem = "missing, though the data directory holds vhosts"
            if policy != damage.SET_ASIDE:
                raise damage.refusal(layout.users_file, problem)
            log.error("%s is %s: starting with no users", layout.users_file, problem)
            host.users.from_file = True
        host.syncer = GroupSync(
            loop, config.sync, replication=host.replication, budget=host.resource_alarms.budget
        )
        self._taken_marks = host.stores.delivered_marks = layout.take_delivered_marks()
        vhosts = layout.load_vhosts(policy)
        definitions = config.load_definitions
        # As RabbitMQ: a new node with definitions to load gets no default vhost and user.
        seed = not (definitions and not vhosts and not host.users.users)
        if not seed:
            log.info("will not seed the default vhost and user: have definitions to load")
        # Restoring builds an object graph of every queue and exchange (hundreds
        # of thousands of objects for 100,000 queues) that lives as long as the
        # broker: the cyclic GC would walk it again and again while it grows
        # (a sixth of a big restore's time), and then at every full collection.
        # Collect once afterwards and freeze what survives.
        gc.disable()
        try:
            for name in vhosts:
                host.vhosts[name] = self._open_vhost(name)
        finally:
            gc.enable()
            gc.collect()
            gc.freeze()
        self._seed = seed

    def _check_definitions(
        self, documents: list[tuple[Path, dict[str, Any]]]
    ) -> list[tuple[Path, Callable[[], None]]]:
        """Each file's import checked, in turn, with the names the files before it
        add; what applies each. DefinitionsError names the file."""
        known = Known(self.host)
        if self._seed and not self.host.vhosts:  # made by _first_writes
            known.add_vhost(self.host.config.default_vhost)
        imports = []
        for file, data in documents:
            try:
                imports.append((file, checked_import(self.host, data, known)))
            except DefinitionsError as exc:
                raise DefinitionsError(f"definitions file {file}: {exc}") from None
        return imports

    def _first_writes(self) -> None:
        """What a start writes before the definitions are applied: the cluster id
        and the default vhost and user of a new directory, the users and vhosts
        files. Only once the start is accepted (the definitions checked)."""
        host = self.host
        config, layout = host.config, host.layout
        if layout.users_file.exists():
            migrate_from_mgmt(host.users, layout.users_file, layout.mirror)
        host.cluster_id = cluster_id.load_or_create(
            layout.cluster_id_file, config.damaged_metadata, layout.mirror
        )
        if self._seed and not host.vhosts:
            host.vhosts[config.default_vhost] = self._open_vhost(config.default_vhost)
        try:
            layout.save_vhosts(list(host.vhosts))
        except OSError as exc:  # the vhosts' directories say it as well
            log.error("cannot write %s: %s", layout.vhosts_file, exc)
        host.stores.delivered_marks = {}  # stores made from now on are new: nothing delivered
        if self._seed and self._new and not host.users.users:
            host.users.add_user(config.default_user, config.default_password, ["administrator"])
            host.users.set_permissions(config.default_user, config.default_vhost)
        if not layout.users_file.exists():
            # Written at the first start, even empty: from then on a missing file
            # is damage, never a reason to make the default user again.
            host.save_users()

    def _abort_start(self) -> None:
        """Undo a start that failed while reading the data directory: close what
        was opened, put back the delivered marks it took, release the lock."""
        host = self.host
        for vhost in host.vhosts.values():
            vhost.close()
        host.vhosts.clear()
        if host.syncer is not None:
            host.syncer.close()
            host.syncer = None
        if self._taken_marks is not None:
            try:
                host.layout.save_delivered_marks(self._taken_marks)
            except OSError as exc:
                log.error("cannot put back what was delivered: %s", exc)
        host.layout.release()

    async def stop(self) -> None:
        """Stop every listener (each closes its clients as its protocol does at
        shutdown; AMQP: 320 CONNECTION_FORCED), then close the store."""
        if not self.started:
            return
        self.started = False
        host = self.host
        host.timers.stop()
        for comp in host.parameter_components.values():
            try:
                await comp.close()
            except Exception:
                log.exception("stopping the %s component failed", comp.name)
        for listener in reversed(host.listeners):
            try:
                await listener.stop()
            except Exception:  # the stores must still be closed
                log.exception("stopping the %s listener failed", listener.name)
        if host.syncer is not None:
            # What the last rounds settle happens before the stores close.
            try:
                await asyncio.wait_for(host.syncer.drain(), 30)
            except (TimeoutError, OSError):
                log.exception("waiting for the last disk syncs failed")
        self._close_store()
        log.info("Warren stopped")

    def _close_store(self) -> None:
        """Write out, sync and close every store, whatever one of them raises (a
        full disk: what was never confirmed and cannot be written is dropped,
        logged by the store); then record what was delivered, if that can be
        written."""
        host = self.host
        vhosts = host.vhosts.values()
        marks: dict[Path, int] = {}
        for vhost in vhosts:
            marks.update(vhost.lifecycle.delivered_marks())
        failed = 0
        stores = [s for vhost in vhosts for s in vhost.lifecycle.stores()]
        for store in stores:
            # The close mark of each segment log (docs/storage.md): before the
            # sync, which covers it, so that the next start appends after it.
            seal = getattr(store, "seal", None)
            if seal is not None:
                try:
                    seal()
                except Exception:
                    log.exception("marking a store closed failed")
        # All at once (store/sync.py sync_all): each store's close then finds
        # nothing left to sync.
        try:
            sync_all(stores)
        except OSError as exc:
            log.error("syncing the stores at the stop failed: %s", exc)
        for vhost in vhosts:
            failed += vhost.close()
        if failed:
            log.error(
                "%d stores did not close cleanly: what was delivered is not recorded, "
                "the next start counts every message as delivered",
                failed,
            )
        else:
            try:
                # After every store is written out and synced: a clean shutdown.
                host.layout.save_delivered_marks(marks)
            except OSError as exc:
                log.error(
                    "cannot record what was delivered (%s): the next start counts "
                    "every message as delivered",
                    exc,
                )
        if host.syncer is not None:
            try:
                host.syncer.close()
            except Exception:
                log.exception("stopping the disk sync threads failed")
        host.layout.release()
