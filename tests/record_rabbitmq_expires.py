"""Record whether RabbitMQ renews a queue's x-expires on use, into
tests/data/rabbitmq_expires_renewal.json (what tests/core/test_queue_expires.py holds
Warren to).

Run by hand (needs Debian's rabbitmq-server): ``python tests/record_rabbitmq_expires.py``.
For a classic and a quorum queue with ``x-expires`` 2 s, it repeats one use
(queue.declare again, a passive queue.declare, basic.get) every 0.5 s for 9 s:
the queue (a marker message in it: not one a later declare made anew) is
alive afterwards exactly when that use renews its expiry. It waits
for the wall clock, which only a recording may do.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).parent))
import rabbitmq_proc  # noqa: E402

OUT = Path(__file__).parent / "data" / "rabbitmq_expires_renewal.json"
USES = ("declare", "passive_declare", "basic_get")
EXPIRES_MS = 2000


def renews(conn: pika.BlockingConnection, kind: str, use: str) -> bool:
    ch = conn.channel()
    name = f"expires-{kind}-{use}"
    arguments: dict[str, object] = {"x-expires": EXPIRES_MS}
    if kind == "quorum":
        arguments["x-queue-type"] = "quorum"
    ch.queue_declare(name, durable=True, arguments=arguments)
    # A marker: a queue.declare after an expiry would make a new, empty queue.
    ch.basic_publish("", name, b"marker")
    start = time.monotonic()
    try:
        # Long enough for a quorum queue, whose expiry is looked at on its
        # periodic tick (about 5 s in 3.10), not at the moment it is due.
        while time.monotonic() - start < 4.5 * EXPIRES_MS / 1000:
            time.sleep(EXPIRES_MS / 4000)
            if use == "declare":
                ch.queue_declare(name, durable=True, arguments=arguments)
            elif use == "passive_declare":
                ch.queue_declare(name, passive=True)
            else:
                method, _props, _body = ch.basic_get(name)
                if method is not None:
                    ch.basic_reject(method.delivery_tag, requeue=True)
    except pika.exceptions.ChannelClosedByBroker:  # 404: it expired meanwhile
        return False
    try:
        ok = ch.queue_declare(name, passive=True)  # after ch's own reject, in order
    except pika.exceptions.ChannelClosedByBroker:
        return False
    ch.queue_delete(name)
    # Only queue.declare could have made it anew (empty); the count is read only
    # then, since a reject just before may not be counted yet (a quorum queue).
    return use != "declare" or bool(ok.method.message_count == 1)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = rabbitmq_proc.RabbitMQ(Path(tmp))
        try:
            conn = pika.BlockingConnection(pika.URLParameters(node.url))
            observed = {
                kind: {use: renews(conn, kind, use) for use in USES}
                for kind in ("classic", "quorum")
            }
            conn.close()
        finally:
            node.stop()
    OUT.write_text(
        json.dumps(
            {
                "recorded by": "tests/record_rabbitmq_expires.py",
                "rabbitmq": "3.10 (Debian)",
                "renews": observed,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
