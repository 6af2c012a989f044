"""Pipeline positions in the transaction state machine: a batch decision that records one
moves its pipeline, one that does not start where the pipeline is is refused, replaying the op
records or restoring a snapshot rebuilds the same positions, and pruning forgets the ranges of
old batches but never where a pipeline is."""

from __future__ import annotations

import pytest

from txmq.broker.transaction import snapshot
from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.state import OpRecord
from txmq.protocol.errors import IllegalOperationError

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
