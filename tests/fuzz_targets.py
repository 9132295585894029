"""Fuzz targets: Warren's codecs given arbitrary bytes, shared by the bounded
hypothesis run in `make test` (tests/protocol/amqp/test_codec_fuzz.py) and the long atheris
run of `make fuzz` (tools/fuzz.py).

A target may refuse its input only with the codecs' own errors
(``DecodeError`` and its subclasses, ``UnsafeValue``; for MQTT the
``MQTTCodecError`` subclasses and for AMQP 1.0 warren.amqp1's DecodeError,
also DecodeErrors; for the stream protocol StreamProtocolError, a DecodeError
too): anything else escaping is a
crash, a bug to turn into a regression test. What decodes must also encode
again, and decode to the same thing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from warren.amqp import spec
from warren.amqp.frames import split_header_payload
from warren.amqp1 import codec as amqp1_codec
from warren.amqp1.frames import Frame, FrameReader, encode_frame
from warren.core import properties as props
from warren.core.codec_errors import DecodeError, UnsafeValue
from warren.core.table import decode_table, validate_table
from warren.core.table_encode import encode_table
from warren.mqtt.codec import Decoder, encode
from warren.stream_protocol import chunk as stream_chunk
from warren.stream_protocol.frames import FrameReader as StreamFrameReader
from warren.stream_protocol.frames import decode_frame as stream_decode_frame
from warren.stream_protocol.publish import Deliver as StreamDeliver
from warren.stream_protocol.publish import Publish as StreamPublish

#: The errors a codec may refuse input with.
REFUSALS = (DecodeError, UnsafeValue)


def amqp_method(data: bytes) -> None:
    """A method frame's payload (class, method, arguments)."""
    try:
        method = spec.decode_method(data)
    except REFUSALS:
        return
    again = spec.decode_method(method.encode())
    assert again == method, (method, again)


def amqp_table(data: bytes) -> None:
    """A field table (headers, arguments, client properties)."""
    with contextlib.suppress(*REFUSALS):
        validate_table(data, 0, len(data))
    try:
        table, _ = decode_table(data, 0)
    except REFUSALS:
        return
    try:
        encoded = encode_table(table)
    except (ValueError, TypeError):
        return  # e.g. a decoded value the encoder will not write back (a NaN decimal)
    assert decode_table(encoded, 0)[0] == table or table != table  # NaN never equals


def amqp_content_header(data: bytes) -> None:
    """A content header frame's payload: class, weight, body size, properties."""
    try:
        _, _, raw = split_header_payload(data)
    except REFUSALS:
        return
    try:
        props.validate_properties(bytes(raw))
        props.peek_headers(bytes(raw))
        props.peek_expiration(bytes(raw))
        props.decode_properties(bytes(raw))
    except REFUSALS:
        return


def mqtt_stream(data: bytes) -> None:
    """Bytes from an MQTT client: as the first bytes of a connection, and after a
    CONNECT at each protocol level."""
    for level in (None, 4, 5):
        decoder = Decoder(level=level, max_packet_size=1 << 20)
        try:
            packets = decoder.feed(data)
        except DecodeError:
            continue
        for packet in packets:
            encode(packet, level or 4)


def _nan_free(value: object) -> bool:
    return "nan" not in repr(value)  # NaN never equals, not even itself decoded again


def amqp1_value(data: bytes) -> None:
    """One AMQP 1.0 value (a performative, a message section, an annotation map...)."""
    try:
        value, end = amqp1_codec.decode(data)
    except amqp1_codec.DecodeError:
        return
    out = bytearray()
    try:
        amqp1_codec.encode(value, out)
    except ValueError:
        return  # an array of described values: decoded, but not written back (types.Array has no descriptor)
    again, _ = amqp1_codec.decode(out)
    assert again == value or not _nan_free(value), (value, again)


def amqp1_frames(data: bytes) -> None:
    """Bytes from an AMQP 1.0 client from its protocol header on; every frame read
    encodes again."""
    try:
        items = FrameReader(1 << 16, expect_header=True).feed(data)
    except amqp1_codec.DecodeError:
        return
    for item in items:
        if isinstance(item, Frame):
            with contextlib.suppress(ValueError):  # as in amqp1_value
                encode_frame(item.channel, item.performative, item.payload, item.type)


def stream_frames(data: bytes) -> None:
    """Bytes from a stream protocol client: frames, their commands encoded again,
    a Publish's batch scanned and a Deliver's chunk read down to its records."""
    try:
        frames = StreamFrameReader(frame_max=1 << 16).feed(data)
    except DecodeError:
        return
    for frame in frames:
        try:
            command = stream_decode_frame(frame)
        except DecodeError:
            continue
        again = stream_decode_frame(command.encode()[4:])
        assert again == command, (command, again)
        with contextlib.suppress(DecodeError):
            if isinstance(command, StreamPublish):
                command.scan()
            elif isinstance(command, StreamDeliver):
                stream_chunk_records(bytes(command.chunk))


def stream_chunk_records(data: bytes) -> None:
    """An osiris chunk as Deliver carries it, read down to its records."""
    try:
        _, body, entries = stream_chunk.decode_delivered_chunk(data, check_crc=False)
        for entry in entries:
            stream_chunk.read_records(body, entry, max_uncompressed=1 << 20)
    except DecodeError:
        return


TARGETS: dict[str, Callable[[bytes], None]] = {
    "amqp-method": amqp_method,
    "amqp-table": amqp_table,
    "amqp-content-header": amqp_content_header,
    "mqtt": mqtt_stream,
    "amqp1-value": amqp1_value,
    "amqp1-frames": amqp1_frames,
    "stream-frames": stream_frames,
    "stream-chunk": stream_chunk_records,
}
