"""Transactional messages on the broker: halves, decisions, recovery, check state.

How it improves on RocketMQ (see the design notes in ``docs/transactions.md``):

* one state machine per transaction id (:mod:`.machine`): the first decision wins, repeats are
  harmless, contradictions are refused — also across restarts, because decisions are op records
  in the commit log and recovery applies them through the same machine;
* END_TRANSACTION is answered once the decision is durable under the flush mode in force (the
  wire handlers are in :mod:`txmq.broker.processors.transaction`);
* check state (count, last check) lives in a small persisted index, halves are never rewritten;
* the check-back (:mod:`.check`) measures age on the broker's clock and counts only checks
  delivered to a live producer of the group;
* several halves may share one transaction id; one decision covers all of them atomically.

This module joins the machine to the store: it appends op records (and, for a commit, the real
messages right after them, in the same append) and then applies them.  The table's own files
(check state, snapshots) are in :mod:`.persistence`, rebuilding the table at start is in
:mod:`.recovery`.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

import structlog

from txmq.protocol.errors import (
    BrokerSystemError,
    FencedError,
    MessageIllegalError,
    NoPermissionError,
    ProtocolError,
    QueryNotFoundError,
)
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_offset_msg_id,
    encode_tail_of,
    pack_host,
)
from txmq.protocol.topics import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from txmq.protocol.trace import TxEvent

from ..delivery import (
    TIMER_DEL_UNIQKEY,
    TIMER_PROPERTIES,
    check_timer_delay,
    route_to_timer,
    timer_deliver_ms,
)
from ..redelivery import redelivered
from ..store import (
    EncodedMessage,
    PutMessageResult,
    encode_for_store,
)
from ..store.tags import tags_code_of
from .check import CheckLimits, CheckSender, CheckService, RemotingCheckSender
from .committed import check_immunity_ms, committed_properties, committed_sys_flag
from .machine import TransactionStateMachine
from .offsets import TxnOffsetsLedger
from .persistence import TransactionPersistence
from .recovery import TransactionRecovery
from .state import (
    OP_TAG,
    Decision,
    HalfMismatchError,
    HalfRef,
    OpKind,
    OpRecord,
    TxRecord,
    TxState,
    half_mismatch,
    log_half_mismatch,
)

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..metrics import BrokerMetrics

log = structlog.get_logger(__name__)

#: Most in-memory copies of recently stored halves (see
#: :meth:`TransactionalMessageService._remember_half`); their body bytes are bounded by
#: ``transactionRecentHalvesBytes``.
RECENT_HALVES_MAX = 131_072


class TxTrace(Protocol):
    """What the transaction service tells the broker's message trace (the messaging side's
    :class:`~txmq.broker.messaging.trace.BrokerTrace`, given by the composition root): a port
    this package owns, so it imports nothing of :mod:`txmq.broker.messaging`."""

    def tx_event(self, rec: TxRecord, event: TxEvent, detail: str = "") -> None: ...

    def check_sent(self, rec: TxRecord, client_id: str) -> None: ...

    def flush(self) -> int: ...


class TxCounts:
    """Halves stored, commits and rollbacks counted in plain integers on the event loop, and
    added to their Prometheus counters (``txmq_transaction_halves``, ``_commits``,
    ``_rollbacks``) whenever the metrics are read (:meth:`fold`, from any thread), as the
    broker's request counts are: no Prometheus call per transaction."""

    __slots__ = ("halves", "commits", "rollbacks", "_metrics", "_folded", "_lock")

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.halves = self.commits = self.rollbacks = 0
        self._metrics = metrics
        self._folded = [0, 0, 0]
        self._lock = threading.Lock()
        metrics.registry.folds.append(self.fold)

    def fold(self) -> None:
        m = self._metrics
        with self._lock:
            folded = self._folded
            for i, (counter, total) in enumerate(
                (
                    (m.tx_half, self.halves),
                    (m.tx_commits, self.commits),
                    (m.tx_rollbacks, self.rollbacks),
                )
            ):
                n = total - folded[i]
                if n:
                    counter.inc(n)
                    folded[i] = total


class TransactionalMessageService:
    half_topic = RMQ_SYS_TRANS_HALF_TOPIC
    op_topic = RMQ_SYS_TRANS_OP_HALF_TOPIC

    def __init__(
        self,
        ctx: BrokerContext,
        check_sender: CheckSender | None = None,
        trace: TxTrace | None = None,
    ) -> None:
        self.ctx = ctx
        cfg = ctx.config
        self.machine = TransactionStateMachine()
        self.persistence = TransactionPersistence(
            self.machine,
            store_root=cfg.store_path_root_dir,
            store=ctx.store,
            flush_now=ctx.flush.flush_now,
            in_background=ctx.in_background,
            now_ms=self.now_ms,
        )
        #: commit-log offset -> the half's committed message encoded for the store, for the
        #: halves stored lately (oldest first): a commit that follows soon appends these
        #: instead of reading, decoding and encoding the halves again.
        #: The op records' constant parts: (store host, magic, tail, tag code, packed host).
        self._op_form: tuple[tuple[str, int], int, bytes, int, bytes] | None = None
        self._recent_halves: OrderedDict[int, EncodedMessage] = OrderedDict()
        self._recent_bytes = 0
        self._recent_max_bytes = cfg.transaction_recent_halves_bytes
        #: the half and op queue ends the last periodic snapshot covered
        self._snapshot_covers: tuple[int, int] | None = None
        #: consumer offsets committed inside transactions (fencing, applying, replay)
        self.txn_offsets = TxnOffsetsLedger(
            ctx.store, ctx.offsets, ctx.clients, ctx.flush.wait_durable
        )
        #: the broker's message trace, None when ``traceTopicEnable`` is off
        self.trace = trace
        self.checks = CheckService(
            self.machine,
            check_sender or RemotingCheckSender(cfg.transaction_check_request_timeout / 1000.0),
            lookup_message=ctx.store.lookup_message,
            producer_channels=ctx.clients.producer_channels,
            park=self.park,
            on_checked=self.persistence.mark_check_state_dirty,
            after_round=self._after_round,
            now_ms=self.now_ms,
            metrics=ctx.metrics,
            limits=CheckLimits.of(cfg),
            on_check_sent=self.trace.check_sent if self.trace is not None else None,
        )
        #: halves stored, commits and rollbacks, counted in plain integers
        self.counts = TxCounts(ctx.metrics)

    # -- the table (read-only views for processors, admin and tests) ----------------------------

    @property
    def records(self) -> dict[str, TxRecord]:
        return self.machine.records

    @property
    def pending(self) -> dict[str, TxRecord]:
        return self.machine.pending

    @property
    def batches(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        return self.machine.batches

    @property
    def check_sender(self) -> CheckSender:
        return self.checks.sender

    @check_sender.setter
    def check_sender(self, sender: CheckSender) -> None:
        self.checks.sender = sender

    @property
    def rounds(self) -> int:
        return self.checks.rounds

    def now_ms(self) -> int:
        return int(self.ctx.clock() * 1000)

    # -- half messages --------------------------------------------------------------------------

    @staticmethod
    def transaction_id_of(props: dict[str, str]) -> str | None:
        return props.get(MessageConst.TRANSACTION_ID) or props.get(MessageConst.UNIQ_KEY)

    def prepare_half(self, msg: MessageExt, header_group: str) -> None:
        """Turn an incoming transactional send into a half message (before it is stored)."""
        cfg = self.ctx.config
        if cfg.reject_transaction_message:
            raise NoPermissionError(
                f"the broker[{cfg.broker_name}] sending transaction message is forbidden "
                "(rejectTransactionMessage=true)"
            )
        props = msg.properties
        group = props.get(MessageConst.PGROUP) or header_group
        if not group:
            raise MessageIllegalError("a transactional message needs its producer group (PGROUP)")
        txid = self.transaction_id_of(props)
        if not txid:
            raise MessageIllegalError("a transactional message needs a UNIQ_KEY or transaction id")
        self.machine.check_joinable(txid, group, props.get(MessageConst.TXMQ_BATCH_KEY))
        if TIMER_DEL_UNIQKEY in props:
            raise MessageIllegalError(
                f"{TIMER_DEL_UNIQKEY} (recalling a timer message) is served for one message "
                "sent alone, not in a batch or a transaction"
            )
        now = self.now_ms()
        if self._delay_level(props) > 0:
            # A delay level wins over a delivery time (RocketMQ clears the timer properties of
            # a message with a level): delivered that long after the commit.
            for key in TIMER_PROPERTIES:
                props.pop(key, None)
        deliver = timer_deliver_ms(props, now)
        if deliver is not None:  # delivered at its time once committed (checked now)
            check_timer_delay(deliver, now, cfg.timer_max_delay_sec)
        props[MessageConst.PGROUP] = group
        props[MessageConst.REAL_TOPIC] = msg.topic
        props[MessageConst.REAL_QID] = str(msg.queue_id)
        msg.sys_flag = MessageSysFlag.reset_transaction_value(
            msg.sys_flag, MessageSysFlag.TRANSACTION_NOT_TYPE
        )
        msg.topic = self.half_topic
        msg.queue_id = 0

    def _delay_level(self, props: dict[str, str]) -> int:
        """A half's ``DELAY`` level, clamped to the levels there are (RocketMQ's rule), left in
        ``props`` for the commit; 0 (and the property dropped) when it asks for none.

        Raises:
            MessageIllegalError: the level is not a number.
        """
        value = props.get(MessageConst.DELAY)
        if value is None:
            return 0
        try:
            level = int(value)
        except ValueError:
            raise MessageIllegalError(f"DELAY property {value!r} is not a level number") from None
        if level <= 0:
            del props[MessageConst.DELAY]
            return 0
        level = min(level, len(self.ctx.delay_levels))
        props[MessageConst.DELAY] = str(level)
        return level

    def on_half_stored(self, msg: MessageExt, result: PutMessageResult) -> None:
        msg.commit_log_offset = result.commit_log_offset
        msg.queue_offset = result.queue_offset
        msg.store_timestamp = result.store_timestamp
        self.on_halves_stored([msg], [result])

    def on_halves_stored(self, msgs: list[MessageExt], results: list[PutMessageResult]) -> None:
        """Halves just stored (the store has set their offsets and store timestamps) join
        their transactions and are remembered for the commit; counted once per request."""
        add_half = self._add_half
        remember = self._remember_half
        for msg, result in zip(msgs, results, strict=True):
            half = add_half(msg, result.offset_msg_id)
            if half is not None:
                remember(msg, half)
        self.counts.halves += len(msgs)

    def _add_half(self, msg: MessageExt, offset_msg_id: str) -> HalfRef | None:
        props = msg.properties
        txid = self.transaction_id_of(props)
        if not txid:
            return None
        half = HalfRef(
            commit_log_offset=msg.commit_log_offset,
            queue_offset=msg.queue_offset,
            real_topic=props.get(MessageConst.REAL_TOPIC, ""),
            real_queue_id=int(props.get(MessageConst.REAL_QID, "0") or 0),
            store_timestamp=msg.store_timestamp,
            uniq_key=props.get(MessageConst.UNIQ_KEY, ""),
            offset_msg_id=offset_msg_id,
            immunity_ms=check_immunity_ms(props),
        )
        group = props.get(MessageConst.PGROUP, "")
        self.machine.add_half(
            txid,
            group,
            props.get(MessageConst.TXMQ_BATCH_KEY),
            half,
            props.get(MessageConst.TXMQ_2PC) == "1",
        )
        return half

    # -- lookups --------------------------------------------------------------------------------

    def find(self, txid: str | None, commit_log_offset: int | None) -> TxRecord:
        """The transaction an END_TRANSACTION names: by its id, else by its half's commit-log
        offset -- but not another transaction's half found at that offset (the log was cut
        back and written again since the producer's send): a transaction id that is neither
        the record's nor a UNIQ_KEY of its halves is answered as an unknown transaction."""
        rec = self.machine.find(txid, commit_log_offset)
        if (
            rec is not None
            and txid
            and rec.transaction_id != txid
            and not any(h.uniq_key == txid for h in rec.halves)
        ):
            log.error(
                "half_message_mismatch",
                transaction_id=txid,
                offset=commit_log_offset,
                found=f"a half of transaction {rec.transaction_id!r}",
                action="the decision is refused",
            )
            rec = None
        if rec is None:
            raise BrokerSystemError("Find prepared transaction message failed")
        return rec

    def find_by_any_id(self, any_id: str) -> TxRecord:
        """A transaction by its id, a half's message id or offset message id."""
        rec = self.records.get(any_id)
        if rec is not None:
            return rec
        for r in self.records.values():
            if any(h.uniq_key == any_id or h.offset_msg_id == any_id for h in r.halves):
                return r
        try:
            _, offset = decode_offset_msg_id(any_id)
            msg = self.ctx.store.lookup_message(offset)
        except (ProtocolError, QueryNotFoundError, KeyError):
            raise QueryNotFoundError(f"no transaction or half message with id {any_id}") from None
        txid = self.transaction_id_of(msg.properties)
        if txid and txid in self.records:
            return self.records[txid]
        raise QueryNotFoundError(f"no transaction or half message with id {any_id}")

    # -- decisions: plan in the machine, append, apply ------------------------------------------

    def _remember_half(self, msg: MessageExt, half: HalfRef) -> None:
        """Keep a just-stored half's committed message, encoded for the store as the commit
        will append it (:meth:`_real_message` of the half, but without reading it back), within
        the bounds."""
        body = bytes(msg.body)
        limit = self._recent_max_bytes
        if limit <= 0 or len(body) > limit // 64:
            return
        props = committed_properties(msg.properties)
        try:
            magic, tail = encode_tail_of(half.real_topic, props)
        except ProtocolError:
            return  # the commit reads it back and refuses it
        self._recent_halves[msg.commit_log_offset] = EncodedMessage(
            half.real_topic,
            half.real_queue_id,
            magic,
            zlib.crc32(body) & 0x7FFFFFFF,
            body,
            tail,
            msg.flag,
            committed_sys_flag(msg.sys_flag),
            msg.born_timestamp,
            pack_host(msg.born_host),
            msg.reconsume_times,
            msg.commit_log_offset,
            tags_code_of(props.get(MessageConst.TAGS)),
        )
        self._recent_bytes += len(body)
        self._evict_recent()

    # -- a port for the direct paths (:mod:`txmq.broker.messaging.fastpath`) -----------------

    def committed_body_max(self) -> int:
        """The largest body whose committed message is kept in memory for its commit (see
        :meth:`_remember_half`); -1: none is kept."""
        limit = self._recent_max_bytes
        return limit // 64 if limit > 0 else -1

    def remember_committed(self, phy: int, record: EncodedMessage, n: int) -> None:
        """Keep the committed message (``record``, its body ``n`` bytes, within
        :meth:`committed_body_max`) of the half a direct path stored at ``phy``."""
        self._recent_halves[phy] = record
        self._recent_bytes += n
        self._evict_recent()

    def remember_committed_many(self, records: list[tuple[int, EncodedMessage]], n: int) -> None:
        """:meth:`remember_committed` of the halves of a batch (their bodies ``n`` bytes)."""
        self._recent_halves.update(records)
        self._recent_bytes += n
        self._evict_recent()

    def _evict_recent(self) -> None:
        recent = self._recent_halves
        while len(recent) > RECENT_HALVES_MAX or self._recent_bytes > self._recent_max_bytes:
            _, oldest = recent.popitem(last=False)
            self._recent_bytes -= len(oldest.body)

    def _forget_halves(self, rec: TxRecord) -> None:
        for h in rec.halves:
            m = self._recent_halves.pop(h.commit_log_offset, None)
            if m is not None:
                self._recent_bytes -= len(m.body)

    def _stored_half(self, half: HalfRef, txid: str | None, action: str) -> MessageExt:
        """The half's own record, read from the store and checked to be that half (of
        ``txid``; None: of the transaction the table names at its offset).

        Raises:
            QueryNotFoundError: the half is no longer stored.
            HalfMismatchError: its offset holds another record now (logged, ``action`` saying
                what is not done); a :class:`QueryNotFoundError`, so callers answer as for a
                half no longer stored.
        """
        h = self.ctx.store.lookup_message(half.commit_log_offset)
        if txid is None:
            txid = self.machine.by_half_offset.get(half.commit_log_offset)
        why = half_mismatch(h, half, txid)
        if why is not None:
            log_half_mismatch(txid, half, why, action)
            raise HalfMismatchError(
                f"the record at commit-log offset {half.commit_log_offset} is not the half of "
                f"transaction {txid}: {why}"
            )
        return h

    def _real_message(self, half: HalfRef, txid: str | None = None) -> MessageExt:
        """The message a commit delivers, read from the store: the half with its real topic
        and queue restored, without the half-only properties.

        Raises:
            QueryNotFoundError: the half is no longer stored, or its offset holds another
                record (:class:`HalfMismatchError`): nothing is committed from it.
        """
        h = self._stored_half(half, txid, "no committed copy is written")
        msg = redelivered(
            h,
            half.real_topic,
            half.real_queue_id,
            committed_properties(h.properties),
            sys_flag=MessageSysFlag.reset_transaction_value(
                h.sys_flag, MessageSysFlag.TRANSACTION_COMMIT_TYPE
            ),
            prepared_transaction_offset=half.commit_log_offset,
        )
        # A half with a delay level: its committed message waits in the timer for the level's
        # delay, counted from the commit (RocketMQ's committed message goes through its delay
        # levels from there); the timer fires it once, also across a crash.
        props = msg.properties
        level = props.pop(MessageConst.DELAY, None)
        if level is not None:
            try:
                n = min(int(level), len(self.ctx.delay_levels))
            except ValueError:
                n = 0  # checked when the half was sent; a record from before is delivered now
            if n > 0:
                route_to_timer(msg, self.now_ms() + self.ctx.delay_levels[n - 1])
                return msg
        # A half with a delivery time: its committed message waits in the timer until then
        # (relative times count from the half's store time).
        deliver = timer_deliver_ms(props, h.store_timestamp)
        if deliver is not None and deliver > self.now_ms():
            route_to_timer(msg, deliver)
        return msg

    def _committed_records(
        self, halves: list[HalfRef], txid: str | None = None
    ) -> list[EncodedMessage]:
        """The committed messages of ``halves`` (of transaction ``txid``; None: each of the
        transaction the table names at its offset), encoded for the store: the in-memory copy
        of each half while there is one, the commit log still holds that offset and the copy
        carries the half's UNIQ_KEY, else :meth:`_real_message` (read back from the store and
        checked to be that half; always for a half with a delivery time, which the timer holds
        until then).

        Raises:
            QueryNotFoundError: a half is no longer stored, or its offset holds another record
                (nothing is appended then).
        """
        pop = self._recent_halves.pop
        min_phy = self.ctx.store.min_phy_offset
        out: list[EncodedMessage] = []
        append = out.append
        freed = 0
        try:
            for h in halves:
                r = pop(h.commit_log_offset, None)
                if r is not None:
                    freed += len(r.body)
                    # A half whose properties may ask for a delivery time is read back (the
                    # timer holds its committed message until then).
                    tail = r.tail
                    if (
                        r.prepared_transaction_offset >= min_phy
                        and b"TIMER_" not in tail
                        and b"__STARTDELIVERTIME" not in tail
                        and b"DELAY\x01" not in tail
                        and h.uniq_key.encode() in tail
                    ):
                        append(r)
                        continue
                append(encode_for_store(self._real_message(h, txid)))
        finally:
            self._recent_bytes -= freed
        return out

    def op_record(self, body: bytes, born_ms: int) -> EncodedMessage:
        """The op record holding ``body``, encoded for the store: what ``encode_for_store`` of
        a MessageExt of the op topic, queue 0, tagged OP_TAG, born here at ``born_ms`` gives
        (``tests/broker/test_op_record_form.py`` compares them), its constant parts (topic,
        properties, tag code, host) encoded once."""
        form = self._op_form
        host = self.ctx.store_host
        if form is None or form[0] != host:
            magic, tail = encode_tail_of(self.op_topic, {MessageConst.TAGS: OP_TAG})
            form = self._op_form = (host, magic, tail, tags_code_of(OP_TAG), pack_host(host))
        _, magic, tail, tags_code, packed_host = form
        return EncodedMessage(
            self.op_topic,
            0,
            magic,
            zlib.crc32(body) & 0x7FFFFFFF,
            body,
            tail,
            0,
            0,
            born_ms,
            packed_host,
            0,
            0,
            tags_code,
        )

    def _append(self, op: OpRecord, extra: list[EncodedMessage] | None = None) -> int:
        """Append ``op`` (and ``extra`` right after it, in the same append) and apply it;
        returns the commit-log offset that must be durable before anyone is told."""
        record = self.op_record(op.encode(), self.now_ms())
        end = self.ctx.write.put_encoded([record, *(extra or [])]).end_offset
        for rec in self.machine.apply(op, end):
            self._count(rec)
        self.persistence.mark_check_state_dirty()
        return end

    def _count(self, rec: TxRecord) -> None:
        state = rec.state
        if state is TxState.COMMITTED:
            self.counts.commits += 1
        elif state is TxState.ROLLED_BACK:
            self.counts.rollbacks += 1
        elif state is TxState.DISCARDED:
            self.ctx.metrics.tx_discards.inc()

    def decide(self, rec: TxRecord, decision: Decision, by: str, remark: str = "") -> int:
        """Commit or roll back ``rec`` (synchronously: no await between the state check and the
        append, so the first decision wins).  Returns the commit-log offset that must be durable
        before the decision is acknowledged; for a repeat, the first decision's.

        Raises:
            IllegalOperationError: ``rec`` already has the other outcome.
        """
        op = self.machine.plan_decision(rec, decision, f"{by}: {remark}".strip(": "), self.now_ms())
        if op is None:
            return rec.decision_end_offset
        with_offsets = op.kind is OpKind.COMMIT and self.txn_offsets.has_offsets(rec)
        if with_offsets:
            # checked and appended in one synchronous step: no membership change in between
            fenced = self.txn_offsets.fenced_reason(rec)
            if fenced is not None:
                self._fence(rec, fenced, by)
                raise FencedError(
                    f"fenced: {fenced}; transaction {rec.transaction_id} was rolled back"
                )
        if op.kind is OpKind.COMMIT:
            extra = self._committed_records(rec.halves, rec.transaction_id)
        else:
            extra = []
            self._forget_halves(rec)
        end = self._append(op, extra)
        if with_offsets:
            self.txn_offsets.committed(rec, end)
        if self.trace is not None:
            done = TxEvent.COMMITTED if op.kind is OpKind.COMMIT else TxEvent.ROLLED_BACK
            self.trace.tx_event(rec, done, f"{by}: {remark}".strip(": "))
        # DEBUG: one line per transaction is the broker's hot path, not an event (the
        # txmq_transaction_commits/rollbacks counters and `txmq trace` keep the account).
        log.debug(
            "transaction_committed" if op.kind is OpKind.COMMIT else "transaction_rolled_back",
            transaction_id=rec.transaction_id,
            group=rec.producer_group,
            messages=len(rec.halves),
            by=by,
        )
        return end

    def _fence(self, rec: TxRecord, reason: str, by: str) -> None:
        """Roll ``rec`` back: its consumer offsets may no longer be committed."""
        op = self.machine.plan_decision(
            rec, Decision.ROLLBACK, f"{by}: fenced: {reason}", self.now_ms()
        )
        if op is not None:
            self._forget_halves(rec)
            self._append(op)
            if self.trace is not None:
                self.trace.tx_event(rec, TxEvent.ROLLED_BACK, f"{by}: fenced: {reason}")
        log.warning(
            "transaction_fenced",
            transaction_id=rec.transaction_id,
            group=rec.producer_group,
            reason=reason,
            by=by,
        )

    def decide_batch(
        self,
        group: str,
        batch_key: str,
        commit: list[str],
        position: tuple[str, str, str] | None = None,
        pipeline: str | None = None,
    ) -> int | None:
        """Commit ``commit`` and roll back the batch's other pending transactions, once per
        batch key; None when the batch was already decided.  ``position``: the pipeline input
        range the batch consumed; ``pipeline``: the batch's pipeline, whose other runs' pending
        transactions the same record rolls back as orphans (see
        :meth:`~.machine.TransactionStateMachine.plan_batch`)."""
        if (group, batch_key) in self.batches:
            return None
        plan = self.machine.plan_batch(group, batch_key, commit, self.now_ms(), position, pipeline)
        end = self._append(plan.op, self._committed_records(plan.to_commit))
        records = self.machine.records
        for txid in plan.op.committed:
            rec = records.get(txid)
            if rec is not None and self.txn_offsets.has_offsets(rec):
                # Consumer offsets committed with a batch (a transaction across broker groups,
                # fenced where its decision was recorded): they count from this append on.
                self.txn_offsets.committed(rec, end)
        if plan.op.orphans:
            self._orphans_rolled_back(group, plan.op.orphans, batch_key)
        if self.trace is not None:
            records = self.machine.records
            for txid in (*plan.op.committed, *plan.op.txids, *plan.op.orphans):
                rec = records.get(txid)
                if rec is not None:
                    done = (
                        TxEvent.COMMITTED if rec.state is TxState.COMMITTED else TxEvent.ROLLED_BACK
                    )
                    orphan = txid in plan.op.orphans
                    self.trace.tx_event(rec, done, rec.remark if orphan else "batch")
        log.info(
            "batch_decided",
            group=group,
            batch_key=batch_key,
            committed=len(plan.op.committed),
            rolled_back=len(plan.op.txids),
            orphans=len(plan.op.orphans),
        )
        return end

    def roll_back_orphans(self, group: str, pipeline: str, run: str) -> int | None:
        """Run ``run`` of ``pipeline`` started: roll back the pending transactions of its other
        runs (they died or were superseded, and the new run writes every undecided batch
        again).  Returns the commit-log offset that must be durable, None if there were none."""
        end = None
        for op in self.machine.plan_orphans(group, pipeline, run, self.now_ms()):
            for t in op.txids:
                self._forget_halves(self.machine.records[t])
            end = self._append(op)
            self._orphans_rolled_back(group, op.txids, f"run {run} of {pipeline!r} started")
            if self.trace is not None:
                for t in op.txids:
                    self.trace.tx_event(self.machine.records[t], TxEvent.ROLLED_BACK, op.remark)
        return end

    def _orphans_rolled_back(self, group: str, txids: tuple[str, ...], by: str) -> None:
        records = self.machine.records
        self.ctx.metrics.tx_pipeline_orphans.inc(len(txids))
        for t in txids:
            rec = records.get(t)
            log.warning(
                "pipeline_orphan_rolled_back",
                transaction_id=t,
                group=group,
                batch_key=None if rec is None else rec.batch_key,
                remark=None if rec is None else rec.remark,
                by=by,
            )

    def local_batch_part(self, group: str, commit: list[str]) -> list[str]:
        """Cluster mode: the transactions of a batch decision that have their halves here (the
        others are in other broker groups)."""
        records = self.machine.records
        return [t for t in commit if t in records and records[t].producer_group == group]

    def resume(self, rec: TxRecord) -> int:
        """Check ``rec`` again from a fresh budget (an operator's command)."""
        end = self._append(self.machine.plan_resume(rec, self.now_ms()))
        if self.trace is not None:
            self.trace.tx_event(rec, TxEvent.RESUMED, "operator")
        log.info("transaction_resumed", transaction_id=rec.transaction_id)
        return end

    def park(self, rec: TxRecord, reason: str) -> None:
        """Park a transaction out of check budget: a discard record, and copies of its halves
        in TRANS_CHECK_MAX_TIME_TOPIC for an operator."""
        copies = []
        for h in rec.halves:
            try:
                m = self._stored_half(h, rec.transaction_id, "no copy is parked")
            except (QueryNotFoundError, KeyError):
                continue
            m.topic = TRANS_CHECK_MAX_TIME_TOPIC
            m.queue_id = 0
            m.properties[MessageConst.TRANSACTION_CHECK_TIMES] = str(rec.check_times)
            m.properties[MessageConst.TRANSACTION_ID] = rec.transaction_id
            copies.append(encode_for_store(m))
        self._append(self.machine.plan_discard(rec, reason, self.now_ms()), copies)
        if self.trace is not None:
            self.trace.tx_event(rec, TxEvent.TIMED_OUT, reason)
        log.warning(
            "transaction_discarded",
            transaction_id=rec.transaction_id,
            group=rec.producer_group,
            check_times=rec.check_times,
            reason=reason,
        )

    # -- check-back -----------------------------------------------------------------------------

    def start(self) -> None:
        self.checks.start()

    async def stop(self) -> None:
        await self.checks.stop()
        await self.txn_offsets.stop()
        if self.trace is not None:
            self.trace.flush()
        await self.persist_check_state()
        await self.write_snapshot()

    def on_producer_registered(self, group: str) -> None:
        self.checks.on_producer_registered(group)

    async def check_round(self) -> dict[str, int]:
        return await self.checks.check_round()

    async def _after_round(self) -> None:
        self.prune()
        self.update_gauges()
        await self.persist_check_state()
        if self.persistence.snapshot_due(self.ctx.config.transaction_snapshot_interval):
            # Only when the half or op queue grew since the last one: the table is what they
            # say (check counts are in the check-state index), so an idle broker does not
            # rewrite an unchanged table, however many transactions are pending.
            covers = self._queue_ends()
            if covers != self._snapshot_covers:
                await self.write_snapshot()
                self._snapshot_covers = covers

    def _queue_ends(self) -> tuple[int, int]:
        store = self.ctx.store
        return (
            store.get_max_offset_in_queue(self.half_topic, 0),
            store.get_max_offset_in_queue(self.op_topic, 0),
        )

    def prune(self) -> int:
        """Forget decisions whose idempotency window is over (``transactionDecidedRetention``,
        ``transactionBatchRetention``), so memory stays bounded however many transactions were
        decided."""
        cfg, now = self.ctx.config, self.now_ms()
        n = self.machine.prune(
            now - cfg.transaction_decided_retention, now - cfg.transaction_batch_retention
        )
        if n:
            self.ctx.metrics.tx_pruned.inc(n)
            log.debug("transactions_pruned", count=n, remembered=len(self.records))
        return n

    # -- persistence (check state, snapshots: :mod:`.persistence`) ------------------------------

    async def persist_check_state(self) -> None:
        """Write the check-state index if it changed."""
        await self.persistence.persist_check_state()

    async def write_snapshot(self) -> None:
        """Snapshot the table (see :mod:`.snapshot`)."""
        await self.persistence.write_snapshot()

    # -- recovery (:mod:`.recovery`) ------------------------------------------------------------

    def load(self) -> dict[str, int]:
        """Rebuild the table (the last snapshot, the half and op queues after it, the check
        state; a commit a crash interrupted is finished), then forget what is past retention."""
        found = TransactionRecovery(
            self.machine,
            self.persistence,
            store=self.ctx.store,
            write=self.ctx.write,
            add_half=self._add_half,
            real_message=self._real_message,
        ).run()
        replayed = self.txn_offsets.catch_up()
        pruned = self.prune()
        self.update_gauges()
        if found.snapshot and not found.halves and not found.ops:
            self._snapshot_covers = self._queue_ends()  # the snapshot on disk is up to date
        stats = {
            "snapshot": int(found.snapshot),
            "halves": found.halves,
            "ops": found.ops,
            "pending": len(self.pending),
            "repaired": found.repaired,
            "pruned": pruned,
            "offsetsReplayed": replayed,
        }
        log.info("transactions_recovered", **stats)
        return stats

    # -- metrics --------------------------------------------------------------------------------

    def update_gauges(self) -> None:
        """Set the pending gauges from the machine's per-(topic, group) index: as many steps as
        there are (topic, group) pairs, however many transactions are pending."""
        now = self.now_ms()
        g = self.ctx.metrics
        g.tx_pending.clear()
        g.tx_pending_oldest.clear()
        for (topic, group), count, oldest_ts in self.machine.gauges:
            g.tx_pending.labels(topic, group).set(count)
            g.tx_pending_oldest.labels(topic, group).set((now - oldest_ts) / 1000.0)

    def summary(self) -> dict[str, int]:
        counts = self.machine.counts()
        return {
            "pending": counts["PENDING"],
            "discarded": counts["DISCARDED"],
            "committed": counts["COMMITTED"],
            "rolledBack": counts["ROLLED_BACK"],
            "checkRounds": self.rounds,
        }


__all__ = ["CheckSender", "RemotingCheckSender", "TransactionalMessageService"]
