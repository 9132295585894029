"""Scenarios: message properties, and hostile ones."""

from __future__ import annotations

import math
import struct
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pamqp import commands
from pamqp import header as pheader

from .common import FRAME_BODY, FRAME_HEADER, Observation, ProbeError, scenario
from .pika_helpers import attempt, connection, get_one, sync
from .raw import RawClient, props_dict, raw_client, raw_frame, raw_get

# ======================================================================================
# Scenarios: message properties
# ======================================================================================


@scenario(queues=["compat-q-props"])
def s_properties_round_trip(host: str, port: int) -> Observation:
    """Every basic property (and assorted header value types) survives publish/get."""
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={
            "str": "v", "int8": 7, "int32": 100000, "int64": 2**40, "neg": -3, "bool": True,
            "list": [1, "a", False], "table": {"k": "v"}, "void": None, "bytes": b"\x00\x01",
        },
        delivery_mode=2,
        priority=3,
        correlation_id="corr",
        reply_to="reply",
        expiration="60000",
        message_id="mid",
        timestamp=1700000000,
        type="kind",
        user_id="guest",
        app_id="compat",
    )  # fmt: skip
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-props")
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-props", b"body", props)
        return {"get": get_one(ch, "compat-q-props", auto_ack=True)}


@scenario(queues=["compat-q-props"])
def s_properties_user_id_mismatch(host: str, port: int) -> Observation:
    """basic.publish with user_id 'compat-other' while logged in as guest."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-props")

        def go() -> None:
            ch.basic_publish(
                "", "compat-q-props", b"m", pika.BasicProperties(user_id="compat-other")
            )
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-props"])
def s_properties_delivery_mode_invalid(host: str, port: int) -> Observation:
    """basic.publish with delivery_mode=3 (raw header), then get it back."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(1, commands.Queue.Declare(queue="compat-q-props"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-q-props"))
        # property flags: delivery-mode only (bit 12); value 3
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQHB", 60, 0, 1, 0x1000, 3)))
        client.send(raw_frame(FRAME_BODY, 1, b"m"))
        obs = client.observe(ping=1)
        if obs["socket"] == "open":
            obs["get"] = raw_get(client, 1, "compat-q-props", no_ack=True)
        return obs


# ======================================================================================
# Scenarios: hostile message properties
# ======================================================================================

#: Recorded instead of a get's properties when pamqp cannot decode its content header
#: (its exception texts may hold memory addresses or vary between versions).
UNPARSEABLE = "<content header not decodable by pamqp>"

BADPROPS_QUEUE = "compat-q-badprops"
FLAG_CONTENT_TYPE, FLAG_HEADERS, FLAG_DELIVERY_MODE, FLAG_TIMESTAMP = (
    0x8000,
    0x2000,
    0x1000,
    0x0040,
)


def _tbl(body: bytes) -> bytes:
    """A field table (or field array) from its encoded contents: length-prefixed."""
    return struct.pack(">I", len(body)) + body


def _longstr(value: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(value)) + value


def _headers_props(table_body: bytes) -> bytes:
    """Property list with headers (the given table contents) and delivery-mode 2."""
    return struct.pack(">H", FLAG_HEADERS | FLAG_DELIVERY_MODE) + _tbl(table_body) + b"\x02"


def _finite(value: Any) -> Any:
    """NaN and infinities as strings: JSON has no such numbers, and NaN != NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _get_properties(client: RawClient, queue: str) -> Observation:
    """basic.get (no_ack) on channel 1: the reply's frame name and, for get-ok, the
    properties of its content header as pamqp decodes them (or :data:`UNPARSEABLE`)."""
    client.method(1, commands.Basic.Get(queue=queue, no_ack=True))
    got = client.next_frame()
    if got.kind != "frame":
        raise ProbeError(f"basic.get: {got.kind}")
    out: Observation = {"frame": getattr(got.frame, "name", type(got.frame).__name__)}
    if out["frame"] != "Basic.GetOk":
        return out
    try:
        # pamqp may raise more than _parse expects (RecursionError, OverflowError).
        got = client.next_frame()
        if got.kind == "frame" and isinstance(got.frame, pheader.ContentHeader):
            out["properties"] = _finite(
                props_dict(got.frame.properties, getattr(got.frame, "present_flags", None))
            )
            return out
    except Exception:
        out["properties"] = UNPARSEABLE
        return out
    if got.kind == "raw" and got.channel == 1:
        out["properties"] = UNPARSEABLE
        return out
    raise ProbeError(f"basic.get: expected a content header, got {got.kind}")


def _badprops(host: str, port: int, props: bytes, routing_key: str = BADPROPS_QUEUE) -> Observation:
    """Confirm mode; publish a 1-byte message whose content header carries ``props``
    (flag words and property list, built by hand) via the default exchange; observe,
    then, if the connection survived, basic.get the queue."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(
            1, commands.Queue.Declare(queue=BADPROPS_QUEUE, durable=True), "Queue.DeclareOk"
        )
        client.call(1, commands.Queue.Purge(queue=BADPROPS_QUEUE), "Queue.PurgeOk")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key=routing_key))
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 1) + props))
        client.send(raw_frame(FRAME_BODY, 1, b"m"))
        obs = client.observe(ping=1)
        if obs["socket"] == "open":
            obs["get"] = _get_properties(client, BADPROPS_QUEUE)
        return obs


def _nested_tables(depth: int) -> bytes:
    """Headers {"a": {"a": ... {}}} with ``depth`` tables below the headers table."""
    value = b"F" + _tbl(b"")
    for _ in range(depth - 1):
        value = b"F" + _tbl(b"\x01a" + value)
    return b"\x01a" + value


def _nested_arrays(depth: int) -> bytes:
    """Headers {"k": [[ ... [] ... ]]} with ``depth`` arrays."""
    value = b"A" + _tbl(b"")
    for _ in range(depth - 1):
        value = b"A" + _tbl(value)
    return b"\x01k" + value


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag(host: str, port: int) -> Observation:
    """Headers {k: <field type 'Z'>}."""
    return _badprops(host, port, _headers_props(b"\x01kZ\x00"))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag_nested(host: str, port: int) -> Observation:
    """Headers {k: {k: <field type 'Z'>}}."""
    return _badprops(host, port, _headers_props(b"\x01kF" + _tbl(b"\x01kZ\x00")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag_in_array(host: str, port: int) -> Observation:
    """Headers {k: [<field type 'Z'>]}."""
    return _badprops(host, port, _headers_props(b"\x01kA" + _tbl(b"Z\x00")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_tag_U(host: str, port: int) -> Observation:
    """Headers {k: 'U' 0x0007} (a signed 16-bit int to pika and py-amqp, unknown to RabbitMQ)."""
    return _badprops(host, port, _headers_props(b"\x01kU\x00\x07"))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_tag_L(host: str, port: int) -> Observation:
    """Headers {k: 'L' 0xffffffffffffffff} (RabbitMQ reads 'L' as signed: -1)."""
    return _badprops(host, port, _headers_props(b"\x01kL" + b"\xff" * 8))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_table_past_end(host: str, port: int) -> Observation:
    """Headers table whose length claims 50 bytes; 4 follow before the frame ends."""
    props = struct.pack(">HI", FLAG_HEADERS, 50) + b"\x01kt\x01"
    return _badprops(host, port, props)


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_array_overrun(host: str, port: int) -> Observation:
    """Headers {k: array} of two 'I' ints (10 bytes) whose length says 7: the second
    int is cut in half; the headers table's length covers all 10 bytes."""
    elements = b"I" + struct.pack(">i", 1) + b"I" + struct.pack(">i", 2)
    table = b"\x01kA" + struct.pack(">I", 7) + elements
    return _badprops(host, port, _headers_props(table))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_shortstr_past_end(host: str, port: int) -> Observation:
    """content-type whose length octet says 200; 3 bytes follow before the frame ends."""
    return _badprops(host, port, struct.pack(">HB", FLAG_CONTENT_TYPE, 200) + b"abc")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_trailing_bytes(host: str, port: int) -> Observation:
    """content-type "abc" followed by 3 bytes no property flag accounts for."""
    return _badprops(host, port, struct.pack(">H", FLAG_CONTENT_TYPE) + b"\x03abc" + b"xyz")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flags_continuation(host: str, port: int) -> Observation:
    """Flags 0x8001 (content-type, continuation bit), a second flag word 0x0000, then
    content-type "abc"."""
    props = struct.pack(">HH", FLAG_CONTENT_TYPE | 1, 0) + b"\x03abc"
    return _badprops(host, port, props)


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flags_continuation_only(host: str, port: int) -> Observation:
    """Flags 0x0001 (continuation bit) and no second flag word."""
    return _badprops(host, port, struct.pack(">H", 0x0001))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flag_bit_1(host: str, port: int) -> Observation:
    """Flags 0x0002 (bit 1, no property of basic) and nothing else."""
    return _badprops(host, port, struct.pack(">H", 0x0002))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_tables_200(host: str, port: int) -> Observation:
    """Headers {"a": {"a": ... {}}}: tables nested 200 deep (a get records the depth
    of the headers that came back, not the headers)."""
    obs = _badprops(host, port, _headers_props(_nested_tables(200)))
    props = obs.get("get", {}).get("properties")
    if isinstance(props, dict) and isinstance(props.get("headers"), dict):
        depth, value = 0, props["headers"]
        while isinstance(value, dict) and value:
            depth, value = depth + 1, value.get("a")
        props["headers"] = {"depth": depth}
    return obs


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_tables_2000(host: str, port: int) -> Observation:
    """Headers {"a": {"a": ... {}}}: tables nested 2000 deep."""
    return _badprops(host, port, _headers_props(_nested_tables(2000)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_arrays_2000(host: str, port: int) -> Observation:
    """Headers {k: [[ ... [] ... ]]}: arrays nested 2000 deep."""
    return _badprops(host, port, _headers_props(_nested_arrays(2000)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_timestamp_header_year_10000(host: str, port: int) -> Observation:
    """Headers {k: 'T' 253402300800} (10000-01-01: pika and py-amqp cannot represent it)."""
    return _badprops(host, port, _headers_props(b"\x01kT" + struct.pack(">Q", 253402300800)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_timestamp_property_huge(host: str, port: int) -> Observation:
    """timestamp property 2**64-1."""
    return _badprops(host, port, struct.pack(">HQ", FLAG_TIMESTAMP, 2**64 - 1))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_float_nan(host: str, port: int) -> Observation:
    """Headers {n: 'f' NaN, i: 'd' +infinity}."""
    nan, inf = struct.pack(">f", float("nan")), struct.pack(">d", float("inf"))
    table = b"\x01nf" + nan + b"\x01id" + inf
    return _badprops(host, port, _headers_props(table))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_key_not_utf8(host: str, port: int) -> Observation:
    """Headers whose only key is the bytes ff fe (not UTF-8), value longstr "v"."""
    return _badprops(host, port, _headers_props(b"\x02\xff\xfe" + _longstr(b"v")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_content_type_not_utf8(host: str, port: int) -> Observation:
    """content-type is the bytes ff fe (not UTF-8)."""
    return _badprops(host, port, struct.pack(">H", FLAG_CONTENT_TYPE) + b"\x02\xff\xfe")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_cc_not_array(host: str, port: int) -> Observation:
    """Headers {CC: longstr "abc"} (CC must be an array of strings)."""
    return _badprops(host, port, _headers_props(b"\x02CC" + _longstr(b"abc")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_bcc_not_array(host: str, port: int) -> Observation:
    """Headers {BCC: 'I' 1} (BCC must be an array of strings)."""
    return _badprops(host, port, _headers_props(b"\x03BCCI" + struct.pack(">i", 1)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_cc_mixed_array(host: str, port: int) -> Observation:
    """Headers {CC: ["compat-q-badprops", 'I' 1]}, routing key compat-nowhere: only the
    CC string routes it (non-strings in CC are ignored)."""
    array = _longstr(BADPROPS_QUEUE.encode()) + b"I" + struct.pack(">i", 1)
    props = _headers_props(b"\x02CCA" + _tbl(array))
    return _badprops(host, port, props, routing_key="compat-nowhere")
