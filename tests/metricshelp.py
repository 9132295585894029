"""Reading a broker's Prometheus endpoints in tests: the samples, parsed by
prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from conftest import BrokerThread
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def prometheus_port(b: BrokerThread) -> int:
    listener = b.broker.listener("http/prometheus")
    assert listener is not None and listener.port
    return listener.port


def fetch(b: BrokerThread, path: str) -> str:
    url = f"http://127.0.0.1:{prometheus_port(b)}{path}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(resp.read().decode())


def scrape(b: BrokerThread, path: str = "/metrics") -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(fetch(b, path)):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: Samples, name: str, **labels: str) -> float:
    [v] = [v for got, v in metrics[name] if got == labels]
    return v
