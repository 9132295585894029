"""The two trees of topic levels match as the MQTT rules do (`filter_matches`, the
reference): the retained messages' (which topics a filter matches, in the order
they were first retained) and a session's subscriptions' (which filters a topic
matches, in the order they were made)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.mqtt.filters import FilterIndex
from warren.mqtt.retained import RetainedMessage, TopicTree, filter_matches
from warren.mqtt.session import SubscriptionOptions
from warren.mqtt.topics import mqtt_to_amqp

LEVEL = st.sampled_from(["a", "b", "", "$SYS", "$x", "c d"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join)
FILTER_LEVEL = st.sampled_from(["a", "b", "", "$SYS", "+"])
FILTER = st.tuples(st.lists(FILTER_LEVEL, min_size=1, max_size=4), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] else t[0])
)


def message(topic: str) -> RetainedMessage:
    return RetainedMessage(topic, b"x", 0, b"", 0)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(TOPIC, max_size=20), st.lists(TOPIC, max_size=5), st.lists(FILTER, max_size=8))
def test_tree_matches_as_the_rules_do(
    topics: list[str], removed: list[str], filters: list[str]
) -> None:
    tree = TopicTree()
    retained: dict[str, RetainedMessage] = {}
    for topic in topics:
        msg = message(topic)
        tree.put(msg)
        retained[topic] = msg  # a topic retained again keeps its place
    for topic in removed:
        tree.remove(topic)
        retained.pop(topic, None)
    for topic in removed[:2]:  # retained again: last
        tree.put(message(topic))
        retained[topic] = message(topic)
    for topic_filter in [*filters, "#", "+/#"]:
        expected = [t for t in retained if filter_matches(topic_filter, t)]
        assert [m.topic for m in tree.matching(topic_filter)] == expected, topic_filter


def test_removing_prunes_and_re_adding_goes_last() -> None:
    tree = TopicTree()
    for topic in ("a/b", "a", "c"):
        tree.put(message(topic))
    tree.remove("a/b")
    tree.remove("a/b")  # not there: nothing happens
    tree.put(message("a/b"))
    assert [m.topic for m in tree.matching("#")] == ["a", "c", "a/b"]
    assert [m.topic for m in tree.matching("a/#")] == ["a", "a/b"]
    assert [m.topic for m in tree.matching("+")] == ["a", "c"]


def options(topic_filter: str) -> SubscriptionOptions:
    return SubscriptionOptions(1, binding_key=mqtt_to_amqp(topic_filter))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(FILTER, max_size=12), st.lists(FILTER, max_size=4), st.lists(TOPIC, max_size=8))
def test_filter_index_matches_as_the_rules_do(
    filters: list[str], removed: list[str], topics: list[str]
) -> None:
    index = FilterIndex()
    subscribed: dict[str, SubscriptionOptions] = {}
    for topic_filter in filters:
        opts = options(topic_filter)
        index.put(topic_filter, opts)
        subscribed[topic_filter] = opts  # options replaced: the same place
    for topic_filter in removed:
        if topic_filter in subscribed:
            index.remove(topic_filter, subscribed.pop(topic_filter))
    assert len(index) == len(subscribed)
    for topic in [*topics, "$SYS/a", "a"]:
        expected = [o for f, o in subscribed.items() if filter_matches(f, topic)]
        assert index.matching(topic) == expected, topic
