"""AMQP 1.0 format codes (part 1, 1.6), the structs that read them, and DecodeError:
shared by the decoder (codec.py) and the encoder (encoding.py).

The first code of each family is its canonical code: the one types.Array keeps
whatever width the wire used (``CANONICAL`` maps the others to it).
"""

from __future__ import annotations

import struct
from typing import Final

from warren.core.codec_errors import DecodeError as CoreDecodeError

#: Nesting limit for lists, maps, arrays and described values (both ways).
MAX_DEPTH: Final = 64

# Format codes (1.6), the canonical one of each family first.
NULL: Final = 0x40
BOOLEAN: Final = 0x56
TRUE: Final = 0x41
FALSE: Final = 0x42
UBYTE: Final = 0x50
USHORT: Final = 0x60
UINT: Final = 0x70
SMALLUINT: Final = 0x52
UINT0: Final = 0x43
ULONG: Final = 0x80
SMALLULONG: Final = 0x53
ULONG0: Final = 0x44
BYTE: Final = 0x51
SHORT: Final = 0x61
INT: Final = 0x71
SMALLINT: Final = 0x54
LONG: Final = 0x81
SMALLLONG: Final = 0x55
FLOAT: Final = 0x72
DOUBLE: Final = 0x82
DECIMAL32: Final = 0x74
DECIMAL64: Final = 0x84
DECIMAL128: Final = 0x94
CHAR: Final = 0x73
TIMESTAMP: Final = 0x83
UUID: Final = 0x98
VBIN8: Final = 0xA0
VBIN32: Final = 0xB0
STR8: Final = 0xA1
STR32: Final = 0xB1
SYM8: Final = 0xA3
SYM32: Final = 0xB3
LIST0: Final = 0x45
LIST8: Final = 0xC0
LIST32: Final = 0xD0
MAP8: Final = 0xC1
MAP32: Final = 0xD1
ARRAY8: Final = 0xE0
ARRAY32: Final = 0xF0
DESCRIBED: Final = 0x00


class DecodeError(CoreDecodeError):
    """Bytes that are not valid AMQP 1.0; ``condition`` is the error the connection
    (or link) closes with: amqp:decode-error, or amqp:invalid-field for a
    well-formed performative missing a mandatory field, ..."""

    def __init__(self, message: str, condition: str = "amqp:decode-error") -> None:
        super().__init__(message)
        self.message = message
        self.condition = condition

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, str]]:
        return (type(self), (self.message, self.condition))


U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
F32 = struct.Struct(">f")
F64 = struct.Struct(">d")
U8U8 = struct.Struct(">BB")
U32U32 = struct.Struct(">II")

#: Each format code's family, by its canonical code (the Array.code decoding gives).
CANONICAL: dict[int, int] = {
    TRUE: BOOLEAN,
    FALSE: BOOLEAN,
    SMALLUINT: UINT,
    UINT0: UINT,
    SMALLULONG: ULONG,
    ULONG0: ULONG,
    SMALLINT: INT,
    SMALLLONG: LONG,
    VBIN32: VBIN8,
    STR32: STR8,
    SYM32: SYM8,
    LIST0: LIST8,
    LIST32: LIST8,
    MAP32: MAP8,
    ARRAY32: ARRAY8,
}
