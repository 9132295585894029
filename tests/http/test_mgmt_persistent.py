"""messages_persistent and message_bytes_persistent as RabbitMQ 3.10 counts them.

``tools/mgmt_persistent.py`` runs one scenario (queues of every kind with a mix
of persistent and transient messages; fetched, acked, rejected, requeued,
purged; republished; a restart on the same data) and records each step's
counts and Prometheus families. ``rabbitmq_persistent_counts.json`` is
RabbitMQ 3.10.8's (``PYTHONPATH=src python tools/mgmt_persistent.py --json
tests/http/rabbitmq_persistent_counts.json`` starts a private one); here the
same scenario runs against an embedded Warren, restarted on its data
directory, and every step must give the same numbers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, start_broker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mgmt_persistent  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RECORDING: dict[str, Any] = json.loads(
    Path(__file__).with_name("rabbitmq_persistent_counts.json").read_text(encoding="utf-8")
)


@pytest.fixture(scope="module")
def warren_steps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The scenario's steps as Warren answers them."""
    data = tmp_path_factory.mktemp("persistent_counts") / "data"
    brokers = [start_broker(data)]

    def current() -> BrokerThread:
        return brokers[-1]

    def restart() -> None:
        current().stop()
        brokers.append(start_broker(data))

    broker = mgmt_persistent.Broker(
        lambda: current().port,
        lambda: current().http_port,
        lambda: f"http://127.0.0.1:{current().http_port}/metrics/per-object",
        restart,
    )
    try:
        yield mgmt_persistent.run(broker)
    finally:
        current().stop()


def test_the_recording_has_every_step() -> None:
    assert RECORDING["rabbitmq_version"] == "3.10.8"
    steps = RECORDING["steps"]
    assert set(steps) == {
        "published",
        "fetched",
        "acked",
        "rejected",
        "requeued",
        "purged",
        "keys",
        "republished",
        "restarted",
    }
    # What the comparison is about: a durable queue counts only its persistent
    # messages (3 of 5, 36 of 80 bytes), after a restart only those are left.
    assert steps["published"]["queues"]["classic"]["messages_persistent"] == 3
    assert steps["published"]["queues"]["classic"]["message_bytes_persistent"] == 36
    assert steps["restarted"]["queues"]["classic"]["messages"] == 4


def differences(expected: Any, got: Any, where: str = "") -> list[str]:
    """``where: RabbitMQ's != Warren's`` for every value that differs."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        for key in sorted(set(expected) | set(got)):
            here = f"{where}.{key}" if where else key
            if key not in got:
                out.append(f"{here}: missing")
            elif key not in expected:
                out.append(f"{here}: extra")
            else:
                out.extend(differences(expected[key], got[key], here))
        return out
    return [] if expected == got else [f"{where}: {expected!r} != {got!r}"]


@pytest.mark.parametrize("step", sorted(RECORDING["steps"]))
def test_counts_as_rabbitmq(warren_steps: dict[str, Any], step: str) -> None:
    found = differences(RECORDING["steps"][step], warren_steps[step])
    assert not found, f"{step}: RabbitMQ's != Warren's\n" + "\n".join(found)
