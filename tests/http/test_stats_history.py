"""The rates and lengths history as deep as RabbitMQ's sample_retention_policies:
a queue's hour (605 s every 5 s, then every 60 s), the overview's day (then every
10 and 30 minutes), older samples repeating the oldest kept; the policies as the
overview lists them and the ranges' shapes compared with RabbitMQ 3.10.8's
recorded answers (tools/mgmt_gaps.py). The broker's clock is the test's:
sample_stats(t) with the times it chooses, nothing waits for time to pass."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from httphelp import Api
from pikahelp import connect, uniq

from warren.core.clock import ManualClock

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mgmt_gaps  # noqa: E402

# The tool's own (tests/http/test_mgmt_compat.py loads mgmt_compat afresh).
Client = mgmt_gaps.Client

pytestmark = pytest.mark.timeout(300)

RECORDED = json.loads(Path(__file__).with_name("rabbitmq_gap_answers.json").read_text())
T0 = 1_794_999_600.0  # a multiple of 30 minutes: every range's timestamps land on samples
Factory = Callable[..., BrokerThread]


def _sample(b: BrokerThread, times: Iterable[float]) -> None:
    """Sample the broker at each time, in one trip to its loop."""
    stamps = list(times)

    def run() -> None:
        for t in stamps:
            b.broker.sample_stats(t)

    b.call(run, timeout=240)


def _every(start: float, stop: float, step: float = 5.0) -> list[float]:
    """start, start + step, ... up to stop (included)."""
    return [start + i * step for i in range(int((stop - start) // step) + 1)]


def _samples(details: dict[str, Any]) -> list[int]:
    """The sample values, oldest first."""
    return [s["sample"] for s in reversed(details["samples"])]


def test_the_overview_lists_rabbitmqs_retention_policies(hand_sampled_broker: BrokerThread) -> None:
    overview = Api(hand_sampled_broker.http_port).get("/api/overview")
    assert overview["sample_retention_policies"] == (
        RECORDED["retention"]["sample_retention_policies"]
    )


def test_every_ui_range_has_rabbitmqs_samples(broker_factory: Factory) -> None:
    """The number of samples and their spacing for each range the management UI
    offers, a minute to a day, as RabbitMQ answers (the broker's own sampling,
    every second of its ManualClock, which moves while the tool polls the API)."""
    b = broker_factory(collect_statistics_interval=1000, clock=ManualClock())
    answers: list[dict[str, Any]] = []
    tool = threading.Thread(
        target=lambda: answers.append(
            mgmt_gaps.retention(Client(f"http://127.0.0.1:{b.http_port}"), b.port)
        ),
        daemon=True,
    )
    tool.start()
    deadline = time.monotonic() + 60
    while tool.is_alive():  # a round of sampling each time around
        assert time.monotonic() < deadline, "the tool never finished"
        b.advance(1000)
        tool.join(0.05)
    assert answers == [RECORDED["retention"]]


def test_a_queues_hour_and_the_overviews_day(hand_sampled_broker: BrokerThread) -> None:
    """One message a minute into a queue for an hour, then one every five seconds for
    ten minutes: the hour's samples every 60 s and the last ten minutes' every 5 s
    are the queue's lengths then; the overview keeps a day, every 30 minutes."""
    b = hand_sampled_broker
    api = Api(b.http_port)
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()  # each publish is in the queue when basic_publish returns
    q = uniq()
    ch.queue_declare(q)
    day, hour = T0, T0 + 86400
    last = hour + 3600
    published = (
        [day + i * 1800 for i in range(48)]  # a day, one message every 30 minutes
        + [hour + i * 60 for i in range(60)]  # an hour, one a minute
        + [last + i * 5 for i in range(120)]  # ten minutes, one every 5 s
    )
    for i, t in enumerate(published):
        ch.basic_publish("", q, b"x")
        following = published[i + 1] if i + 1 < len(published) else t + 5
        _sample(b, _every(t, following - 5))
    now = last + 595

    def count_at(t: float) -> int:
        return sum(1 for p in published if p <= t)

    def expected(age: int, incr: int, end: float = now) -> list[int]:
        newest = end // incr * incr
        return [count_at(newest - incr * k) for k in range(age // incr, -1, -1)]

    assert api.get(f"/api/queues/%2F/{q}")["messages"] == 228
    minutes = api.get(f"/api/queues/%2F/{q}?lengths_age=3600&lengths_incr=60")
    assert _samples(minutes["messages_details"]) == expected(3600, 60)
    fives = api.get(f"/api/queues/%2F/{q}?lengths_age=600&lengths_incr=5")
    assert fives["messages_details"]["samples"][0]["timestamp"] == int(now * 1000)
    assert _samples(fives["messages_details"]) == expected(600, 5)
    rates = api.get(f"/api/queues/%2F/{q}?msg_rates_age=600&msg_rates_incr=5")
    assert _samples(rates["message_stats"]["publish_details"]) == expected(600, 5)
    # The overview (global policy) keeps the day, every 30 minutes.
    overview = api.get("/api/overview?lengths_age=86400&lengths_incr=1800")
    assert _samples(overview["queue_totals"]["messages_details"]) == expected(86400, 1800)
    # A queue (basic policy) keeps an hour: further back, the oldest kept repeats.
    queue_day = _samples(
        api.get(f"/api/queues/%2F/{q}?lengths_age=86400&lengths_incr=1800")["messages_details"]
    )
    oldest_kept = count_at((now - 3600) // 60 * 60)  # the newest sample dropped
    assert queue_day == [
        count if t > now - 3600 else oldest_kept
        for t, count in zip(
            [now // 1800 * 1800 - 1800 * k for k in range(48, -1, -1)],
            expected(86400, 1800),
            strict=True,
        )
    ]
    conn.close()

    # Bounded: an hour of 5 s and 60 s samples (RabbitMQ's 605 and 3600 s), a day's
    # of the overview's, however many changes there were.
    def sizes() -> tuple[int, int]:
        queue = b.broker.vhosts["/"].queues[q]
        return len(queue.lengths.history.records()), len(b.broker.queue_totals.history.records())

    queue_records, overview_records = b.call(sizes)
    assert queue_records <= 121 + 61 + 2
    assert overview_records <= 121 + 61 + 49 + 49 + 4


def test_a_history_keeps_what_its_policy_says() -> None:
    """History alone: records thinned to one per interval as they age, dropped past
    the last tier, decoded back to the values they had."""
    from warren.core.stats_history import History  # noqa: PLC0415

    h = History()
    policy = ((60, 5), (600, 60))
    for i in range(400):  # a change every 5 s for 1995 s
        h.add(i * 5.0, (i, -i, 7), policy)
    # The last minute every 5 s (from 1935 s); then the last sample of each minute
    # (those at its end: intervals are (t - 60, t]) back to 600 s ago (1395 s), and
    # the newest of the minute under way at 1930 s; before, the newest dropped (1380 s).
    kept = [60 * b for b in range(24, 33)] + [1930]

    def expected(t: int) -> tuple[int, int, int]:
        if t >= 1935:
            i = t // 5
        else:
            older = [k for k in kept if k <= t]
            i = (older[-1] if older else 1380) // 5
        return (i, -i, 7)

    times = list(range(0, 2000, 5))
    assert h.values_at([t * 1000 for t in times]) == [expected(t) for t in times]
    assert len(h.records()) == 13 + len(kept)
    assert h.trimmed and h.size() < 6 * len(h.records())  # a few bytes a record


def test_an_idle_object_keeps_one_record(hand_sampled_broker: BrokerThread) -> None:
    b = hand_sampled_broker
    q = uniq()
    conn = connect(b)
    conn.channel().queue_declare(q)
    _sample(b, _every(T0, T0 + 3600))
    records = b.call(lambda: b.broker.vhosts["/"].queues[q].stats.history.records())
    assert len(records) == 1
    conn.close()


def test_sample_retention_is_configured_as_rabbitmq_does(tmp_path: Path) -> None:
    from warren.config import Config, ConfigError

    ini = tmp_path / "w.ini"
    ini.write_text(
        "[mgmt]\n"
        "sample_retention_policies.global.minute = 5\n"
        "sample_retention_policies.global.hour = 60\n"
        "sample_retention_policies.global.day = 1200\n"
        "sample_retention_policies.basic.605 = 5\n"
    )
    config = Config.from_ini(ini)
    assert config.sample_retention_global == ((60, 5), (3600, 60), (86400, 1200))
    assert config.sample_retention_basic == ((605, 5),)
    assert config.sample_retention_detailed == ((605, 5),)  # not set: RabbitMQ's default
    ini.write_text("[mgmt]\nsample_retention_policies.basic.minute = 120\n")
    with pytest.raises(ConfigError, match="interval must be positive and at most the age"):
        Config.from_ini(ini)
    ini.write_text("[mgmt]\nsample_retention_policies.everything.minute = 5\n")
    with pytest.raises(ConfigError, match="global|basic|detailed"):
        Config.from_ini(ini)


def test_configured_retention_shows_in_the_overview_and_the_history(
    broker_factory: Factory,
) -> None:
    b = broker_factory(
        collect_statistics_interval=0,
        sample_retention_basic=((60, 5),),
        sample_retention_global=((60, 5), (3600, 60)),
    )
    api = Api(b.http_port)
    assert api.get("/api/overview")["sample_retention_policies"] == {
        "global": [60, 3600],
        "basic": [60],
        "detailed": [600],
    }
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q)
    for i in range(30):
        ch.basic_publish("", q, b"x")
        _sample(b, [T0 + i * 5])
    aged = api.get(f"/api/queues/%2F/{q}?lengths_age=150&lengths_incr=5")
    # A minute kept: before it, the oldest kept value.
    values = _samples(aged["messages_details"])
    assert values[-13:] == list(range(18, 31))
    assert values[:18] == [values[0]] * 18
    conn.close()


def test_the_brokers_own_rounds_give_the_loop_back(hand_sampled_broker: BrokerThread) -> None:
    """Recording an hour of history costs a busy object a few microseconds a round:
    the broker's rounds (warren/sampling.py) give the event loop back every SLICE
    objects, so other work runs while 1,500 queues (3,000 objects) are sampled."""
    from warren import sampling  # noqa: PLC0415

    b = hand_sampled_broker
    vhost = b.broker.vhosts["/"]
    b.call(lambda: [vhost.declare_queue(f"sliced-{i}", durable=False) for i in range(1500)])

    async def round_with_other_work() -> tuple[list[str], int]:
        events: list[str] = []
        asyncio.get_running_loop().call_soon(events.append, "other work")
        sampled = await sampling.sample_in_slices(b.broker, T0)
        events.append("round done")
        return events, sampled

    events, sampled = b.run(round_with_other_work())
    assert events == ["other work", "round done"]
    assert sampled > 3000
    assert b.call(lambda: {q.lengths.history.last_s for q in vhost.queues.values()}) == {T0}
    assert b.call(lambda: b.broker.stats.history.last_s) == T0
