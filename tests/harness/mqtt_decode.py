"""An MQTT decoder for the broker's output written apart from Warren's codec, so
a raw in-memory test does not read the broker's bytes with the broker's own code.

Fixed header and variable headers are parsed here from the spec (MQTT 3.1.1
section 2-3, MQTT 5 section 2-3); MQTT 5 properties by paho-mqtt's
``Properties.unpack``. The result is Warren's packet dataclasses (the shape the
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

_PAHO_TYPES = {
    2: PacketTypes.CONNACK,
    3: PacketTypes.PUBLISH,
    4: PacketTypes.PUBACK,
    5: PacketTypes.PUBREC,
    6: PacketTypes.PUBREL,
    7: PacketTypes.PUBCOMP,
    9: PacketTypes.SUBACK,
    11: PacketTypes.UNSUBACK,
    14: PacketTypes.DISCONNECT,
    15: PacketTypes.AUTH,
}


class DecodeError(AssertionError):
    """The broker wrote something that is no MQTT packet."""


def _properties(kind: int, body: bytes, at: int) -> tuple[dict[int, object], int]:
    props = PahoProperties(_PAHO_TYPES[kind])
    props_obj, length = props.unpack(body[at:])
    out: dict[int, object] = {}
    for name, ident in props_obj.names.items():
        attr = name.replace(" ", "")
        if hasattr(props_obj, attr):
            out[ident] = getattr(props_obj, attr)
    return out, at + length


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
