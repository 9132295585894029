"""An MQTT decoder for the broker's output written apart from Warren's codec, so
a raw in-memory test does not read the broker's bytes with the broker's own code.

Fixed header and variable headers are parsed here from the spec (MQTT 3.1.1
section 2-3, MQTT 5 section 2-3); MQTT 5 properties by the
spec's types, as paho's property table lists them. The result is Warren's packet dataclasses (the shape the
tests compare with), properties as ``{identifier: value}``.
"""

from __future__ import annotations

import struct

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from warren.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Disconnect,
    Packet,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    UnsubAck,
)


class DecodeError(AssertionError):
    """The broker wrote something that is no MQTT packet."""


#: identifier -> value type, paho's table (an index into PahoProperties.types).
_TYPES = {
    ident: kind
    for ident, (kind, _packets) in PahoProperties(PacketTypes.CONNACK).properties.items()
}
_REPEATED = {0x0B, 0x26}  # Subscription Identifier (in PUBLISH), User Property


def _vbi(body: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = body[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _properties(kind: int, body: bytes, at: int) -> tuple[dict[int, object], int]:
    """The property block at ``at``: values decoded by the spec's types (paho's
    table; its own unpack refuses a Maximum Packet Size above 268435455, which
    the spec allows: the largest packet is 268435460 bytes)."""
    length, at = _vbi(body, at)
    end = at + length
    out: dict[int, object] = {}
    while at < end:
        ident, at = _vbi(body, at)
        if ident not in _TYPES:
            raise DecodeError(f"unknown property {ident:#x} in packet type {kind}")
        kind_of = _TYPES[ident]
        value: object
        if kind_of == 0:
            value, at = body[at], at + 1
        elif kind_of == 1:
            value, at = struct.unpack_from("!H", body, at)[0], at + 2
        elif kind_of == 2:
            value, at = struct.unpack_from("!I", body, at)[0], at + 4
        elif kind_of == 3:
            value, at = _vbi(body, at)
        elif kind_of == 4:
            (n,) = struct.unpack_from("!H", body, at)
            value, at = body[at + 2 : at + 2 + n], at + 2 + n
        elif kind_of == 5:
            value, at = _string(body, at)
        else:
            name, at = _string(body, at)
            val, at = _string(body, at)
            value = (name, val)
        if ident in _REPEATED:
            out.setdefault(ident, []).append(value)  # type: ignore[union-attr]
        elif ident in out:
            raise DecodeError(f"property {ident:#x} twice in packet type {kind}")
        else:
            out[ident] = value
    if at != end:
        raise DecodeError("a property ran past its block")
    return out, end


def _string(body: bytes, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("!H", body, at)
    return body[at + 2 : at + 2 + n].decode("utf-8"), at + 2 + n


class PacketReader:
    """Bytes in (in any pieces), whole packets out."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self.buffer += data
        out: list[Packet] = []
        while True:
            got = self._one()
            if got is None:
                return out
            out.append(got)

    def _one(self) -> Packet | None:
        buf = self.buffer
        if len(buf) < 2:
            return None
        length, shift, at = 0, 0, 1
        while True:
            if at >= len(buf):
                return None
            byte = buf[at]
            length |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                break
            shift += 7
            if shift > 21:
                raise DecodeError("remaining length over four bytes")
        if len(buf) < at + length:
            return None
        first = buf[0]
        body = bytes(buf[at : at + length])
        del buf[: at + length]
        return self._packet(first >> 4, first & 0x0F, body)

    def _packet(self, kind: int, flags: int, body: bytes) -> Packet:
        v5 = self.level == MQTT_5
        if kind == 2:
            present, code = bool(body[0] & 1), body[1]
            props = _properties(kind, body, 2)[0] if v5 else {}
            return ConnAck(present, code, props)  # type: ignore[arg-type]
        if kind == 3:
            qos = (flags >> 1) & 3
            topic, at = _string(body, 0)
            pid = None
            if qos:
                (pid,) = struct.unpack_from("!H", body, at)
                at += 2
            props: dict[int, object] = {}
            if v5:
                props, at = _properties(kind, body, at)
            return Publish(
                topic,
                body[at:],
                qos,
                bool(flags & 1),
                bool(flags & 8),
                pid,
                props,  # type: ignore[arg-type]
            )
        if kind in (4, 5, 6, 7):
            (pid,) = struct.unpack_from("!H", body, 0)
            code = body[2] if len(body) > 2 else 0
            props = _properties(kind, body, 3)[0] if len(body) > 3 else {}
            cls = {4: PubAck, 5: PubRec, 6: PubRel, 7: PubComp}[kind]
            return cls(pid, code, props)  # type: ignore[arg-type]
        if kind in (9, 11):
            (pid,) = struct.unpack_from("!H", body, 0)
            at = 2
            props = {}
            if v5:
                props, at = _properties(kind, body, at)
            codes = list(body[at:])
            if kind == 9:
                return SubAck(pid, codes, props)  # type: ignore[arg-type]
            return UnsubAck(pid, codes, props)  # type: ignore[arg-type]
        if kind == 13:
            return PingResp()
        if kind in (14, 15):
            code = body[0] if body else 0
            props = _properties(kind, body, 1)[0] if len(body) > 1 else {}
            cls2 = Disconnect if kind == 14 else Auth
            return cls2(code, props)  # type: ignore[arg-type]
        raise DecodeError(f"packet type {kind} from a server")
