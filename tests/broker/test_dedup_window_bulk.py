"""The duplicate window's bookkeeping in bulk: a batch's ids are remembered with one update and
forgotten mark by mark; what it remembers, in which order, and what it forgets first must be
what one id at a time gives (the oldest first, an id stored again keeping its first place)."""

from __future__ import annotations

from txmq.broker.messaging.dedup import DedupIndex
from txmq.broker.metrics import BrokerMetrics


def _index(window_ms: int = 1000, max_entries: int = 100) -> DedupIndex:
    return DedupIndex(window_ms, max_entries, BrokerMetrics())


def _ids(d: DedupIndex, topic: str) -> list[str]:
    return [u for u in (f"u{i}" for i in range(200)) if d.known(topic, u)]


def _early(d: DedupIndex) -> float:
    return float(d.metrics.dedup_evicted_early._value.get())


def test_batch_remembered_and_forgotten_after_its_window() -> None:
    d = _index(window_ms=1000)
    d.add_many("t", ["u1", "u2", "u3"], [10, 20, 30], 5_000)
    d.add_many("t", ["u4"], [40], 5_500)
    assert len(d) == 4
    assert d.any_known("t", ["x", "u2"]) and not d.any_known("t", ["x", "y"])
    assert not d.any_known("other", ["u1"])
    d.add_many("t", ["u5"], [50], 6_001)  # the first batch is past its window now
    assert _ids(d, "t") == ["u4", "u5"]
    assert len(d) == 2
    d.add(("t", "u6"), 60, 6_600)  # the second one is past its window too
    assert _ids(d, "t") == ["u5", "u6"]
    assert len(d) == 2


def test_over_the_bound_the_oldest_go_first_even_inside_a_batch() -> None:
    d = _index(window_ms=60_000, max_entries=5)
    d.add_many("t", ["u1", "u2", "u3"], [1, 2, 3], 1_000)
    d.add_many("t", ["u4", "u5", "u6", "u7"], [4, 5, 6, 7], 2_000)
    assert len(d) == 5
    assert _ids(d, "t") == ["u3", "u4", "u5", "u6", "u7"]
    assert _early(d) == 2
    d.add_many("t", ["u8", "u9"], [8, 9], 3_000)  # cuts into the second batch's mark
    assert _ids(d, "t") == ["u5", "u6", "u7", "u8", "u9"]
    assert _early(d) == 4


def test_an_id_stored_again_keeps_its_first_place_and_is_counted_once() -> None:
    d = _index(window_ms=60_000, max_entries=4)
    d.add_many("t", ["u1", "u2"], [1, 2], 1_000)
    # u1 again (with a new offset) and u3 twice in one batch: two new ids, not four.
    d.add_many("t", ["u3", "u1", "u3", "u4"], [3, 11, 33, 4], 2_000)
    assert len(d) == 4
    assert d._topics["t"] == {"u1": 11, "u2": 2, "u3": 33, "u4": 4}
    d.add(("t", "u5"), 5, 3_000)  # over the bound by one: u1, the oldest place, goes
    assert _ids(d, "t") == ["u2", "u3", "u4", "u5"]
    d.add(("t", "u2"), 22, 3_000)  # known: keeps its place, nothing added
    assert len(d) == 4
    d.add_many("t", ["u6", "u7"], [6, 7], 4_000)
    assert _ids(d, "t") == ["u4", "u5", "u6", "u7"]


def test_topics_are_forgotten_apart_and_an_emptied_topic_is_dropped() -> None:
    d = _index(window_ms=1000)
    d.add_many("a", ["u1", "u2"], [1, 2], 1_000)
    d.add_many("b", ["u1"], [3], 1_000)
    d.add_many("a", ["u3"], [4], 1_500)
    assert _ids(d, "a") == ["u1", "u2", "u3"] and _ids(d, "b") == ["u1"]
    d.add_many("b", ["u4"], [5], 2_200)
    assert _ids(d, "a") == ["u3"] and _ids(d, "b") == ["u4"]
    d.add_many("b", ["u5"], [6], 3_400)
    assert "a" not in d._topics
    assert _ids(d, "b") == ["u5"] and len(d) == 1


def test_the_caller_list_is_not_changed_by_later_appends_in_the_same_millisecond() -> None:
    d = _index(window_ms=1000)
    first = ["u1", "u2"]
    d.add_many("t", first, [1, 2], 1_000)
    d.add_many("t", ["u3"], [3], 1_000)  # shares the first append's mark
    d.add(("t", "u4"), 4, 1_000)
    assert first == ["u1", "u2"]
    d.add_many("t", ["u5"], [5], 2_001)
    assert _ids(d, "t") == ["u5"] and len(d) == 1
