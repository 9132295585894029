"""Record RabbitMQ's 406 texts for redeclarations whose arguments differ by
presence, one AMQP wire type per case (tests/arg_types_scenario.py), into
tests/data/rabbitmq_arg_types.json, which tests/protocol/amqp/test_arg_type_names.py
holds Warren to.

Run by hand (needs Debian's rabbitmq-server): ``python tests/record_rabbitmq_arg_types.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import arg_types_scenario  # noqa: E402
import rabbitmq_proc  # noqa: E402
from rawamqp import RawAMQP  # noqa: E402

OUT = Path(__file__).parent / "data" / "rabbitmq_arg_types.json"


def record(port: int) -> dict[str, list[str]]:
    with RawAMQP(port) as client:
        client.handshake()
        client.open_channel(1)
        observed = arg_types_scenario.run(client)
        client.close()
    return observed


def main() -> None:
    if len(sys.argv) > 1:  # the port of a RabbitMQ already running
        observed = record(int(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            node = rabbitmq_proc.RabbitMQ(Path(tmp))
            try:
                observed = record(node.port)
            finally:
                node.stop()
    OUT.write_text(
        json.dumps({"rabbitmq": "3.10.8", "outcomes": observed}, indent=2, ensure_ascii=False)
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
