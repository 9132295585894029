"""AMQP 1.0 performatives and the composite types they carry, as slotted dataclasses.

Transport (part 2, 2.7-2.8): open, begin, attach, flow, transfer, disposition,
detach, end, close and error; security (part 5, 5.3): the SASL frames;
messaging (part 3, 3.4-3.5): the delivery states, source, target and the
lifetime policies. Each class lists its fields in spec order with the spec's
defaults, and a table (LAYOUTS) gives each field's AMQP type, so a handle is
written as a uint whatever Python int holds it.

Decoding fills a field that is absent or null with its default; a mandatory
field missing is a DecodeError with condition amqp:invalid-field (the peer
sent a well-formed frame the broker cannot act on); a field of the wrong type
is amqp:decode-error. Encoding writes a field equal to its default as null
and omits trailing nulls, as every client does. Importing this module
registers the types with the codec.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, fields
from typing import Any, Final

from warren.amqp1.codec import register_described, register_encoder
from warren.amqp1.encoding import (
    encode_array,
    encode_binary,
    encode_bool,
    encode_map,
    encode_string,
    encode_symbol,
    encode_ubyte,
    encode_uint,
    encode_ulong,
    encode_ushort,
    encode_value,
    write_compound,
    write_descriptor,
)
from warren.amqp1.formats import LIST0, LIST8, LIST32, SYM8, DecodeError
from warren.amqp1.types import Array, Symbol

__all__ = [
    "AMQP_PERFORMATIVES",
    "LAYOUTS",
    "SASL_PERFORMATIVES",
    "Accepted",
    "Attach",
    "Begin",
    "Close",
    "DeleteOnClose",
    "DeleteOnNoLinks",
    "DeleteOnNoLinksOrMessages",
    "DeleteOnNoMessages",
    "Detach",
    "Disposition",
    "End",
    "Error",
    "Flow",
    "Modified",
    "Open",
    "Received",
    "Rejected",
    "Released",
    "SaslChallenge",
    "SaslInit",
    "SaslMechanisms",
    "SaslOutcome",
    "SaslResponse",
    "Source",
    "Target",
    "Transfer",
]

# Restricted types' values (2.8, 5.3.3.6).
SENDER: Final = False
RECEIVER: Final = True
SND_UNSETTLED: Final = 0
SND_SETTLED: Final = 1
SND_MIXED: Final = 2
RCV_FIRST: Final = 0
RCV_SECOND: Final = 1
SASL_OK: Final = 0
SASL_AUTH: Final = 1
SASL_SYS: Final = 2
SASL_SYS_PERM: Final = 3
SASL_SYS_TEMP: Final = 4
UINT_MAX: Final = 0xFFFFFFFF


@dataclass(slots=True)
class Error:
    """An error condition (2.8.14), carried by detach, end, close and rejected."""

    condition: Symbol
    description: str | None = None
    info: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Open:
    container_id: str
    hostname: str | None = None
    max_frame_size: int = UINT_MAX
    channel_max: int = 65535
    idle_time_out: int | None = None
    outgoing_locales: tuple[Symbol, ...] | None = None
    incoming_locales: tuple[Symbol, ...] | None = None
    offered_capabilities: tuple[Symbol, ...] | None = None
    desired_capabilities: tuple[Symbol, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Begin:
    remote_channel: int | None = None
    next_outgoing_id: int
    incoming_window: int
    outgoing_window: int
    handle_max: int = UINT_MAX
    offered_capabilities: tuple[Symbol, ...] | None = None
    desired_capabilities: tuple[Symbol, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Attach:
    name: str
    handle: int
    role: bool
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    source: Any = None
    target: Any = None
    unsettled: dict[Any, Any] | None = None
    incomplete_unsettled: bool = False
    initial_delivery_count: int | None = None
    max_message_size: int | None = None
    offered_capabilities: tuple[Symbol, ...] | None = None
    desired_capabilities: tuple[Symbol, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Flow:
    next_incoming_id: int | None = None
    incoming_window: int
    next_outgoing_id: int
    outgoing_window: int
    handle: int | None = None
    delivery_count: int | None = None
    link_credit: int | None = None
    available: int | None = None
    drain: bool = False
    echo: bool = False
    properties: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Transfer:
    handle: int
    delivery_id: int | None = None
    delivery_tag: bytes | None = None
    message_format: int | None = None
    settled: bool | None = None
    more: bool = False
    rcv_settle_mode: int | None = None
    state: Any = None
    resume: bool = False
    aborted: bool = False
    batchable: bool = False


@dataclass(slots=True, kw_only=True)
class Disposition:
    role: bool
    first: int
    last: int | None = None
    settled: bool = False
    state: Any = None
    batchable: bool = False


@dataclass(slots=True, kw_only=True)
class Detach:
    handle: int
    closed: bool = False
    error: Error | None = None


@dataclass(slots=True, kw_only=True)
class End:
    error: Error | None = None


@dataclass(slots=True, kw_only=True)
class Close:
    error: Error | None = None


@dataclass(slots=True, kw_only=True)
class SaslMechanisms:
    sasl_server_mechanisms: tuple[Symbol, ...]


@dataclass(slots=True, kw_only=True)
class SaslInit:
    mechanism: Symbol
    initial_response: bytes | None = None
    hostname: str | None = None


@dataclass(slots=True, kw_only=True)
class SaslChallenge:
    challenge: bytes


@dataclass(slots=True, kw_only=True)
class SaslResponse:
    response: bytes


@dataclass(slots=True, kw_only=True)
class SaslOutcome:
    code: int
    additional_data: bytes | None = None


@dataclass(slots=True, kw_only=True)
class Received:
    section_number: int
    section_offset: int


@dataclass(slots=True)
class Accepted:
    pass


@dataclass(slots=True)
class Rejected:
    error: Error | None = None


@dataclass(slots=True)
class Released:
    pass


@dataclass(slots=True, kw_only=True)
class Modified:
    delivery_failed: bool | None = None
    undeliverable_here: bool | None = None
    message_annotations: dict[Any, Any] | None = None


@dataclass(slots=True, kw_only=True)
class Source:
    address: Any = None
    durable: int = 0
    expiry_policy: Symbol = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: Symbol | None = None
    filter: dict[Any, Any] | None = None
    default_outcome: Any = None
    outcomes: tuple[Symbol, ...] | None = None
    capabilities: tuple[Symbol, ...] | None = None


@dataclass(slots=True, kw_only=True)
class Target:
    address: Any = None
    durable: int = 0
    expiry_policy: Symbol = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    capabilities: tuple[Symbol, ...] | None = None


@dataclass(slots=True)
class DeleteOnClose:
    pass


@dataclass(slots=True)
class DeleteOnNoLinks:
    pass


@dataclass(slots=True)
class DeleteOnNoMessages:
    pass


@dataclass(slots=True)
class DeleteOnNoLinksOrMessages:
    pass


# Field kinds: the AMQP type a field is written as and checked against.
ANY: Final = 0
UINT: Final = 1
USHORT: Final = 2
UBYTE: Final = 3
ULONG: Final = 4
BOOL: Final = 5
STRING: Final = 6
SYMBOL: Final = 7
BINARY: Final = 8
SYMBOLS: Final = 9  # symbol multiple="true": one symbol or an array of them
FIELDS: Final = 10  # a map with symbol keys
MAP: Final = 11
ERROR: Final = 12

_CAPS = (("offered_capabilities", SYMBOLS), ("desired_capabilities", SYMBOLS))

#: Per class: its descriptor code and name, and (field, kind) in spec order;
#: mandatory fields are the dataclass fields without a default. (The code is
#: not a ClassVar on the dataclass: mypyc takes those for fields.)
LAYOUTS: dict[type, tuple[int, str, tuple[tuple[str, int], ...]]] = {
    Error: (
        0x1D,
        "amqp:error:list",
        (("condition", SYMBOL), ("description", STRING), ("info", FIELDS)),
    ),
    Open: (
        0x10,
        "amqp:open:list",
        (
            ("container_id", STRING),
            ("hostname", STRING),
            ("max_frame_size", UINT),
            ("channel_max", USHORT),
            ("idle_time_out", UINT),
            ("outgoing_locales", SYMBOLS),
            ("incoming_locales", SYMBOLS),
            *_CAPS,
            ("properties", FIELDS),
        ),
    ),
    Begin: (
        0x11,
        "amqp:begin:list",
        (
            ("remote_channel", USHORT),
            ("next_outgoing_id", UINT),
            ("incoming_window", UINT),
            ("outgoing_window", UINT),
            ("handle_max", UINT),
            *_CAPS,
            ("properties", FIELDS),
        ),
    ),
    Attach: (
        0x12,
        "amqp:attach:list",
        (
            ("name", STRING),
            ("handle", UINT),
            ("role", BOOL),
            ("snd_settle_mode", UBYTE),
            ("rcv_settle_mode", UBYTE),
            ("source", ANY),
            ("target", ANY),
            ("unsettled", MAP),
            ("incomplete_unsettled", BOOL),
            ("initial_delivery_count", UINT),
            ("max_message_size", ULONG),
            *_CAPS,
            ("properties", FIELDS),
        ),
    ),
    Flow: (
        0x13,
        "amqp:flow:list",
        (
            ("next_incoming_id", UINT),
            ("incoming_window", UINT),
            ("next_outgoing_id", UINT),
            ("outgoing_window", UINT),
            ("handle", UINT),
            ("delivery_count", UINT),
            ("link_credit", UINT),
            ("available", UINT),
            ("drain", BOOL),
            ("echo", BOOL),
            ("properties", FIELDS),
        ),
    ),
    Transfer: (
        0x14,
        "amqp:transfer:list",
        (
            ("handle", UINT),
            ("delivery_id", UINT),
            ("delivery_tag", BINARY),
            ("message_format", UINT),
            ("settled", BOOL),
            ("more", BOOL),
            ("rcv_settle_mode", UBYTE),
            ("state", ANY),
            ("resume", BOOL),
            ("aborted", BOOL),
            ("batchable", BOOL),
        ),
    ),
    Disposition: (
        0x15,
        "amqp:disposition:list",
        (
            ("role", BOOL),
            ("first", UINT),
            ("last", UINT),
            ("settled", BOOL),
            ("state", ANY),
            ("batchable", BOOL),
        ),
    ),
    Detach: (0x16, "amqp:detach:list", (("handle", UINT), ("closed", BOOL), ("error", ERROR))),
    End: (0x17, "amqp:end:list", (("error", ERROR),)),
    Close: (0x18, "amqp:close:list", (("error", ERROR),)),
    SaslMechanisms: (0x40, "amqp:sasl-mechanisms:list", (("sasl_server_mechanisms", SYMBOLS),)),
    SaslInit: (
        0x41,
        "amqp:sasl-init:list",
        (("mechanism", SYMBOL), ("initial_response", BINARY), ("hostname", STRING)),
    ),
    SaslChallenge: (0x42, "amqp:sasl-challenge:list", (("challenge", BINARY),)),
    SaslResponse: (0x43, "amqp:sasl-response:list", (("response", BINARY),)),
    SaslOutcome: (0x44, "amqp:sasl-outcome:list", (("code", UBYTE), ("additional_data", BINARY))),
    Received: (0x23, "amqp:received:list", (("section_number", UINT), ("section_offset", ULONG))),
    Accepted: (0x24, "amqp:accepted:list", ()),
    Rejected: (0x25, "amqp:rejected:list", (("error", ERROR),)),
    Released: (0x26, "amqp:released:list", ()),
    Modified: (
        0x27,
        "amqp:modified:list",
        (("delivery_failed", BOOL), ("undeliverable_here", BOOL), ("message_annotations", FIELDS)),
    ),
    Source: (
        0x28,
        "amqp:source:list",
        (
            ("address", ANY),
            ("durable", UINT),
            ("expiry_policy", SYMBOL),
            ("timeout", UINT),
            ("dynamic", BOOL),
            ("dynamic_node_properties", FIELDS),
            ("distribution_mode", SYMBOL),
            ("filter", FIELDS),
            ("default_outcome", ANY),
            ("outcomes", SYMBOLS),
            ("capabilities", SYMBOLS),
        ),
    ),
    Target: (
        0x29,
        "amqp:target:list",
        (
            ("address", ANY),
            ("durable", UINT),
            ("expiry_policy", SYMBOL),
            ("timeout", UINT),
            ("dynamic", BOOL),
            ("dynamic_node_properties", FIELDS),
            ("capabilities", SYMBOLS),
        ),
    ),
    DeleteOnClose: (0x2B, "amqp:delete-on-close:list", ()),
    DeleteOnNoLinks: (0x2C, "amqp:delete-on-no-links:list", ()),
    DeleteOnNoMessages: (0x2D, "amqp:delete-on-no-messages:list", ()),
    DeleteOnNoLinksOrMessages: (0x2E, "amqp:delete-on-no-links-or-messages:list", ()),
}

AMQP_PERFORMATIVES: Final = (Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close)
SASL_PERFORMATIVES: Final = (SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome)


class _Composite:
    """One registered class's field table, flattened for the loops below."""

    __slots__ = ("cls", "code", "name", "names", "kinds", "mandatory", "defaults")

    def __init__(self, cls: type, code: int, name: str, spec: tuple[tuple[str, int], ...]) -> None:
        declared = {f.name: f for f in fields(cls)}
        if [n for n, _ in spec] != list(declared):
            raise AssertionError(f"{cls.__name__}: field table out of step with the class")
        self.cls = cls
        self.code = code
        self.name = name
        self.names = tuple(n for n, _ in spec)
        self.kinds = tuple(k for _, k in spec)
        self.mandatory = tuple(declared[n].default is MISSING for n in self.names)
        self.defaults: tuple[Any, ...] = tuple(
            None if declared[n].default is MISSING else declared[n].default for n in self.names
        )


def _encode_symbols(value: Any, out: bytearray, depth: int = 0) -> None:
    if isinstance(value, str):
        encode_symbol(value, out, depth)
    else:
        encode_array(Array(SYM8, tuple(value)), out, depth)


def _encode_fields(value: dict[Any, Any], out: bytearray, depth: int = 0) -> None:
    encode_map({Symbol(k) if type(k) is str else k: v for k, v in value.items()}, out, depth)


_KIND_ENCODERS = (
    encode_value,
    encode_uint,
    encode_ushort,
    encode_ubyte,
    encode_ulong,
    encode_bool,
    encode_string,
    encode_symbol,
    encode_binary,
    _encode_symbols,
    _encode_fields,
    encode_map,
    encode_value,
)

_SPECS: dict[type, _Composite] = {}


def _encode_composite(value: Any, out: bytearray, depth: int = 0) -> None:
    """A registered dataclass as its described list: defaults as null, trailing nulls omitted."""
    spec = _SPECS[type(value)]
    body = bytearray()
    count = 0
    nulls = 0
    defaults = spec.defaults
    for i, name in enumerate(spec.names):
        v = getattr(value, name)
        if v is None or (defaults[i] is not None and v == defaults[i]):
            if spec.mandatory[i]:
                raise ValueError(f"{spec.name}: mandatory field {name} is None")
            nulls += 1
            continue
        if nulls:
            body += b"\x40" * nulls
            count += nulls
            nulls = 0
        _KIND_ENCODERS[spec.kinds[i]](v, body, depth + 1)
        count += 1
    write_descriptor(spec.code, out)
    if count:
        write_compound(LIST8, LIST32, body, count, out)
    else:
        out.append(LIST0)


def _bad(spec: _Composite, i: int, value: Any) -> DecodeError:
    return DecodeError(
        f"{spec.name}: field {spec.names[i]} cannot be {type(value).__name__} {value!r:.40}"
    )


def _check(spec: _Composite, i: int, v: Any) -> Any:
    """A decoded field's value if it has the field's type (symbols as a tuple)."""
    kind = spec.kinds[i]
    if kind == ANY:
        return v
    if kind <= ULONG:
        top = (0, UINT_MAX, 0xFFFF, 0xFF, 0xFFFFFFFFFFFFFFFF)[kind]
        if type(v) is bool or not isinstance(v, int) or not 0 <= v <= top:
            raise _bad(spec, i, v)
        return v
    if kind == BOOL:
        if type(v) is not bool:
            raise _bad(spec, i, v)
        return v
    if kind in (STRING, SYMBOL):
        if not isinstance(v, str):
            raise _bad(spec, i, v)
        return v if kind == STRING or type(v) is Symbol else Symbol(v)
    if kind == BINARY:
        if not isinstance(v, bytes):
            raise _bad(spec, i, v)
        return v
    if kind == SYMBOLS:
        if isinstance(v, str):
            return (Symbol(v),)
        items = v.items if isinstance(v, Array) else v
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise _bad(spec, i, v)
        return tuple(Symbol(s) for s in items)
    if kind in (FIELDS, MAP):
        if not isinstance(v, dict):
            raise _bad(spec, i, v)
        return v
    if not isinstance(v, Error):
        raise _bad(spec, i, v)
    return v


def _build(spec: _Composite, value: Any) -> Any:
    """The dataclass from its decoded list: absent or null fields take their defaults."""
    if not isinstance(value, list):
        raise DecodeError(f"{spec.name} is not a list")
    n = len(value)
    kwargs: dict[str, Any] = {}
    for i, name in enumerate(spec.names):
        v = value[i] if i < n else None
        if v is None:
            if spec.mandatory[i]:
                raise DecodeError(
                    f"{spec.name}: mandatory field {name} is missing", "amqp:invalid-field"
                )
            v = spec.defaults[i]
        else:
            v = _check(spec, i, v)
        kwargs[name] = v
    return spec.cls(**kwargs)


def _register() -> None:
    for cls, (code, name, spec) in LAYOUTS.items():
        composite = _Composite(cls, code, name, spec)
        _SPECS[cls] = composite
        register_described(composite.code, name, functools.partial(_build, composite))
        register_encoder(cls, _encode_composite)


_register()
