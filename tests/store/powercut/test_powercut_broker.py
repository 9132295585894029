"""Power cuts under load: 0 confirmed messages lost.

A real `warren` process runs on the power-cut file system (powercut_fs.py) while
real clients publish with confirms; the power goes at a random point (a seeded
count of file system operations), the broker is killed with it (kill -9), and
the backing directory is left as a power cut would have left it: only what was
fsynced, in directories that were fsynced. The broker restarts on that, and
every confirmed message must be there; acknowledged ones may come back, as
redeliveries only.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from powercut_load import ClassicQueues, Deduplication, MQTTSessions, Stream, WarrenProcess
from powercut_mount import PowerCutMount, power_fixture  # noqa: F401 (the fixtures)

ARGS = ("--segment-size", "65536")


def run_rounds(power: PowerCutMount, workloads: list[Any], rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    broker: WarrenProcess | None = None
    try:
        for n in range(rounds + 1):
            mnt = power.mount(torn=n % 2 == 1)
            broker = WarrenProcess(mnt, *ARGS)
            for w in workloads:
                if n:
                    w.verify(broker)
                w.setup(broker)
            if n == rounds:
                break
            for w in workloads:
                w.start(broker, rng)
            power.arm_ops(rng.randint(50, 1500))
            assert power.frozen.wait(60), "the load never reached the cut"
            broker.kill()
            for w in workloads:
                w.stop()
            power.unmount()
            print(f"round {n}: cut after {power.frozen_at} operations;",
                  ", ".join(f"{w.name} {w.confirmed()} confirmed" for w in workloads))
        for w in workloads:
            assert w.confirmed() > 0, f"{w.name}: nothing was confirmed before the cuts"
        broker.stop()
    except BaseException:
        if broker is not None:
            print(broker.log_tail())
        raise
    finally:
        if broker is not None:
            broker.kill()
        for w in workloads:
            w.stop()


@pytest.mark.parametrize("seed", [1])
def test_confirmed_publishes_survive_power_cuts(power: PowerCutMount, seed: int) -> None:
    run_rounds(power, [ClassicQueues()], rounds=3, seed=seed)


@pytest.mark.parametrize("seed", [7])
def test_mqtt_qos1_and_qos2_publishes_survive_power_cuts(power: PowerCutMount, seed: int) -> None:
    run_rounds(power, [MQTTSessions()], rounds=3, seed=seed)


@pytest.mark.parametrize("seed", [3])
def test_stream_publishes_survive_power_cuts(power: PowerCutMount, seed: int) -> None:
    run_rounds(power, [Stream()], rounds=3, seed=seed)


@pytest.mark.parametrize("seed", [4])
def test_deduplicated_publishes_survive_power_cuts(power: PowerCutMount, seed: int) -> None:
    run_rounds(power, [Deduplication()], rounds=3, seed=seed)


@pytest.mark.parametrize("seed", [5])
def test_every_workload_at_once_survives_power_cuts(power: PowerCutMount, seed: int) -> None:
    """All four together: the cut lands among interleaved group commits, lazy ack
    syncs, stream and MQTT session writes."""
    workloads = [ClassicQueues(), MQTTSessions(), Stream(), Deduplication()]
    run_rounds(power, workloads, rounds=4, seed=seed)
