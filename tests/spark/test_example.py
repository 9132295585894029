"""examples/spark_pipeline (--once) against the embedded broker: every window average
the watermark has closed is in Parquet with the right value, every alert arrives once."""

from __future__ import annotations

import datetime as dt
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from .helpers import BrokerInfo, channel, message_count

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline"


@pytest.fixture
def example(spark_broker: BrokerInfo, warren_only: None) -> Any:
    sys.path.insert(0, str(EXAMPLE))
    import run
    import sensors

    yield run, sensors
    sys.path.remove(str(EXAMPLE))
    from warren.amqp import spec

    with channel(spark_broker.url) as c:
        for topology in (sensors.LIVE, sensors.ONCE):
            for queue in topology.queues():
                c.rpc(1, spec.QueueDelete(queue=queue), spec.QueueDeleteOk)
            for exchange in topology.exchanges():
                c.rpc(1, spec.ExchangeDelete(exchange=exchange), spec.ExchangeDeleteOk)


def expected(
    sensors: Any, count: int, rounds: int
) -> tuple[dict[tuple[int, str], list[float]], list[tuple[str, float, dt.datetime, int]]]:
    """What ``run_once`` must give for ``count`` sensors and ``rounds`` simulated
    seconds: the readings of each window the watermark has closed, keyed by
    (window number, sensor), and every reading over the threshold as (sensor,
    value, time, offset): the readings go into the stream in order, the k-th at
    offset k."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    source = sensors.readings(count, start, dt.timedelta(seconds=1))
    windows: dict[tuple[int, str], list[float]] = defaultdict(list)
    over: list[tuple[str, float, dt.datetime, int]] = []
    offset = 0
    for _ in range(rounds):
        for r in next(source):
            windows[(int((r.time - start).total_seconds()) // 10, r.sensor)].append(r.value)
            if r.value > sensors.THRESHOLD:
                over.append((r.sensor, r.value, r.time, offset))
            offset += 1
    # The watermark trails the newest reading (second rounds - 1) by 30 s: the windows
    # ending at or before it are final and written; the later ones are still open.
    watermark_s = rounds - 1 - 30
    closed = {k: v for k, v in windows.items() if (k[0] + 1) * 10 <= watermark_s}
    return closed, over


def check_once(
    url: str, sensors: Any, count: int, rounds: int, averages: list[Any], alerts: list[Any]
) -> None:
    """``run_once``'s output is exactly :func:`expected`: every closed window's average,
    maximum and count, no other window, and every alert once."""
    closed, over = expected(sensors, count, rounds)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    got = {
        (
            int((row.window_start.replace(tzinfo=dt.UTC) - start).total_seconds()) // 10,
            row.sensor,
        ): (row.avg_value, row.max_value, row.readings)
        for row in averages
    }
    assert len(averages) == len(got) == len(closed) > 0
    for key, values in closed.items():
        avg, top, n = got[key]
        assert n == len(values)
        assert avg == pytest.approx(round(sum(values) / len(values), 3), abs=1e-9)
        assert top == max(values)

    assert over, "the simulated readings should cross the threshold now and then"
    assert sorted(
        (a["sensor"], a["value"], dt.datetime.fromisoformat(a["time"]), a["offset"]) for a in alerts
    ) == sorted(over)
    assert message_count(url, sensors.ONCE.alerts_queue) == 0  # and nothing twice


def test_the_pipeline_writes_every_closed_window_and_every_alert_once(
    spark: Any, spark_broker: BrokerInfo, example: Any, tmp_path: Path
) -> None:
    run, sensors = example
    count, rounds = 4, 1200
    averages, alerts = run.run_once(
        spark, spark_broker.url, tmp_path, sensor_count=count, rounds=rounds
    )
    check_once(spark_broker.url, sensors, count, rounds, averages, alerts)


def test_once_after_a_live_run_gives_what_it_gives_on_a_fresh_broker(
    spark: Any, spark_broker: BrokerInfo, example: Any, tmp_path: Path
) -> None:
    """A live run leaves readings of the current time in the broker and a watermark
    of the current time in its checkpoints: ``--once`` (readings of 2026-01-01) must
    not read either, or its simulated hour is dropped as late data.

    What a fresh broker gives is known exactly (the test above checks it
    there): the live run's readings would add windows and alerts, its
    watermark would drop the simulated hour's windows. So ``--once`` after the
    live run is checked against that, not against a second run on a second
    broker."""
    run, sensors = example
    count, rounds = 3, 300
    out = tmp_path / "out"
    run.run_live(spark, spark_broker.url, out, 600, count, rounds=40, interval_s=0)
    assert message_count(spark_broker.url, sensors.LIVE.readings_stream) == 40 * count
    averages, alerts = run.run_once(spark, spark_broker.url, out, sensor_count=count, rounds=rounds)
    check_once(spark_broker.url, sensors, count, rounds, averages, alerts)
