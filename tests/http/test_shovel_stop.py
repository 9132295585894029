"""A broker with a shovel defined stops promptly whatever the shovel is doing:
stopped as the peer refuses its passive declare (the race that hung a stop for
good), connecting to a peer that never answers the AMQP handshake, or waiting
to reconnect to a peer that is gone. Each stop is asserted to return within a
generous bound; nothing waits for time to pass."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api

from warren.shovel.component import ShovelComponent
from warren.shovel.runner import Shovel
from warren.shovel.spec import validate

#: Far more than a stop takes (milliseconds), far less than the hang (forever).
PROMPT = 10.0


class _CancelledAtTheRefusal(Shovel):
    """A shovel whose task is cancelled the moment the peer's 404 closes the
    channel of its first passive declare, as a broker stop may: the callback on
    aiormq's own close future of the channel runs before the channel's RPC hands
    its caller the 404, so the cancellation meets it every time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled: list[asyncio.Task[Any]] = []  # the task, once cancelled
        self.refused = asyncio.Event()

    async def _ensure_queue(self, conn: Any, ch: Any, queue: str, uri: str) -> Any:
        task = asyncio.current_task()
        assert task is not None
        if not self.cancelled:

            def cancel(_: asyncio.Future[Any]) -> None:
                if not self.cancelled:
                    self.cancelled.append(task)
                    task.cancel()
                    self.refused.set()

            ch._closing.add_done_callback(cancel)  # aiormq's; the public .closing is later
        return await super()._ensure_queue(conn, ch, queue, uri)


def _aiormq_tasks() -> list[asyncio.Task[Any]]:
    """The running tasks of aiormq connections and channels (readers, writers,
    heartbeats): none once every connection a shovel opened is closed."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and t.get_coro().__qualname__.startswith(("Connection.", "Channel."))
    ]


def test_a_stop_that_meets_a_refused_declare_ends_the_shovel(broker: BrokerThread) -> None:
    """The stop used to be swallowed: aiormq turned the cancellation into the
    404 (ChannelNotFoundEntity), which the shovel caught to declare the queue,
    and it went on to running, its task never ending: the broker stop hung."""

    async def scenario() -> tuple[bool, bool, str, list[asyncio.Task[Any]]]:
        spec = validate(
            {"src-uri": "amqp://", "src-queue": "x", "dest-uri": "amqp://", "dest-queue": "y"}
        )  # neither queue exists: the destination's passive declare is refused first
        shovel = _CancelledAtTheRefusal(
            "/", "s", spec, lambda _uri, _vhost: broker.url, "test", lambda _s: None
        )
        shovel.start()
        await shovel.refused.wait()
        (task,) = shovel.cancelled
        done, _ = await asyncio.wait([task], timeout=PROMPT)
        ended = task in done
        await shovel.stop()
        return ended, task.cancelled(), shovel.state, _aiormq_tasks()

    ended, cancelled, state, left = broker.run(scenario(), PROMPT + 20)
    assert ended, "the shovel went on after its cancellation"
    assert cancelled and state == "starting"  # it never reported running
    assert left == []  # both its connections closed


@pytest.fixture
def silent_peer() -> Iterator[socket.socket]:
    """A port that accepts TCP but never says a word of AMQP."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def _shovels(broker: BrokerThread) -> ShovelComponent:
    component = broker.broker.parameter_components["shovel"]
    assert isinstance(component, ShovelComponent)
    return component


def _define(broker: BrokerThread, dest_port: int) -> None:
    value = {
        "src-uri": "amqp://",
        "src-queue": "x",
        "dest-uri": f"amqp://guest:guest@127.0.0.1:{dest_port}/%2F",
        "dest-queue": "y",
    }
    assert Api(broker.http_port).put("/api/parameters/shovel/%2F/s", {"value": value}).status == 201


def _wait_state(broker: BrokerThread, state: str) -> None:
    """Woken by each change of the shovel's state (no polling)."""

    async def wait() -> None:
        shovel = _shovels(broker).shovels[("/", "s")]
        await shovel.wait_for_state(lambda s: s == state, PROMPT)

    broker.run(wait(), PROMPT + 5)


def test_a_stop_while_the_shovel_waits_for_a_silent_peer_is_prompt(
    tmp_path: Path, silent_peer: socket.socket
) -> None:
    a = start_broker(tmp_path / "a")
    try:
        _define(a, silent_peer.getsockname()[1])
        silent_peer.settimeout(PROMPT)
        conn, _ = silent_peer.accept()  # the shovel is in the destination's handshake
        with conn:
            a.stop(timeout=PROMPT)
    finally:
        a.stop()


def test_a_stop_while_the_shovel_waits_to_reconnect_is_prompt(tmp_path: Path) -> None:
    """Its peer stopped under it: the shovel failed and waits its reconnect-delay."""
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    try:
        _define(a, b.port)
        _wait_state(a, "running")
        b.stop()
        _wait_state(a, "terminated")
        a.stop(timeout=PROMPT)
    finally:
        a.stop()
        b.stop()
