"""Shared by the AMQP 1.0 wire tests: generated instances of every registered
type (from performatives.LAYOUTS) and a client's conversation in bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st
from protonhelp import ELEMENTS, keys, values

from warren.amqp1 import formats as f
from warren.amqp1 import performatives as p
from warren.amqp1.frames import (
    AMQP_HEADER,
    HEARTBEAT,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    encode_frame,
    transfer_frames,
)
from warren.amqp1.types import Symbol

#: A strategy per field kind (performatives.py), with values that are not the default.
KIND_VALUES: dict[int, st.SearchStrategy[Any]] = {
    p.UINT: ELEMENTS[f.UINT],
    p.USHORT: ELEMENTS[f.USHORT],
    p.UBYTE: ELEMENTS[f.UBYTE],
    p.ULONG: ELEMENTS[f.ULONG],
    p.BOOL: st.booleans(),
    p.STRING: ELEMENTS[f.STR8],
    p.SYMBOL: ELEMENTS[f.SYM8],
    p.BINARY: ELEMENTS[f.VBIN8],
    p.SYMBOLS: st.lists(ELEMENTS[f.SYM8], max_size=3).map(tuple),
    p.FIELDS: st.dictionaries(ELEMENTS[f.SYM8], values, max_size=3),
    p.MAP: st.dictionaries(keys, values, max_size=3),
    p.ERROR: st.builds(
        p.Error,
        ELEMENTS[f.SYM8],
        st.none() | ELEMENTS[f.STR8],
        st.none() | st.dictionaries(ELEMENTS[f.SYM8], values, max_size=2),
    ),
    p.ANY: values,
}


@st.composite
def instances(draw: st.DrawFn, cls: type) -> Any:
    _, _, layout = p.LAYOUTS[cls]
    mandatory = {fld.name for fld in dataclasses.fields(cls) if fld.default is dataclasses.MISSING}
    kwargs = {}
    for name, kind in layout:
        if name in mandatory or draw(st.booleans()):
            kwargs[name] = draw(KIND_VALUES[kind])
    return cls(**kwargs)


any_instance = st.sampled_from(sorted(p.LAYOUTS, key=lambda c: c.__name__)).flatmap(instances)


PAYLOAD = bytes(range(256)) * 12


def conversation() -> tuple[bytes, list[Any]]:
    """A client's bytes from SASL to close, and what the reader should give for them."""
    transfer = p.Transfer(handle=0, delivery_id=0, delivery_tag=b"t", message_format=0)
    parts: list[tuple[bytes, Any]] = [
        (SASL_HEADER, SASL_HEADER),
        (
            encode_frame(
                0, p.SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"\0u\0p"), type=TYPE_SASL
            ),
            ("sasl", p.SaslInit),
        ),
        (AMQP_HEADER, AMQP_HEADER),
        (encode_frame(0, p.Open(container_id="c", max_frame_size=1024)), (0, p.Open)),
        (
            encode_frame(1, p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)),
            (1, p.Begin),
        ),
        (
            encode_frame(
                1, p.Attach(name="l", handle=0, role=p.SENDER, target=p.Target(address="/queues/q"))
            ),
            (1, p.Attach),
        ),
        (HEARTBEAT, (0, None)),
    ]
    frames = transfer_frames(1, transfer, PAYLOAD, 1024)
    parts += [(raw, (1, p.Transfer)) for raw in frames]
    parts.append((encode_frame(0, p.Close()), (0, p.Close)))
    return b"".join(raw for raw, _ in parts), [want for _, want in parts]


def summary(items: list[Frame | bytes]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, bytes):
            out.append(item)
        elif item.type == TYPE_SASL:
            out.append(("sasl", type(item.performative)))
        else:
            out.append(
                (item.channel, None if item.performative is None else type(item.performative))
            )
    return out


def transfer_payload(items: list[Frame | bytes]) -> bytes:
    return b"".join(
        bytes(i.payload)
        for i in items
        if isinstance(i, Frame) and isinstance(i.performative, p.Transfer)
    )
