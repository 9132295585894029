"""Record RabbitMQ's Prometheus families into tests/data/rabbitmq_prometheus_families.json.

Run by hand (needs Debian's rabbitmq-server): ``python tests/record_rabbitmq_prometheus.py``.
Starts a private RabbitMQ with the prometheus plugin (rabbitmq_proc.py), gives it
a little traffic, and keeps, for each of its three endpoints, every family's
type, help and label names (not values): what tests/http/test_metrics.py compares
Warren's families with.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import pika
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
import rabbitmq_proc  # noqa: E402

OUT = Path(__file__).parent / "data" / "rabbitmq_prometheus_families.json"
DETAILED = ["queue_coarse_metrics", "queue_metrics", "queue_consumer_count", "connection_coarse_metrics", "connection_metrics", "channel_metrics", "channel_exchange_metrics", "channel_queue_metrics", "channel_queue_exchange_metrics", "connection_churn_metrics", "node_coarse_metrics", "node_metrics", "node_persister_metrics", "auth_attempt_metrics", "vhost_status", "exchange_bindings", "exchange_names"]


def families(text: str) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = sorted({k for s in fam.samples for k in s.labels})
        out[name] = {"type": fam.type, "help": fam.documentation, "labels": labels}
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = rabbitmq_proc.RabbitMQ(
            Path(tmp), plugins=["rabbitmq_management", "rabbitmq_prometheus"]
        )
        try:
            conn = pika.BlockingConnection(pika.URLParameters(node.url))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("q")
            ch.exchange_declare("x", "fanout")
            ch.queue_bind("q", "x")
            for _ in range(3):
                ch.basic_publish("x", "", b"m")
            ch.basic_get("q", auto_ack=False)
            base = f"http://127.0.0.1:{node.prometheus_port}"
            query = "&".join(f"family={f}" for f in DETAILED)
            record = {
                "source": "RabbitMQ 3.10.8 (Debian) with rabbitmq_prometheus, "
                "recorded by tests/record_rabbitmq_prometheus.py",
                "endpoints": {
                    path: families(urllib.request.urlopen(base + path).read().decode())
                    for path in ("/metrics", "/metrics/per-object", f"/metrics/detailed?{query}")
                },
            }
            conn.close()
        finally:
            node.stop()
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
