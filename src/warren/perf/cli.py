"""Argument parsing for ``warren perf`` and its subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["build_parser", "main"]

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/"

_N = TypeVar("_N", int, float)


def _non_negative(text: str, parse: Callable[[str], _N], what: str) -> _N:
    """``parse(text)``, refused as an argument error unless it is a number ``>= 0``."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _count(text: str) -> int:
    """A non-negative integer argument."""
    return _non_negative(text, int, "an integer")


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _seconds(text: str) -> float:
    return _non_negative(text, float, "a number")


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warren perf",
        description="Load tests for AMQP 0-9-1 brokers (Warren, RabbitMQ, ...). Each "
        "publisher and consumer of `throughput` runs in its own process.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    t = sub.add_parser(
        "throughput",
        help="publish and consume, report msg/s and latency",
        description="Publish and consume as fast as possible (or at --rate); print the rates "
        "once a second and a summary at the end. Without -z or -C it runs until Ctrl-C. "
        "Latency is measured from a send timestamp in the first 8 bytes of each body "
        "(bodies under 8 bytes: no latency).",
    )
    t.add_argument("--uri", default=DEFAULT_URI, help=f"broker URI (default: {DEFAULT_URI})")
    t.add_argument("-x", "--publishers", type=_count, default=1, metavar="N", help="default 1")
    t.add_argument(
        "-y",
        "--consumers",
        type=_count,
        default=1,
        metavar="N",
        help="default 1 (with --queues: consumers per queue). -y 0 without --queue/--queues "
        "declares no queue, so the broker drops every message: the publishers' ceiling",
    )
    t.add_argument(
        "-s", "--size", type=_count, default=16, metavar="BYTES", help="body size, default 16"
    )
    t.add_argument(
        "-c",
        "--confirm",
        type=_count,
        default=0,
        metavar="N",
        help="publisher confirms with at most N unconfirmed messages (0 = no confirms)",
    )
    t.add_argument("-p", "--persistent", action="store_true", help="delivery_mode 2")
    t.add_argument(
        "-q", "--prefetch", type=_count, default=0, metavar="N", help="basic.qos (0 = no limit)"
    )
    t.add_argument(
        "-a",
        "--ack",
        "--multi-ack",
        dest="ack",
        type=_count,
        default=0,
        metavar="N",
        help="manual acks, multiple=true every N messages (0 = no-ack consumers)",
    )
    t.add_argument("--queue", metavar="NAME", help="queue name (default perf-test)")
    t.add_argument(
        "--queue-args", type=_json_object, metavar="JSON", help="e.g. '{\"x-max-length\": 1000}'"
    )
    t.add_argument("--durable", action="store_true", help="durable queues and exchange")
    t.add_argument(
        "-e",
        "--exchange",
        default="",
        metavar="NAME",
        help="exchange (default: the default exchange)",
    )
    t.add_argument(
        "-t",
        "--exchange-type",
        metavar="TYPE",
        help="type when declaring -e (default direct; fanout for --queues without -e)",
    )
    t.add_argument(
        "-k",
        "--routing-key",
        metavar="KEY",
        help="default: the queue name with the default exchange, else empty",
    )
    t.add_argument(
        "--queues",
        type=_count,
        default=0,
        metavar="N",
        help="fanout: N queues bound to the exchange, -y consumers on each",
    )
    t.add_argument(
        "-r", "--rate", type=_count, default=0, metavar="N", help="msgs/s per publisher (0 = max)"
    )
    t.add_argument("-z", "--time", type=_seconds, default=0.0, metavar="SECONDS", help="run time")
    t.add_argument(
        "-C",
        "--pmessages",
        type=_count,
        default=0,
        metavar="N",
        help="messages per publisher; stop once all are consumed",
    )
    t.add_argument(
        "--keep", action="store_true", help="do not delete the queues/exchange at the end"
    )
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    c = sub.add_parser(
        "connection-count",
        help="open many connections, report the broker's memory",
        description="Open N connections, M channels on each and K consumers per channel (each "
        "on its own server-named exclusive queue); report the time taken and the broker's "
        "VmRSS/RssAnon from /proc/PID/status.",
    )
    c.add_argument("--uri", default=DEFAULT_URI, help=f"broker URI (default: {DEFAULT_URI})")
    c.add_argument(
        "-n", "--connections", type=_positive, default=100, metavar="N", help="default 100"
    )
    c.add_argument(
        "--channels", type=_count, default=1, metavar="M", help="per connection, default 1"
    )
    c.add_argument(
        "--consumers", type=_count, default=0, metavar="K", help="per channel, default 0"
    )
    c.add_argument("--pid", type=int, metavar="PID", help="the broker's pid, for memory figures")
    c.add_argument(
        "--settle", type=_seconds, default=1.0, metavar="SECONDS", help="wait before reading memory"
    )
    c.add_argument(
        "--hold", type=_seconds, default=0.0, metavar="SECONDS", help="keep them open this long"
    )
    c.add_argument("--json", action="store_true", help="print the result as one JSON object")

    q = sub.add_parser(
        "queue-count",
        help="declare many queues, report the time and the broker's memory",
        description="Declare N queues (pipelined), report the time taken and the broker's "
        "VmRSS/RssAnon, then delete them again (unless --keep).",
    )
    q.add_argument("--uri", default=DEFAULT_URI, help=f"broker URI (default: {DEFAULT_URI})")
    q.add_argument("-n", "--queues", type=_positive, default=1000, metavar="N", help="default 1000")
    q.add_argument("--durable", action="store_true", help="durable queues")
    q.add_argument("--prefix", default="perf-q-", help="queue name prefix (default perf-q-)")
    q.add_argument("--pid", type=int, metavar="PID", help="the broker's pid, for memory figures")
    q.add_argument(
        "--settle", type=_seconds, default=1.0, metavar="SECONDS", help="wait before reading memory"
    )
    q.add_argument("--keep", action="store_true", help="do not delete the queues afterwards")
    q.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help or a usage error
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "throughput":
        from warren.perf.throughput import ThroughputParams, run

        if args.publishers == 0 and args.consumers == 0:
            print("warren perf throughput: nothing to do with -x 0 -y 0", file=sys.stderr)
            return 2
        if args.ack and args.prefetch and args.ack > args.prefetch:
            print(
                f"warren perf throughput: note: --ack {args.ack} > --prefetch {args.prefetch}: "
                "consumers ack early whenever they run dry",
                file=sys.stderr,
            )
        params = ThroughputParams(
            uri=args.uri,
            publishers=args.publishers,
            consumers=args.consumers,
            size=args.size,
            confirm=args.confirm,
            persistent=args.persistent,
            prefetch=args.prefetch,
            ack=args.ack,
            queue=args.queue,
            queue_args=args.queue_args,
            durable=args.durable,
            exchange=args.exchange,
            exchange_type=args.exchange_type,
            routing_key=args.routing_key,
            queues=args.queues,
            rate=args.rate,
            time=args.time,
            pmessages=args.pmessages,
            keep=args.keep,
        )
        return run(params, as_json=args.json)
    if args.command == "connection-count":
        from warren.perf.connections import ConnectionParams
        from warren.perf.connections import run as run_connections

        return run_connections(
            ConnectionParams(
                uri=args.uri,
                connections=args.connections,
                channels=args.channels,
                consumers=args.consumers,
                pid=args.pid,
                settle=args.settle,
                hold=args.hold,
            ),
            as_json=args.json,
        )
    from warren.perf.queues import QueueParams
    from warren.perf.queues import run as run_queues

    return run_queues(
        QueueParams(
            uri=args.uri,
            queues=args.queues,
            durable=args.durable,
            prefix=args.prefix,
            pid=args.pid,
            settle=args.settle,
            keep=args.keep,
        ),
        as_json=args.json,
    )
