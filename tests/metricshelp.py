"""Reading a broker's Prometheus endpoints in tests: the samples, parsed by
prometheus-client's own parser."""

from __future__ import annotations

import urllib.request
from typing import Any

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
    return samples(fetch(b, path))


def scrape_api(api: Any, path: str = "/metrics") -> Samples:
    """The samples the management listener's own metrics endpoint answers
    (``api``: httphelp.Api, or harness.http()'s in-memory one)."""
    reply = api.anonymous().request("GET", path)
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples(reply.body.decode())


def samples(text: str) -> Samples:
    """An exposition's samples, by name: (labels, value) each."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: Samples, name: str, **labels: str) -> float:
    [v] = [v for got, v in metrics[name] if got == labels]
    return v
