"""Declares whose arguments carry chosen AMQP wire types, then a redeclaration
without them (or the other way round): the 406 PRECONDITION_FAILED texts name
the wire type of the argument (RabbitMQ's names: 'byte', 'short', 'long', ...).

Shared by tests/record_rabbitmq_arg_types.py (run against RabbitMQ, recorded in
tests/data/rabbitmq_arg_types.json) and tests/protocol/amqp/test_arg_type_names.py
(run against Warren in memory, compared with the recording). The tables are
built octet by octet, so each value has exactly the type tag a case names.
"""

from __future__ import annotations

import struct

from pamqp import commands
from rawamqp import AMQPFrames, raw_frame

#: (argument, type tag, the value's octets after the tag).
CASES: list[tuple[str, str, bytes]] = [
    ("x-max-length", "b", struct.pack(">b", 5)),
    ("x-max-length", "B", struct.pack(">B", 5)),
    ("x-max-length", "s", struct.pack(">h", 5)),
    ("x-max-length", "u", struct.pack(">H", 5)),
    ("x-max-length", "I", struct.pack(">i", 5)),
    ("x-max-length", "i", struct.pack(">I", 5)),
    ("x-max-length", "l", struct.pack(">q", 5)),
    ("x-message-ttl", "b", struct.pack(">b", -1)),
    ("x-message-ttl", "I", struct.pack(">i", 60000)),
    ("x-dead-letter-exchange", "S", struct.pack(">I", 3) + b"dlx"),
    ("x-dead-letter-routing-key", "x", struct.pack(">I", 2) + b"rk"),
    ("x-single-active-consumer", "t", b"\x01"),
    ("x-max-priority", "u", struct.pack(">H", 3)),
]

#: The same for an exchange's compared argument.
EXCHANGE_CASES: list[tuple[str, str, bytes]] = [
    ("alternate-exchange", "S", struct.pack(">I", 2) + b"ae"),
    ("alternate-exchange", "x", struct.pack(">I", 2) + b"ae"),
]


def table(key: str, tag: str, value: bytes) -> bytes:
    entry = bytes([len(key)]) + key.encode() + tag.encode() + value
    return struct.pack(">I", len(entry)) + entry


def _shortstr(text: str) -> bytes:
    return bytes([len(text)]) + text.encode()


def queue_declare(channel: int, queue: str, arguments: bytes, durable: bool = False) -> bytes:
    """queue.declare (not passive) with ``arguments`` (an encoded table)."""
    bits = b"\x02" if durable else b"\x00"
    payload = struct.pack(">HHH", 50, 10, 0) + _shortstr(queue) + bits + arguments
    return raw_frame(1, channel, payload)


def exchange_declare(channel: int, exchange: str, arguments: bytes) -> bytes:
    """exchange.declare of a direct exchange with ``arguments`` (an encoded table)."""
    payload = (
        struct.pack(">HHH", 40, 10, 0)
        + _shortstr(exchange)
        + _shortstr("direct")
        + b"\x00"
        + arguments
    )
    return raw_frame(1, channel, payload)


def _outcome(client: AMQPFrames, channel: int) -> str:
    """'ok', or the channel.close's code and text (answered: the channel is reopened)."""
    _ch, frame = client.read_frame()
    if isinstance(frame, commands.Channel.Close):
        client.send_method(channel, commands.Channel.CloseOk())
        client.open_channel(channel)
        return f"{frame.reply_code} {frame.reply_text}"
    assert isinstance(frame, commands.Queue.DeclareOk | commands.Exchange.DeclareOk), frame
    return "ok"


def _pair(client: AMQPFrames, declare: object, name: str, first: bytes, second: bytes) -> list[str]:
    make = declare  # queue_declare or exchange_declare
    assert callable(make)
    client.send(make(1, name, first))
    got = [_outcome(client, 1)]
    client.send(make(1, name, second))
    got.append(_outcome(client, 1))
    return got


def run(client: AMQPFrames) -> dict[str, list[str]]:
    """Every case both ways on an opened connection (channel 1 open): its
    outcomes keyed ``queue|exchange <argument> <tag> given|missing first``.
    Everything declared is deleted again."""
    empty = struct.pack(">I", 0)
    out: dict[str, list[str]] = {}
    for kind, cases, declare in (
        ("queue", CASES, queue_declare),
        ("exchange", EXCHANGE_CASES, exchange_declare),
    ):
        for n, (key, tag, value) in enumerate(cases):
            given = table(key, tag, value)
            for order, first, second in (("given", given, empty), ("missing", empty, given)):
                name = f"argtypes-{kind}-{n}-{order}"
                out[f"{kind} {key} {tag} {order} first"] = _pair(
                    client, declare, name, first, second
                )
                if kind == "queue":
                    client.send_method(1, commands.Queue.Delete(queue=name))
                    client.expect_method(commands.Queue.DeleteOk, channel=1)
                else:
                    client.send_method(1, commands.Exchange.Delete(exchange=name))
                    client.expect_method(commands.Exchange.DeleteOk, channel=1)
    return out
