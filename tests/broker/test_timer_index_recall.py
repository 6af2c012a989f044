"""The timer index finds the timers due at one millisecond and takes one out (a recall),
wherever it is: in a second still to come or in the second being fired; what is left fires
once, nothing recalled fires."""

from __future__ import annotations

import random

from txmq.broker.messaging.timer import TimerIndex

BASE = 1_700_000_000_000


def test_recalled_timers_never_fire_and_the_others_fire_once() -> None:
    rnd = random.Random(11)
    idx = TimerIndex()
    due_of: dict[int, int] = {}
    for phy in range(3000):
        due_of[phy] = BASE + rnd.randrange(0, 10_000)
        idx.add(due_of[phy], phy, phy, BASE)
    recalled: set[int] = set()
    taken: list[int] = []
    t = BASE
    while len(idx):
        t += rnd.randrange(1, 200)
        # Recall a few of those still pending, some in the second being fired.
        pool = sorted(set(due_of) - recalled - set(taken))
        for phy in rnd.sample(pool, k=min(3, len(pool))):
            if due_of[phy] <= t:
                continue  # due: it may already be taken
            assert phy in idx.at(due_of[phy])
            assert idx.remove(due_of[phy], phy)
            assert not idx.remove(due_of[phy], phy), "removed twice"
            assert phy not in idx.at(due_of[phy])
            recalled.add(phy)
        got, _ = idx.take_due(t, 100)
        assert all(due_of[p] <= t for p in got)
        taken.extend(got)
    assert recalled and not recalled & set(taken), "a recalled timer fired"
    assert sorted(taken) == sorted(set(due_of) - recalled), "a timer was lost or fired twice"


def test_at_finds_only_that_millisecond() -> None:
    idx = TimerIndex()
    idx.add(BASE + 1500, 1, 0, BASE)
    idx.add(BASE + 1500, 2, 1, BASE)
    idx.add(BASE + 1501, 3, 2, BASE)
    idx.add(BASE - 10, 4, 3, BASE)  # overdue when read: not recallable
    assert sorted(idx.at(BASE + 1500)) == [1, 2]
    assert idx.at(BASE + 1501) == [3]
    assert idx.at(BASE - 10) == [] and not idx.remove(BASE - 10, 4)
    # Once the second is being fired, its rest is still found.
    got, _ = idx.take_due(BASE + 1500, 10)
    assert sorted(got) == [1, 2, 4]
    assert idx.at(BASE + 1501) == [3] and idx.remove(BASE + 1501, 3)
    assert len(idx) == 0 and idx.take_due(BASE + 5000, 10)[0] == []
