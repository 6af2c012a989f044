"""Rebuilding the transaction table when the broker starts.

The table is what the half queue and the op queue say, applied in commit-log order through the
same state machine the live broker uses: the last snapshot (:mod:`.persistence`) stands in for
the part of both queues it covers, the check-state index adds the check counts, and a commit
that a crash cut short is finished.

Every field a replayed decision sets is what the live decision set, in particular
``decision_end_offset``: live, the end of the decision's whole append (the op record and, for a
commit, the committed messages right after it, see
:meth:`~.service.TransactionalMessageService.decide`); on replay, the end of the op record and
of the committed messages found right after it.  A repeated decision waits for that offset to
be durable, before a restart as after one.

Recovery gets only what it uses: the store (to read the queues and the committed messages), the
write path (to finish an interrupted commit), the state machine, the persistence, and the
service's ways to add a stored half and to rebuild a half's committed message.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from txmq.protocol.errors import QueryNotFoundError
from txmq.protocol.message import POS_PREPARED_TRANSACTION_OFFSET, MessageExt, decode_message
from txmq.protocol.topics import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC

from ..store import GetMessageStatus
from ..store.commit_log import RECORD_HEADER_SIZE
from ..store.reading import read_queue
from ..topics import TIMER_TOPIC
from .machine import TransactionStateMachine
from .persistence import TransactionPersistence
from .state import HalfRef, OpKind, OpRecord, OpRecordError, TxRecord, TxState

if TYPE_CHECKING:
    from ..store import MessageStore, PutMessageResult

log = structlog.get_logger(__name__)


class Appends(Protocol):
    """What recovery writes through (the broker's write path, which tells the flusher and the
    rest of each append): a port of this package, which imports nothing of
    :mod:`txmq.broker.messaging`."""

    def put_messages(self, msgs: list[MessageExt]) -> list[PutMessageResult]: ...


#: PREPARED_TRANSACTION_OFFSET in a stored message: a committed message's half.
_PREPARED_OFFSET = struct.Struct(">q")
#: Op records followed by committed messages in the same append.
_COMMITTING = (OpKind.COMMIT, OpKind.BATCH)

#: The last commit replayed: (commit-log offset to scan back to, offsets of its halves).
LastCommit = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Recovered:
    #: a snapshot was restored
    snapshot: bool
    #: halves and op records replayed after it
    halves: int
    ops: int
    #: committed messages written to finish a commit a crash interrupted
    repaired: int


@dataclass(eq=False)
class TransactionRecovery:
    machine: TransactionStateMachine
    persistence: TransactionPersistence
    _: KW_ONLY
    store: MessageStore
    write: Appends
    add_half: Callable[[MessageExt, str], HalfRef | None]
    real_message: Callable[[HalfRef], MessageExt]

    def run(self) -> Recovered:
        """Rebuild the table: the last snapshot, then the half and op queues after it (all of
        them without one), merged in commit-log order and applied through the state machine;
        load the check-state index; finish a commit that a crash interrupted."""
        half_from, op_from = self.persistence.load_snapshot()
        halves = (
            (m.commit_log_offset, 0, m)
            for m in read_queue(self.store, RMQ_SYS_TRANS_HALF_TOPIC, 0, half_from or 0)
        )
        ops = (
            (m.commit_log_offset, 1, m)
            for m in read_queue(self.store, RMQ_SYS_TRANS_OP_HALF_TOPIC, 0, op_from or 0)
        )
        n_half = n_op = 0
        last_commit: LastCommit | None = None
        for offset, kind, m in heapq.merge(halves, ops, key=lambda x: (x[0], x[1])):
            if kind == 0:
                self.add_half(m, m.offset_msg_id)
                n_half += 1
                continue
            n_op += 1
            try:
                op = OpRecord.decode(m.body)
            except OpRecordError as exc:
                log.warning("op_record_unreadable", offset=offset, error=str(exc))
                continue
            self.machine.apply(op, self._append_end(m, op))
            if op.kind in _COMMITTING and op.halves:
                last_commit = (m.commit_log_offset, op.halves)
        if last_commit is None and half_from is not None:
            last_commit = self._last_commit_in_snapshot()
        self.persistence.load_check_state()
        repaired = self._complete_interrupted_commit(last_commit) if last_commit else 0
        return Recovered(half_from is not None, n_half, n_op, repaired)

    def _append_end(self, m: MessageExt, op: OpRecord) -> int:
        """Where the append of op record ``m`` ended, as the live decision returned it: after
        the record and, for a commit, after the committed messages of ``op``'s halves that
        follow it back to back (all of them unless a crash cut the append short, see
        :meth:`_complete_interrupted_commit`)."""
        end = m.commit_log_offset + RECORD_HEADER_SIZE + m.store_size
        if op.kind not in _COMMITTING or not op.halves:
            return end
        read = self.store.read_message_bytes
        unpack = _PREPARED_OFFSET.unpack_from
        expected = set(op.halves)
        while expected:
            try:
                payload = read(end)
            except QueryNotFoundError:
                break  # the end of the log
            half = unpack(payload, POS_PREPARED_TRANSACTION_OFFSET)[0]
            if half not in expected:
                break  # not this commit's: its append ended before
            expected.discard(half)
            end += RECORD_HEADER_SIZE + len(payload)
        return end

    def _last_commit_in_snapshot(self) -> LastCommit | None:
        """The newest commit the snapshot holds, as the tail's last commit would be given: its
        messages lie after its halves, so scanning back to the newest half is enough."""
        committed = [
            r for r in self.machine.records.values() if r.state is TxState.COMMITTED and r.halves
        ]
        if not committed:
            return None
        rec = max(committed, key=lambda r: r.decision_end_offset)
        offsets = tuple(h.commit_log_offset for h in rec.halves)
        return max(offsets), offsets

    def _complete_interrupted_commit(self, last: LastCommit) -> int:
        """The last commit's messages were appended right after its op record; a crash can
        have cut that append short.  Write whatever is missing; a repeat of that decision then
        waits for this append too."""
        op_offset, half_offsets = last
        store = self.store
        wanted: dict[int, HalfRef] = {}
        for off in half_offsets:
            half = self.machine.half_at(off)
            if half is not None:
                wanted[off] = half
        found: set[int] = set()
        # A delayed transaction's committed messages wait in the timer queue.
        queues = {(h.real_topic, h.real_queue_id) for h in wanted.values()}
        for q in queues | {(TIMER_TOPIC, 0)}:
            qoff = store.get_max_offset_in_queue(*q) - 1
            floor = store.get_min_offset_in_queue(*q)
            while qoff >= floor:
                r = store.get_messages(q[0], q[1], qoff, 1)
                if r.status is not GetMessageStatus.FOUND:
                    break
                m = decode_message(r.messages[0])
                if m.commit_log_offset < op_offset:
                    break
                found.add(m.prepared_transaction_offset)
                qoff -= 1
        missing = []
        for off, h in sorted(wanted.items()):
            if off in found:
                continue
            try:
                missing.append(self.real_message(h))
            except QueryNotFoundError:
                # The half's own record is damaged or gone: nothing to write it from.
                log.error(
                    "committed_half_unreadable",
                    commit_log_offset=off,
                    uniq_key=h.uniq_key,
                    action="its committed message cannot be written",
                )
        if missing:
            results = self.write.put_messages(missing)
            end = results[-1].end_offset
            decided: dict[str, TxRecord] = {}
            for h in wanted.values():
                rec = self.machine.find(None, h.commit_log_offset)
                if rec is not None and rec.state is TxState.COMMITTED:
                    decided[rec.transaction_id] = rec
            for rec in decided.values():
                rec.decision_end_offset = max(rec.decision_end_offset, end)
            log.warning(
                "transaction_commit_completed_after_crash",
                op_offset=op_offset,
                written=len(missing),
            )
        return len(missing)
