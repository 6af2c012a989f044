"""Transactional messages on the broker: halves, decisions, check-back.

How it improves on RocketMQ (see the design notes in ``docs/transactions.md``):

* one state machine per transaction id (:mod:`.state`): the first decision wins, repeats are
  harmless, contradictions are refused — also across restarts, because decisions are op records
  in the commit log and the table is rebuilt from them;
* END_TRANSACTION is answered once the decision is durable under the flush mode in force;
* check state (count, last check) lives in a small persisted index, halves are never rewritten;
* age is measured on the broker's clock (the half's store timestamp);
* only checks acknowledged by a live producer of the group count against the budget;
* several halves may share one transaction id; one decision covers all of them atomically.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from txmq.protocol.aio import Connection, wait_event
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    BrokerSystemError,
    IllegalOperationError,
    InvalidParameterError,
    MessageIllegalError,
    NoPermissionError,
    ProtocolError,
    QueryNotFoundError,
    TxmqError,
)
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    DecideBatchRequestHeader,
    EndTransactionRequestHeader,
    ForceDecideRequestHeader,
    GetTransactionRequestHeader,
    ListTransactionsRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
)
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_offset_msg_id,
    encode_message,
)

from ..clients import ClientChannel
from ..store import GetMessageStatus, PutMessageResult, atomic_write
from ..topics import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from .state import OP_TAG, Decision, HalfRef, TxRecord, TxState, decode_op, encode_op

if TYPE_CHECKING:
    from ..server import BrokerController

log = structlog.get_logger(__name__)

CHECK_STATE_VERSION = 1
#: Checks sent at once in one round.
CHECK_CONCURRENCY = 128


class CheckSender(Protocol):
    """The seam between the check service and the network (tests may substitute it)."""

    async def __call__(
        self, channel: ClientChannel, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool: ...


class RemotingCheckSender:
    """Sends CHECK_TRANSACTION_STATE in the encoding the producer's connection speaks.

    The txmq SDK (msgpack) gets it as a request and acknowledges that it accepted the check
    (SUCCESS) or that it is too busy now (SYSTEM_BUSY); only an acknowledged check counts as
    delivered.  Stock RocketMQ clients (JSON or ROCKETMQ headers) take it oneway, as RocketMQ's
    broker sends it, and acknowledge nothing: for them a check written to a live connection
    counts as delivered, and the half stays pending until their END_TRANSACTION (also oneway)
    arrives or the next check is due.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def __call__(
        self, channel: ClientChannel, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool:
        conn = channel.conn
        st = conn.peer_serialize_type
        cmd = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, header.to_ext_fields(), body, serialize_type=st
        )
        if st != SerializeType.MSGPACK:
            try:
                conn.send_oneway(cmd)
            except TxmqError as exc:
                log.info("check_not_delivered", client_id=channel.client_id, error=str(exc))
                return False
            return True
        try:
            resp = await conn.request(cmd, self.timeout_s)
        except TxmqError as exc:
            log.info("check_not_delivered", client_id=channel.client_id, error=str(exc))
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.info(
                "check_refused", client_id=channel.client_id, code=resp.code, remark=resp.remark
            )
            return False
        return True


class TransactionalMessageService:
    half_topic = RMQ_SYS_TRANS_HALF_TOPIC
    op_topic = RMQ_SYS_TRANS_OP_HALF_TOPIC

    def __init__(self, broker: BrokerController, check_sender: CheckSender | None = None) -> None:
        self.broker = broker
        cfg = broker.config
        self.check_sender: CheckSender = check_sender or RemotingCheckSender(
            cfg.transaction_check_request_timeout / 1000.0
        )
        self.records: dict[str, TxRecord] = {}
        self.pending: dict[str, TxRecord] = {}
        self._by_half_offset: dict[int, str] = {}
        self.batches: dict[tuple[str, str], dict[str, list[str]]] = {}
        self._batch_members: dict[tuple[str, str], set[str]] = {}
        self._check_state_path = os.path.join(
            cfg.store_path_root_dir, "transaction", "checkState.json"
        )
        self._check_state_dirty = False
        self._task: asyncio.Task[None] | None = None
        self._round_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.rounds = 0

    # -- clock ----------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.broker.clock() * 1000)

    # -- half messages --------------------------------------------------------------------------

    @staticmethod
    def transaction_id_of(props: dict[str, str]) -> str | None:
        return props.get(MessageConst.TRANSACTION_ID) or props.get(MessageConst.UNIQ_KEY)

    def prepare_half(self, msg: MessageExt, header_group: str) -> None:
        """Turn an incoming transactional send into a half message (before it is stored)."""
        cfg = self.broker.config
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
        bk = props.get(MessageConst.TXMQ_BATCH_KEY)
        if bk is not None and (group, bk) in self.batches:
            raise IllegalOperationError(
                f"batch {bk!r} of producer group {group} is already decided; this attempt's "
                "messages will never be delivered"
            )
        props[MessageConst.PGROUP] = group
        props[MessageConst.REAL_TOPIC] = msg.topic
        props[MessageConst.REAL_QID] = str(msg.queue_id)
        props.pop(MessageConst.DELAY, None)  # a delay level on a transactional message is ignored
        msg.sys_flag = MessageSysFlag.reset_transaction_value(
            msg.sys_flag, MessageSysFlag.TRANSACTION_NOT_TYPE
        )
        msg.topic = self.half_topic
        msg.queue_id = 0

    def on_half_stored(self, msg: MessageExt, result: PutMessageResult) -> None:
        msg.commit_log_offset = result.commit_log_offset
        msg.queue_offset = result.queue_offset
        msg.store_timestamp = result.store_timestamp
        self._add_half(msg, result.offset_msg_id)
        self.broker.metrics.tx_half.inc()
        log.debug(
            "half_message_stored",
            transaction_id=self.transaction_id_of(msg.properties),
            offset=result.commit_log_offset,
        )

    def _add_half(self, msg: MessageExt, offset_msg_id: str) -> TxRecord | None:
        props = msg.properties
        txid = self.transaction_id_of(props)
        group = props.get(MessageConst.PGROUP, "")
        if not txid:
            return None
        rec = self.records.get(txid)
        if rec is None:
            rec = TxRecord(txid, group, batch_key=props.get(MessageConst.TXMQ_BATCH_KEY))
            self.records[txid] = rec
            self.pending[txid] = rec
            if rec.batch_key is not None:
                self._batch_members.setdefault((group, rec.batch_key), set()).add(txid)
        immunity = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
        try:
            immunity_ms = int(float(immunity) * 1000) if immunity else None
        except ValueError:
            immunity_ms = None
        rec.halves.append(
            HalfRef(
                commit_log_offset=msg.commit_log_offset,
                queue_offset=msg.queue_offset,
                real_topic=props.get(MessageConst.REAL_TOPIC, ""),
                real_queue_id=int(props.get(MessageConst.REAL_QID, "0") or 0),
                store_timestamp=msg.store_timestamp,
                uniq_key=props.get(MessageConst.UNIQ_KEY, ""),
                offset_msg_id=offset_msg_id,
                immunity_ms=immunity_ms,
            )
        )
        self._by_half_offset[msg.commit_log_offset] = txid
        return rec

    # -- decisions ------------------------------------------------------------------------------

    def _real_message(self, half: HalfRef) -> MessageExt:
        """The message a commit delivers: the half with its real topic and queue restored."""
        h = self.broker.store.lookup_message(half.commit_log_offset)
        props = dict(h.properties)
        for k in (
            MessageConst.REAL_TOPIC,
            MessageConst.REAL_QID,
            MessageConst.TRAN_MSG,
            MessageConst.TRANSACTION_CHECK_TIMES,
            MessageConst.TXMQ_BATCH_KEY,
        ):
            props.pop(k, None)
        return MessageExt(
            topic=half.real_topic,
            body=h.body,
            queue_id=half.real_queue_id,
            flag=h.flag,
            sys_flag=MessageSysFlag.reset_transaction_value(
                h.sys_flag, MessageSysFlag.TRANSACTION_COMMIT_TYPE
            ),
            born_timestamp=h.born_timestamp,
            born_host=h.born_host,
            reconsume_times=h.reconsume_times,
            prepared_transaction_offset=half.commit_log_offset,
            properties=props,
        )

    def _op_message(self, body: bytes) -> MessageExt:
        return MessageExt(
            topic=self.op_topic,
            body=body,
            queue_id=0,
            born_timestamp=self.now_ms(),
            born_host=self.broker.store_host,
            properties={MessageConst.TAGS: OP_TAG},
        )

    def _apply_decision(
        self, rec: TxRecord, state: TxState, by: str, remark: str, end_offset: int
    ) -> None:
        rec.state = state
        rec.decided_ms = self.now_ms()
        rec.decided_by = by
        rec.remark = remark
        rec.check_in_flight = False
        rec.decision_end_offset = end_offset
        self.pending.pop(rec.transaction_id, None)
        self._check_state_dirty = True
        m = self.broker.metrics
        if state is TxState.COMMITTED:
            m.tx_commits.inc()
        elif state is TxState.ROLLED_BACK:
            m.tx_rollbacks.inc()

    def decide(self, rec: TxRecord, decision: Decision, by: str, remark: str = "") -> int:
        """Apply a decision synchronously (no await between the state check and the append, so
        the first decision wins).  Returns the commit-log offset that must be durable before
        the decision is acknowledged."""
        target = TxState.COMMITTED if decision == Decision.COMMIT else TxState.ROLLED_BACK
        if rec.state.decided:
            if rec.state is target:
                return rec.decision_end_offset
            word = "commit" if decision == Decision.COMMIT else "rollback"
            raise IllegalOperationError(
                f"transaction {rec.transaction_id} is already {rec.state.value}; the {word} "
                f"was refused and the outcome does not change"
            )
        kind = "commit" if target is TxState.COMMITTED else "rollback"
        op = self._op_message(
            encode_op(
                kind,
                rec.producer_group,
                [rec.transaction_id],
                [h.commit_log_offset for h in rec.halves],
                f"{by}: {remark}".strip(": "),
                self.now_ms(),
            )
        )
        msgs = [op]
        if target is TxState.COMMITTED:
            msgs += [self._real_message(h) for h in rec.halves]
        results = self.broker.put_messages(msgs)
        self._apply_decision(rec, target, by, remark, results[-1].end_offset)
        log.info(
            "transaction_committed" if target is TxState.COMMITTED else "transaction_rolled_back",
            transaction_id=rec.transaction_id,
            group=rec.producer_group,
            messages=len(rec.halves),
            by=by,
        )
        return rec.decision_end_offset

    def _find(self, txid: str | None, commit_log_offset: int | None) -> TxRecord:
        rec = self.records.get(txid) if txid else None
        if rec is None and commit_log_offset is not None:
            other = self._by_half_offset.get(commit_log_offset)
            rec = self.records.get(other) if other else None
        if rec is None:
            raise BrokerSystemError("Find prepared transaction message failed")
        return rec

    async def end_transaction(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = EndTransactionRequestHeader.from_ext_fields(cmd.ext_fields)
        m = self.broker.metrics
        try:
            decision = Decision(h.commit_or_rollback)
        except ValueError:
            raise InvalidParameterError(
                f"commitOrRollback must be 0, 8 or 12, got {h.commit_or_rollback}"
            ) from None
        rec = self._find(h.transaction_id, h.commit_log_offset)
        if h.from_transaction_check:
            m.tx_checks_answered.inc()
            if rec.state.decided:
                m.tx_checks_unexpected.inc()
            rec.check_in_flight = False
        half = next((x for x in rec.halves if x.commit_log_offset == h.commit_log_offset), None)
        if rec.producer_group != h.producer_group:
            raise BrokerSystemError(
                f"The producer group wrong: transaction {rec.transaction_id} belongs to "
                f"{rec.producer_group}, not {h.producer_group}"
            )
        if half is None:
            raise BrokerSystemError(
                f"The commit log offset wrong: {h.commit_log_offset} is not a half message of "
                f"transaction {rec.transaction_id}"
            )
        if half.queue_offset != h.tran_state_table_offset:
            raise BrokerSystemError(
                f"The transaction state table offset wrong: expected {half.queue_offset}, "
                f"got {h.tran_state_table_offset}"
            )
        if decision == Decision.UNKNOWN:
            log.info(
                "transaction_unknown",
                transaction_id=rec.transaction_id,
                from_check=h.from_transaction_check,
                remark=cmd.remark,
            )
            return cmd.response(remark=f"transaction {rec.transaction_id} stays {rec.state.value}")
        by = "check" if h.from_transaction_check else "producer"
        already = rec.state.decided
        end = self.decide(rec, decision, by, cmd.remark or "")
        await self.broker.flush.wait_durable(end)
        return cmd.response(
            remark=f"transaction {rec.transaction_id} "
            f"{'was already ' if already else ''}{rec.state.value}"
        )

    # -- batch decisions (TXMQ_DECIDE_BATCH) ----------------------------------------------------

    async def decide_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = DecideBatchRequestHeader.from_ext_fields(cmd.ext_fields)
        try:
            doc = json.loads(cmd.body.decode("utf-8")) if cmd.body else {}
            commit = [str(x) for x in doc.get("commit", [])]
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError) as exc:
            raise InvalidParameterError(
                f"decide-batch body must be JSON {{'commit': [...]}}: {exc}"
            ) from None
        key = (h.producer_group, h.batch_key)
        first = key not in self.batches
        if h.query_only:
            decided = self.batches.get(key)
            pending = sorted(
                t
                for t in self._batch_members.get(key, set())
                if self.records[t].state is TxState.PENDING
            )
            return cmd.response(
                body=json.dumps(
                    {
                        "batchKey": h.batch_key,
                        "decided": decided is not None,
                        "committed": decided["committed"] if decided else [],
                        "rolledBack": decided["rolledBack"] if decided else [],
                        "pending": pending,
                    }
                ).encode()
            )
        if first:
            end = self._decide_batch(h.producer_group, h.batch_key, commit)
            await self.broker.flush.wait_durable(end)
        decided = self.batches[key]
        body = json.dumps(
            {
                "batchKey": h.batch_key,
                "decided": True,
                "committed": decided["committed"],
                "rolledBack": decided["rolledBack"],
                "first": first,
            }
        ).encode()
        return cmd.response(body=body)

    def _decide_batch(self, group: str, batch_key: str, commit: list[str]) -> int:
        commit_recs = []
        for txid in dict.fromkeys(commit):
            rec = self.records.get(txid)
            if rec is None or rec.producer_group != group:
                raise InvalidParameterError(
                    f"transaction {txid} has no half message in producer group {group}"
                )
            if rec.state is TxState.ROLLED_BACK:
                raise IllegalOperationError(
                    f"transaction {txid} is already ROLLED_BACK; batch {batch_key!r} was not "
                    "decided"
                )
            commit_recs.append(rec)
        commit_set = {r.transaction_id for r in commit_recs}
        rollback_recs = [
            self.records[t]
            for t in sorted(self._batch_members.get((group, batch_key), set()))
            if t not in commit_set and not self.records[t].state.decided
        ]
        to_commit = [r for r in commit_recs if not r.state.decided]
        op = self._op_message(
            encode_op(
                "batch",
                group,
                [r.transaction_id for r in rollback_recs],
                [h.commit_log_offset for r in to_commit for h in r.halves],
                "batch",
                self.now_ms(),
                batch_key=batch_key,
                committed=[r.transaction_id for r in commit_recs],
            )
        )
        msgs = [op] + [self._real_message(h) for r in to_commit for h in r.halves]
        results = self.broker.put_messages(msgs)
        end = results[-1].end_offset
        for r in to_commit:
            self._apply_decision(r, TxState.COMMITTED, "batch", batch_key, end)
        for r in rollback_recs:
            self._apply_decision(r, TxState.ROLLED_BACK, "batch", batch_key, end)
        self.batches[(group, batch_key)] = {
            "committed": sorted(commit_set),
            "rolledBack": sorted(r.transaction_id for r in rollback_recs),
        }
        log.info(
            "batch_decided",
            group=group,
            batch_key=batch_key,
            committed=len(commit_set),
            rolled_back=len(rollback_recs),
        )
        return end

    # -- operator commands ----------------------------------------------------------------------

    def _find_by_any_id(self, any_id: str) -> TxRecord:
        rec = self.records.get(any_id)
        if rec is not None:
            return rec
        for r in self.records.values():
            if any(h.uniq_key == any_id or h.offset_msg_id == any_id for h in r.halves):
                return r
        try:
            _, offset = decode_offset_msg_id(any_id)
            msg = self.broker.store.lookup_message(offset)
        except (ProtocolError, QueryNotFoundError, KeyError):
            raise QueryNotFoundError(f"no transaction or half message with id {any_id}") from None
        txid = self.transaction_id_of(msg.properties)
        if txid and txid in self.records:
            return self.records[txid]
        raise QueryNotFoundError(f"no transaction or half message with id {any_id}")

    async def resume_check_half_message(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = ResumeCheckHalfMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        rec = self._find_by_any_id(h.msg_id)
        if rec.state.decided:
            raise IllegalOperationError(
                f"transaction {rec.transaction_id} is already {rec.state.value}"
            )
        op = self._op_message(
            encode_op(
                "resume", rec.producer_group, [rec.transaction_id], [], "operator", self.now_ms()
            )
        )
        results = self.broker.put_messages([op])
        self._resume(rec)
        await self.broker.flush.wait_durable(results[-1].end_offset)
        log.info("transaction_resumed", transaction_id=rec.transaction_id)
        return cmd.response(remark=f"transaction {rec.transaction_id} is under checking again")

    def _resume(self, rec: TxRecord) -> None:
        rec.state = TxState.PENDING
        rec.check_times = 0
        rec.last_check_ms = 0
        rec.check_in_flight = False
        self.pending[rec.transaction_id] = rec
        self._check_state_dirty = True

    async def list_transactions(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ListTransactionsRequestHeader.from_ext_fields(cmd.ext_fields)
        now = self.now_ms()
        states = (
            {s.strip().upper() for s in h.state.split(",")}
            if h.state
            else {TxState.PENDING.value, TxState.DISCARDED.value}
        )
        out = []
        for rec in self.records.values():
            if rec.state.value not in states:
                continue
            if h.producer_group and rec.producer_group != h.producer_group:
                continue
            if h.topic and not any(x.real_topic == h.topic for x in rec.halves):
                continue
            out.append(rec.to_json(now))
            if len(out) >= h.limit:
                break
        return cmd.response(body=json.dumps(out).encode())

    async def get_transaction(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetTransactionRequestHeader.from_ext_fields(cmd.ext_fields)
        rec = self._find_by_any_id(h.transaction_id)
        return cmd.response(body=json.dumps(rec.to_json(self.now_ms())).encode())

    async def force_decide(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ForceDecideRequestHeader.from_ext_fields(cmd.ext_fields)
        try:
            decision = Decision(h.commit_or_rollback)
        except ValueError:
            raise InvalidParameterError(
                "commitOrRollback must be 8 (commit) or 12 (rollback)"
            ) from None
        if decision == Decision.UNKNOWN:
            raise InvalidParameterError("an operator decision must be commit (8) or rollback (12)")
        rec = self._find_by_any_id(h.transaction_id)
        already = rec.state.decided
        end = self.decide(rec, decision, "operator", cmd.remark or "")
        await self.broker.flush.wait_durable(end)
        return cmd.response(
            remark=f"transaction {rec.transaction_id} "
            f"{'was already ' if already else ''}{rec.state.value}"
        )

    # -- check-back -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-tx-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.persist_check_state()

    def on_producer_registered(self, group: str) -> None:
        """A producer (re)connected: if it has halves waiting for a check, check soon."""
        now = self.now_ms()
        if any(r.producer_group == group and self._due(r, now) for r in self.pending.values()):
            self._wake.set()

    async def _run(self) -> None:
        interval = self.broker.config.transaction_check_interval / 1000.0
        while True:
            await wait_event(self._wake, interval)
            self._wake.clear()
            try:
                await self.check_round()
            except Exception as exc:
                log.error("check_round_failed", error=repr(exc))

    def _due(self, rec: TxRecord, now: int) -> bool:
        threshold = self.broker.config.transaction_time_out
        immunities = [h.immunity_ms for h in rec.halves if h.immunity_ms is not None]
        if immunities:
            threshold = max(immunities)
        return now - rec.newest_store_timestamp >= threshold

    async def check_round(self) -> dict[str, int]:
        """One pass over the pending halves (RocketMQ's TransactionalMessageCheckService)."""
        async with self._round_lock:
            cfg = self.broker.config
            now = self.now_ms()
            reserved_ms = int(cfg.file_reserved_time * 3_600_000)
            stats = {"due": 0, "sent": 0, "no_producer": 0, "discarded": 0, "not_delivered": 0}
            due: list[tuple[TxRecord, ClientChannel]] = []
            for rec in list(self.pending.values()):
                if not self._due(rec, now):
                    continue
                if (
                    rec.check_times >= cfg.transaction_check_max
                    or now - rec.oldest_store_timestamp > reserved_ms
                ):
                    self._discard(rec, now, reserved_ms)
                    stats["discarded"] += 1
                    continue
                stats["due"] += 1
                channels = self.broker.clients.producer_channels(rec.producer_group)
                if not channels:
                    stats["no_producer"] += 1
                    continue
                due.append((rec, random.choice(channels)))
            sem = asyncio.Semaphore(CHECK_CONCURRENCY)

            async def one(rec: TxRecord, ch: ClientChannel) -> None:
                async with sem:
                    if await self._send_check(rec, ch):
                        stats["sent"] += 1
                    else:
                        stats["not_delivered"] += 1

            await asyncio.gather(*(one(r, c) for r, c in due))
            self.rounds += 1
            self.persist_check_state()
            self.update_gauges()
            if any(stats.values()):
                log.info("check_round_finished", **stats)
            return stats

    async def _send_check(self, rec: TxRecord, ch: ClientChannel) -> bool:
        if rec.state is not TxState.PENDING or rec.check_in_flight:
            return False
        half = rec.halves[0]
        try:
            stored = self.broker.store.lookup_message(half.commit_log_offset)
        except (QueryNotFoundError, KeyError):
            log.warning(
                "half_message_missing",
                transaction_id=rec.transaction_id,
                offset=half.commit_log_offset,
            )
            return False
        stored.topic = half.real_topic
        stored.queue_id = half.real_queue_id
        stored.properties[MessageConst.TRANSACTION_CHECK_TIMES] = str(rec.check_times + 1)
        stored.properties.setdefault(MessageConst.TRANSACTION_ID, rec.transaction_id)
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.commit_log_offset,
            msg_id=half.uniq_key,
            transaction_id=rec.transaction_id,
            offset_msg_id=half.offset_msg_id,
        )
        # One check in flight per transaction: rounds never overlap, and within a round a
        # transaction is checked once.  An unanswered check is simply sent again next round.
        rec.check_in_flight = True
        delivered = False
        try:
            delivered = await self.check_sender(ch, header, encode_message(stored))
        finally:
            rec.check_in_flight = False
        if delivered:
            # counted even when the answer overtook the acknowledgement
            self.broker.metrics.tx_checks_sent.inc()
        if delivered and rec.state is TxState.PENDING:
            rec.check_times += 1
            rec.last_check_ms = self.now_ms()
            self._check_state_dirty = True
            log.info(
                "check_sent",
                transaction_id=rec.transaction_id,
                client_id=ch.client_id,
                check_times=rec.check_times,
            )
        return delivered

    def _discard(self, rec: TxRecord, now: int, reserved_ms: int) -> None:
        """Park a half that used up its check budget in TRANS_CHECK_MAX_TIME_TOPIC."""
        reason = (
            "fileReservedTime"
            if now - rec.oldest_store_timestamp > reserved_ms
            else "transactionCheckMax"
        )
        copies = []
        for h in rec.halves:
            try:
                m = self.broker.store.lookup_message(h.commit_log_offset)
            except (QueryNotFoundError, KeyError):
                continue
            m.topic = TRANS_CHECK_MAX_TIME_TOPIC
            m.queue_id = 0
            m.properties[MessageConst.TRANSACTION_CHECK_TIMES] = str(rec.check_times)
            m.properties[MessageConst.TRANSACTION_ID] = rec.transaction_id
            copies.append(m)
        op = self._op_message(
            encode_op(
                "discard",
                rec.producer_group,
                [rec.transaction_id],
                [h.commit_log_offset for h in rec.halves],
                reason,
                now,
            )
        )
        self.broker.put_messages([op, *copies])
        rec.state = TxState.DISCARDED
        rec.remark = reason
        self.pending.pop(rec.transaction_id, None)
        self._check_state_dirty = True
        self.broker.metrics.tx_discards.inc()
        log.warning(
            "transaction_discarded",
            transaction_id=rec.transaction_id,
            group=rec.producer_group,
            check_times=rec.check_times,
            reason=reason,
        )

    # -- persistence of check state -------------------------------------------------------------

    def persist_check_state(self) -> None:
        if not self._check_state_dirty:
            return
        doc = {
            "version": CHECK_STATE_VERSION,
            "checks": {
                r.transaction_id: [r.check_times, r.last_check_ms]
                for r in self.records.values()
                if r.state in (TxState.PENDING, TxState.DISCARDED) and r.check_times
            },
        }
        os.makedirs(os.path.dirname(self._check_state_path), exist_ok=True)
        atomic_write(self._check_state_path, json.dumps(doc).encode())
        self._check_state_dirty = False

    def _load_check_state(self) -> None:
        try:
            with open(self._check_state_path, "rb") as fh:
                doc = json.loads(fh.read())
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("check_state_unreadable", path=self._check_state_path, error=repr(exc))
            return
        for txid, (times, last) in (doc.get("checks") or {}).items():
            rec = self.records.get(txid)
            if rec is not None and not rec.state.decided:
                rec.check_times = max(rec.check_times, int(times))
                rec.last_check_ms = int(last)

    # -- recovery -------------------------------------------------------------------------------

    def _read_queue(self, topic: str) -> Iterator[MessageExt]:
        store = self.broker.store
        offset = store.get_min_offset_in_queue(topic, 0)
        while True:
            r = store.get_messages(topic, 0, offset, 256)
            if r.status is GetMessageStatus.FOUND:
                for raw in r.messages:
                    yield decode_message(raw)
                offset = r.next_begin_offset
            elif r.next_begin_offset > offset:
                offset = r.next_begin_offset
            else:
                return

    def load(self) -> dict[str, int]:
        """Rebuild the table from the half and op queues (merged in commit-log order), load the
        check-state index, and finish a commit that a crash interrupted."""
        halves = ((m.commit_log_offset, 0, m) for m in self._read_queue(self.half_topic))
        ops = ((m.commit_log_offset, 1, m) for m in self._read_queue(self.op_topic))
        n_half = n_op = 0
        last_commit: tuple[int, list[int]] | None = None
        for offset, kind, m in heapq.merge(halves, ops, key=lambda x: (x[0], x[1])):
            if kind == 0:
                self._add_half(m, m.offset_msg_id)
                n_half += 1
                continue
            n_op += 1
            try:
                op = decode_op(m.body)
            except Exception:
                log.warning("op_record_unreadable", offset=offset)
                continue
            covered = self._replay_op(op, m.commit_log_offset)
            if covered:
                last_commit = (m.commit_log_offset, covered)
        self._load_check_state()
        repaired = self._complete_interrupted_commit(last_commit) if last_commit else 0
        self.update_gauges()
        stats = {"halves": n_half, "ops": n_op, "pending": len(self.pending), "repaired": repaired}
        log.info("transactions_recovered", **stats)
        return stats

    def _replay_op(self, op: dict[str, Any], offset: int) -> list[int]:
        """Apply one op record; returns the half offsets a commit in it covers."""
        kind, group = op["k"], op.get("g", "")
        by, ts = op.get("r", ""), int(op.get("ts", 0))

        def rec_for(txid: str) -> TxRecord:
            rec = self.records.get(txid)
            if rec is None:  # its halves were removed by retention: remember the decision
                rec = TxRecord(txid, group)
                self.records[txid] = rec
            return rec

        def settle(rec: TxRecord, state: TxState) -> None:
            rec.state, rec.decided_ms, rec.decided_by = state, ts, by
            rec.decision_end_offset = offset
            self.pending.pop(rec.transaction_id, None)

        if kind == "commit":
            for t in op["t"]:
                settle(rec_for(t), TxState.COMMITTED)
            return list(op.get("h", []))
        if kind == "rollback":
            for t in op["t"]:
                settle(rec_for(t), TxState.ROLLED_BACK)
        elif kind == "discard":
            for t in op["t"]:
                rec = rec_for(t)
                if not rec.state.decided:
                    rec.state = TxState.DISCARDED
                    rec.remark = by
                    self.pending.pop(t, None)
        elif kind == "resume":
            for t in op["t"]:
                rec = rec_for(t)
                if not rec.state.decided:
                    self._resume(rec)
        elif kind == "batch":
            committed = list(op.get("c", []))
            for t in committed:
                settle(rec_for(t), TxState.COMMITTED)
            for t in op["t"]:
                settle(rec_for(t), TxState.ROLLED_BACK)
            self.batches[(group, op["bk"])] = {
                "committed": sorted(committed),
                "rolledBack": sorted(op["t"]),
            }
            return list(op.get("h", []))
        return []

    def _complete_interrupted_commit(self, last: tuple[int, list[int]]) -> int:
        """The last commit's messages were appended right after its op record; a crash can
        have cut that append short.  Write whatever is missing."""
        op_offset, half_offsets = last
        store = self.broker.store
        wanted: dict[int, HalfRef] = {}
        for off in half_offsets:
            txid = self._by_half_offset.get(off)
            rec = self.records.get(txid) if txid else None
            half = (
                next((h for h in rec.halves if h.commit_log_offset == off), None) if rec else None
            )
            if half is not None:
                wanted[off] = half
        found: set[int] = set()
        for q in {(h.real_topic, h.real_queue_id) for h in wanted.values()}:
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
        missing = [h for off, h in sorted(wanted.items()) if off not in found]
        if missing:
            self.broker.put_messages([self._real_message(h) for h in missing])
            log.warning(
                "transaction_commit_completed_after_crash",
                op_offset=op_offset,
                written=len(missing),
            )
        return len(missing)

    # -- metrics --------------------------------------------------------------------------------

    def update_gauges(self) -> None:
        now = self.now_ms()
        groups: dict[tuple[str, str], list[int]] = {}
        for rec in self.pending.values():
            for h in rec.halves[:1]:
                groups.setdefault((h.real_topic, rec.producer_group), []).append(
                    now - rec.oldest_store_timestamp
                )
        g = self.broker.metrics
        g.tx_pending.clear()
        g.tx_pending_oldest.clear()
        for (topic, group), ages in groups.items():
            g.tx_pending.labels(topic, group).set(len(ages))
            g.tx_pending_oldest.labels(topic, group).set(max(ages) / 1000.0)

    def summary(self) -> dict[str, int]:
        counts = {s.value: 0 for s in TxState}
        for rec in self.records.values():
            counts[rec.state.value] += 1
        return {
            "pending": counts["PENDING"],
            "discarded": counts["DISCARDED"],
            "committed": counts["COMMITTED"],
            "rolledBack": counts["ROLLED_BACK"],
            "checkRounds": self.rounds,
        }


__all__ = ["CheckSender", "RemotingCheckSender", "TransactionalMessageService"]
