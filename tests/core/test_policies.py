"""Policies and operator policies: RabbitMQ 3.10's validation texts, matching, the
precedence of policy against queue argument, and their effect through a client.

The expected texts were taken from ``rabbitmqctl set_policy`` / ``set_operator_policy``
against RabbitMQ 3.10.8; the precedence rules from its source (cited per test).
The broker's tests run in memory (issue 29): a tests/harness broker, pika's
calls over MemoryAMQP (harness.channel, frames by pamqp; pika over a socket
before); a restart is a new Harness on the same data dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Connection, Harness, harness_fixture
from harness.channel import Unroutable

from warren.core.errors import NotFound
from warren.core.policies import (
    Policy,
    best_match,
    effective_definition,
    effective_queue_settings,
    validate_policy,
)
from warren.core.runtime_parameters import ValidationFailed

pytestmark = pytest.mark.timeout(60)

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def policy(definition: dict[str, Any], **kw: Any) -> Policy:
    kw.setdefault("name", "p")
    kw.setdefault("pattern", ".*")
    return validate_policy(kw.pop("name"), kw.pop("pattern"), definition, **kw)


def op_policy(definition: dict[str, Any], **kw: Any) -> Policy:
    return policy(definition, operator=True, name=kw.pop("name", "op"), **kw)


def refusal(fn: Any, *args: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(ValidationFailed) as info:
        fn(*args, **kwargs)
    return info.value.errors


# -- validation: RabbitMQ 3.10.8's texts ---------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "text"),
    [
        ({"message-ttl": "abc"}, '<<"abc">> is not a valid message TTL'),
        ({"message-ttl": -1}, "-1 is not a valid message TTL"),
        ({"message-ttl": 1.5}, "1.5 is not a valid message TTL"),
        ({"expires": 0}, "0 is not a valid queue expiry"),
        ({}, "no policy provided"),
        ({"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
        (
            {"foo": 1, "bar": "x"},
            '[{<<"bar">>,<<"x">>},{<<"foo">>,1}] are not recognised policy settings',
        ),
        ({"max-length": 1, "foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
        ({"max-age": "0D"}, '<<"0D">> is not a valid max age'),
        ({"max-age": "5X"}, '<<"5X">> is not a valid max age'),
        ({"alternate-exchange": 5}, "5 is not a valid alternate exchange name"),
        ({"overflow": "x"}, '<<"x">> is not a valid overflow value'),
        ({"queue-mode": "x"}, '<<"x">> is not a valid queue-mode value'),
        ({"dead-letter-exchange": None}, "null is not a valid dead letter exchange name"),
        ({"max-length": True}, "true is not a valid maximum length"),
        ({"max-length": "5"}, '<<"5">> is not a valid maximum length'),
        # Keys are checked in sorted order; the first bad one is reported.
        ({"message-ttl": "abc", "max-length": -1}, "-1 is not a valid maximum length"),
        ({"ha-mode": "exactly"}, 'ha-mode="exactly" takes an integer, none given'),
        ({"queue-version": 3}, "3 is not a valid queue-version value"),
    ],
)
def test_policy_definition_refused_with_rabbitmq_text(
    definition: dict[str, Any], text: str
) -> None:
    assert refusal(policy, definition) == [text]


def test_validation_failed_reads_as_rabbitmqctl_prints_it() -> None:
    with pytest.raises(ValidationFailed) as info:
        policy({"expires": 0})
    assert str(info.value) == "Validation failed\n\n0 is not a valid queue expiry"
    assert isinstance(info.value, ValueError)


def test_apply_to_is_one_of_4_xs_values() -> None:
    # RabbitMQ 4.x's values and text (3.10 knew only queues, exchanges and all).
    assert refusal(policy, {"max-length": 1}, apply_to="foo") == [
        "apply-to 'foo' unrecognised; should be one of: 'queues', 'classic_queues',  "
        "'quorum_queues', 'streams', 'exchanges', or 'all'"
    ]
    for value in ("classic_queues", "quorum_queues", "streams"):
        assert policy({"max-length": 1}, apply_to=value).apply_to == value


def test_a_queue_type_apply_to_matches_only_that_type() -> None:
    for value, kind in (
        ("classic_queues", "classic"),
        ("quorum_queues", "quorum"),
        ("streams", "stream"),
    ):
        p = policy({"max-length-bytes": 10}, apply_to=value)
        assert [t for t in ("classic", "quorum", "stream") if p.matches("queue", "q", t)] == [
            kind
        ]
        assert not p.matches("exchange", "q")


def test_invalid_pattern_and_priority() -> None:
    (text,) = refusal(policy, {"max-length": 1}, pattern="(")
    assert text.startswith("pattern should be regular expression but is invalid: {")
    assert refusal(policy, {"max-length": 1}, priority="x") == [
        'priority should be a number, actually was <<"x">>'
    ]
    # Every failing field is reported, the definition first (RabbitMQ's order).
    errors = refusal(policy, {}, pattern="(", priority="x")
    assert errors[0] == "no policy provided"
    assert errors[-1] == 'priority should be a number, actually was <<"x">>'


def test_keys_rabbitmq_accepts_without_warren_using_them() -> None:
    for definition in (
        {"ha-mode": "all"},
        {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"},
        {"queue-master-locator": "min-masters"},
        {"queue-mode": "lazy", "queue-version": 2},
        {"dead-letter-routing-key": "k"},
        {"max-age": "7D", "delivery-limit": 3},
    ):
        assert policy(definition).definition == definition


@pytest.mark.parametrize(
    ("definition", "text"),
    [
        (
            {"alternate-exchange": "x"},
            '[{<<"alternate-exchange">>,<<"x">>}] are not recognised policy settings',
        ),
        (
            {"overflow": "drop-head"},
            '[{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings',
        ),
        ({"max-length": -1}, "-1 is not a valid maximum length"),
        ({}, "no policy provided"),
    ],
)
def test_operator_policy_keys_are_the_numeric_limits(definition: dict[str, Any], text: str) -> None:
    assert refusal(op_policy, definition) == [text]


def test_operator_policy_accepts_its_keys_and_any_apply_to() -> None:
    keys = {
        "expires": 1,
        "message-ttl": 0,
        "max-length": 0,
        "max-length-bytes": 0,
        "max-in-memory-length": 0,
        "max-in-memory-bytes": 0,
        "delivery-limit": 0,
    }
    p = op_policy(keys, apply_to="exchanges")
    assert p.operator and p.apply_to == "exchanges" and p.definition == keys


# -- matching (rabbit_policy:match/2, matches/2) ------------------------------------------


def test_pattern_is_searched_not_anchored() -> None:
    p = policy({"max-length": 1}, pattern="orders")
    assert p.matches("queue", "my-orders-1")
    anchored = policy({"max-length": 1}, pattern="^orders$")
    assert anchored.matches("queue", "orders")
    assert not anchored.matches("queue", "orders2")


def test_apply_to_selects_the_kind() -> None:
    queues = policy({"max-length": 1}, apply_to="queues")
    exchanges = policy({"alternate-exchange": "ae"}, apply_to="exchanges")
    everything = policy({"max-length": 1})
    assert queues.matches("queue", "x") and not queues.matches("exchange", "x")
    assert exchanges.matches("exchange", "x") and not exchanges.matches("queue", "x")
    assert everything.matches("queue", "x") and everything.matches("exchange", "x")


def test_highest_priority_wins_ties_by_name() -> None:
    low = policy({"max-length": 1}, name="low", priority=1)
    high = policy({"max-length": 2}, name="high", priority=5)
    other = policy({"max-length": 3}, name="other", priority=9, pattern="^nope$")
    assert best_match([low, high, other], "queue", "q") is high
    b = policy({"max-length": 1}, name="b")
    a = policy({"max-length": 1}, name="a")
    assert best_match([b, a], "queue", "q") is a
    assert best_match([], "queue", "q") is None


def test_policy_with_a_key_classic_queues_lack_does_not_apply_to_queues() -> None:
    # rabbit_classic_queue:capabilities/0 lists max-age & co as unsupported_policies;
    # RabbitMQ 3.10.8 showed no policy on a classic queue matched by such a policy.
    p = policy({"max-age": "1D", "max-length": 1})
    assert not p.matches("queue", "q")
    assert p.matches("exchange", "q")
    winner = best_match([p, policy({"max-length": 2}, name="z")], "queue", "q")
    assert winner is not None and winner.name == "z"


def test_delivery_limit_policy_applies_to_warren_queues() -> None:
    # RabbitMQ's classic queues ignore it; Warren's queues implement delivery-limit.
    p = policy({"delivery-limit": 3, "max-length": 1})
    assert p.matches("queue", "q")


# -- effective settings: RabbitMQ's precedence --------------------------------------------


def test_numeric_limits_take_the_lower_of_argument_and_policy() -> None:
    # rabbit_amqqueue_process:process_args_policy/1: expires, message-ttl,
    # max-length and max-length-bytes resolve with res_min (erlang:min).
    # Verified on RabbitMQ 3.10.8: x-max-length 7 with a policy max-length 3 keeps 3.
    p = policy({"expires": 1000, "message-ttl": 9000, "max-length": 3, "max-length-bytes": 50})
    args = {"x-expires": 5000, "x-message-ttl": 100, "x-max-length": 7, "x-max-length-bytes": 40}
    assert effective_queue_settings(args, p, None) == {
        "expires": 1000,
        "message-ttl": 100,
        "max-length": 3,
        "max-length-bytes": 40,
    }


def test_dead_lettering_and_overflow_arguments_beat_the_policy() -> None:
    # process_args_policy/1: dead-letter-exchange, dead-letter-routing-key and
    # overflow resolve with res_arg. Verified on RabbitMQ 3.10.8: dropped messages
    # went to the x-dead-letter-exchange, not to the policy's.
    p = policy(
        {
            "dead-letter-exchange": "pol",
            "dead-letter-routing-key": "pk",
            "overflow": "reject-publish",
        }
    )
    args = {
        "x-dead-letter-exchange": "arg",
        "x-dead-letter-routing-key": "ak",
        "x-overflow": "drop-head",
    }
    assert effective_queue_settings(args, p, None) == {
        "dead-letter-exchange": "arg",
        "dead-letter-routing-key": "ak",
        "overflow": "drop-head",
    }
    # Each key on its own: the argument's exchange with the policy's routing key.
    mixed = effective_queue_settings({"x-dead-letter-exchange": "arg"}, p, None)
    assert mixed["dead-letter-exchange"] == "arg" and mixed["dead-letter-routing-key"] == "pk"


def test_delivery_limit_takes_the_lower_and_max_age_the_policy() -> None:
    # rabbit_quorum_queue: delivery-limit with fun min/2; rabbit_stream_queue:
    # max-age with policy_precedence/2. (Such policies match no classic queue in
    # 3.10; the function still resolves them the way those queue types do.)
    p = Policy("p", ".*", {"delivery-limit": 5, "max-age": "1D"})
    args = {"x-delivery-limit": 3, "x-max-age": "7D"}
    assert effective_queue_settings(args, p, None) == {"delivery-limit": 3, "max-age": "1D"}


def test_one_source_alone_is_taken_and_unset_keys_are_absent() -> None:
    p = policy({"message-ttl": 500})
    assert effective_queue_settings({}, p, None) == {"message-ttl": 500}
    assert effective_queue_settings({"x-max-length": 2}, None, None) == {"max-length": 2}
    assert effective_queue_settings({"x-max-priority": 5}, None, None) == {}
    assert effective_queue_settings({"x-dead-letter-exchange": b"dlx"}, None, None) == {
        "dead-letter-exchange": "dlx"
    }


def test_operator_policy_and_policy_merge_to_the_lower_value() -> None:
    # rabbit_policy:get/2 merges with rabbit_policies:merge_policy_value/3 (min) for
    # the keys an operator policy may set. Verified on RabbitMQ 3.10.8: policy
    # max-length 3 and operator policy max-length 10 kept 3 messages.
    p = policy({"max-length": 3, "message-ttl": 5000, "dead-letter-exchange": "dlx"})
    op = op_policy({"max-length": 10, "message-ttl": 1000, "expires": 60000})
    assert effective_queue_settings({}, p, op) == {
        "max-length": 3,
        "message-ttl": 1000,
        "expires": 60000,
        "dead-letter-exchange": "dlx",
    }
    # The merged policy value then meets the argument: lower still wins.
    assert effective_queue_settings({"x-max-length": 2}, p, op)["max-length"] == 2
    assert effective_queue_settings({}, None, op) == {
        "max-length": 10,
        "message-ttl": 1000,
        "expires": 60000,
    }
    # rabbit_policy:merge_operator_definitions/2 (the effective policy definition).
    assert effective_definition(p, op) == {
        "dead-letter-exchange": "dlx",
        "expires": 60000,
        "max-length": 3,
        "message-ttl": 1000,
    }
    assert effective_definition(None, None) is None


# -- a vhost's policies, through the broker -----------------------------------------------


def test_set_and_clear_apply_to_existing_and_new_objects(broker: Harness) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("pol-before", durable=True)
        ch.exchange_declare("pol-ex", "direct")
        b = broker.broker

        def state(queue: str) -> tuple[Any, ...]:
            v = b.vhosts["/"]
            q = v.queues[queue]
            return (
                q.policy and q.policy.name,
                q.operator_policy and q.operator_policy.name,
                v.exchanges["pol-ex"].policy and v.exchanges["pol-ex"].policy.name,
            )

        broker.call(lambda: b.set_policy("/", "caps", "^pol-", {"max-length": 5}, 1, "all"))
        broker.call(lambda: b.set_operator_policy("/", "ops", "^pol-", {"max-length": 2}))
        assert broker.call(lambda: state("pol-before")) == ("caps", "ops", "caps")
        ch.queue_declare("pol-after")
        assert broker.call(lambda: state("pol-after")) == ("caps", "ops", "caps")
        ch.queue_declare("pol-excl", exclusive=True)
        assert broker.call(lambda: state("pol-excl")) == ("caps", "ops", "caps")

        broker.call(
            lambda: b.set_policy(
                "/", "ex-only", "^pol-ex$", {"alternate-exchange": "a"}, 5, "exchanges"
            )
        )
        assert broker.call(lambda: state("pol-before")) == ("caps", "ops", "ex-only")
        broker.call(lambda: b.clear_policy("/", "caps"))
        broker.call(lambda: b.clear_operator_policy("/", "ops"))
        assert broker.call(lambda: state("pol-before")) == (None, None, "ex-only")
        listed = broker.call(lambda: [p.name for p in b.policies("/")])
        assert listed == ["ex-only"]
        assert broker.call(lambda: b.operator_policies("/")) == []


def test_queue_is_told_only_when_its_policies_change(broker: Harness) -> None:
    # As rabbit_policy:update_queue/3: an unchanged match is no_change. The queue
    # keeps the very Policy object it was given until apply_policies runs again.
    b = broker.broker
    q = broker.call(lambda: b.vhosts["/"].declare_queue("told"))
    broker.call(lambda: b.set_policy("/", "t", "^told$", {"max-length": 1}))
    given = q.policy
    assert given is not None and given.definition == {"max-length": 1}
    broker.call(lambda: b.set_policy("/", "t", "^told$", {"max-length": 1}))  # same value
    broker.call(lambda: b.set_policy("/", "elsewhere", "^x$", {"max-length": 1}))
    assert q.policy is given
    broker.call(lambda: b.set_policy("/", "t", "^told$", {"max-length": 2}))  # new definition
    assert q.policy is not given and q.policy.definition == {"max-length": 2}
    broker.call(lambda: b.clear_policy("/", "t"))
    assert q.policy is None


def test_broker_api_errors(broker: Harness) -> None:
    b = broker.broker
    with pytest.raises(NotFound, match="Virtual host 'nope' does not exist"):
        broker.call(lambda: b.set_policy("nope", "p", ".*", {"max-length": 1}))
    with pytest.raises(NotFound, match="Parameter does not exist"):
        broker.call(lambda: b.clear_policy("/", "missing"))
    with pytest.raises(NotFound, match="Parameter does not exist"):
        broker.call(lambda: b.clear_operator_policy("/", "missing"))
    with pytest.raises(ValidationFailed):
        broker.call(lambda: b.set_operator_policy("/", "o", ".*", {"overflow": "drop-head"}))
    assert broker.call(lambda: b.operator_policies("/")) == []


def _publish_unroutable(ch: Any, exchange: str) -> bool:
    """Publish mandatory with confirms; False when the broker returned it as unroutable."""
    try:
        ch.basic_publish(exchange, "nobody-binds-this", b"m", mandatory=True)
    except Unroutable:
        return False
    return True


def test_alternate_exchange_from_a_policy(broker: Harness) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("ae-target", "fanout")
        ch.queue_declare("ae-sink")
        ch.queue_bind("ae-sink", "ae-target")
        ch.exchange_declare("ae-source", "direct")
        assert not _publish_unroutable(ch, "ae-source")

        b = broker.broker
        broker.call(
            lambda: b.set_policy(
                "/", "ae", "^ae-source$", {"alternate-exchange": "ae-target"}, 0, "exchanges"
            )
        )
        assert _publish_unroutable(ch, "ae-source")
        method, _props, body = ch.basic_get("ae-sink", auto_ack=True)
        assert method is not None and body == b"m"

        broker.call(lambda: b.clear_policy("/", "ae"))
        assert not _publish_unroutable(ch, "ae-source")
        assert ch.basic_get("ae-sink", auto_ack=True)[0] is None


def test_alternate_exchange_argument_beats_the_policy(broker: Harness) -> None:
    # rabbit_policy:get_arg/3: the exchange's own argument first. Verified on
    # RabbitMQ 3.10.8 with a policy AE and an exchange declared with another AE.
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for name in ("by-arg", "by-policy"):
            ch.exchange_declare(name, "fanout")
            ch.queue_declare(name + "-q")
            ch.queue_bind(name + "-q", name)
        ch.exchange_declare("src-arg", "direct", arguments={"alternate-exchange": "by-arg"})
        ch.exchange_declare("src-none", "direct")
        b = broker.broker
        broker.call(lambda: b.set_policy("/", "ae", "^src-", {"alternate-exchange": "by-policy"}))
        assert _publish_unroutable(ch, "src-arg")
        assert _publish_unroutable(ch, "src-none")
        assert ch.queue_declare("by-arg-q", passive=True).method.message_count == 1
        assert ch.queue_declare("by-policy-q", passive=True).method.message_count == 1


def test_policies_survive_a_restart(tmp_path: Path) -> None:
    with Harness(tmp_path / "data") as first:
        b = first.broker
        with connect(first) as conn:
            ch = conn.channel()
            ch.exchange_declare("keep-ae", "fanout", durable=True)
            ch.queue_declare("keep-sink", durable=True)
            ch.queue_bind("keep-sink", "keep-ae")
            ch.exchange_declare("keep-src", "direct", durable=True)
            ch.queue_declare("keep-q", durable=True, arguments={"x-max-length": 2})

        def configure() -> None:
            b.set_policy(
                "/", "limits", "^keep-q$", {"max-length": 10, "message-ttl": 60000}, 3, "queues"
            )
            b.set_policy(
                "/", "ae", "^keep-src$", {"alternate-exchange": "keep-ae"}, 0, "exchanges"
            )
            b.set_policy("/", "gone", ".*", {"max-length": 1})
            b.clear_policy("/", "gone")
            b.set_operator_policy("/", "cap", ".*", {"message-ttl": 1000}, 0, "queues")

        first.call(configure)

    with Harness(tmp_path / "data") as second:
        b2 = second.broker

        def inspect() -> tuple[Any, ...]:
            v = b2.vhosts["/"]
            q = v.queues["keep-q"]
            return (
                [(p.name, p.pattern, p.priority, p.apply_to, p.definition) for p in v.policies],
                [(p.name, p.definition) for p in v.operator_policies],
                q.policy.name if q.policy else None,
                q.operator_policy.name if q.operator_policy else None,
                effective_queue_settings(q.arguments, q.policy, q.operator_policy),
                v.exchanges["keep-src"].alternate_exchange,
            )

        assert second.call(inspect) == (
            [
                ("limits", "^keep-q$", 3, "queues", {"max-length": 10, "message-ttl": 60000}),
                ("ae", "^keep-src$", 0, "exchanges", {"alternate-exchange": "keep-ae"}),
            ],
            [("cap", {"message-ttl": 1000})],
            "limits",
            "cap",
            {"max-length": 2, "message-ttl": 1000},
            "keep-ae",
        )
        with connect(second) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            assert _publish_unroutable(ch, "keep-src")
            assert ch.queue_declare("keep-sink", passive=True).method.message_count == 1


def test_policy_definition_types_survive_json_round_trip(tmp_path: Path) -> None:
    definition = {"ha-mode": "nodes", "ha-params": ["a", "b"], "max-length-bytes": 2**40}
    with Harness(tmp_path / "data") as first:
        first.call(lambda: first.broker.set_policy("/", "types", "x", definition))
    with Harness(tmp_path / "data") as second:
        assert second.call(lambda: second.broker.policies("/")[0].definition) == definition
