"""One embedded Warren broker for the whole compatibility session.

The broker lives on its own asyncio loop in a background thread, entered with
``async with Broker(Config(...))`` exactly as an embedding application would,
so the synchronous probe scenarios (pika BlockingConnection, raw sockets) talk
to it over real sockets. Start-up and shutdown are synchronised with a
``concurrent.futures.Future`` and an ``asyncio.Event``; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

#: How long the broker may take to start or stop (seconds).
STARTUP_TIMEOUT = 60.0

#: The settings the reference RabbitMQ ran with (Debian's defaults: heartbeat 60,
#: frame_max 131072, channel_max 2047), so connection.tune compares like for like.
RABBITMQ_SETTINGS: dict[str, Any] = {"heartbeat": 60, "frame_max": 131072, "channel_max": 2047}


class EmbeddedBroker:
    """Run ``async with Broker(config)`` on a private loop in a daemon thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.ready: Future[int] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="warren-compat-broker", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # handed to the test thread via the future
            if not self.ready.done():
                self.ready.set_exception(exc)
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        from warren import Broker, Config  # imported here: a broken import fails the fixture only

        self._stop = asyncio.Event()
        config = Config(
            data_dir=str(self.data_dir), amqp_port=0, http_port=0, mqtt_port=0, stream_port=0, prometheus_port=0, **RABBITMQ_SETTINGS
        )
        async with Broker(config) as broker:
            self.ready.set_result(broker.amqp_port)
            await self._stop.wait()

    def start(self) -> int:
        """Start the thread; return the bound AMQP port once the broker listens."""
        self._thread.start()
        return self.ready.result(timeout=STARTUP_TIMEOUT)

    def stop(self) -> None:
        stop = self._stop
        if stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=STARTUP_TIMEOUT)


@pytest.fixture(scope="session")
def warren_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The AMQP port of a Warren broker shared by every compatibility test."""
    broker = EmbeddedBroker(tmp_path_factory.mktemp("warren-compat"))
    try:
        yield broker.start()
    finally:
        broker.stop()
