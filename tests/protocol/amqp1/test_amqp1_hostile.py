"""Hostile AMQP 1.0 input: encodings of generated values, performatives and
conversations with bytes flipped, cut or inserted only ever raise DecodeError
(tests/fuzz_targets.py's amqp1 targets take arbitrary bytes; these start from
valid structure, to reach deeper)."""

from __future__ import annotations

import contextlib
from typing import Any

from amqp1help import any_instance, conversation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protonhelp import values

from examples import examples
from warren.amqp1 import codec
from warren.amqp1.codec import DecodeError
from warren.amqp1.frames import FrameReader

#: The pure-Python pass runs a third, as the other codec fuzz tests do.
EXAMPLES = examples(900)
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def mutate(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(("flip", "cut", "insert", "size")))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:  # a plausible size or count byte: small, or all ones
            data[at] = draw(st.sampled_from((0, 1, 2, 0x7F, 0xFF)))
    return bytes(data)


def encoded(value: Any) -> bytes:
    out = bytearray()
    codec.encode(value, out)
    return bytes(out)


@SETTINGS
@given(st.data(), st.one_of(values, any_instance))
def test_mutated_values_only_raise_decode_error(data: st.DataObject, value: Any) -> None:
    raw = encoded(value)
    with contextlib.suppress(DecodeError):
        codec.decode(mutate(data.draw, raw))


@SETTINGS
@given(st.data())
def test_mutated_conversations_only_raise_decode_error(data: st.DataObject) -> None:
    raw, _ = conversation()
    hostile = mutate(data.draw, raw)
    reader = FrameReader(1024, expect_header=True)
    step = data.draw(st.integers(1, 600))
    try:
        for i in range(0, len(hostile), step):
            reader.feed(hostile[i : i + step])
    except DecodeError:
        pass
