"""The transaction state machine: every transition of every transaction, synchronously.

It owns the table (records by transaction id, the pending ones, halves by commit-log offset,
batch decisions) and nothing else: no store, no network, no clock, no metrics.  The same
methods serve a live broker and recovery, so there is one path to test and the one a replica
applies:

* a half message joins its transaction with :meth:`add_half` (live, after the append; at
  start, for each half read back from the half queue);
* a decision is first *planned* (:meth:`plan_decision`, :meth:`plan_batch`,
  :meth:`plan_discard`, :meth:`plan_resume`), which checks it against the current state and
  returns the :class:`~.state.OpRecord` to append, or None when it changes nothing; once the
  record is in the commit log, :meth:`apply` makes the transition.  Recovery calls
  :meth:`apply` for every op record read back, in commit-log order.

Planning and applying run without an await in between (the broker appends synchronously), so
the first decision wins.
"""

from __future__ import annotations

import sys
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from txmq.protocol.errors import FencedError, IllegalOperationError, InvalidParameterError

from .state import (
    Decision,
    HalfRef,
    OpKind,
    OpRecord,
    TxRecord,
    TxState,
    orphan_remark,
    pipeline_run,
)


@dataclass(frozen=True)
class BatchPlan:
    op: OpRecord
    #: halves whose real messages the commit appends right after the op record
    to_commit: list[HalfRef]


class PendingWatcher(Protocol):
    """Told of every transaction entering or leaving :attr:`TransactionStateMachine.pending`
    (the check schedule, the gauges): whatever the path (a new half, a resume, replay at start,
    a restored snapshot), so they never need to scan the table."""

    def entered(self, rec: TxRecord) -> None:
        """``rec`` became pending (with its halves so far)."""

    def joined(self, rec: TxRecord) -> None:
        """More halves joined ``rec``, which was already pending."""

    def left(self, rec: TxRecord) -> None:
        """``rec`` is no longer pending (decided or parked)."""


class PendingTable(dict[str, TxRecord]):
    """The pending transactions by id (a dict) that tells the machine's watchers of every
    record put in or taken out, by whichever path (:mod:`.snapshot` restores into it too)."""

    __slots__ = ("_watchers",)

    def __init__(self, watchers: list[PendingWatcher]) -> None:
        super().__init__()
        self._watchers = watchers

    def __setitem__(self, txid: str, rec: TxRecord) -> None:
        old = dict.get(self, txid)
        if old is rec:
            return
        if old is not None:
            self._left(old)
        dict.__setitem__(self, txid, rec)
        for w in self._watchers:
            w.entered(rec)

    def __delitem__(self, txid: str) -> None:
        rec = dict.pop(self, txid)
        self._left(rec)

    def pop(self, txid: str, *default: TxRecord | None) -> TxRecord | None:  # type: ignore[override]
        rec = dict.pop(self, txid, None)
        if rec is None:
            if default:
                return default[0]
            raise KeyError(txid)
        self._left(rec)
        return rec

    def _left(self, rec: TxRecord) -> None:
        for w in self._watchers:
            w.left(rec)

    def _refused(self, *_: object, **__: object) -> None:
        raise TypeError("PendingTable changes one record at a time")

    # one name a line: mypyc compiles no chained assignment in a class body
    update = _refused
    setdefault = _refused  # type: ignore[assignment]
    popitem = _refused  # type: ignore[assignment]
    clear = _refused


class PendingGauges:
    """The pending transactions per (real topic of the first half, producer group), each in
    the order it became pending: the count is the size, the oldest is the first one.  Kept up
    to date on every change, so reading the gauges costs nothing per pending transaction."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], OrderedDict[str, TxRecord]] = {}

    @staticmethod
    def key(rec: TxRecord) -> tuple[str, str]:
        return (rec.halves[0].real_topic if rec.halves else "", rec.producer_group)

    def entered(self, rec: TxRecord) -> None:
        members = self.by_key.get(key := self.key(rec))
        if members is None:
            members = self.by_key[key] = OrderedDict()
        members[rec.transaction_id] = rec
        # A resumed transaction is older than the ones that became pending after it: put it
        # first if it is the oldest, so the first one stays the oldest.
        if len(members) > 1:
            first = members[next(iter(members))]
            if rec.oldest_store_timestamp < first.oldest_store_timestamp:
                members.move_to_end(rec.transaction_id, last=False)

    def joined(self, rec: TxRecord) -> None:
        pass  # the first half (and so the key and the oldest timestamp) does not change

    def left(self, rec: TxRecord) -> None:
        key = self.key(rec)
        members = self.by_key.get(key)
        if members is not None and members.pop(rec.transaction_id, None) is not None:
            if not members:
                del self.by_key[key]

    def __iter__(self) -> Iterator[tuple[tuple[str, str], int, int]]:
        """(topic, group), pending count, store timestamp of the oldest pending half."""
        for key, members in self.by_key.items():
            first = members[next(iter(members))]
            yield key, len(members), first.oldest_store_timestamp


class TransactionStateMachine:
    def __init__(self, watchers: Iterable[PendingWatcher] = ()) -> None:
        self.records: dict[str, TxRecord] = {}
        #: per (topic, group): how many are pending and the oldest (kept up to date)
        self.gauges = PendingGauges()
        self._watchers: list[PendingWatcher] = [self.gauges, *watchers]
        #: transactions that may still be checked (state PENDING); tells the watchers
        self.pending: dict[str, TxRecord] = PendingTable(self._watchers)
        #: pending and parked transactions that have been checked (what the check-state
        #: index persists), so writing it does not scan the table; completed from the table
        #: once (a restored snapshot brings counts of its own)
        self._checked: set[str] = set()
        self._checked_complete = False
        self.by_half_offset: dict[int, str] = {}
        #: (group, batch key) -> {"committed": [...], "rolledBack": [...]}
        self.batches: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.batch_members: dict[tuple[str, str], set[str]] = {}
        #: Pipelines (a batch decision may record the input range it consumed, see
        #: :meth:`plan_batch`): (group, pipeline) -> (end of its last decided batch, that
        #: batch's key), never forgotten; (group, pipeline, start) -> end of the decided batch
        #: that started there; (group, batch key) -> (pipeline, start, end).  The last two are
        #: forgotten with the batch decision.
        self.pipelines: dict[tuple[str, str], tuple[str, str]] = {}
        self.pipeline_ranges: dict[tuple[str, str, str], str] = {}
        self.batch_positions: dict[tuple[str, str], tuple[str, str, str]] = {}
        #: decided transactions and batches in decision order, for :meth:`prune`
        self._decided: deque[tuple[int, str]] = deque()
        #: Decided transactions :meth:`prune` forgot, by state: the counts go on across the
        #: pruning (and restarts: snapshots carry them).
        self.forgotten: dict[str, int] = {}
        #: decided two-phase transactions, remembered as long as batch decisions: an outside
        #: coordinator may repeat its decision long after it (its recovery after an outage)
        self._decided_two_phase: deque[tuple[int, str]] = deque()
        self._decided_batches: deque[tuple[int, tuple[str, str]]] = deque()

    def watch(self, watcher: PendingWatcher) -> None:
        """Tell ``watcher`` of every transaction entering or leaving :attr:`pending` from now
        on, starting with those already pending."""
        self._watchers.append(watcher)
        for rec in self.pending.values():
            watcher.entered(rec)

    # -- halves ---------------------------------------------------------------------------------

    def check_joinable(self, txid: str, group: str, batch_key: str | None) -> None:
        """Raise unless a new half may join transaction ``txid`` of ``group``."""
        rec = self.records.get(txid)
        if rec is not None:
            if rec.producer_group != group:
                raise IllegalOperationError(
                    f"transaction {txid} belongs to producer group {rec.producer_group}, "
                    f"not {group}"
                )
            if rec.state is not TxState.PENDING:
                raise IllegalOperationError(
                    f"transaction {txid} is already {rec.state.value}; no message can join it"
                )
        if batch_key is not None and (group, batch_key) in self.batches:
            raise IllegalOperationError(
                f"batch {batch_key!r} of producer group {group} is already decided; this "
                "attempt's messages will never be delivered"
            )

    def add_half(
        self,
        txid: str,
        group: str,
        batch_key: str | None,
        half: HalfRef,
        two_phase: bool = False,
    ) -> TxRecord:
        """A stored half joins its transaction (created PENDING on its first half);
        ``two_phase``: the half carries ``TXMQ_2PC`` (an outside coordinator decides)."""
        return self.add_halves(txid, group, batch_key, [half], two_phase)

    def add_halves(
        self,
        txid: str,
        group: str,
        batch_key: str | None,
        halves: list[HalfRef],
        two_phase: bool = False,
    ) -> TxRecord:
        """:meth:`add_half` of several halves of one transaction, in order."""
        rec = self.records.get(txid)
        by_offset = self.by_half_offset
        for h in halves:
            by_offset[h.commit_log_offset] = txid
        if rec is None:
            rec = TxRecord(txid, group, batch_key=batch_key, two_phase=two_phase)
            rec.halves += halves
            self.records[txid] = rec
            self.pending[txid] = rec  # with its halves: the watchers schedule it
            if batch_key is not None:
                self.batch_members.setdefault((group, batch_key), set()).add(txid)
            return rec
        rec.halves += halves
        if two_phase:
            rec.two_phase = True
        if rec.state is TxState.PENDING and txid in self.pending:
            for w in self._watchers:
                w.joined(rec)
        return rec

    # -- lookups --------------------------------------------------------------------------------

    def find(self, txid: str | None, commit_log_offset: int | None = None) -> TxRecord | None:
        rec = self.records.get(txid) if txid else None
        if rec is None and commit_log_offset is not None:
            other = self.by_half_offset.get(commit_log_offset)
            rec = self.records.get(other) if other else None
        return rec

    def half_at(self, commit_log_offset: int) -> HalfRef | None:
        rec = self.find(None, commit_log_offset)
        if rec is None:
            return None
        return next((h for h in rec.halves if h.commit_log_offset == commit_log_offset), None)

    def orphans_of(self, group: str, pipeline: str, run: str) -> dict[str, list[str]]:
        """The pending transactions of ``group`` written by runs of ``pipeline`` other than
        ``run``, by run: a pipeline has one live run (the newest), so they are the orphans of
        runs that died or were superseded; every batch they belong to is run again."""
        out: dict[str, list[str]] = {}
        for txid, rec in self.pending.items():
            if rec.producer_group != group:
                continue
            other = pipeline_run(pipeline, rec.batch_key)
            if other is not None and other != run:
                out.setdefault(other, []).append(txid)
        for txids in out.values():
            txids.sort()
        return out

    def plan_orphans(self, group: str, pipeline: str, run: str, ts: int) -> list[OpRecord]:
        """Roll back the orphans of ``pipeline``'s runs other than ``run`` (one record per
        old run, its remark naming both runs)."""
        return [
            OpRecord(
                kind=OpKind.ROLLBACK,
                group=group,
                txids=tuple(txids),
                halves=tuple(h.commit_log_offset for t in txids for h in self.records[t].halves),
                remark=orphan_remark(pipeline, self.records[txids[0]].batch_key, run),
                ts=ts,
            )
            for _, txids in sorted(self.orphans_of(group, pipeline, run).items())
        ]

    def pending_in_batch(self, group: str, batch_key: str) -> list[str]:
        members = self.batch_members.get((group, batch_key), set())
        return sorted(t for t in members if self.records[t].state is TxState.PENDING)

    # -- planning decisions ---------------------------------------------------------------------

    def plan_decision(
        self, rec: TxRecord, decision: Decision, remark: str, ts: int
    ) -> OpRecord | None:
        """The op record of a commit or rollback; None when ``rec`` already has that outcome.

        Raises:
            IllegalOperationError: ``rec`` already has the other outcome.
        """
        target = TxState.COMMITTED if decision == Decision.COMMIT else TxState.ROLLED_BACK
        if rec.state.decided:
            if rec.state is target:
                return None
            word = "commit" if decision == Decision.COMMIT else "rollback"
            raise IllegalOperationError(
                f"transaction {rec.transaction_id} is already {rec.state.value}; the {word} "
                f"was refused and the outcome does not change"
            )
        return OpRecord(
            kind=OpKind.COMMIT if target is TxState.COMMITTED else OpKind.ROLLBACK,
            group=rec.producer_group,
            txids=(rec.transaction_id,),
            halves=tuple([h.commit_log_offset for h in rec.halves]),
            remark=remark,
            ts=ts,
        )

    # Over 80 lines for its docstring: the checks and the record they plan read best together.
    def plan_batch(
        self,
        group: str,
        batch_key: str,
        commit: list[str],
        ts: int,
        position: tuple[str, str, str] | None = None,
        pipeline: str | None = None,
    ) -> BatchPlan:
        """Commit the listed transactions of a batch and roll back its other pending ones.

        With ``pipeline`` (the batch key then is ``<pipeline>-<run>-<batchId>``), the same
        record also rolls back the orphans of the pipeline's other runs
        (:meth:`orphans_of`): a run decides only once it is the pipeline's live one.

        ``position`` is ``(pipeline, start, end)``: the input range the batch consumed.  The
        decision records it and moves the pipeline to ``end``; it is refused unless ``start``
        is where the pipeline's last decided batch ended (the first one is taken as it is), so
        two batches of one pipeline never consume the same input.

        Raises:
            InvalidParameterError: a listed transaction is unknown or of another group.
            IllegalOperationError: a listed transaction is already rolled back, or the batch
                does not start where its pipeline is.
        """
        commit_recs = []
        for txid in dict.fromkeys(commit):
            rec = self.records.get(txid)
            if rec is None or rec.producer_group != group:
                raise InvalidParameterError(
                    f"transaction {txid} has no half message in producer group {group}"
                )
            if rec.state is TxState.ROLLED_BACK and rec.remark.startswith("pipeline: orphan"):
                raise FencedError(
                    f"fenced: transaction {txid} was rolled back as an "
                    f"{rec.remark.split(': ', 1)[1]}; batch {batch_key!r} was not decided "
                    "and nothing of it was committed"
                )
            if rec.state is TxState.ROLLED_BACK:
                raise IllegalOperationError(
                    f"transaction {txid} is already ROLLED_BACK; batch {batch_key!r} was not "
                    "decided"
                )
            commit_recs.append(rec)
        if position is not None:
            head = self.pipelines.get((group, position[0]))
            if head is not None and head[0] != position[1]:
                raise IllegalOperationError(
                    f"pipeline {position[0]!r} of producer group {group} is at {head[0]} "
                    f"(batch {head[1]!r}); batch {batch_key!r} starts at {position[1]}: another "
                    "query runs this pipeline, or its source does not resume from the pipeline"
                )
        commit_set = {r.transaction_id for r in commit_recs}
        rollback = [
            t
            for t in sorted(self.batch_members.get((group, batch_key), set()))
            if t not in commit_set and not self.records[t].state.decided
        ]
        to_commit = [h for r in commit_recs if not r.state.decided for h in r.halves]
        run = None if pipeline is None else pipeline_run(pipeline, batch_key)
        orphans: tuple[str, ...] = ()
        if pipeline is not None and run is not None:
            orphans = tuple(
                sorted(
                    t
                    for txids in self.orphans_of(group, pipeline, run).values()
                    for t in txids
                    if t not in commit_set
                )
            )
        op = OpRecord(
            kind=OpKind.BATCH,
            group=group,
            txids=tuple(rollback),
            halves=tuple(h.commit_log_offset for h in to_commit),
            remark="batch",
            ts=ts,
            batch_key=batch_key,
            committed=tuple(r.transaction_id for r in commit_recs),
            position=position,
            pipeline=None if run is None else pipeline,
            orphans=orphans,
        )
        return BatchPlan(op, to_commit)

    def plan_discard(self, rec: TxRecord, reason: str, ts: int) -> OpRecord:
        """Park a pending transaction whose check budget is used up."""
        return OpRecord(
            kind=OpKind.DISCARD,
            group=rec.producer_group,
            txids=(rec.transaction_id,),
            halves=tuple(h.commit_log_offset for h in rec.halves),
            remark=reason,
            ts=ts,
        )

    def plan_resume(self, rec: TxRecord, ts: int) -> OpRecord:
        """Check a parked (or pending) transaction again from a fresh budget.

        Raises:
            IllegalOperationError: it is already decided.
        """
        if rec.state.decided:
            raise IllegalOperationError(
                f"transaction {rec.transaction_id} is already {rec.state.value}"
            )
        return OpRecord(
            kind=OpKind.RESUME,
            group=rec.producer_group,
            txids=(rec.transaction_id,),
            remark="operator",
            ts=ts,
        )

    # -- the transition -------------------------------------------------------------------------

    def apply(self, op: OpRecord, end_offset: int) -> list[TxRecord]:
        """Apply an op record that is in the commit log (its append ends at ``end_offset``).

        Idempotent per record, and the only place decisions change state.  Returns the records
        that changed state.
        """
        changed: list[TxRecord] = []

        def settle(txid: str, state: TxState, remark: str | None = None) -> None:
            rec = self._record(txid, op.group)
            if rec.state is state:
                return
            if rec.state.decided:  # the first decision won; a contradiction is ignored on replay
                return
            rec.state = state
            rec.decided_ms = op.ts
            rec.decided_by = sys.intern(op.by if remark is None else "pipeline")
            rec.remark = op.remark if remark is None else remark
            rec.check_in_flight = False
            rec.decision_end_offset = end_offset
            self.pending.pop(txid, None)
            self._checked.discard(txid)
            (self._decided_two_phase if rec.two_phase else self._decided).append((op.ts, txid))
            changed.append(rec)

        if op.kind is OpKind.COMMIT:
            for t in op.txids:
                settle(t, TxState.COMMITTED)
        elif op.kind is OpKind.ROLLBACK:
            for t in op.txids:
                settle(t, TxState.ROLLED_BACK)
        elif op.kind is OpKind.BATCH:
            for t in op.committed:
                settle(t, TxState.COMMITTED)
            for t in op.txids:
                settle(t, TxState.ROLLED_BACK)
            if op.pipeline is not None:
                run = pipeline_run(op.pipeline, op.batch_key)
                records = self.records
                for t in op.orphans:
                    old = records.get(t)
                    remark = orphan_remark(op.pipeline, None if old is None else old.batch_key, run)
                    settle(t, TxState.ROLLED_BACK, remark)
            key = (op.group, op.batch_key or "")
            if op.batch_key is not None and key not in self.batches:
                self.batches[key] = {
                    "committed": sorted(op.committed),
                    "rolledBack": sorted(op.txids),
                }
                self._decided_batches.append((op.ts, key))
                if op.position is not None:
                    self.record_position(key, op.position)
        elif op.kind is OpKind.DISCARD:
            for t in op.txids:
                rec = self._record(t, op.group)
                if rec.state is TxState.PENDING:
                    rec.state = TxState.DISCARDED
                    rec.remark = op.remark
                    rec.check_in_flight = False
                    self.pending.pop(t, None)
                    changed.append(rec)
        elif op.kind is OpKind.RESUME:
            for t in op.txids:
                rec = self._record(t, op.group)
                if not rec.state.decided and rec.halves:
                    rec.state = TxState.PENDING
                    rec.check_times = 0
                    rec.last_check_ms = 0
                    rec.check_in_flight = False
                    self._checked.discard(t)
                    if t in self.pending:  # resumed while pending: a fresh budget, no more
                        for w in self._watchers:
                            w.joined(rec)
                    else:
                        self.pending[t] = rec
                    changed.append(rec)
        return changed

    def record_position(self, key: tuple[str, str], position: tuple[str, str, str]) -> None:
        """Batch ``key`` (group, batch key) consumed ``position``: its pipeline moves on."""
        group = key[0]
        pipeline, start, end = position
        self.batch_positions[key] = position
        self.pipeline_ranges[(group, pipeline, start)] = end
        self.pipelines[(group, pipeline)] = (end, key[1])

    def _record(self, txid: str, group: str) -> TxRecord:
        rec = self.records.get(txid)
        if rec is None:  # its halves were removed by retention: remember the decision
            rec = TxRecord(txid, group, state=TxState.PENDING)
            self.records[txid] = rec
        return rec

    # -- bounded memory -------------------------------------------------------------------------

    def prune(self, decided_before_ms: int, batches_before_ms: int) -> int:
        """Forget transactions decided before ``decided_before_ms`` and batch decisions made
        before ``batches_before_ms`` (their idempotency windows are over).  Cheap: decisions are
        kept in decision order, so only the expired ones are looked at.  Returns how many
        transactions were forgotten."""
        n = self._forget(self._decided, decided_before_ms)
        n += self._forget(self._decided_two_phase, batches_before_ms)
        while self._decided_batches and self._decided_batches[0][0] < batches_before_ms:
            _, key = self._decided_batches.popleft()
            self.batches.pop(key, None)
            position = self.batch_positions.pop(key, None)
            if position is not None:
                self.pipeline_ranges.pop((key[0], position[0], position[1]), None)
        return n

    def _forget(self, decided: deque[tuple[int, str]], before_ms: int) -> int:
        """Forget the transactions of ``decided`` (in decision order) decided before
        ``before_ms``; how many."""
        n = 0
        while decided and decided[0][0] < before_ms:
            _, txid = decided.popleft()
            rec = self.records.get(txid)
            if rec is None or not rec.state.decided:
                continue
            del self.records[txid]
            self.forgotten[rec.state.value] = self.forgotten.get(rec.state.value, 0) + 1
            for h in rec.halves:
                if self.by_half_offset.get(h.commit_log_offset) == txid:
                    del self.by_half_offset[h.commit_log_offset]
            if rec.batch_key is not None:
                members = self.batch_members.get((rec.producer_group, rec.batch_key))
                if members is not None:
                    members.discard(txid)
                    if not members:
                        del self.batch_members[(rec.producer_group, rec.batch_key)]
            n += 1
        return n

    # -- check state ----------------------------------------------------------------------------

    def record_check(self, rec: TxRecord, now_ms: int) -> bool:
        """A check of ``rec`` was delivered; counts it if ``rec`` is still pending."""
        if rec.state is not TxState.PENDING:
            return False
        rec.check_times += 1
        rec.last_check_ms = now_ms
        self._checked.add(rec.transaction_id)
        return True

    def restore_check(self, txid: str, times: int, last_ms: int) -> None:
        """Check counts from the persisted index (they are not in the commit log)."""
        rec = self.records.get(txid)
        if rec is not None and not rec.state.decided:
            rec.check_times = max(rec.check_times, times)
            rec.last_check_ms = last_ms
            if rec.check_times:
                self._checked.add(txid)

    def check_counts(self) -> dict[str, list[int]]:
        """What the check-state index persists."""
        out: dict[str, list[int]] = {}
        records = self.records
        if not self._checked_complete:
            self._checked.update(t for t, r in records.items() if r.check_times)
            self._checked_complete = True
        for txid in list(self._checked):
            r = records.get(txid)
            if r is not None and r.state in (TxState.PENDING, TxState.DISCARDED) and r.check_times:
                out[txid] = [r.check_times, r.last_check_ms]
            else:
                self._checked.discard(txid)
        return out

    def counts(self) -> dict[str, int]:
        """Transactions by state: those in the table, and the decided ones it forgot."""
        out = {s.value: self.forgotten.get(s.value, 0) for s in TxState}
        for rec in self.records.values():
            out[rec.state.value] += 1
        return out
