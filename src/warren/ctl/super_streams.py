"""``warren ctl super-streams add|delete``: RabbitMQ's ``rabbitmq-streams
add_super_stream`` and ``delete_super_stream``, over the management API
(PUT and DELETE /api/stream/super-streams/{vhost}/{name}).

The options are rabbitmq-streams': ``--partitions N`` (3 when neither it nor
``--binding-keys`` is given) or ``--binding-keys a,b,c``, and the partitions'
``--max-length-bytes`` and ``--stream-max-segment-size-bytes`` (a number of
bytes, or one with a unit: 500mb, 2gib), ``--max-age`` (an ISO 8601 duration,
PT10M30S, sent as seconds; or a stream's own form, 7D, 1h, sent as it is),
``--leader-locator`` and ``--initial-cluster-size``.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from warren.ctl.client import path
from warren.ctl.context import Context, in_vhost, positive_int, quoted

__all__ = ["add_options", "cmd_add", "cmd_delete", "information_unit", "max_age"]

#: RabbitMQ's information units (rabbit_resource_monitor_misc): k, M, G... are
#: powers of 1000 and Ki, Mi, Gi... of 1024, as Kubernetes reads them.
_UNIT = re.compile(r"^([0-9]+)(?:([kKmMgGtTpP])([iI]?)[bB]?)?$")
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
#: An ISO 8601 duration; RabbitMQ counts a year as 365 days and a month as 30.
_DURATION = re.compile(
    r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$"
)
_SECONDS = (365 * 86400, 30 * 86400, 86400, 3600, 60, 1)


def information_unit(text: str) -> int:
    """``500mb``, ``2GiB``, ``1000``: a number of bytes."""
    match = _UNIT.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 100gb, 50mb): {text!r}")
    number, unit, binary = match.groups()
    if unit is None:
        return int(number)
    base = 1024 if binary else 1000
    return int(number) * base ** _POWERS[unit.lower()]


def max_age(text: str) -> str:
    """An ISO 8601 duration as seconds (``PT10M30S`` is ``630s``, as
    rabbitmq-streams sends it); another text goes as it is (``7D``)."""
    if not text.startswith("P"):
        return text
    match = _DURATION.match(text)
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise argparse.ArgumentTypeError(f"not an ISO 8601 duration (e.g. PT10M30S): {text!r}")
    seconds = sum(int(v) * s for v, s in zip(match.groups(), _SECONDS, strict=True) if v)
    return f"{seconds}s"


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--partitions", type=positive_int, help="partitions NAME-0 ... (default 3)")
    how.add_argument(
        "--binding-keys", metavar="KEYS", help="comma-separated keys: partitions NAME-KEY"
    )
    p.add_argument("--max-length-bytes", type=information_unit, metavar="SIZE")
    p.add_argument("--max-age", type=max_age, metavar="DURATION")
    p.add_argument("--stream-max-segment-size-bytes", type=information_unit, metavar="SIZE")
    p.add_argument("--leader-locator", metavar="LOCATOR", help="client-local or balanced")
    p.add_argument("--initial-cluster-size", type=positive_int, metavar="N")


def cmd_add(ctx: Context) -> int:
    a = ctx.args
    body: dict[str, Any] = {}
    if a.binding_keys is not None:
        body["binding-keys"] = a.binding_keys
    else:
        body["partitions"] = a.partitions if a.partitions is not None else 3
    options = {
        "max-length-bytes": a.max_length_bytes,
        "max-age": a.max_age,
        "stream-max-segment-size-bytes": a.stream_max_segment_size_bytes,
        "queue-leader-locator": a.leader_locator,
        "initial-cluster-size": a.initial_cluster_size,
    }
    body["arguments"] = {k: v for k, v in options.items() if v is not None}
    answer = ctx.client.put(path("stream", "super-streams", ctx.vhost, a.name), body)
    return ctx.done(answer, f"Added super stream {quoted(a.name)} {in_vhost(ctx)}.")


def cmd_delete(ctx: Context) -> int:
    name = ctx.args.name
    answer = ctx.client.delete(path("stream", "super-streams", ctx.vhost, name))
    return ctx.done(answer, f"Deleted super stream {quoted(name)} {in_vhost(ctx)}.")
