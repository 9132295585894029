"""Argument parsing for ``warren perf`` and its subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["build_parser", "main"]

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_STREAM_URI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"

_N = TypeVar("_N", int, float)
_P = TypeVar("_P", bound="DataclassInstance")


class _Checked(Protocol):
    def check(self) -> str | None: ...


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


def _add_amqp_uri(a: argparse.ArgumentParser) -> None:
    a.add_argument("--uri", default=DEFAULT_URI, help=f"broker URI (default: {DEFAULT_URI})")


def _add_publishers(a: argparse.ArgumentParser) -> None:
    a.add_argument("-x", "--publishers", type=_count, default=1, metavar="N", help="default 1")


def _add_rate(a: argparse.ArgumentParser) -> None:
    a.add_argument(
        "-r", "--rate", type=_count, default=0, metavar="N", help="msgs/s per publisher (0 = max)"
    )


def _add_time(a: argparse.ArgumentParser) -> None:
    a.add_argument("-z", "--time", type=_seconds, default=0.0, metavar="SECONDS", help="run time")


def _add_consumers(a: argparse.ArgumentParser) -> None:
    a.add_argument("-y", "--consumers", type=_count, default=1, metavar="N", help="default 1")


def _add_size(a: argparse.ArgumentParser, what: str = "body") -> None:
    a.add_argument(
        "-s", "--size", type=_count, default=16, metavar="BYTES", help=f"{what} size, default 16"
    )


def _add_count(a: argparse.ArgumentParser, text: str) -> None:
    """``-C``: how many messages each publisher sends before the run ends."""
    a.add_argument("-C", "--count", type=_count, default=0, metavar="N", help=text)


def _add_broker_memory(a: argparse.ArgumentParser) -> None:
    """``--pid`` and ``--settle`` of the tools that report the broker's memory."""
    a.add_argument("--pid", type=int, metavar="PID", help="the broker's pid, for memory figures")
    a.add_argument(
        "--settle", type=_seconds, default=1.0, metavar="SECONDS", help="wait before reading memory"
    )


def _add_json(a: argparse.ArgumentParser, what: str) -> None:
    a.add_argument("--json", action="store_true", help=f"print the {what} as one JSON object")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warren perf",
        description="Load tests for AMQP 0-9-1 brokers (Warren, RabbitMQ, ...), AMQP 1.0 "
        "brokers, MQTT brokers (Warren, mosquitto, ...) and RabbitMQ stream protocol brokers. "
        "Each publisher and consumer of `throughput`, `amqp1`, `mqtt` and `stream` runs in "
        "its own process.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    t = sub.add_parser(
        "throughput",
        help="publish and consume, report msg/s and latency",
        description="Publish and consume as fast as possible (or at --rate); print the rates "
        "once a second and a summary at the end. Without -z, -C, -D or --drain it runs "
        "until Ctrl-C. "
        "Latency is measured from a send timestamp in the first 8 bytes of each body "
        "(bodies under 8 bytes: no latency).",
    )
    _add_amqp_uri(t)
    _add_publishers(t)
    t.add_argument(
        "-y",
        "--consumers",
        type=_count,
        default=1,
        metavar="N",
        help="default 1 (with --queues: consumers per queue). -y 0 without --queue/--queues "
        "declares no queue, so the broker drops every message: the publishers' ceiling",
    )
    _add_size(t)
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
    acks = t.add_mutually_exclusive_group()
    acks.add_argument(
        "-a",
        "-A",
        "--ack",
        "--multi-ack",
        "--multi-ack-every",
        dest="ack",
        type=_count,
        default=0,
        metavar="N",
        help="manual acks, basic.ack multiple=true every N messages (0 = no-ack consumers)",
    )
    acks.add_argument(
        "--single-ack",
        action="store_true",
        help="manual acks, one basic.ack multiple=false per message (as most applications)",
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
    _add_rate(t)
    _add_time(t)
    t.add_argument(
        "-C",
        "--pmessages",
        type=_count,
        default=0,
        metavar="N",
        help="messages per publisher; stop once all are consumed",
    )
    t.add_argument(
        "-D",
        "--cmessages",
        type=_count,
        default=0,
        metavar="N",
        help="messages per consumer: each stops after N (manual acks: the rest stay queued); "
        "the run ends once all have",
    )
    t.add_argument(
        "--drain",
        action="store_true",
        help="with -x 0: consume the messages the queues hold at the start, report the "
        "drain rate, and stop once they are consumed",
    )
    t.add_argument(
        "--keep", action="store_true", help="do not delete the queues/exchange at the end"
    )
    _add_json(t, "summary")

    c = sub.add_parser(
        "connection-count",
        help="open many connections, report the broker's memory",
        description="Open N connections, M channels on each and K consumers per channel (each "
        "on its own server-named exclusive queue); report the time taken and the broker's "
        "VmRSS/RssAnon from /proc/PID/status.",
    )
    _add_amqp_uri(c)
    c.add_argument(
        "-n", "--connections", type=_positive, default=100, metavar="N", help="default 100"
    )
    c.add_argument(
        "--channels", type=_count, default=1, metavar="M", help="per connection, default 1"
    )
    c.add_argument(
        "--consumers", type=_count, default=0, metavar="K", help="per channel, default 0"
    )
    _add_broker_memory(c)
    c.add_argument(
        "--hold", type=_seconds, default=0.0, metavar="SECONDS", help="keep them open this long"
    )
    _add_json(c, "result")

    q = sub.add_parser(
        "queue-count",
        help="declare many queues, report the time and the broker's memory",
        description="Declare N queues (pipelined), report the time taken and the broker's "
        "VmRSS/RssAnon, then delete them again (unless --keep).",
    )
    _add_amqp_uri(q)
    q.add_argument("-n", "--queues", type=_positive, default=1000, metavar="N", help="default 1000")
    q.add_argument("--durable", action="store_true", help="durable queues")
    q.add_argument("--prefix", default="perf-q-", help="queue name prefix (default perf-q-)")
    _add_broker_memory(q)
    q.add_argument("--keep", action="store_true", help="do not delete the queues afterwards")
    _add_json(q, "result")
    _add_mqtt_parsers(sub)
    _add_amqp1_parser(sub)
    _add_stream_parser(sub)
    return p


def _add_stream_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser(
        "stream",
        help="stream protocol producers and consumers, report msg/s and latency",
        description="RabbitMQ stream protocol load (Warren's [stream] port, RabbitMQ's "
        "rabbitmq_stream): producer connections publish with confirms into --stream, "
        "consumers subscribe to it with chunk credit, each in its own process. The stream "
        "is created (and deleted at the end if this run created it). Every consumer reads "
        "every message. Prints rates once a second and a summary; without -z or -C it runs "
        "until Ctrl-C. Latency is measured from a send timestamp in the first 8 bytes of "
        "each body: by default a chunk's first record's, counted for all its records.",
    )
    a.add_argument(
        "--uri",
        default=DEFAULT_STREAM_URI,
        help="broker URI (default: " + DEFAULT_STREAM_URI.replace("%", "%%") + ")",
    )
    a.add_argument(
        "-x", "--producers", type=_count, default=1, metavar="N", help="connections, default 1"
    )
    a.add_argument(
        "--publishers-per-connection",
        type=_positive,
        default=1,
        metavar="N",
        help="publishers declared on each producer connection, sent batches in turn",
    )
    _add_consumers(a)
    _add_size(a)
    a.add_argument(
        "-b",
        "--batch",
        type=_positive,
        default=100,
        metavar="N",
        help="messages per Publish frame (default 100)",
    )
    a.add_argument(
        "-c",
        "--confirm",
        type=_count,
        default=10_000,
        metavar="N",
        help="at most N messages per connection awaiting their confirm (default 10000; "
        "0 = no limit)",
    )
    a.add_argument(
        "-q",
        "--credit",
        type=_positive,
        default=10,
        metavar="N",
        help="chunks granted to each subscription at the start, one more per chunk (default 10)",
    )
    a.add_argument("--offset", choices=("first", "last", "next"), default="next")
    a.add_argument(
        "--decode",
        action="store_true",
        help="consumers locate every record of a chunk (each its own latency) rather "
        "than reading the chunk header alone",
    )
    a.add_argument("--stream", default="perf-stream", metavar="NAME", help="default perf-stream")
    a.add_argument(
        "--max-length-bytes", type=_count, default=0, metavar="N", help="when creating the stream"
    )
    a.add_argument("--keep", action="store_true", help="do not delete the stream at the end")
    _add_rate(a)
    _add_time(a)
    _add_count(a, "messages per producer connection; stop once every consumer has all")
    _add_json(a, "summary")


def _add_amqp1_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser(
        "amqp1",
        help="AMQP 1.0 senders and receivers, report msg/s and latency",
        description="AMQP 1.0 load: senders attach to the queue (or --exchange), receivers "
        "attach to the queue with --credit, each in its own process. The queue is declared "
        "(and deleted at the end) over AMQP 0-9-1 on the same port. Prints rates once a "
        "second and a summary; without -z or -C it runs until Ctrl-C. Latency is measured "
        "from a send timestamp in the first 8 bytes of each body.",
    )
    _add_amqp_uri(a)
    _add_publishers(a)
    _add_consumers(a)
    _add_size(a)
    a.add_argument(
        "-c",
        "--confirm",
        type=_count,
        default=0,
        metavar="N",
        help="unsettled transfers, at most N awaiting the broker's disposition "
        "(0 = pre-settled transfers)",
    )
    a.add_argument(
        "-q",
        "--credit",
        type=_positive,
        default=1000,
        metavar="N",
        help="link credit per receiver, topped up once half is used (default 1000)",
    )
    a.add_argument(
        "-a",
        "--ack",
        type=_count,
        default=0,
        metavar="N",
        help="receivers accept deliveries as one range every N (0 = the broker pre-settles)",
    )
    a.add_argument("-p", "--persistent", action="store_true", help="header durable=true")
    a.add_argument("--queue", default="perf-test", metavar="NAME", help="default perf-test")
    a.add_argument("--durable", action="store_true", help="declare a durable queue")
    a.add_argument(
        "-e",
        "--exchange",
        default="",
        metavar="NAME",
        help="send to this (existing) exchange, the queue bound to it with -k",
    )
    a.add_argument("-k", "--routing-key", metavar="KEY", help="default: the queue name")
    a.add_argument(
        "--addresses",
        choices=("v1", "v2"),
        default="v2",
        help="v2 (default): /queues/Q, /exchanges/X/K (Warren, RabbitMQ 4); "
        "v1: /amq/queue/Q, /exchange/X/K (RabbitMQ 3.x's rabbitmq_amqp1_0)",
    )
    a.add_argument(
        "--no-declare",
        dest="declare",
        action="store_false",
        help="the queue exists: no AMQP 0-9-1 connection to declare and delete it",
    )
    a.add_argument("--keep", action="store_true", help="do not delete the queue at the end")
    _add_rate(a)
    _add_time(a)
    _add_count(a, "messages per sender; stop once all are received")
    _add_json(a, "summary")


def _add_mqtt_target(a: argparse.ArgumentParser) -> None:
    """The broker options shared by ``mqtt`` and ``mqtt-idle``."""
    a.add_argument(
        "--uri",
        metavar="URI",
        help="mqtt://[user:password@]host[:port]; overrides --host/--port/--username/--password",
    )
    a.add_argument("--host", default="127.0.0.1", help="broker host (default 127.0.0.1)")
    a.add_argument("--port", type=_count, default=1883, help="broker port (default 1883)")
    a.add_argument("--username", metavar="NAME")
    a.add_argument("--password", metavar="PASSWORD")
    a.add_argument(
        "--protocol",
        type=int,
        choices=(4, 5),
        default=4,
        help="4 = MQTT 3.1.1 (default), 5 = MQTT 5",
    )


def _add_mqtt_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser(
        "mqtt",
        help="MQTT publishers and subscribers, report msg/s and latency",
        description="MQTT load: every subscriber subscribes to --topic, every publisher "
        "publishes to it, each in its own process. Prints rates once a second and a summary. "
        "Without --time or --count it runs until Ctrl-C. QoS 1/2 publishers keep at most "
        "--inflight messages unacknowledged, never more than an MQTT 5 broker's Receive "
        "Maximum.",
    )
    _add_mqtt_target(m)
    m.add_argument("--qos", type=int, choices=(0, 1, 2), default=0, help="default 0")
    _add_publishers(m)
    m.add_argument("-y", "--subscribers", type=_count, default=1, metavar="N", help="default 1")
    _add_size(m, "payload")
    m.add_argument("--topic", default="perf/test", help="topic name (default perf/test)")
    _add_time(m)
    _add_count(m, "messages per publisher; stop once all are received (or none arrived for 5 s)")
    _add_rate(m)
    m.add_argument(
        "--inflight",
        type=_positive,
        default=1024,
        metavar="N",
        help="QoS 1/2: unacknowledged messages per publisher (default 1024; capped by the "
        "broker's Receive Maximum in MQTT 5)",
    )
    session = m.add_mutually_exclusive_group()
    session.add_argument(
        "--clean-session",
        dest="clean_session",
        action="store_true",
        default=True,
        help="clean session / clean start (default)",
    )
    session.add_argument(
        "--persistent",
        dest="clean_session",
        action="store_false",
        help="persistent sessions (MQTT 5: session expiry 1 h); dropped again at the end",
    )
    m.add_argument(
        "--latency",
        action="store_true",
        help="send timestamps in the payload (first 8 bytes) and report end-to-end latency",
    )
    m.add_argument(
        "--keepalive", type=_count, default=0, metavar="SECONDS", help="default 0 (none)"
    )
    _add_json(m, "summary")

    i = sub.add_parser(
        "mqtt-idle",
        help="hold many idle MQTT connections, report the broker's memory",
        description="Open N MQTT connections (CONNECT/CONNACK, keep-alive 0 by default) "
        "and hold them. Beyond 25,000 connections to a loopback broker they are spread over "
        "source addresses 127.0.0.1, 127.0.0.2, ...; the open-file limit is raised as far "
        "as allowed (as root up to /proc/sys/fs/nr_open).",
    )
    _add_mqtt_target(i)
    i.add_argument(
        "-n", "--connections", type=_positive, default=1000, metavar="N", help="default 1000"
    )
    i.add_argument(
        "--hold",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="hold them this long (default 0: until SIGINT/SIGTERM)",
    )
    i.add_argument(
        "--keepalive",
        type=_count,
        default=0,
        metavar="SECONDS",
        help="keep-alive in CONNECT (default 0: none); > 0 sends PINGREQ every half of it",
    )
    i.add_argument(
        "--concurrency",
        type=_positive,
        default=500,
        metavar="N",
        help="handshakes in progress at once (default 500)",
    )
    i.add_argument(
        "--sources",
        type=_count,
        default=0,
        metavar="N",
        help="source addresses 127.0.0.1..N (default: one per 25,000 connections)",
    )
    _add_broker_memory(i)
    i.add_argument(
        "--ready",
        action="store_true",
        help="print 'READY <connected> <failed>' on stdout once all handshakes are over",
    )
    _add_json(i, "result")


def _mqtt_target(args: argparse.Namespace) -> dict[str, object]:
    target: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "username": args.username,
        "password": args.password,
    }
    if args.uri:
        from warren.perf.mqtt import parse_uri

        for key, value in parse_uri(args.uri).items():
            if value is not None:
                target[key] = value
    return target


def _params(cls: type[_P], args: argparse.Namespace, **given: object) -> _P:
    """A parameters dataclass with each field from the argument of the same name, unless
    ``given`` (fields without an argument keep their default)."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    values.update(given)
    return cls(**values)


def _checked_run(args: argparse.Namespace, params: _Checked, run: Callable[..., int]) -> int:
    """``run(params)``, or 2 with the reason on stderr when ``params.check()`` refuses."""
    problem = params.check()
    if problem:
        print(f"warren perf {args.command}: {problem}", file=sys.stderr)
        return 2
    return run(params, as_json=args.json)


def _main_mqtt(args: argparse.Namespace) -> int:
    try:
        target = _mqtt_target(args)
    except ValueError as exc:
        print(f"warren perf {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "mqtt-idle":
        from warren.perf.mqtt_idle import IdleParams
        from warren.perf.mqtt_idle import run as run_idle

        return run_idle(_params(IdleParams, args, **target), as_json=args.json)
    from warren.perf.mqtt import MQTTParams
    from warren.perf.mqtt import run as run_mqtt

    return _checked_run(args, _params(MQTTParams, args, **target), run_mqtt)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help or a usage error
        return exc.code if isinstance(exc.code, int) else 2
    if args.command in ("mqtt", "mqtt-idle"):
        return _main_mqtt(args)
    if args.command == "amqp1":
        from warren.perf.amqp1 import AMQP1Params
        from warren.perf.amqp1 import run as run_amqp1

        return _checked_run(args, _params(AMQP1Params, args), run_amqp1)
    if args.command == "stream":
        from warren.perf.stream import StreamParams
        from warren.perf.stream import run as run_stream

        return _checked_run(args, _params(StreamParams, args), run_stream)
    if args.command == "throughput":
        from warren.perf.throughput import ThroughputParams, run

        if args.publishers == 0 and args.consumers == 0:
            print("warren perf throughput: nothing to do with -x 0 -y 0", file=sys.stderr)
            return 2
        if args.drain and (args.publishers or not args.consumers):
            print("warren perf throughput: --drain needs -x 0 and consumers", file=sys.stderr)
            return 2
        if args.ack and args.prefetch and args.ack > args.prefetch:
            print(
                f"warren perf throughput: note: --ack {args.ack} > --prefetch {args.prefetch}: "
                "consumers ack early whenever they run dry",
                file=sys.stderr,
            )
        return run(_params(ThroughputParams, args), as_json=args.json)
    if args.command == "connection-count":
        from warren.perf.connections import ConnectionParams
        from warren.perf.connections import run as run_connections

        return run_connections(_params(ConnectionParams, args), as_json=args.json)
    from warren.perf.queues import QueueParams
    from warren.perf.queues import run as run_queues

    return run_queues(_params(QueueParams, args), as_json=args.json)
