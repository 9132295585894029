"""Sans-IO MQTT 3.1.1 / 5.0 decoder and encoder.

`Decoder.feed(data)` returns every complete packet in the bytes seen so far;
`encode(packet, level)` returns the wire bytes of one packet. Errors are
`MQTTCodecError` subclasses carrying the MQTT 5 reason code.
"""

from __future__ import annotations

import struct

from warren.mqtt import properties as P
from warren.mqtt.errors import (
    MalformedPacket,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
)
from warren.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from warren.mqtt.properties import Properties

__all__ = ["Decoder", "encode"]

#: Largest packet the protocol can express (remaining length 268435455 + 5 bytes header).
MAX_PACKET_SIZE = 268_435_460

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


# --- primitive readers: (buf, pos, end) -> (value, new pos) ---------------------------


def _vbi(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise MalformedPacket("truncated variable byte integer")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def _u8(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise MalformedPacket("truncated packet")
    return buf[pos], pos + 1


def _u16(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise MalformedPacket("truncated packet")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def _u32(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise MalformedPacket("truncated packet")
    return _U32.unpack_from(buf, pos)[0], pos + 4


def _binary(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    n, pos = _u16(buf, pos, end)
    if pos + n > end:
        raise MalformedPacket("truncated string or binary data")
    return buf[pos : pos + n], pos + n


def _str(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    raw, pos = _binary(buf, pos, end)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("invalid UTF-8 string") from None
    if "\x00" in text:
        raise MalformedPacket("U+0000 in a UTF-8 string")
    return text, pos


def _properties(buf: bytes, pos: int, end: int, packet_type: int) -> tuple[Properties, int]:
    length, pos = _vbi(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise MalformedPacket("property length beyond the packet")
    props: Properties = {}
    table = P.PROPERTY_TABLE
    while pos < stop:
        pid, pos = _vbi(buf, pos, stop)
        entry = table.get(pid)
        if entry is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02x}")
        name, kind, allowed = entry
        if packet_type not in allowed:
            raise ProtocolError(f"property {name} not allowed in this packet")
        value: int | str | bytes
        if kind == P.BYTE:
            value, pos = _u8(buf, pos, stop)
        elif kind == P.TWO_BYTE_INT:
            value, pos = _u16(buf, pos, stop)
        elif kind == P.FOUR_BYTE_INT:
            value, pos = _u32(buf, pos, stop)
        elif kind == P.VARIABLE_BYTE_INT:
            value, pos = _vbi(buf, pos, stop)
        elif kind == P.UTF8_STRING:
            value, pos = _str(buf, pos, stop)
        elif kind == P.BINARY_DATA:
            value, pos = _binary(buf, pos, stop)
        else:
            key, pos = _str(buf, pos, stop)
            val, pos = _str(buf, pos, stop)
            pairs = props.setdefault(pid, [])
            assert isinstance(pairs, list)
            pairs.append((key, val))  # type: ignore[arg-type]
            continue
        if pid in P.BOOLEAN_PROPERTIES and value not in (0, 1):
            raise ProtocolError(f"property {name} must be 0 or 1")
        if pid in P.NON_ZERO_PROPERTIES and value == 0:
            raise ProtocolError(f"property {name} must not be 0")
        if pid == P.SUBSCRIPTION_IDENTIFIER and packet_type == P.PUBLISH:
            ids = props.setdefault(pid, [])
            assert isinstance(ids, list)
            ids.append(value)  # type: ignore[arg-type]
            continue
        if pid in props:
            raise ProtocolError(f"property {name} included more than once")
        props[pid] = value
    return props, stop


def _check_flags(first: int, expected: int, name: str) -> None:
    if first & 0x0F != expected:
        raise MalformedPacket(f"invalid fixed header flags for {name}")


def _check_end(pos: int, end: int, name: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{name}: remaining length does not match the content")


def _has_wildcard(topic: str) -> bool:
    return "+" in topic or "#" in topic


class Decoder:
    """Incremental decoder. `level` None: taken from the first CONNECT."""

    def __init__(self, level: int | None = None, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        self.level = level
        self.max_packet_size = max_packet_size
        self._buf = b""
        # An incomplete packet whose size is known is gathered in pieces and joined
        # once complete: joining on every read would copy a large packet over and
        # over (quadratic in its size).
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0

    def feed(self, data: bytes) -> list[Packet]:
        buf, frames = self.frames(data)
        return [self._decode(first, buf, start, end) for first, start, end in frames]

    def frames(self, data: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
        """Split off every complete packet without decoding it: the buffer and, per
        packet, (first byte, body start, body end). The broker's hot path parses
        PUBLISH bodies itself and hands the rest to `decode`."""
        if self._need:
            parts = self._parts
            if len(parts[-1]) < 65536:  # small pieces are merged (bounded copies)
                parts[-1] = parts[-1] + data
            else:
                parts.append(bytes(data))
            self._have += len(data)
            if self._have < self._need:
                return b"", []
            buf = b"".join(self._parts)
            self._parts = []
            self._need = 0
        else:
            buf = self._buf + data if self._buf else bytes(data)
        n = len(buf)
        pos = 0
        need = 0
        out: list[tuple[int, int, int]] = []
        while n - pos >= 2:
            # Remaining length: at most 4 bytes.
            rl = 0
            shift = 0
            i = pos + 1
            complete = False
            while i < n:
                b = buf[i]
                i += 1
                rl |= (b & 0x7F) << shift
                if not b & 0x80:
                    complete = True
                    break
                shift += 7
                if shift >= 28:
                    raise MalformedPacket("remaining length longer than 4 bytes")
            if not complete:
                break
            size = i - pos + rl
            if size > self.max_packet_size:
                raise PacketTooLarge(
                    f"packet of {size} bytes exceeds the maximum of {self.max_packet_size}"
                )
            if i + rl > n:
                need = size
                break
            out.append((buf[pos], i, i + rl))
            pos = i + rl
        if need:
            tail = buf[pos:]
            self._parts = [tail]
            self._have = len(tail)
            self._need = need
            self._buf = b""
        else:
            self._buf = buf[pos:] if pos < n else b""
        return buf, out

    def held(self) -> int:
        """Bytes of an unfinished packet kept since the last complete one (only
        what arrived: nothing is allocated for the size a header announces)."""
        return self._have if self._need else len(self._buf)

    def announced(self) -> int:
        """The size the unfinished packet's header announced (0: not read yet)."""
        return self._need

    def discard(self) -> None:
        """Let go of an unfinished packet (the connection is closing)."""
        self._buf = b""
        self._parts = []
        self._have = 0
        self._need = 0

    def decode(self, first: int, buf: bytes, pos: int, end: int) -> Packet:
        """One packet split off by `frames`."""
        return self._decode(first, buf, pos, end)

    def _decode(self, first: int, buf: bytes, pos: int, end: int) -> Packet:
        ptype = first >> 4
        if ptype == P.CONNECT:
            _check_flags(first, 0, "CONNECT")
            return self._connect(buf, pos, end)
        level = self.level
        if level is None:
            raise ProtocolError("the first packet must be CONNECT")
        v5 = level == MQTT_5
        if ptype == P.CONNACK:
            _check_flags(first, 0, "CONNACK")
            ack_flags, pos = _u8(buf, pos, end)
            if ack_flags & 0xFE:
                raise MalformedPacket("CONNACK reserved flags set")
            rc, pos = _u8(buf, pos, end)
            props: Properties = {}
            if v5:
                props, pos = _properties(buf, pos, end, P.CONNACK)
            _check_end(pos, end, "CONNACK")
            return ConnAck(bool(ack_flags), rc, props)
        if ptype == P.PUBLISH:
            return _publish(first, buf, pos, end, v5)
        if P.PUBACK <= ptype <= P.PUBCOMP:
            _check_flags(first, 2 if ptype == P.PUBREL else 0, "PUBACK/PUBREC/PUBREL/PUBCOMP")
            pid, pos = _u16(buf, pos, end)
            rc = 0
            props = {}
            if v5:
                if pos < end:
                    rc, pos = _u8(buf, pos, end)
                if pos < end:
                    props, pos = _properties(buf, pos, end, ptype)
            _check_end(pos, end, "PUBACK")
            cls = (PubAck, PubRec, PubRel, PubComp)[ptype - P.PUBACK]
            return cls(pid, rc, props)
        if ptype == P.SUBSCRIBE or ptype == P.UNSUBSCRIBE:
            name = "SUBSCRIBE" if ptype == P.SUBSCRIBE else "UNSUBSCRIBE"
            _check_flags(first, 2, name)
            pid, pos = _u16(buf, pos, end)
            props = {}
            if v5:
                props, pos = _properties(buf, pos, end, ptype)
            if pos >= end:
                raise ProtocolError(f"{name} with no topic filter")
            if ptype == P.UNSUBSCRIBE:
                filters: list[str] = []
                while pos < end:
                    tf, pos = _str(buf, pos, end)
                    filters.append(tf)
                return Unsubscribe(pid, filters, props)
            subs: list[Subscription] = []
            while pos < end:
                tf, pos = _str(buf, pos, end)
                opts, pos = _u8(buf, pos, end)
                qos = opts & 3
                if qos == 3:
                    raise MalformedPacket("subscription QoS 3")
                if v5:
                    if opts & 0xC0:
                        raise MalformedPacket("reserved subscription option bits set")
                    rh = (opts >> 4) & 3
                    if rh == 3:
                        raise ProtocolError("retain handling 3")
                    subs.append(Subscription(tf, qos, bool(opts & 4), bool(opts & 8), rh))
                else:
                    if opts & 0xFC:
                        raise MalformedPacket("reserved subscription option bits set")
                    subs.append(Subscription(tf, qos))
            return Subscribe(pid, subs, props)
        if ptype == P.SUBACK or ptype == P.UNSUBACK:
            _check_flags(first, 0, "SUBACK/UNSUBACK")
            pid, pos = _u16(buf, pos, end)
            props = {}
            if v5:
                props, pos = _properties(buf, pos, end, ptype)
            codes = list(buf[pos:end])
            if ptype == P.SUBACK:
                return SubAck(pid, codes, props)
            if not v5 and codes:
                raise MalformedPacket("UNSUBACK: remaining length must be 2")
            return UnsubAck(pid, codes, props)
        if ptype == P.PINGREQ or ptype == P.PINGRESP:
            _check_flags(first, 0, "PINGREQ/PINGRESP")
            _check_end(pos, end, "PINGREQ/PINGRESP")
            return PingReq() if ptype == P.PINGREQ else PingResp()
        if ptype == P.DISCONNECT or (ptype == P.AUTH and v5):
            _check_flags(first, 0, "DISCONNECT/AUTH")
            rc = 0
            props = {}
            if v5 and pos < end:
                rc, pos = _u8(buf, pos, end)
                if pos < end:
                    props, pos = _properties(buf, pos, end, ptype)
            _check_end(pos, end, "DISCONNECT/AUTH")
            return Disconnect(rc, props) if ptype == P.DISCONNECT else Auth(rc, props)
        raise MalformedPacket(f"reserved packet type {ptype}")

    def _connect(self, buf: bytes, pos: int, end: int) -> Connect:
        name, pos = _str(buf, pos, end)
        level, pos = _u8(buf, pos, end)
        if name == "MQIsdp" and level == 3:
            # MQTT 3.1: answered with CONNACK 1 (unacceptable protocol version), which
            # 3.1 clients understand, rather than a bare close.
            raise UnsupportedProtocolVersion("MQTT 3.1 (MQIsdp) is not supported")
        if name != "MQTT":
            raise ProtocolError(f"unknown protocol name {name!r}")
        if level not in (MQTT_3_1_1, MQTT_5):
            raise UnsupportedProtocolVersion(f"unsupported protocol level {level}")
        if self.level is None:
            self.level = level
        flags, pos = _u8(buf, pos, end)
        if flags & 1:
            raise MalformedPacket("CONNECT reserved flag set")
        will_flag = bool(flags & 4)
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise MalformedPacket("will QoS/retain without a will")
        has_password = bool(flags & 0x40)
        has_username = bool(flags & 0x80)
        if level == MQTT_3_1_1 and has_password and not has_username:
            raise MalformedPacket("password without user name")
        keep_alive, pos = _u16(buf, pos, end)
        props: Properties = {}
        if level == MQTT_5:
            props, pos = _properties(buf, pos, end, P.CONNECT)
        client_id, pos = _str(buf, pos, end)
        will = None
        if will_flag:
            wprops: Properties = {}
            if level == MQTT_5:
                wprops, pos = _properties(buf, pos, end, P.WILL)
            wtopic, pos = _str(buf, pos, end)
            if not wtopic or _has_wildcard(wtopic):
                raise MalformedPacket("invalid will topic")
            wpayload, pos = _binary(buf, pos, end)
            will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
        username = None
        password = None
        if has_username:
            username, pos = _str(buf, pos, end)
        if has_password:
            password, pos = _binary(buf, pos, end)
        _check_end(pos, end, "CONNECT")
        return Connect(
            client_id, level, bool(flags & 2), keep_alive, username, password, will, props
        )


def _publish(first: int, buf: bytes, pos: int, end: int, v5: bool) -> Publish:
    qos = (first >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(first & 8)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH QoS 0 with DUP set")
    topic, pos = _str(buf, pos, end)
    if _has_wildcard(topic):
        raise MalformedPacket("wildcard in a PUBLISH topic name")
    packet_id = None
    if qos:
        packet_id, pos = _u16(buf, pos, end)
        if packet_id == 0:
            raise MalformedPacket("packet identifier 0")
    props: Properties = {}
    if v5:
        props, pos = _properties(buf, pos, end, P.PUBLISH)
        if not topic and P.TOPIC_ALIAS not in props:
            raise ProtocolError("empty topic name without a topic alias")
    elif not topic:
        raise MalformedPacket("empty topic name")
    return Publish(topic, buf[pos:end], qos, bool(first & 1), dup, packet_id, props)


# --- encoder -------------------------------------------------------------------------


def _e_vbi(value: int) -> bytes:
    if value < 128:
        return bytes((value,))
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _e_bin(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("string or binary data longer than 65535 bytes")
    return _U16.pack(len(data)) + data


def _e_str(text: str) -> bytes:
    return _e_bin(text.encode("utf-8"))


def _e_props(props: Properties) -> bytes:
    out = bytearray()
    types = P.PROPERTY_TYPES
    for pid, value in props.items():
        kind = types[pid]
        if kind == P.UTF8_PAIR:
            assert isinstance(value, list)
            for key, val in value:  # type: ignore[misc]
                out += bytes((pid,)) + _e_str(key) + _e_str(val)
            continue
        if pid == P.SUBSCRIPTION_IDENTIFIER and isinstance(value, list):
            for sid in value:
                out += bytes((pid,)) + _e_vbi(sid)  # type: ignore[arg-type]
            continue
        out.append(pid)
        if kind == P.BYTE:
            out.append(value)  # type: ignore[arg-type]
        elif kind == P.TWO_BYTE_INT:
            out += _U16.pack(value)
        elif kind == P.FOUR_BYTE_INT:
            out += _U32.pack(value)
        elif kind == P.VARIABLE_BYTE_INT:
            out += _e_vbi(value)  # type: ignore[arg-type]
        elif kind == P.UTF8_STRING:
            out += _e_str(value)  # type: ignore[arg-type]
        else:
            out += _e_bin(value)  # type: ignore[arg-type]
    return _e_vbi(len(out)) + bytes(out)


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _e_vbi(len(body)) + body


def _ack_body(pid: int, rc: int, props: Properties, v5: bool) -> bytes:
    body = _U16.pack(pid)
    if v5 and (rc or props):
        body += bytes((rc,))
        if props:
            body += _e_props(props)
    return body


def encode(packet: Packet, level: int = MQTT_3_1_1) -> bytes:
    """The wire bytes of `packet` at protocol level 4 (3.1.1) or 5."""
    v5 = level == MQTT_5
    if isinstance(packet, Publish):
        first = 0x30 | (packet.qos << 1) | (8 if packet.dup else 0) | (1 if packet.retain else 0)
        body = _e_str(packet.topic)
        if packet.qos:
            if packet.packet_id is None:
                raise ValueError("PUBLISH with QoS > 0 needs a packet identifier")
            body += _U16.pack(packet.packet_id)
        if v5:
            body += _e_props(packet.properties)
        return _frame(first, body + packet.payload)
    if isinstance(packet, PubAck | PubRec | PubComp):
        ptype = (
            P.PUBACK
            if isinstance(packet, PubAck)
            else (P.PUBREC if isinstance(packet, PubRec) else P.PUBCOMP)
        )
        return _frame(
            ptype << 4, _ack_body(packet.packet_id, packet.reason_code, packet.properties, v5)
        )
    if isinstance(packet, PubRel):
        return _frame(0x62, _ack_body(packet.packet_id, packet.reason_code, packet.properties, v5))
    if isinstance(packet, Connect):
        plevel = packet.protocol_level
        v5 = plevel == MQTT_5
        will = packet.will
        flags = 2 if packet.clean_start else 0
        if will is not None:
            flags |= 4 | (will.qos << 3) | (0x20 if will.retain else 0)
        if packet.password is not None:
            flags |= 0x40
        if packet.username is not None:
            flags |= 0x80
        body = _e_str("MQTT") + bytes((plevel, flags)) + _U16.pack(packet.keep_alive)
        if v5:
            body += _e_props(packet.properties)
        body += _e_str(packet.client_id)
        if will is not None:
            if v5:
                body += _e_props(will.properties)
            body += _e_str(will.topic) + _e_bin(will.payload)
        if packet.username is not None:
            body += _e_str(packet.username)
        if packet.password is not None:
            body += _e_bin(packet.password)
        return _frame(0x10, body)
    if isinstance(packet, ConnAck):
        body = bytes((1 if packet.session_present else 0, packet.reason_code))
        if v5:
            body += _e_props(packet.properties)
        return _frame(0x20, body)
    if isinstance(packet, Subscribe):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _e_props(packet.properties)
        for sub in packet.subscriptions:
            opts = sub.qos
            if v5:
                opts |= (
                    (4 if sub.no_local else 0)
                    | (8 if sub.retain_as_published else 0)
                    | (sub.retain_handling << 4)
                )
            body += _e_str(sub.topic_filter) + bytes((opts,))
        return _frame(0x82, body)
    if isinstance(packet, SubAck):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _e_props(packet.properties)
        return _frame(0x90, body + bytes(packet.reason_codes))
    if isinstance(packet, Unsubscribe):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _e_props(packet.properties)
        for tf in packet.topic_filters:
            body += _e_str(tf)
        return _frame(0xA2, body)
    if isinstance(packet, UnsubAck):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _e_props(packet.properties) + bytes(packet.reason_codes)
        return _frame(0xB0, body)
    if isinstance(packet, PingReq):
        return b"\xc0\x00"
    if isinstance(packet, PingResp):
        return b"\xd0\x00"
    if isinstance(packet, Disconnect | Auth):
        first = 0xE0 if isinstance(packet, Disconnect) else 0xF0
        body = b""
        if v5 and (packet.reason_code or packet.properties):
            body = bytes((packet.reason_code,))
            if packet.properties:
                body += _e_props(packet.properties)
        return _frame(first, body)
    raise TypeError(f"not an MQTT packet: {packet!r}")
