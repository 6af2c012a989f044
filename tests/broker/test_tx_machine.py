"""The transaction state machine on its own: op records pinned by golden bytes, every
transition, and the property a replica relies on: replaying the op records of a live run
rebuilds the same table."""

from __future__ import annotations

import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker.transaction import snapshot
from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.state import (
    Decision,
    HalfRef,
    OpKind,
    OpRecord,
    OpRecordError,
    TxRecord,
    TxState,
)
from txmq.protocol.errors import IllegalOperationError, InvalidParameterError

# Records written by earlier versions must stay readable, and these bytes must not change
# without a new format version.
GOLDEN = [
    (
        OpRecord(OpKind.COMMIT, "orders-tx", ("TX1",), (4096, 8192), "producer", 1700000000123),
        b"\x87\xa1v\x01\xa1k\xa6commit\xa1g\xa9orders-tx\xa1t\x91\xa3TX1\xa1h\x92\xcd\x10\x00"
        b"\xcd \x00\xa1r\xa8producer\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h{",
    ),
    (
        OpRecord(OpKind.BATCH, "spark", ("TX2",), (512,), "batch", 1700000000456, "q1/7", ("TX1",)),
        b"\x89\xa1v\x01\xa1k\xa5batch\xa1g\xa5spark\xa1t\x91\xa3TX2\xa1h\x91\xcd\x02\x00\xa1r"
        b"\xa5batch\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5i\xc8\xa2bk\xa4q1/7\xa1c\x91\xa3TX1",
    ),
]


@pytest.mark.parametrize(("op", "wire"), GOLDEN)
def test_op_records_are_pinned_by_golden_bytes(op: OpRecord, wire: bytes) -> None:
    assert op.encode() == wire
    assert OpRecord.decode(wire) == op


@given(
    kind=st.sampled_from(list(OpKind)),
    txids=st.lists(st.text(max_size=20), max_size=5).map(tuple),
    halves=st.lists(st.integers(0, 2**63 - 1), max_size=5).map(tuple),
    remark=st.text(max_size=30),
    ts=st.integers(0, 2**63 - 1),
    bk=st.none() | st.text(max_size=10),
)
@settings(max_examples=200)
def test_op_records_round_trip(kind, txids, halves, remark, ts, bk) -> None:
    committed = ("c1", "c2") if kind is OpKind.BATCH else ()
    op = OpRecord(kind, "g", txids, halves, remark, ts, bk, committed)
    assert OpRecord.decode(op.encode()) == op


@pytest.mark.parametrize(
    "body",
    [b"", b"\xc1", b"\x81\xa1v\x02", b"\x82\xa1v\x01\xa1k\xa4nope", b"\x81\xa1v\x01", b"[1,2]"],
)
def test_anything_else_is_refused_with_op_record_error(body: bytes) -> None:
    with pytest.raises(OpRecordError):
        OpRecord.decode(body)


def half(offset: int, topic: str = "orders") -> HalfRef:
    return HalfRef(offset, offset // 100, topic, 0, 1_000 + offset, f"U{offset}", f"O{offset}")


def live(m: TransactionStateMachine, op: OpRecord | None, log: list[OpRecord]) -> None:
    """What the broker does: append (here: remember) the record, then apply it."""
    if op is not None:
        log.append(op)
        m.apply(op, 10_000 + len(log))


def test_first_decision_wins_repeats_change_nothing_contradictions_are_refused() -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    rec = m.add_half("T1", "g", None, half(100))
    live(m, m.plan_decision(rec, Decision.COMMIT, "producer", 5), ops)
    assert rec.state is TxState.COMMITTED and rec.decided_by == "producer" and not m.pending
    assert m.plan_decision(rec, Decision.COMMIT, "check", 6) is None
    with pytest.raises(IllegalOperationError, match="already COMMITTED"):
        m.plan_decision(rec, Decision.ROLLBACK, "operator", 7)
    with pytest.raises(IllegalOperationError, match="no message can join"):
        m.check_joinable("T1", "g", None)
    with pytest.raises(IllegalOperationError, match="belongs to producer group g"):
        m.check_joinable("T1", "other", None)
    # Applying the same record again (a replica seeing it twice) changes nothing.
    assert m.apply(ops[0], 99) == [] and rec.decision_end_offset == 10_001


def test_discard_resume_and_decide_a_parked_transaction() -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    rec = m.add_half("T1", "g", None, half(100))
    assert m.record_check(rec, 50) and rec.check_times == 1
    live(m, m.plan_discard(rec, "transactionCheckMax", 60), ops)
    assert rec.state is TxState.DISCARDED and "T1" not in m.pending
    assert not m.record_check(rec, 70)  # a parked transaction is not checked
    live(m, m.plan_resume(rec, 80), ops)
    assert rec.state.value == "PENDING"
    assert rec.check_times == 0 and "T1" in m.pending
    live(m, m.plan_discard(rec, "transactionCheckMax", 90), ops)
    live(m, m.plan_decision(rec, Decision.ROLLBACK, "operator: ticket 7", 95), ops)
    assert rec.state.value == "ROLLED_BACK" and rec.decided_by == "operator"
    with pytest.raises(IllegalOperationError):
        m.plan_resume(rec, 99)


def test_a_batch_commits_the_listed_and_rolls_back_the_rest_once() -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    for i, t in enumerate(["A", "B", "C"]):
        m.add_half(t, "g", "q/1", half(100 * (i + 1)))
    m.add_half("D", "g", "q/2", half(400))
    plan = m.plan_batch("g", "q/1", ["A", "C", "A"], 10)
    assert [h.commit_log_offset for h in plan.to_commit] == [100, 300]
    live(m, plan.op, ops)
    assert m.batches[("g", "q/1")] == {"committed": ["A", "C"], "rolledBack": ["B"]}
    assert [m.records[t].state for t in "ABCD"] == [
        TxState.COMMITTED,
        TxState.ROLLED_BACK,
        TxState.COMMITTED,
        TxState.PENDING,
    ]
    with pytest.raises(IllegalOperationError, match="already decided"):
        m.check_joinable("E", "g", "q/1")
    with pytest.raises(InvalidParameterError, match="no half message in producer group g"):
        m.plan_batch("g", "q/2", ["nope"], 11)
    with pytest.raises(IllegalOperationError, match="ROLLED_BACK"):
        m.plan_batch("g", "q/3", ["B"], 12)


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Random interleavings of halves, decisions, discards, resumes and batches."""
    steps = st.tuples(
        st.sampled_from(["half", "commit", "rollback", "discard", "resume", "batch", "check"]),
        st.integers(0, 5),
        st.integers(0, 5),
    )
    return draw(st.lists(steps, max_size=40))


@given(scripts())
@settings(max_examples=150)
def test_replaying_the_op_records_of_a_live_run_rebuilds_the_same_table(
    script: list[tuple[str, int, int]],
) -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    halves: list[tuple[str, str | None, HalfRef]] = []
    offset = 0
    for step, a, b in script:
        txid, batch = f"T{a}", (f"b{b % 2}" if a % 2 else None)
        rec = m.records.get(txid)
        try:
            if step == "half":
                group = "g"
                m.check_joinable(txid, group, batch)
                offset += 100
                h = half(offset)
                m.add_half(txid, group, batch if rec is None else rec.batch_key, h)
                halves.append((txid, batch if rec is None else rec.batch_key, h))
            elif rec is None:
                continue
            elif step in ("commit", "rollback"):
                d = Decision.COMMIT if step == "commit" else Decision.ROLLBACK
                live(m, m.plan_decision(rec, d, "producer", offset), ops)
            elif step == "discard" and rec.state is TxState.PENDING:
                live(m, m.plan_discard(rec, "transactionCheckMax", offset), ops)
            elif step == "resume":
                live(m, m.plan_resume(rec, offset), ops)
            elif step == "batch" and rec.batch_key and ("g", rec.batch_key) not in m.batches:
                live(m, m.plan_batch("g", rec.batch_key, [txid], offset).op, ops)
            elif step == "check":
                m.record_check(rec, offset)
        except (IllegalOperationError, InvalidParameterError):
            continue
    # Recovery: the halves and op records, in commit-log order, through the same machine.
    replica = TransactionStateMachine()
    for txid, batch, h in halves:
        replica.add_half(txid, "g", batch, h)
    for i, op in enumerate(ops):
        replica.apply(OpRecord.decode(op.encode()), 10_000 + i + 1)
    for txid, rec in replica.records.items():
        rec.check_times = m.records[txid].check_times if rec.state is TxState.PENDING else 0
    assert _table(replica) == _table(m, ignore_checks_of_decided=True)
    assert replica.batches == m.batches and set(replica.pending) == set(m.pending)
    # A snapshot of the live table restores it exactly, check counts included.
    restored = TransactionStateMachine()
    snap = snapshot.take(m, 1, 2, 3)
    # The file is the msgpack map of the whole document behind its checksum, also when decided
    # rows are reused.
    whole = msgpack.packb(
        {
            "v": snapshot.SNAPSHOT_VERSION,
            "clog": 1,
            "halfFrom": 2,
            "opFrom": 3,
            "records": [
                r if isinstance(r, list) else snapshot._record_row(r) for r in snap.records
            ],
            "batches": snap.batches,
        },
        use_bin_type=True,
    )
    whole = b"TXS1" + zlib.crc32(whole).to_bytes(4, "big") + whole
    assert snapshot.encode(snap) == whole
    assert snapshot.encode(snap) == whole  # decided rows packed by the first encode
    snapshot.restore(restored, snapshot.decode(snapshot.encode(snap)))
    assert _table(restored) == _table(m)
    assert restored.batches == m.batches and set(restored.pending) == set(m.pending)
    assert restored.by_half_offset == m.by_half_offset
    assert restored.batch_members == m.batch_members
    assert list(restored._decided) == sorted(m._decided)


def _table(
    m: TransactionStateMachine, ignore_checks_of_decided: bool = False
) -> dict[str, tuple[object, ...]]:
    def row(r: TxRecord) -> tuple[object, ...]:
        checks = r.check_times
        if ignore_checks_of_decided and r.state is not TxState.PENDING:
            checks = 0
        return (r.state, r.decided_by, r.decision_end_offset, len(r.halves), checks)

    return {t: row(r) for t, r in m.records.items()}


def test_decisions_are_forgotten_after_their_window_and_batches_after_theirs() -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    for i, t in enumerate(["A", "B", "C"]):
        rec = m.add_half(t, "g", "q/1" if t != "C" else None, half(100 * (i + 1)))
    live(m, m.plan_batch("g", "q/1", ["A"], 1_000).op, ops)  # A committed, B rolled back
    live(m, m.plan_decision(m.records["C"], Decision.COMMIT, "producer", 5_000), ops)
    m.add_half("D", "g", None, half(400))  # still pending: never forgotten
    assert m.prune(decided_before_ms=1_000, batches_before_ms=1_000) == 0
    assert m.prune(decided_before_ms=2_000, batches_before_ms=0) == 2
    assert set(m.records) == {"C", "D"} and set(m.by_half_offset.values()) == {"C", "D"}
    # The batch decision outlives its members' records: a replayed batch still finds it, and
    # no new attempt can join it.
    assert m.batches[("g", "q/1")]["committed"] == ["A"]
    with pytest.raises(IllegalOperationError, match="already decided"):
        m.check_joinable("E", "g", "q/1")
    assert m.prune(decided_before_ms=10_000, batches_before_ms=10_000) == 1
    assert set(m.records) == {"D"} and m.batches == {} and "D" in m.pending
    assert rec.transaction_id == "C"


def test_two_phase_decisions_are_remembered_as_long_as_batches_and_kept_by_snapshots() -> None:
    m, ops = TransactionStateMachine(), list[OpRecord]()
    m.add_half("P", "g", None, half(100), two_phase=True)
    m.add_half("Q", "g", None, half(200))
    m.add_half("W", "g", None, half(300), two_phase=True)  # still pending
    for t in ("P", "Q"):
        live(m, m.plan_decision(m.records[t], Decision.COMMIT, "producer", 1_000), ops)
    assert m.records["P"].two_phase and not m.records["Q"].two_phase
    snap = snapshot.decode(snapshot.encode(snapshot.take(m, 1, 2, 3)))
    restored = TransactionStateMachine()
    snapshot.restore(restored, snap)
    for table in (m, restored):
        assert table.records["P"].two_phase and table.records["W"].two_phase
        assert not table.records["Q"].two_phase
        assert table.prune(decided_before_ms=2_000, batches_before_ms=0) == 1
        assert set(table.records) == {"P", "W"}
        assert table.prune(decided_before_ms=2_000, batches_before_ms=2_000) == 1
        assert set(table.records) == {"W"}
    # a row written before the two-phase element existed reads as not two-phase
    old_row = snapshot._record_row(TxRecord("O", "g", halves=[half(400)]))
    assert len(old_row) == 11
    assert not snapshot._restored(old_row)[0].two_phase
    assert snapshot._restored([*old_row, 1])[0].two_phase
