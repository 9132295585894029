"""RabbitMQ 3.10's declaration-argument rules and the Erlang-formatted texts they use.

The texts are the ones RabbitMQ sends (see tests/compat/rabbitmq_expected.json for
recorded ones); the cases not recorded follow the same rules in RabbitMQ's source.
"""

from __future__ import annotations

from typing import Any

import pytest

from warren.amqp.publish_checks import expiration_error
from warren.core.erlang_format import (
    binary_p,
    binary_w,
    frame_octets,
    last_column,
    string_p,
    tagged_tuple_p,
    term_p,
)
from warren.core.errors import PreconditionFailed
from warren.core.queue_arguments import (
    CLASSIC_QUEUE_ARGUMENTS,
    assert_args_equivalent,
    validate_queue_arguments,
)

Q = "queue 'q' in vhost '/'"


def refusal(arguments: dict[str, Any]) -> str:
    with pytest.raises(PreconditionFailed) as info:
        validate_queue_arguments("q", "/", arguments)
    return info.value.text


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"x-max-length": "10"},
            f"invalid arg 'x-max-length' for {Q}: \"expected integer, got longstr\"",
        ),
        ({"x-max-length": -1}, f"invalid arg 'x-max-length' for {Q}: {{value_negative,-1}}"),
        (
            {"x-max-length-bytes": True},
            f"invalid arg 'x-max-length-bytes' for {Q}: \"expected integer, got bool\"",
        ),
        ({"x-message-ttl": -5}, f"invalid arg 'x-message-ttl' for {Q}: {{value_negative,-5}}"),
        (
            {"x-message-ttl": 315_360_000_001},
            f"invalid arg 'x-message-ttl' for {Q}: {{value_too_large,315360000001}}",
        ),
        ({"x-expires": 0}, f"invalid arg 'x-expires' for {Q}: {{value_zero,0}}"),
        ({"x-overflow": "drop-tail"}, f"invalid arg 'x-overflow' for {Q}: invalid_overflow"),
        ({"x-overflow": 1}, f"invalid arg 'x-overflow' for {Q}: {{unacceptable_type,signedint}}"),
        (
            {"x-max-priority": 256},
            f"invalid arg 'x-max-priority' for {Q}: {{max_value_exceeded,256}}",
        ),
        (
            {"x-dead-letter-routing-key": "rk"},
            f"invalid arg 'x-dead-letter-routing-key' for {Q}: routing_key_but_no_dlx_defined",
        ),
        (
            {"x-dead-letter-exchange": 5},
            f"invalid type 'signedint' for arg 'x-dead-letter-exchange' in {Q}",
        ),
        (
            {"x-queue-mode": "eager"},
            f"invalid arg 'x-queue-mode' for {Q}: \"unsupported queue mode 'eager'\"",
        ),
        (
            {"x-queue-version": 3},
            f"invalid arg 'x-queue-version' for {Q}: \"unsupported queue version '3'\"",
        ),
        (
            {"x-single-active-consumer": "yes"},
            f"invalid arg 'x-single-active-consumer' for {Q}: {{unacceptable_type,longstr}}",
        ),
        (
            {"x-queue-type": "bogus"},
            f"invalid arg 'x-queue-type' for {Q}: \"unsupported queue type 'bogus'\"",
        ),
        (
            {"x-max-in-memory-length": 5},
            f"invalid arg 'x-max-in-memory-length' for {Q} of queue type rabbit_classic_queue",
        ),
        # RabbitMQ runs its checks in a fixed order, not in the table's.
        (
            {"x-max-length": -1, "x-expires": 0},
            f"invalid arg 'x-expires' for {Q}: {{value_zero,0}}",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_rabbitmq_texts(
    arguments: dict[str, Any], text: str
) -> None:
    assert refusal(arguments) == text


def test_valid_arguments_pass() -> None:
    validate_queue_arguments(
        "q",
        "/",
        {
            "x-max-length": 0,
            "x-max-length-bytes": 10,
            "x-message-ttl": 0,
            "x-expires": 1,
            "x-overflow": "reject-publish-dlx",
            "x-max-priority": 255,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "rk",
            "x-queue-mode": "lazy",
            "x-queue-version": 2,
            "x-single-active-consumer": False,
            "x-queue-type": "classic",
            "x-custom": [1, "a"],
        },
    )


def inequivalence(current: dict[str, Any], received: dict[str, Any]) -> str | None:
    try:
        assert_args_equivalent(Q, current, received, CLASSIC_QUEUE_ARGUMENTS)
    except PreconditionFailed as exc:
        return exc.text
    return None


def test_equivalence_rules() -> None:
    prefix = f"inequivalent arg 'x-max-length' for {Q}: received"
    assert inequivalence({"x-max-length": 10}, {"x-max-length": 10}) is None
    assert inequivalence({"x-max-length": 10}, {"x-max-length": 20}) == (
        f"{prefix} '20' but current is '10'"
    )
    assert inequivalence({"x-max-length": 10}, {}) == (
        f"{prefix} none but current is the value '10' of type 'signedint'"
    )
    assert inequivalence({}, {"x-max-length": 10}) == (
        f"{prefix} the value '10' of type 'signedint' but current is none"
    )
    assert inequivalence({"x-max-length": 10}, {"x-max-length": "10"}) == (
        f"{prefix} '10' but current is '10'"
    )
    # A missing x-queue-type is classic; unknown arguments are not compared.
    assert inequivalence({"x-queue-type": "classic"}, {}) is None
    assert inequivalence({}, {"x-queue-type": "classic"}) is None
    assert inequivalence({"x-custom": 1}, {"x-custom": 2}) is None


def test_erlang_binaries() -> None:
    assert binary_w(b"\x00\x01abc") == "<<0,1,97,98,99>>"
    assert binary_p(b"") == "<<>>"
    assert binary_p(b'say "hi"\n') == '<<"say \\"hi\\"\\n">>'
    assert binary_p(b"\x00\x3c") == "<<0,60>>"
    assert string_p("s") == '"s"'
    assert string_p(b"\x01\x02") == "[1,2]"


def test_erlang_pretty_printer_wraps_long_numeric_binaries() -> None:
    text = frame_octets(3, bytes(range(128, 144)))
    assert text == (
        "type 3, all octets = <<128,129,130,131,132,133,134,135,136,137,138,139,140,141,\n"
        + " " * 23
        + "142,143>>"
    )
    assert frame_octets(1, bytes(20)).startswith("type 1, first 16 octets = <<0,0,")
    tail = tagged_tuple_p("invalid_frame_end_marker", "255", column=61)
    assert tail == "{invalid_frame_end_marker,\n" + " " * 61 + "255}"
    assert last_column("ab\ncd") == 3
    assert tagged_tuple_p("frame_too_large", "5000", "4088", column=30) == (
        "{frame_too_large,5000,4088}"
    )


def test_erlang_terms_of_field_values() -> None:
    assert term_p(True) == "true"
    assert term_p(1.5) == "1.5"
    assert term_p("x") == '<<"x">>'
    assert term_p({"k": [1]}) == '[{<<"k">>,array,[{signedint,1}]}]'


@pytest.mark.parametrize(
    ("expiration", "error"),
    [
        ("60000", None),
        ("+5", None),
        ("0", None),
        ("soon", "no_integer"),
        ("", "no_integer"),
        ("-", "no_integer"),
        ("10s", '{leftover_string,"s"}'),
        ("-5", "{value_negative,-5}"),
        ("315360000001", "{value_too_large,315360000001}"),
    ],
)
def test_expiration_property_parsing(expiration: str, error: str | None) -> None:
    assert expiration_error(expiration) == error
