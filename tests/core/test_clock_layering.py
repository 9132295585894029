"""One clock (core/clock.py): the source reads time and arms timers only through it.

Every TTL, expiry, delay, timeout, keep alive, heartbeat and rate goes through
the broker's clock, so a test can drive them all with a ManualClock. This reads
src/warren with ast and fails on a direct reading of the system clock
(time.time, time.monotonic, time.perf_counter and their _ns forms, an event
loop's time()), a timer armed on something other than a clock (call_later,
call_at on a loop), an asyncio.sleep of more than a loop turn, an
asyncio.wait_for or an asyncio.wait with a timeout, or a Message
made without a time, outside core/clock.py and the allowlist below, each entry
with the reason it stays off the clock. perf/, spark/ and client/ are clients
with their own timing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import REPO

# Reads the source, not the build: the same in both builds, so once
# (tests/passes.py).
pytestmark = pytest.mark.passes("compiled")

SRC = REPO / "src" / "warren"

#: Packages that are clients with their own timing: warren perf and Spark measure
#: their runs, warren.client (the AMQP client they share) its socket deadlines.
CLIENT_PACKAGES = ("perf", "spark", "client")

#: (file, what) -> why it is not the broker's clock.
ALLOWED: dict[tuple[str, str], str] = {
    ("core/clock.py", "time.time"): "the clock itself",
    ("core/clock.py", "time.monotonic"): "the clock itself",
    ("core/clock.py", "call_later"): "the clock itself (LoopClock on the loop)",
    ("core/clock.py", "call_at"): "the clock itself (ManualClock's call_later)",
    ("broker_timers.py", "call_later"): (
        "the free-disk and memory alarms poll the OS once a second: what they watch "
        "moves outside the broker, so a ManualClock must not stop them"
    ),
    ("store/sync.py", "call_later"): (
        "the group sync of acks: an I/O batching interval, nothing a client can "
        "observe as time; a ManualClock must not hold acks back from the disk"
    ),
    ("federation/component.py", "call_later"): (
        "federation's sweep for new queues and policies: a poll for changes no "
        "event announces, not a time the protocol defines"
    ),
    # Bounds on a stop or a close, which must end in real time even when a test
    # never moves its ManualClock (a timeout on a peer goes on the clock:
    # links.py's _within).
    ("amqp/server.py", "asyncio.wait timeout"): "the listener's stop: connections' closes",
    ("batched_protocol.py", "asyncio.wait timeout"): (
        "OpenClients.close_all, MQTT's and AMQP 1.0's listeners' stop: connections' closes"
    ),
    ("http/websocket.py", "asyncio.wait timeout"): "a WebSocket's close handshake on stop",
    ("broker_lifecycle.py", "asyncio.wait_for"): "the stop's bound on a vhost's disk sync",
    ("links.py", "asyncio.wait_for"): "StateWaiters.wait: its caller's (a test's) own deadline",
    ("metrics/snapshot.py", "time.time"): "process start and scrape time, for /metrics",
    ("http/api_overview.py", "time.time"): "the process's uptime in /api/overview",
    ("ctl/startup.py", "time.monotonic"): (
        "`warren ctl await-startup`: a command-line client's own deadline (injectable)"
    ),
    # cluster/: nodes are separate processes with their own timing, in etcd
    # leases and the leader's ack watchdog; cluster/retry.py is its injectable
    # Clock (seconds, monotonic, with sleep), which tests/cluster drives.
    ("cluster/etcd.py", "loop.time"): "etcd requests' deadlines (a client of etcd)",
    ("cluster/leader.py", "loop.time"): "the followers' ack deadlines (cluster timing)",
    ("cluster/leader.py", "call_later"): "the followers' ack watchdog (cluster timing)",
    ("cluster/leader.py", "asyncio.sleep"): "a retry pause after a failed replication",
    ("cluster/leader.py", "asyncio.wait_for"): "the leader's stop: followers' sockets closing",
    (
        "cluster/proxy.py",
        "asyncio.wait_for",
    ): "the cluster proxy's connect to a node (cluster timing)",
    ("cluster/retry.py", "loop.time"): "the cluster's own injectable Clock",
    ("cluster/retry.py", "asyncio.sleep"): "the cluster's own injectable Clock",
}

_TIME_FUNCTIONS = {
    "time",
    "monotonic",
    "perf_counter",
    "time_ns",
    "monotonic_ns",
    "perf_counter_ns",
}
_TIMER_METHODS = {"call_later", "call_at"}


def _receiver(node: ast.expr) -> str:
    """The dotted name a call is made on, as written (``self.vhost.clock``)."""
    return ast.unparse(node)


def _findings(path: Path) -> set[str]:
    """What ``path`` does with time outside the clock, by kind."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            for alias in node.names:
                if alias.name in _TIME_FUNCTIONS:
                    found.add(f"time.{alias.name.removesuffix('_ns')}")
        if (  # time.time called, or handed on as a clock
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
            and node.attr in _TIME_FUNCTIONS
        ):
            found.add(f"time.{node.attr.removesuffix('_ns')}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Message":
            if len(node.args) < 5 and not any(k.arg == "timestamp" for k in node.keywords):
                found.add("Message without a time")
            continue
        if not isinstance(func, ast.Attribute):
            continue
        owner = _receiver(func.value)
        if owner == "time":
            continue  # seen as an attribute above
        if func.attr == "time" and "loop" in owner.lower():
            found.add("loop.time")
        elif func.attr in _TIMER_METHODS and not owner.endswith("clock"):
            found.add(func.attr)
        elif owner == "asyncio" and func.attr == "wait_for":
            found.add("asyncio.wait_for")
        elif owner == "asyncio" and func.attr == "wait":
            timeout = next((k.value for k in node.keywords if k.arg == "timeout"), None)
            if timeout is not None and not (
                isinstance(timeout, ast.Constant) and timeout.value is None
            ):
                found.add("asyncio.wait timeout")
        elif owner == "asyncio" and func.attr == "sleep":
            zero = node.args and isinstance(node.args[0], ast.Constant) and not node.args[0].value
            if not zero:
                found.add("asyncio.sleep")
    return found


def _sources() -> list[Path]:
    return sorted(
        p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in CLIENT_PACKAGES
    )


def test_time_is_read_and_timers_armed_only_through_the_clock() -> None:
    offenders = sorted(
        f"{path.relative_to(SRC)}: {what}"
        for path in _sources()
        for what in _findings(path)
        if (str(path.relative_to(SRC)), what) not in ALLOWED
    )
    assert not offenders, "read the broker's clock (core/clock.py) instead:\n" + "\n".join(
        offenders
    )


def test_the_allowlist_has_no_stale_entries() -> None:
    """An entry whose file no longer does what it allows goes, so the list stays
    the exact set of exceptions."""
    stale = sorted(f"{file}: {what}" for file, what in ALLOWED if what not in _findings(SRC / file))
    assert not stale


def test_the_check_sees_each_kind(tmp_path: Path) -> None:
    """The checker itself: each way around the clock is found, the clock's own
    calls and a turn of the loop are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio, time\n"
        "from time import monotonic\n"
        "time.time(); time.perf_counter_ns(); loop.time(); self._loop.time()\n"
        "loop.call_later(1, f); asyncio.get_running_loop().call_at(2, f)\n"
        "asyncio.sleep(1); Message('', 'k', b'', b'')\n"
        "self.vhost.clock.call_at(1, f); clock.call_later(1, f); asyncio.sleep(0)\n"
        "Message('', 'k', b'', b'', now)\n"
        "asyncio.wait_for(f, 5); asyncio.wait([f], timeout=5); asyncio.wait([f], timeout=None)\n"
    )
    assert _findings(sample) == {
        "time.time",
        "time.monotonic",
        "time.perf_counter",
        "loop.time",
        "call_later",
        "call_at",
        "asyncio.sleep",
        "Message without a time",
        "asyncio.wait_for",
        "asyncio.wait timeout",
    }
