"""The duplicate window's bookkeeping: ids in two generations (each id remembered for at least
the window, or at least until ``max_entries`` newer ids came; forgotten a generation at a time),
a batch's ids checked and remembered in bulk, and ids remembered by their hash, two UNIQ_KEYs of
one hash told apart by the stored records."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.broker.messaging.dedup import DedupIndex
from txmq.broker.metrics import BrokerMetrics
from txmq.broker.store import MessageStore, StoreConfig
from txmq.protocol.message import MessageConst, MessageExt


def _index(window_ms: int = 1000, max_entries: int = 100) -> DedupIndex:
    return DedupIndex(window_ms, max_entries, BrokerMetrics())


def _ids(d: DedupIndex, topic: str) -> list[str]:
    return [u for u in (f"u{i}" for i in range(200)) if d.known(topic, u)]


def _early(d: DedupIndex) -> float:
    return float(d.metrics.dedup_evicted_early._value.get())


def _placed(offsets: list[int]) -> list[tuple[int, int, int]]:
    return [(o, 100, i) for i, o in enumerate(offsets)]


def test_a_batch_is_remembered_at_least_a_window_and_forgotten_a_generation_at_a_time() -> None:
    d = _index(window_ms=1000)
    ids = d.fresh("t", ["u1", "u2", "u3"])
    assert ids is not None
    d.add_fresh("t", ids, _placed([10, 20, 30]), 5_000)
    d.add_many("t", ["u4"], [40], 5_500)
    assert len(d) == 4
    assert d.any_known("t", ["x", "u2"]) and not d.any_known("t", ["x", "y"])
    assert not d.any_known("other", ["u1"])
    # A window after the first: a new generation; the old one is still remembered.
    d.add_many("t", ["u5"], [50], 6_000)
    assert _ids(d, "t") == ["u1", "u2", "u3", "u4", "u5"]
    d.add(("t", "u6"), 60, 6_999)
    assert _ids(d, "t") == ["u1", "u2", "u3", "u4", "u5", "u6"]
    # Another window: the first generation goes whole (u4 was stored 1.5 s ago).
    d.add(("t", "u7"), 70, 7_000)
    assert _ids(d, "t") == ["u5", "u6", "u7"]
    assert len(d) == 3
    assert _early(d) == 0  # past their window, not cut short
    # Idle for longer than two windows: all forgotten at the next send.
    d.add(("t", "u8"), 80, 9_500)
    d.add(("t", "u9"), 90, 10_600)
    assert _ids(d, "t") == ["u8", "u9"]


def test_over_the_bound_a_generation_is_dropped_and_counted_as_cut_short() -> None:
    d = _index(window_ms=60_000, max_entries=4)
    d.add_many("t", ["u1", "u2", "u3"], [1, 2, 3], 1_000)
    d.add_many("t", ["u4", "u5"], [4, 5], 2_000)  # the generation is full after this
    assert _ids(d, "t") == ["u1", "u2", "u3", "u4", "u5"]
    d.add_many("t", ["u6"], [6], 3_000)  # a new generation; the full one kept
    assert _ids(d, "t") == ["u1", "u2", "u3", "u4", "u5", "u6"]
    assert _early(d) == 0
    d.add_many("t", ["u7", "u8", "u9"], [7, 8, 9], 4_000)
    d.add_many("t", ["u10"], [10], 5_000)  # the first generation goes, inside its window
    assert _ids(d, "t") == ["u6", "u7", "u8", "u9", "u10"]
    assert _early(d) == 5
    # Every id was remembered until at least max_entries newer ones came.


def test_a_batch_with_a_known_id_or_an_id_twice_is_not_fresh() -> None:
    d = _index(window_ms=60_000)
    d.add_many("t", ["u1", "u2"], [1, 2], 1_000)
    assert d.fresh("t", ["u3", "u1"]) is None
    assert d.fresh("t", ["u3", "u4", "u3"]) is None
    assert d.fresh("t", ["u3", "u4"]) is not None
    assert d.fresh("other", ["u1", "u2"]) is not None
    # An id stored again (after its window) is remembered once, with its new place.
    d.add_many("t", ["u3", "u1", "u3", "u4"], [3, 11, 33, 4], 2_000)
    assert len(d) == 4
    assert _ids(d, "t") == ["u1", "u2", "u3", "u4"]


def test_topics_are_apart_and_an_emptied_topic_is_dropped() -> None:
    d = _index(window_ms=1000)
    d.add_many("a", ["u1", "u2"], [1, 2], 1_000)
    d.add_many("b", ["u1"], [3], 1_000)
    assert _ids(d, "a") == ["u1", "u2"] and _ids(d, "b") == ["u1"]
    d.add_many("b", ["u4"], [5], 2_000)
    d.add_many("b", ["u5"], [6], 3_000)
    assert _ids(d, "a") == [] and _ids(d, "b") == ["u4", "u5"]
    assert "a" not in d._cur and "a" not in d._prev


# -- two UNIQ_KEYs of one hash --------------------------------------------------------------------


#: The store's clock (ms), fixed: what its records are stamped with.
T0 = 1_700_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(StoreConfig(str(tmp_path / "store")), ("127.0.0.1", 10911), lambda: T0 / 1000)
    s.load()
    with contextlib.closing(s):
        yield s


def _put(store: MessageStore, topic: str, uniq: str) -> int:
    m = MessageExt(topic=topic, body=uniq.encode(), properties={MessageConst.UNIQ_KEY: uniq})
    return store.put_message(m).commit_log_offset


def test_uniq_keys_of_one_hash_answer_each_their_own_first_send(store: MessageStore) -> None:
    """A worst hash (every UNIQ_KEY alike): the stored records tell the ids apart, through a
    generation change, and an id stored again after its window answers from its new copy."""
    d = DedupIndex(60_000, 1000, BrokerMetrics(), store.lookup_message, key_hash=lambda u: 7)
    t0 = T0
    a = _put(store, "t", "A")
    d.add(("t", "A"), a, t0)
    assert d.known("t", "B")  # its hash is known: a resend as far as the quick check can tell
    got = d.get(("t", "B"), t0)
    assert got is None  # the record read back is A's: B is new
    b = _put(store, "t", "B")
    d.add(("t", "B"), b, t0)
    c = _put(store, "t", "C")
    d.add(("t", "C"), c, t0)
    for uniq, phy in (("A", a), ("B", b), ("C", c)):
        s = d.get(("t", uniq), t0)
        assert s is not None and s.commit_log_offset == phy, uniq
    assert d.get(("t", "D"), t0) is None
    assert d.get(("u", "A"), t0) is None  # the same id, another topic
    # A new generation (a window later): all still answered until the next one.
    d.add(("t", "E"), _put(store, "t", "E"), t0 + 60_000)
    for uniq, phy in (("A", a), ("B", b), ("C", c)):
        s = d.get(("t", uniq), t0 + 1)
        assert s is not None and s.commit_log_offset == phy, uniq
        assert d.known("t", uniq)
    # B stored again (its first copy past the window): it answers from its new copy, A and C
    # are still themselves.
    b2 = _put(store, "t", "B")
    d.add(("t", "B"), b2, t0 + 60_000)
    s = d.get(("t", "B"), t0 + 1)
    assert s is not None and s.commit_log_offset == b2
    s = d.get(("t", "A"), t0 + 1)
    assert s is not None and s.commit_log_offset == a


def test_a_fast_batch_check_sees_every_id_of_a_colliding_hash(store: MessageStore) -> None:
    d = DedupIndex(60_000, 1000, BrokerMetrics(), store.lookup_message, key_hash=len)
    t0 = T0
    d.add(("t", "AA"), _put(store, "t", "AA"), t0)
    d.add(("t", "BB"), _put(store, "t", "BB"), t0)  # same length: the same "hash"
    assert d.fresh("t", ["CC"]) is None  # maybe known: the generic path reads it back
    assert d.fresh("t", ["DDD"]) is not None
    d.add(("t", "X"), _put(store, "t", "X"), t0 + 60_000)  # a new generation
    d.add(("t", "Y"), _put(store, "t", "Y"), t0 + 120_000)  # and another: AA and BB go
    assert d.fresh("t", ["CC"]) is not None
    assert d.get(("t", "BB"), t0 + 120_000) is None
