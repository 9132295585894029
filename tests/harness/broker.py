"""A started broker without listeners, on an event loop the test thread runs."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from warren.broker import Broker
from warren.config import Config
from warren.core.clock import Clock, ManualClock

if TYPE_CHECKING:
    from harness.amqp import MemoryAMQP, ProtocolAMQP
    from harness.channel import Connection
    from harness.management import MemoryHTTP
    from harness.mqtt import MemoryMQTT, RawMQTT
    from warren.amqp.server import AMQPListener
    from warren.mqtt.server import MQTTListener

T = TypeVar("T")

#: Peer ports of the in-memory connections (each connection is told one, as a
#: socket's would be: logs and the management listings show it).
_peer_ports = itertools.count(40000)


class Harness:
    """warren.broker.Broker (the core and the store, no listeners) on a loop of
    its own, run only while the test waits for something (run, pump)."""

    def __init__(self, data_dir: Path, clock: Clock | None = None, **settings: Any) -> None:
        """``clock``: the broker's (a ManualClock for tests about time, moved with
        ``advance``); the system's by default."""
        settings.setdefault("auth_failure_delay", 0)
        settings.setdefault("stream_port", -1)
        # (amqp_port stays what Config says: warren.broker.Broker opens no listener.)
        config = Config(
            data_dir=str(data_dir),
            mqtt_port=-1,
            http_port=-1,
            prometheus_port=-1,
            **settings,
        )
        # asyncio's own loop: the harness runs it in steps, on this thread.
        self.loop = asyncio.new_event_loop()
        self.broker = Broker(config, clock=clock)
        self.config = self.broker.config
        self.closed = False
        self._mqtt: MQTTListener | None = None
        self._amqp_listener: AMQPListener | None = None
        self._http: MemoryHTTP | None = None
        #: What stop runs before the broker stops (the HTTP app's cleanup).
        self._on_stop: list[Callable[[], None]] = []
        try:
            self.run(self.broker.start())
        except BaseException:
            self.stop()  # a refused start stopped, as BrokerThread.stop does it
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the broker's loop until it is done."""
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the broker's loop (BrokerThread.call's shape;
        here the loop is this thread's, so it runs at once, inside the loop)."""

        async def call() -> T:
            return fn()

        return self.run(call())

    def advance(self, ms: float) -> int:
        """Move the broker's ManualClock by ``ms``, running the timers due on the
        way (on the broker's loop); how many ran."""
        clock = self.broker.clock
        assert isinstance(clock, ManualClock), "make the harness with clock=ManualClock()"

        async def advance() -> int:
            return clock.advance(ms)

        return self.run(advance())

    def pump(self) -> None:
        """Let the loop run what is ready now (callbacks scheduled by the last
        step), without waiting for anything."""
        self.run(asyncio.sleep(0))

    def settle(self, timeout: float = 30) -> None:
        """Run the broker's loop until it has nothing left to do now: no callback
        ready, no loop timer due, no file sync round in flight (awaited through
        GroupSync.drain, not polled). What a timer on the broker's clock does
        later is the test's to bring about (``advance``)."""
        self.run(self._settle(), timeout)

    def run_ready(self, timeout: float = 30) -> None:
        """Run the broker's loop until it has nothing ready now (no callback, no
        timer due), without waiting for a file sync round in flight (settle
        does): what waits for a sync the test holds stays waiting."""

        async def ready() -> None:
            await asyncio.sleep(0)
            while self._busy():
                await asyncio.sleep(0)

        self.run(ready(), timeout)

    def _busy(self) -> bool:
        """Whether the loop has a callback ready or a timer due (asyncio's own
        queues: no public API says so)."""
        loop: Any = self.loop
        if loop._ready:
            return True
        now = loop.time()
        return any(not h.cancelled() and h.when() <= now for h in loop._scheduled)

    async def _settle(self) -> None:
        while True:
            await asyncio.sleep(0)
            if self._busy():
                continue
            syncer = self.broker.syncer
            if syncer is not None:
                await syncer.drain()  # returns at once when no round is wanted
            if not self._busy():
                return

    def amqp(self, peer: tuple[str, int] | None = None, timeout: float = 5.0) -> MemoryAMQP:
        """A new AMQP 0-9-1 connection to the broker, in memory."""
        from harness.amqp import MemoryAMQP

        return MemoryAMQP(self, peer or ("127.0.0.1", next(_peer_ports)), timeout)

    def amqp_client(self, channels: int = 1) -> MemoryAMQP:
        """A new in-memory AMQP connection with the handshake done (guest on
        "/") and channels 1 .. ``channels`` open."""
        client = self.amqp()
        client.handshake()
        for channel in range(1, channels + 1):
            client.open_channel(channel)
        return client

    def amqp_connection(
        self, user: str = "guest", password: str = "guest", vhost: str = "/"
    ) -> Connection:
        """A new in-memory AMQP connection with pika's calls (harness.channel):
        ``.channel()``, ``queue_declare``, ``basic_publish``...; ConnectionClosed
        when the broker refuses it."""
        from harness.channel import Connection

        return Connection(self.amqp(), user, password, vhost)

    @property
    def amqp_listener(self) -> AMQPListener:
        """An AMQP listener that never listens: the owner of ProtocolAMQP's
        protocols (``.protocols``), as a socket listener owns its clients'."""
        if self._amqp_listener is None:
            from warren.amqp.server import AMQPListener

            listener = self._amqp_listener = AMQPListener("127.0.0.1", -1)
            listener._node = self.broker  # what start() sets before it binds
        return self._amqp_listener

    def amqp_protocol(
        self, peer: tuple[str, int] | None = None, timeout: float = 5.0
    ) -> ProtocolAMQP:
        """A new AMQP connection through the listener's AMQPProtocol on an
        in-memory transport: its timers (handshake, heartbeats) on the broker's
        clock. MemoryAMQP (``amqp``) drives AMQPConnection without that layer."""
        from harness.amqp import ProtocolAMQP

        return ProtocolAMQP(self, peer or ("127.0.0.1", next(_peer_ports)), timeout)

    def mqtt(
        self,
        client_id: str = "",
        protocol: int = 4,
        peer: tuple[str, int] | None = None,
        **options: Any,
    ) -> MemoryMQTT:
        """A new MQTT connection (paho's client; ``protocol`` 4 is 3.1.1, 5 is 5;
        ``options``: more of paho's Client arguments, such as clean_session)."""
        from harness.mqtt import MemoryMQTT

        peer = peer or ("127.0.0.1", next(_peer_ports))
        return MemoryMQTT(self, self.mqtt_listener(), peer, client_id, protocol, **options)

    def mqtt_raw(
        self, level: int = 5, peer: tuple[str, int] | None = None, timeout: float = 5.0
    ) -> RawMQTT:
        """A new MQTT connection whose every byte the test writes (RawClient's shape)."""
        from harness.mqtt import RawMQTT

        peer = peer or ("127.0.0.1", next(_peer_ports))
        return RawMQTT(self, self.mqtt_listener(), peer, level, timeout)

    def mqtt_listener(self) -> MQTTListener:
        """The MQTT listener's state and protocols (sessions, retained messages,
        wills, keep-alive timers), started without a port."""
        from warren.mqtt.server import MQTTListener

        if self._mqtt is None:
            listener = MQTTListener("127.0.0.1", -1)
            self.run(listener.start(self.broker))
            self._mqtt = listener
        return self._mqtt

    def http(self, user: str = "guest", password: str = "guest") -> MemoryHTTP:
        """The management API in memory (harness.management), as ``user``: the HTTP
        listener's application and aiohttp's request handler, no socket."""
        from harness.management import MemoryHTTP

        if self._http is None:
            self._http = MemoryHTTP(self)
        return self._http.as_user(user, password)

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` as the harness stops, before the broker does."""
        self._on_stop.append(fn)

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            for fn in reversed(self._on_stop):
                fn()
            if self._mqtt is not None:
                self.run(self._mqtt.stop())
            if self._amqp_listener is not None:
                for proto in list(self._amqp_listener.protocols):
                    self.call(lambda p=proto: p.connection_lost(None))
            self.run(self.broker.stop())
        finally:
            self.loop.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
