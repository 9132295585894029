"""Record RabbitMQ's per-channel series by exchange and queue into
tests/data/rabbitmq_prometheus_channel_series.json.

Run by hand (needs Debian's rabbitmq-server):
``python tests/record_rabbitmq_channel_series.py``. Starts a private RabbitMQ
with the management and prometheus plugins (rabbitmq_proc.py), runs
tests/prometheus_channel_scenario.py's client script and keeps the samples of
its families, with values, from /metrics, /metrics/per-object and the
detailed endpoint's three per-channel groups: what
tests/http/test_metrics_channels.py compares Warren's with.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).parent))
import prometheus_channel_scenario as scenario  # noqa: E402
import rabbitmq_proc  # noqa: E402

OUT = Path(__file__).parent / "data" / "rabbitmq_prometheus_channel_series.json"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = rabbitmq_proc.RabbitMQ(
            Path(tmp), plugins=["rabbitmq_management", "rabbitmq_prometheus"]
        )
        try:
            conn = pika.BlockingConnection(pika.URLParameters(node.url))
            scenario.run(conn, "scenario")
            base = f"http://127.0.0.1:{node.prometheus_port}"
            endpoints = {}
            for path, prefix in (
                ("/metrics", "rabbitmq_"),
                ("/metrics/per-object", "rabbitmq_"),
                (scenario.DETAILED, "rabbitmq_detailed_"),
            ):
                text = urllib.request.urlopen(base + path).read().decode()
                endpoints[path] = scenario.reduce(text, prefix)
            conn.close()
        finally:
            node.stop()
    record = {
        "source": "RabbitMQ 3.10.8 (Debian) with rabbitmq_management and rabbitmq_prometheus, "
        "tests/prometheus_channel_scenario.py's traffic, recorded by "
        "tests/record_rabbitmq_channel_series.py",
        "endpoints": endpoints,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
