"""Pipeline positions in the transaction state machine: a batch decision that records one
moves its pipeline, one that does not start where the pipeline is is refused, replaying the op
records or restoring a snapshot rebuilds the same positions, and pruning forgets the ranges of
old batches but never where a pipeline is."""

from __future__ import annotations

import pytest

from txmq.broker.transaction import snapshot
from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.state import HalfRef, OpRecord
from txmq.protocol.errors import FencedError, IllegalOperationError

G = "g"


def _decide(m: TransactionStateMachine, key: str, start: str, end: str, ts: int) -> OpRecord:
    op = m.plan_batch(G, key, [], ts, ("p", start, end)).op
    m.apply(op, ts)
    return op


def _state(m: TransactionStateMachine) -> tuple[object, ...]:
    return (m.pipelines, m.pipeline_ranges, m.batch_positions)


def test_positions_move_refuse_replay_restore_and_prune() -> None:
    m = TransactionStateMachine()
    ops = [_decide(m, "k0", "", "a", 1), _decide(m, "k1", "a", "b", 2)]
    ops.append(_decide(m, "k2", "b", "c", 3))
    assert m.pipelines[(G, "p")] == ("c", "k2")
    assert m.pipeline_ranges[(G, "p", "a")] == "b"
    with pytest.raises(IllegalOperationError, match="pipeline 'p' of producer group g is at c"):
        m.plan_batch(G, "k3", [], 4, ("p", "b", "d"))
    # Another pipeline, or the same name in another group, is not concerned.
    m.plan_batch(G, "k3", [], 4, ("q", "b", "d"))
    m.plan_batch("other", "k3", [], 4, ("p", "b", "d"))

    # The op records survive their encoding; replayed, they rebuild the same positions.
    replica = TransactionStateMachine()
    for i, op in enumerate(ops):
        assert OpRecord.decode(op.encode()) == op
        replica.apply(OpRecord.decode(op.encode()), i)
    assert _state(replica) == _state(m)

    restored = TransactionStateMachine()
    snapshot.restore(restored, snapshot.decode(snapshot.encode(snapshot.take(m, 1, 2, 3))))
    assert _state(restored) == _state(m)

    # Past the batch retention the ranges go; where the pipeline is stays, also in a snapshot.
    m.prune(0, 3)
    assert m.pipeline_ranges == {(G, "p", "b"): "c"} and m.pipelines[(G, "p")] == ("c", "k2")
    m.prune(0, 10)
    assert m.pipeline_ranges == {} and m.batch_positions == {}
    again = TransactionStateMachine()
    snapshot.restore(again, snapshot.decode(snapshot.encode(snapshot.take(m, 1, 2, 3))))
    assert again.pipelines == {(G, "p"): ("c", "k2")}
    with pytest.raises(IllegalOperationError):
        again.plan_batch(G, "k4", [], 11, ("p", "a", "x"))


def _half(m: TransactionStateMachine, txid: str, key: str, offset: int, group: str = G) -> None:
    m.add_half(txid, group, key, HalfRef(offset, offset, "t", 0, offset, txid, f"o{offset}"))


def test_a_runs_decision_rolls_back_the_other_runs_orphans_in_its_record() -> None:
    m = TransactionStateMachine()
    _half(m, "old-a", "p-r1-1", 1)
    _half(m, "old-b", "p-r0-7", 2)
    _half(m, "mine", "p-r2-1", 3)
    _half(m, "later", "p-r2-2", 4)  # the same run: not an orphan
    _half(m, "eu", "p-eu-r1-1", 5)  # pipeline "p-eu"
    _half(m, "plain", "p-r1", 6)  # not <pipeline>-<run>-<digits>
    _half(m, "other", "p-r1-1", 7, group="other")
    plan = m.plan_batch(G, "p-r2-1", ["mine"], 10, ("p", "", "a"), "p")
    assert plan.op.orphans == ("old-a", "old-b") and plan.op.txids == ()
    assert OpRecord.decode(plan.op.encode()) == plan.op
    m.apply(plan.op, 100)
    assert (
        m.records["old-a"].remark == "pipeline: orphan of pipeline 'p' run r1, superseded by run r2"
    )
    assert m.records["old-b"].decided_by == "pipeline"
    assert m.batches[(G, "p-r2-1")] == {"committed": ["mine"], "rolledBack": []}
    assert sorted(m.pending) == ["eu", "later", "other", "plain"]
    # A zombie of run r1 committing its orphan is fenced; nothing is planned.
    with pytest.raises(
        FencedError, match="fenced: transaction old-a .* run r1, superseded by run r2"
    ):
        m.plan_batch(G, "p-r1-1", ["old-a"], 11, ("p", "a", "b"), "p")

    # Replayed from its record (recovery), the decision rolls back the same orphans.
    replica = TransactionStateMachine()
    for i, (t, k, g) in enumerate(
        [("old-a", "p-r1-1", G), ("old-b", "p-r0-7", G), ("mine", "p-r2-1", G)]
        + [("later", "p-r2-2", G), ("eu", "p-eu-r1-1", G), ("plain", "p-r1", G)]
        + [("other", "p-r1-1", "other")]
    ):
        _half(replica, t, k, i + 1, group=g)
    replica.apply(OpRecord.decode(plan.op.encode()), 100)
    assert {t: (r.state, r.remark) for t, r in replica.records.items()} == {
        t: (r.state, r.remark) for t, r in m.records.items()
    }


def test_a_runs_announcement_rolls_back_the_other_runs_orphans() -> None:
    m = TransactionStateMachine()
    _half(m, "a", "p-r1-1", 1)
    _half(m, "b", "p-r1-1", 2)
    _half(m, "c", "p-r0-3", 3)
    _half(m, "mine", "p-r2-1", 4)
    ops = m.plan_orphans(G, "p", "r2", 10)
    assert [(op.txids, op.remark) for op in ops] == [
        (("c",), "pipeline: orphan of pipeline 'p' run r0, superseded by run r2"),
        (("a", "b"), "pipeline: orphan of pipeline 'p' run r1, superseded by run r2"),
    ]
    for op in ops:
        m.apply(op, 10)
    assert list(m.pending) == ["mine"] and m.plan_orphans(G, "p", "r2", 11) == []
