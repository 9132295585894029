"""Record the PromQL of RabbitMQ's Grafana dashboards into
tests/data/rabbitmq_grafana_promql.json.

Run by hand: ``python tests/record_grafana_promql.py <rabbitmq-server git dir>``
(a clone of rabbitmq/rabbitmq-server, or its bare mirror). Keeps, for
RabbitMQ-Overview.json and RabbitMQ-Stream.json at each tag in TAGS, only
the panels' titles, types, expressions and legend formats and the template
variables' queries: what tests/http/test_prometheus_server.py evaluates against
Warren through a real Prometheus. The 3.13 dashboards are kept under their
file names, later ones under ``<file> (<tag>)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "rabbitmq_grafana_promql.json"
DIR = "deps/rabbitmq_prometheus/docker/grafana/dashboards"
DASHBOARDS = ("RabbitMQ-Overview.json", "RabbitMQ-Stream.json")
#: 3.13's, and 4.3's: from 4.1 on the dashboards select on identity_info's
#: rabbitmq_endpoint label.
TAGS = ("v3.13.7", "v4.3.5")


def extract(dashboard: dict[str, Any]) -> dict[str, Any]:
    variables: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            variables[var["name"]] = query["query"] if isinstance(query, dict) else query
    targets: list[dict[str, str]] = []

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            for target in panel.get("targets") or []:
                if "expr" in target:
                    targets.append(
                        {
                            "title": panel.get("title", ""),
                            "type": panel.get("type", ""),
                            "expr": target["expr"],
                            "legend": target.get("legendFormat", ""),
                        }
                    )
            panels(panel.get("panels") or [])

    panels(dashboard.get("panels", []))
    return {"variables": variables, "targets": targets}


def main() -> None:
    git_dir = sys.argv[1]
    dashboards: dict[str, Any] = {}
    for tag in TAGS:
        for name in DASHBOARDS:
            text = subprocess.run(
                ["git", "--git-dir", git_dir, "show", f"{tag}:{DIR}/{name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            key = name if tag == TAGS[0] else f"{name} ({tag})"
            dashboards[key] = extract(json.loads(text))
    record = {
        "source": "PromQL expressions and template variables of RabbitMQ's Grafana "
        "dashboards RabbitMQ-Overview.json and RabbitMQ-Stream.json, "
        f"rabbitmq/rabbitmq-server (tags {', '.join(TAGS)}), {DIR}/. Copyright (c) "
        "2007-2026 Broadcom; licensed under the Mozilla Public License 2.0 "
        "(https://mozilla.org/MPL/2.0/). Only the expressions, the panels' titles and "
        "legend formats, and the variable queries are kept here; "
        "tests/http/test_prometheus_server.py evaluates them against Warren through a real "
        "Prometheus. Recorded by tests/record_grafana_promql.py.",
        "dashboards": dashboards,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
