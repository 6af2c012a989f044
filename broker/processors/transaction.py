"""Transaction request codes: END_TRANSACTION, TXMQ_DECIDE_BATCH and the operator commands.

Each handler parses its header, asks the transaction service for the transition (which the
state machine checks), and answers once the decision is durable under the flush mode in force.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from typing import Any

import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import BrokerSystemError, InvalidParameterError, TransactionFailedError
from txmq.protocol.headers import (
    DecideBatchRequestHeader,
    EndTransactionRequestHeader,
    ForceDecideRequestHeader,
    GetTransactionRequestHeader,
    ListTransactionsRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
)

from ..messaging.core import MessagingCore
from ..ports import ClusterPort
from ..transaction.state import Decision, TxRecord, TxState

log = structlog.get_logger(__name__)


_DECISIONS = {int(d): d for d in Decision}


def _decision(value: int, allowed: str) -> Decision:
    d = _DECISIONS.get(value) if value.__class__ is int else None
    if d is None:
        try:
            return Decision(value)
        except ValueError:
            raise InvalidParameterError(
                f"commitOrRollback must be {allowed}, got {value}"
            ) from None
    return d


_END_FIELDS = (
    "producerGroup",
    "tranStateTableOffset",
    "commitLogOffset",
    "commitOrRollback",
    "fromTransactionCheck",
    "msgId",
    "transactionId",
)


def end_transaction_header(ext: dict[str, Any]) -> EndTransactionRequestHeader:
    """``EndTransactionRequestHeader.from_ext_fields(ext)``: taken as it is when every field
    already has its type (what the SDK's msgpack requests carry), else read by the typed header
    (strings of stock clients, anything missing or wrong, with its error);
    ``tests/broker/test_end_transaction_header.py`` compares the two."""
    if len(ext) == 7:
        group, qoff, off, decision, check, msg_id, txid = map(ext.get, _END_FIELDS)
        if (
            type(group) is str
            and type(qoff) is int
            and type(off) is int
            and type(decision) is int
            and type(check) is bool
            and type(msg_id) is str
            and type(txid) is str
        ):
            return EndTransactionRequestHeader(group, qoff, off, decision, check, msg_id, txid)
    return EndTransactionRequestHeader.from_ext_fields(ext)


@dataclass
class _BatchBody:
    """A decide-batch request's body, read and checked."""

    doc: dict[str, Any]
    commit: list[str]
    #: A transaction across groups committing consumer offsets asks their group with this
    #: flag: a commit without its offsets half here is refused.
    with_offsets: bool
    #: A pipeline's batch names the input range it consumed (start and end as the client's
    #: canonical text); a query may ask where a pipeline is.
    pipeline: Any
    #: ``(pipeline, start, end)`` of a pipeline's decision that names its range, else None.
    position: tuple[str, str, str] | None


def _batch_body(raw: bytes, query_only: bool) -> _BatchBody:
    """The body of a decide-batch request; InvalidParameterError when it is not one."""
    try:
        doc = json.loads(raw.decode("utf-8")) if raw else {}
        commit = [str(x) for x in doc.get("commit", [])]
        with_offsets = bool(doc.get("offsets"))
        pipeline = doc.get("pipeline")
        # A pipeline's decision without a range (a batch it runs again, or one that
        # read nothing) names the pipeline only: its other runs' orphans are rolled back.
        position = (
            (str(pipeline), str(doc["start"]), str(doc["end"]))
            if pipeline is not None and not query_only and ("start" in doc or "end" in doc)
            else None
        )
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError) as exc:
        raise InvalidParameterError(
            f"decide-batch body must be JSON {{'commit': [...]}}: {exc}"
        ) from None
    except KeyError as exc:
        raise InvalidParameterError(f"decide-batch of a pipeline needs {exc}") from None
    return _BatchBody(doc, commit, with_offsets, pipeline, position)


@dataclass
class _ClusterPart:
    """A batch's decision as the cluster recorded it, for this broker group."""

    #: The transactions of this group the batch commits.
    commit: list[str]
    #: The pipeline position the decision recorded.
    recorded: tuple[str, str, str] | None = None
    #: What the batch's decision commits in every group.
    whole: list[str] | None = None
    #: Why this call fenced the batch's consumer offsets (its rollback was recorded).
    fenced: str | None = None


#: About the most JSON one page of a transaction listing carries (a page ends after the
#: transaction that passes it; frames may carry 16 MiB).
LIST_PAGE_BYTES = 4 * 1024 * 1024


class TransactionProcessor:
    def __init__(self, core: MessagingCore, cluster: ClusterPort | None = None) -> None:
        self.core = core
        self.tx = core.tx
        self.flush = core.ctx.flush
        self.cluster = cluster

    async def end_transaction(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = end_transaction_header(cmd.ext_fields)
        decision = _decision(h.commit_or_rollback, "0, 8 or 12")
        rec = self.tx.find(h.transaction_id, h.commit_log_offset)
        half = None
        for x in rec.halves:
            if x.commit_log_offset == h.commit_log_offset:
                half = x
                break
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
        text = await self.core.end_transaction(
            rec, decision, from_check=bool(h.from_transaction_check), remark=cmd.remark or ""
        )
        return cmd.response(remark=text)

    async def decide_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = DecideBatchRequestHeader.from_ext_fields(cmd.ext_fields)
        body = _batch_body(cmd.body, h.query_only)
        if h.query_only:
            return await self._query_batch(cmd, h, body)
        return await self._decide_batch(cmd, h, body)

    async def _query_batch(
        self, cmd: RemotingCommand, h: DecideBatchRequestHeader, body: _BatchBody
    ) -> RemotingCommand:
        """A decide-batch query: whether (and how) the batch was decided and, for a pipeline,
        where it is; a run announcing itself rolls back its pipeline's orphans first."""
        doc, pipeline = body.doc, body.pipeline
        key = (h.producer_group, h.batch_key)
        machine = self.tx.machine
        run = doc.get("run")
        orphans_end = None
        if pipeline is not None and run is not None:
            # A run of the pipeline announces itself as it starts: the pending halves of
            # the pipeline's other runs are orphans (their batches are all run again).
            orphans_end = self.tx.roll_back_orphans(h.producer_group, str(pipeline), str(run))
        decided = self.tx.batches.get(key)
        answer: dict[str, Any] = {
            "batchKey": h.batch_key,
            "decided": decided is not None,
            "committed": decided["committed"] if decided else [],
            "rolledBack": decided["rolledBack"] if decided else [],
            "pending": machine.pending_in_batch(*key),
            "position": _position(machine.batch_positions.get(key)),
        }
        if pipeline is not None and self.cluster is not None:
            # A cluster keeps pipelines' positions in etcd: any group's leader answers.
            where = await self.cluster.decisions.pipeline_where(
                h.producer_group, str(pipeline), doc.get("start"), h.batch_key
            )
            answer["position"] = _position(where.pop("position"))
            answer["pipeline"] = where
        elif pipeline is not None:
            head = machine.pipelines.get((h.producer_group, str(pipeline)))
            start = doc.get("start")
            answer["pipeline"] = {
                "end": head[0] if head else None,
                "batchKey": head[1] if head else None,
                "next": None
                if start is None
                else machine.pipeline_ranges.get((h.producer_group, str(pipeline), start)),
            }
        if orphans_end is not None:
            await self.flush.wait_durable(orphans_end)
        return cmd.response(body=json.dumps(answer).encode())

    async def _decide_batch(
        self, cmd: RemotingCommand, h: DecideBatchRequestHeader, body: _BatchBody
    ) -> RemotingCommand:
        """A batch's decision: recorded in the cluster first when there is one, applied here,
        and answered once it is durable."""
        pipeline = body.pipeline
        commit, position = body.commit, body.position
        key = (h.producer_group, h.batch_key)
        machine = self.tx.machine
        cluster = self.cluster
        if cluster is None:
            part = _ClusterPart(commit)
        else:
            part = await self._cluster_decision(cluster, h, body)
            commit, position = part.commit, None
        end = self.tx.decide_batch(
            h.producer_group,
            h.batch_key,
            commit,
            position,
            None if pipeline is None else str(pipeline),
        )
        decided = self.tx.batches[key]
        durable = end
        if durable is None:
            # A repeat is answered once the first decision is durable, as the first was (its
            # transactions' records say where it ended while they are remembered; older ones
            # are long on disk).
            records = self.tx.records
            durable = max(
                (
                    records[t].decision_end_offset
                    for t in (*decided["committed"], *decided["rolledBack"])
                    if t in records
                ),
                default=None,
            )
        if durable is not None:
            await self.flush.wait_durable(durable)
        whole, fenced = part.whole, part.fenced
        response = json.dumps(
            {
                "batchKey": h.batch_key,
                "decided": True,
                "committed": decided["committed"],
                "rolledBack": decided["rolledBack"],
                "first": end is not None,
                "position": _position(
                    part.recorded if cluster is not None else machine.batch_positions.get(key)
                ),
                # A cluster's batch may span groups: "committed" is this group's part.
                **({} if whole is None else {"batchCommitted": whole}),
                **({} if fenced is None else {"fenced": fenced}),
            }
        ).encode()
        return cmd.response(body=response)

    async def _cluster_decision(
        self, cluster: ClusterPort, h: DecideBatchRequestHeader, body: _BatchBody
    ) -> _ClusterPart:
        """A batch's decision as the cluster records it, and this group's part of it."""
        commit, position = body.commit, body.position
        part = _ClusterPart(commit)
        if (h.producer_group, h.batch_key) not in self.tx.batches:
            # The batch may span broker groups: its decision is one create-if-absent record in
            # etcd (the first decision wins everywhere); this group applies its part of it.
            # A pipeline's position moves in the same etcd transaction (a compare-and-swap
            # from the batch's start), which is where the cluster keeps it.
            moves = self._offsets_moves(h.producer_group, commit)
            if moves is None and body.with_offsets and commit:
                # e.g. the half was acknowledged by a leader that died before a follower had
                # it: committing the outputs without the offsets would process the input twice
                decided_commit = await cluster.decisions.batch_decision(
                    h.producer_group, h.batch_key, []
                )
                part.fenced = (
                    None
                    if decided_commit  # a commit recorded before stands in every group
                    else f"the consumer offsets of batch {h.batch_key!r} are not in this broker "
                    "group (lost with a leader, or sent elsewhere)"
                )
            elif moves is not None:
                # Consumer offsets of this group move with the batch: fenced in etcd (a
                # compare-and-swap per queue, in the decision's transaction).
                reason, queues = moves
                if reason is None:
                    decided_commit, part.fenced = await cluster.decisions.offsets_decision(
                        h.producer_group, h.batch_key, commit, queues
                    )
                else:
                    decided_commit = await cluster.decisions.batch_decision(
                        h.producer_group, h.batch_key, []
                    )
                    part.fenced = reason
            elif position is not None:
                decided_commit, part.recorded = await cluster.decisions.pipeline_decision(
                    h.producer_group, h.batch_key, commit, position
                )
            else:
                decided_commit = await cluster.decisions.batch_decision(
                    h.producer_group, h.batch_key, commit
                )
            part.whole = decided_commit
            part.commit = self.tx.local_batch_part(h.producer_group, decided_commit)
        else:
            before = await cluster.decisions.recorded_batch(h.producer_group, h.batch_key)
            if before is not None:
                part.whole, part.recorded = before
        return part

    def _offsets_moves(
        self, producer_group: str, commit: list[str]
    ) -> tuple[str | None, list[tuple[str, str, str, int, int, int]]] | None:
        """For a batch committing transactions that hold consumer offsets here: the offsets
        they move (and why not, when an offsets half is unreadable); None when the batch moves
        no offsets here."""
        ledger = self.tx.txn_offsets
        records = self.tx.records
        queues: list[tuple[str, str, str, int, int, int]] = []
        found = False
        for txid in commit:
            rec = records.get(txid)
            if rec is None or rec.producer_group != producer_group or rec.state.decided:
                continue
            if not ledger.has_offsets(rec):
                continue
            found = True
            reason, moved = ledger.moves(rec)
            if reason is not None:
                return reason, []
            queues += moved
        return (None, queues) if found else None

    async def resume_check_half_message(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = ResumeCheckHalfMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        rec = self.tx.find_by_any_id(h.msg_id)
        end = self.tx.resume(rec)
        await self.flush.wait_durable(end)
        return cmd.response(remark=f"transaction {rec.transaction_id} is under checking again")

    async def list_transactions(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ListTransactionsRequestHeader.from_ext_fields(cmd.ext_fields)
        now = self.tx.now_ms()
        states = (
            {s.strip().upper() for s in h.state.split(",")}
            if h.state
            else {TxState.PENDING.value, TxState.DISCARDED.value}
        )
        if h.limit < 1:
            raise InvalidParameterError(f"limit must be at least 1, got {h.limit}")
        after = _cursor_key(h.after) if h.after else None
        found: list[tuple[tuple[int, str], TxRecord]] = []
        for rec in self.tx.records.values():
            if rec.state.value not in states:
                continue
            if h.producer_group and rec.producer_group != h.producer_group:
                continue
            if h.two_phase and not rec.two_phase:
                continue
            if h.topic and not any(x.real_topic == h.topic for x in rec.halves):
                continue
            key = _list_key(rec)
            if after is None or key > after:
                found.append((key, rec))
        # A page: the first ``limit`` in commit-log order after the cursor, and the cursor of
        # the next page when more remain (stable while transactions come and go).
        # A page is also cut at about LIST_PAGE_BYTES of JSON (always one transaction at least).
        page = heapq.nsmallest(h.limit + 1, found, key=lambda kr: kr[0])
        parts: list[str] = []
        size = 0
        for _key, rec in page[: h.limit]:
            if parts and size > LIST_PAGE_BYTES:
                break
            parts.append(json.dumps(rec.to_json(now)))
            size += len(parts[-1]) + 1
        resp = cmd.response(body=("[" + ",".join(parts) + "]").encode())
        if len(page) > len(parts):
            offset, txid = page[len(parts) - 1][0]
            resp.ext_fields["nextCursor"] = f"{offset}/{txid}"
        return resp

    async def get_transaction(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetTransactionRequestHeader.from_ext_fields(cmd.ext_fields)
        rec = self.tx.find_by_any_id(h.transaction_id)
        return cmd.response(body=json.dumps(rec.to_json(self.tx.now_ms())).encode())

    async def force_decide(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ForceDecideRequestHeader.from_ext_fields(cmd.ext_fields)
        decision = _decision(h.commit_or_rollback, "8 (commit) or 12 (rollback)")
        if decision == Decision.UNKNOWN:
            raise InvalidParameterError("an operator decision must be commit (8) or rollback (12)")
        rec = self.tx.find_by_any_id(h.transaction_id)
        if (
            self.cluster is not None
            and rec.batch_key == rec.transaction_id
            and not rec.state.decided
        ):
            # An SDK transaction across broker groups: the operator's decision is recorded as
            # the transaction's decision in etcd first, so every group applies the same one
            # (a decision recorded before, by the producer or a check-back, wins).
            commit = decision == Decision.COMMIT
            recorded = await self.cluster.decisions.batch_decision(
                rec.producer_group, rec.batch_key, [rec.transaction_id] if commit else []
            )
            if (rec.transaction_id in recorded) != commit:
                raise TransactionFailedError(
                    f"transaction {rec.transaction_id} spans broker groups and was decided "
                    f"before as {'commit' if not commit else 'rollback'} in all of them"
                )
        text = await self.core.decide(rec, decision, "operator", cmd.remark or "")
        return cmd.response(remark=text)


def _list_key(rec: TxRecord) -> tuple[int, str]:
    """Where a transaction stands in a listing: its first half's commit-log offset."""
    return (min((x.commit_log_offset for x in rec.halves), default=-1), rec.transaction_id)


def _cursor_key(cursor: str) -> tuple[int, str]:
    offset, sep, txid = cursor.partition("/")
    try:
        if not sep:
            raise ValueError(cursor)
        return (int(offset), txid)
    except ValueError:
        raise InvalidParameterError(
            f"cursor {cursor!r} is not one a listing answered (<offset>/<transaction id>)"
        ) from None


def _position(position: tuple[str, str, str] | None) -> dict[str, str] | None:
    """A batch decision's pipeline position as the answers show it."""
    if position is None:
        return None
    return {"pipeline": position[0], "start": position[1], "end": position[2]}
