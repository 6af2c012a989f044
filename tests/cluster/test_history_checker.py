"""The partition tests' history checker on hand-built histories: a clean history passes, and
each anomaly kind is caught (and only it)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.support.history import (
    DUPLICATE,
    FAILED_DELIVERED,
    LOST,
    PARTIAL,
    READ_LOST,
    ROLLED_BACK_DELIVERED,
    SPLIT_BRAIN,
    UNEXPECTED,
    History,
    check,
    leader_events,
)


def fake_clock() -> Any:
    ticks = itertools.count()
    return lambda: float(next(ticks))


def base() -> History:
    """Two acknowledged sends, one unknown, one failed; a committed and a rolled-back
    transaction; a consumer read."""
    h = History(fake_clock())
    a = h.invoke("p0", "send", "s-1")
    h.ok(a)
    b = h.invoke("p0", "send", "s-2")
    h.ok(b)
    c = h.invoke("p1", "send", "s-3")
    h.info(c, "request timed out")
    d = h.invoke("p1", "send", "s-4")
    h.fail(d, "refused by a follower")
    t = h.invoke("t0", "txn", {"id": "t-1", "msgs": ["t-1.0", "t-1.1"], "decision": "commit"})
    h.ok(t)
    r = h.invoke("t0", "txn", {"id": "t-2", "msgs": ["t-2.0", "t-2.1"], "decision": "rollback"})
    h.ok(r)
    u = h.invoke("t0", "txn", {"id": "t-3", "msgs": ["t-3.0", "t-3.1"], "decision": "commit"})
    h.info(u, "decision timed out")
    rd = h.invoke("c0", "read", None)
    h.ok(rd, ["s-2", "s-2"])
    return h


def drain(h: History, ids: list[str]) -> History:
    inv = h.invoke("final", "drain", None)
    h.ok(inv, ids)
    return h


CLEAN = ["s-1", "s-2", "t-1.0", "t-1.1"]


def test_a_clean_history_passes_and_counts() -> None:
    res = check(drain(base(), CLEAN))
    assert res.valid, res.report()
    assert res.stats["sends_ok"] == 2 and res.stats["sends_info"] == 1
    assert res.stats["sends_fail"] == 1 and res.stats["txns_committed_ok"] == 1
    assert res.stats["redelivered"] == 1  # the consumer's repeat is at-least-once, not stored


def test_unknown_operations_may_or_may_not_be_there() -> None:
    res = check(drain(base(), [*CLEAN, "s-3", "t-3.0", "t-3.1"]))
    assert res.valid, res.report()


def test_an_invocation_never_completed_counts_as_unknown() -> None:
    h = base()
    h.invoke("p9", "send", "s-9")
    assert check(drain(h, CLEAN)).valid
    h2 = base()
    h2.invoke("p9", "send", "s-9")
    assert check(drain(h2, [*CLEAN, "s-9"])).valid


@pytest.mark.parametrize(
    ("stored", "kind"),
    [
        (["s-2", "t-1.0", "t-1.1"], LOST),  # acknowledged send missing
        (["s-1", "s-2"], LOST),  # acknowledged commit wholly missing
        (["s-1", "s-2", "t-1.0"], PARTIAL),  # acknowledged commit seen in part
        ([*CLEAN, "t-3.1"], PARTIAL),  # unknown commit seen in part
        ([*CLEAN, "x-1"], UNEXPECTED),  # never sent
        ([*CLEAN, "s-4"], FAILED_DELIVERED),  # its send certainly failed
        ([*CLEAN, "t-2.0", "t-2.1"], ROLLED_BACK_DELIVERED),
        ([*CLEAN, "s-2"], DUPLICATE),  # stored twice
    ],
)
def test_each_anomaly_is_caught(stored: list[str], kind: str) -> None:
    res = check(drain(base(), stored))
    assert res.kinds() == {kind}, res.report()
    assert kind in res.report()


def test_a_consumer_handed_a_rolled_back_or_unsent_message_is_caught() -> None:
    h = base()
    rd = h.invoke("c0", "read", None)
    h.ok(rd, ["t-2.1", "ghost"])
    res = check(drain(h, CLEAN))
    # (and neither is stored after heal: read, then gone)
    assert res.kinds() == {ROLLED_BACK_DELIVERED, UNEXPECTED, READ_LOST}, res.report()
    # The excerpt names the operations involved: the transaction and the read.
    rolled = next(a for a in res.anomalies if a.kind == ROLLED_BACK_DELIVERED)
    assert [op.f for op in rolled.ops] == ["txn", "txn", "read"]


def test_a_message_read_then_gone_is_caught() -> None:
    h = base()
    rd = h.invoke("c0", "read", None)
    h.ok(rd, ["s-3"])  # an unknown send, read during the run
    assert check(drain(h, [*CLEAN, "s-3"])).valid
    res = check(drain(h, CLEAN))
    assert res.kinds() == {READ_LOST}, res.report()
    assert [op.f for op in res.anomalies[0].ops] == ["send", "send", "read", "drain"]


def test_a_transaction_decided_rollback_after_its_halves_failed() -> None:
    h = History(fake_clock())
    t = h.invoke("t0", "txn", {"id": "t-9", "msgs": ["t-9.0"], "decision": "commit"})
    h.info(t, "half timed out", {"id": "t-9", "msgs": ["t-9.0"], "decision": "rollback"})
    assert check(drain(h, [])).valid
    assert check(drain(h, ["t-9.0"])).kinds() == {ROLLED_BACK_DELIVERED}


def test_two_leaders_in_one_epoch() -> None:
    ok = [
        {"group": "g1", "replica": 0, "epoch": 1},
        {"group": "g1", "replica": 1, "epoch": 2},
        {"group": "g1", "replica": 1, "epoch": 2},  # the same replica logged twice: fine
        {"group": "g2", "replica": 0, "epoch": 2},  # another group
    ]
    assert check(drain(base(), CLEAN), ok).valid
    bad = [*ok, {"group": "g1", "replica": 2, "epoch": 2}]
    res = check(drain(base(), CLEAN), bad)
    assert res.kinds() == {SPLIT_BRAIN}
    assert "replicas [1, 2]" in res.report()


def test_leader_events_from_a_broker_log() -> None:
    lines = [
        '{"event": "follower_started", "group": "g1"}',
        "not json",
        '{"event": "leading", "group": "g1", "replica": 2, "epoch": 5, "timestamp": "t"}',
    ]
    assert leader_events(lines, "g1", 2) == [
        {"group": "g1", "replica": 2, "epoch": 5, "timestamp": "t"}
    ]


def test_a_history_without_a_final_read_is_refused() -> None:
    with pytest.raises(ValueError, match="drain"):
        check(base())


def test_a_history_round_trips_through_a_file(tmp_path: Path) -> None:
    h = drain(base(), CLEAN)
    h.dump(tmp_path / "history.jsonl")
    again = History.load(tmp_path / "history.jsonl")
    assert again.ops == h.ops
    assert check(again).valid


def test_a_process_runs_one_operation_at_a_time() -> None:
    h = History(fake_clock())
    h.invoke("p0", "send", "a")
    h.invoke("p0", "send", "b")
    with pytest.raises(ValueError, match="before completing"):
        h.pairs()
