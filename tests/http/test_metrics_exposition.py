"""The Prometheus text writer (warren/metrics/exposition.py): a family of one
sample per queue joined in C from cached label texts reads the same as the
same samples written one by one, whatever the values and names."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from warren.metrics.exposition import LabelCache, Text, labels

NAMES = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 0.0, 1.0]),
)


@settings(max_examples=200, deadline=None)
@given(
    queues=st.lists(st.tuples(st.sampled_from(["/", "v\\1", 'q"', "é"]), NAMES), max_size=30),
    values=st.data(),
    cached=st.booleans(),
)
def test_series_reads_as_the_samples_one_by_one(
    queues: list[tuple[str, str]], values: st.DataObject, cached: bool
) -> None:
    column = values.draw(st.lists(VALUES, min_size=len(queues), max_size=len(queues)))
    cache = LabelCache()
    vhosts, names = [v for v, _ in queues], [n for _, n in queues]
    if cached:  # a second scrape takes the texts from the cache
        cache.queues(vhosts, names)
        cache.done()
    prefixes = cache.queues(vhosts, names)
    fast, slow = Text(), Text()
    fast.head("rabbitmq_x", "gauge", "X")
    fast.series("rabbitmq_x", prefixes, column)
    kept = [(v, n, x) for (v, n), x in zip(queues, column, strict=True) if x is not None]
    slow.family("rabbitmq_x", "gauge", "X", [(labels(vhost=v, queue=n), x) for v, n, x in kept])
    text = fast.take()
    assert text == slow.take()
    [family] = text_string_to_metric_families(text)
    got = [(s.labels["vhost"], s.labels["queue"], s.value) for s in family.samples]
    assert len(got) == len(kept)
    for (gv, gn, gx), (v, n, x) in zip(got, kept, strict=True):
        assert (gv, gn) == (v, n) and (gx == x or math.isclose(gx, x))
