"""The retained messages' topic tree matches a filter exactly as the MQTT rules do
(`filter_matches`, the reference), in the order the topics were first retained."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.mqtt.retained import RetainedMessage, TopicTree, filter_matches

LEVEL = st.sampled_from(["a", "b", "", "$SYS", "$x", "c d"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join)
FILTER_LEVEL = st.sampled_from(["a", "b", "", "$SYS", "+"])
FILTER = st.tuples(st.lists(FILTER_LEVEL, min_size=1, max_size=4), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] else t[0])
)


def message(topic: str) -> RetainedMessage:
    return RetainedMessage(topic, b"x", 0, b"", 0)


@settings(max_examples=300, deadline=None)
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
