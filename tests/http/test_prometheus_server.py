"""RabbitMQ's Grafana dashboards, read by a real Prometheus scraping Warren.

Debian's ``prometheus`` (``make prometheus``) is started on a free port with a
configuration that scrapes Warren's [prometheus] listener every second, with
the ``namespace`` label a Kubernetes scrape would add. Under a small AMQP load
(publishers with confirms, manual- and auto-ack consumers, basic.get, a stream
queue, unroutable messages, queue and channel churn), every PromQL expression
of RabbitMQ's RabbitMQ-Overview and RabbitMQ-Stream dashboards, 3.13's and
4.3's (tests/data/rabbitmq_grafana_promql.json: only the expressions and
variables, MPL 2.0, source named there, recorded by
tests/record_grafana_promql.py) is evaluated through Prometheus's HTTP API
with the dashboards' variables filled in as Grafana fills them, and must
return series with the labels the panel shows.

No panel is allowed to come back empty but the 4.x Overview's message size
panels (NO_DATA): all of them read families Warren always exports, alarms
included (value 0 while no alarm is raised), and the Stream dashboard's
protocol="stream" series, which Warren always exports (zeros here: the load
is AMQP's; docs/metrics.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from free_ports import free_port
from paths import DATA
from pikahelp import barrier, connect, uniq, wait_until

PROMETHEUS = shutil.which("prometheus")
DASHBOARDS = json.loads(
    (DATA / "rabbitmq_grafana_promql.json").read_text()
)["dashboards"]
NAMESPACE = "warren-test"
#: Families of RabbitMQ's dashboards Warren does not export (docs/metrics.md):
#: their panels come back empty. rabbitmq_message_size_bytes is RabbitMQ 4.1's
#: histogram of every published message's size (work per message).
NO_DATA = ("rabbitmq_message_size_bytes",)

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian's prometheus is not installed (make prometheus)"
)


class Prometheus:
    """A private Prometheus server scraping one target every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: rabbitmq\n    scrape_timeout: 1s\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
            f"        labels:\n          namespace: {NAMESPACE}\n"
        )
        self.log = (tmp / "prometheus.log").open("w")
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def poll(self, expr: str, timeout: float = 60) -> list[dict[str, Any]]:
        """The query's result once it is not empty (Prometheus scrapes every second)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
            except OSError:  # not listening yet
                result = []
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.2)  # polling: the next scrape comes within a second

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def prometheus(broker: BrokerThread, tmp_path: Path) -> Iterator[Prometheus]:
    listener = broker.broker.listener("http/prometheus")
    assert listener is not None
    server = Prometheus(tmp_path, f"127.0.0.1:{listener.port}")
    try:
        yield server
    finally:
        server.stop()


def load(broker: BrokerThread) -> None:
    """A little of everything the dashboards count."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    work, auto, stream = uniq(), uniq(), uniq()
    ch.queue_declare(work)
    ch.queue_declare(auto)
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(20):
        ch.basic_publish("", work, b"job %d" % i)
        ch.basic_publish("", auto, b"tick")
        ch.basic_publish("", stream, b"event %d" % i)
    ch.basic_publish("amq.direct", "nowhere", b"lost")  # unroutable, dropped
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=5)
    acked: list[int] = []

    def on_work(c: Any, method: Any, props: Any, body: bytes) -> None:
        c.basic_ack(method.delivery_tag)
        acked.append(1)

    consumer.basic_consume(work, on_work)
    consumer.basic_consume(auto, lambda *a: None, auto_ack=True)
    events: list[bytes] = []
    consumer.basic_consume(
        stream,
        lambda c, m, p, body: (events.append(body), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": "first"},
    )
    wait_until(conn, lambda: len(acked) >= 19 and len(events) == 20)
    getter = conn.channel()
    getter.basic_get(work, auto_ack=False)
    getter.basic_get(auto, auto_ack=True)  # empty by now: get_empty
    temp = getter.queue_declare("", exclusive=True).method.queue
    getter.queue_delete(temp)
    getter.close()
    barrier(ch)
    # The connection stays open: the gauges (publishers, consumers) have something to show.
    broker.keep = conn  # type: ignore[attr-defined]


def fill(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value).replace(f"${{{name}}}", value)
    expr = expr.replace("$__rate_interval", "60s").replace("$__interval", "15s")
    return expr.replace("$__range", "5m")


def panel_labels(target: dict[str, str]) -> set[str]:
    """The labels a panel shows: its legend's {{label}}s and the labels it groups by."""
    wanted = set(re.findall(r"{{\s*(\w+)\s*}}", target["legend"]))
    for group in re.findall(r"\bby\s*\(([^)]*)\)", target["expr"]):
        wanted |= {label.strip() for label in group.split(",") if label.strip()}
    if "sum" not in target["expr"]:  # the table: build_info joined with identity_info
        for group in re.findall(r"group_left\s*\(([^)]*)\)", target["expr"]):
            wanted |= {label.strip() for label in group.split(",")}
    return wanted


def test_rabbitmq_dashboards_read_warren(broker: BrokerThread, prometheus: Prometheus) -> None:
    load(broker)
    # Three scrapes of the load: rate() and irate() need two points within their window.
    assert prometheus.poll("count_over_time(rabbitmq_global_messages_received_total[1m]) >= 3")
    exported = (
        urllib.request.urlopen(
            f"http://127.0.0.1:{broker.broker.listener('http/prometheus').port}/metrics"  # type: ignore[union-attr]
        )
        .read()
        .decode()
    )
    checked = empty = 0
    for dashboard, spec in DASHBOARDS.items():
        # The variables, resolved as Grafana does (label_values(metric{...}, label)),
        # each once those it names are.
        variables: dict[str, str] = {}
        pending = dict(spec["variables"])
        while pending:
            name, query = next(
                (n, q)
                for n, q in pending.items()
                if not any(f"${other}" in q for other in pending if other != n)
            )
            del pending[name]
            metric, label = re.fullmatch(r"label_values\((.*), ?(\w+)\)", query).groups()  # type: ignore[union-attr]
            values = prometheus.api(f"label/{label}/values", **{"match[]": fill(metric, variables)})
            assert len(values) == 1, (dashboard, name, values)
            variables[name] = values[0]
        expected = {"namespace": NAMESPACE, "rabbitmq_cluster": broker.broker.cluster_name}
        if "endpoint" in variables:  # 4.1's: rabbitmq_identity_info's rabbitmq_endpoint
            expected["endpoint"] = "aggregated"
        assert variables == expected, dashboard
        for target in spec["targets"]:
            expr = fill(target["expr"], variables)
            if any(family in expr for family in NO_DATA):
                assert not prometheus.query(expr), (dashboard, target["title"])
                empty += 1
                continue
            # Metric names (not the label names in matchers, by() and group_left()).
            for metric in set(re.findall(r"\b(rabbitmq_\w+)\b(?!\s*[=,)!~])", expr)):
                assert f"\n{metric}" in exported, (dashboard, target["title"], metric)
            result = prometheus.query(expr)
            assert result, (dashboard, target["title"], expr)
            wanted = panel_labels(target)
            for series in result:
                assert wanted <= set(series["metric"]), (dashboard, target["title"], series)
            checked += 1
    assert checked + empty == sum(len(spec["targets"]) for spec in DASHBOARDS.values())
    assert (checked, empty) == (137, 10)
