"""What x-delivery-count a quorum queue shows after returns of each kind, asked
of a broker: a basic.nack (requeue), then a return by a closing channel, with
and without a clean restart of the broker between them and the next delivery.

Record RabbitMQ's answers (a private node, tests/rabbitmq_proc.py)::

    python tools/quorum_counts.py --json tests/data/rabbitmq_quorum_counts.json

tests/core/test_quorum_delivery_counts.py runs the same :func:`scenario` against
Warren, restarted on the same data directory, and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

#: A restart: the broker stopped cleanly and started again on the same data.
Restart = Callable[[], None]
Connect = Callable[[], pika.BlockingConnection]


def _count(props: Any) -> Any:
    return (props.headers or {}).get("x-delivery-count")


def _get(conn: pika.BlockingConnection, queue: str) -> tuple[Any, Any]:
    """basic.get the queue's message; a restarted RabbitMQ may need a moment to
    elect the queue's leader, so an empty answer is asked again (for a while)."""
    ch = conn.channel()
    deadline = time.monotonic() + 30
    while True:
        method, props, _body = ch.basic_get(queue)
        if method is not None:
            return ch, (method, props)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue}: the message never came back")
        conn.sleep(0.2)


def scenario(connect: Connect, queue: str, restart: Restart | None) -> list[Any]:
    """The x-delivery-count of each delivery of one message: got and nacked,
    consumed and given back by its closing channel, (the broker restarted,)
    got and nacked, got again."""
    conn = connect()
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"m")
    seen = []
    ch, (method, props) = _get(conn, queue)
    seen.append(_count(props))
    ch.basic_nack(method.delivery_tag, requeue=True)
    consumer = conn.channel()
    got: list[Any] = []
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(queue, lambda _c, _m, props, _b: got.append(_count(props)))
    while not got:
        conn.process_data_events(1)
    seen.append(got[0])
    consumer.close()  # gives the message back
    ch.queue_declare(queue, passive=True)  # a round trip after the close
    conn.close()
    if restart is not None:
        restart()
    conn = connect()
    ch, (method, props) = _get(conn, queue)
    seen.append(_count(props))
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch, (method, props) = _get(conn, queue)
    seen.append(_count(props))
    ch.basic_ack(method.delivery_tag)
    ch.queue_delete(queue)
    conn.close()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the answers")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from rabbitmq_proc import RabbitMQ  # noqa: PLC0415 - tests/ is not a package here

    with tempfile.TemporaryDirectory() as tmp:
        server = RabbitMQ(Path(tmp))
        try:

            def connect() -> pika.BlockingConnection:
                return pika.BlockingConnection(pika.URLParameters(server.url))

            answers = {
                "running": scenario(connect, "qc-running", None),
                "restarted": scenario(connect, "qc-restarted", server.restart),
            }
            conn = connect()
            version = str(conn._impl.server_properties["version"])
            conn.close()
        finally:
            server.stop()
    document = {"rabbitmq_version": version, **answers}
    args.json.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
