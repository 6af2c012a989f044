"""Transaction records and the op-record format.

One :class:`TxRecord` per transaction id: the state machine of txmq's transactions.

::

    PENDING --commit--> COMMITTED
    PENDING --rollback--> ROLLED_BACK
    PENDING --check budget used up--> DISCARDED --resume--> PENDING
    DISCARDED --commit/rollback (producer or operator)--> COMMITTED / ROLLED_BACK

The first decision wins; the same decision again is answered the same way and writes nothing;
a contradicting decision is refused.  Decisions live in the commit log as op records in
``RMQ_SYS_TRANS_OP_HALF_TOPIC``; the table is rebuilt from the half and op queues on start.

Op record (the body of a message in the op topic, tag ``d``), msgpack map:

======  ========================================================================
key     meaning
======  ========================================================================
``v``   format version (1)
``k``   kind: ``commit``, ``rollback``, ``discard``, ``resume``, ``batch``
``g``   producer group
``t``   transaction ids this record decides (list)
``h``   half-message commit-log offsets covered (list; commit/discard)
``bk``  batch key (kind ``batch``)
``c``   committed ids (kind ``batch``); ``t`` then lists the rolled-back ones
``pp``  pipeline position (kind ``batch``, optional): ``[pipeline, start, end]``, the input
        range the batch consumed, as the client's canonical text
``pl``  pipeline (kind ``batch``, optional): the pipeline whose batch this is
``o``   orphans (kind ``batch``, optional): pending transactions of the pipeline's other
        runs the decision rolls back too (see :func:`pipeline_run`)
``r``   remark: who decided and why (operator, check, producer, batch)
``ts``  broker time of the decision, ms
======  ========================================================================

For ``commit`` and ``batch`` the committed messages are appended right after the op record, in
the same append, so a crash can only leave the *last* commit incomplete; recovery finishes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgpack
import structlog

from txmq.protocol.errors import QueryNotFoundError
from txmq.protocol.message import MessageConst, MessageExt
from txmq.protocol.topics import RMQ_SYS_TRANS_HALF_TOPIC

log = structlog.get_logger(__name__)

OP_FORMAT_VERSION = 1
OP_TAG = "d"


class TxState(enum.Enum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"

    #: COMMITTED or ROLLED_BACK (an attribute of each member, read on every decision)
    decided: bool


for _state in TxState:
    _state.decided = _state in (TxState.COMMITTED, TxState.ROLLED_BACK)
del _state


class Decision(enum.IntEnum):
    """``commitOrRollback`` values (RocketMQ's sysFlag transaction bits)."""

    UNKNOWN = 0x0
    COMMIT = 0x8
    ROLLBACK = 0xC


@dataclass(slots=True)
class HalfRef:
    """One half message of a transaction."""

    commit_log_offset: int
    queue_offset: int
    real_topic: str
    real_queue_id: int
    store_timestamp: int
    uniq_key: str
    offset_msg_id: str
    immunity_ms: int | None = None


class HalfMismatchError(QueryNotFoundError):
    """The record at a half's commit-log offset is another message: the log was cut back below
    the half and written again while the table still names the offset.  Treated as a half that
    is no longer stored (nothing is committed from it, no check is sent for it)."""


def half_mismatch(stored: MessageExt, half: HalfRef, txid: str | None) -> str | None:
    """Why ``stored``, the record read at ``half``'s commit-log offset, is not that half (of
    transaction ``txid`` when given); None when it is.  A half is identified by its topic, its
    UNIQ_KEY and its transaction id (``__transactionId__``, else the UNIQ_KEY)."""
    props = stored.properties
    uniq = props.get(MessageConst.UNIQ_KEY, "")
    if stored.topic != RMQ_SYS_TRANS_HALF_TOPIC:
        return f"a message of topic {stored.topic} (UNIQ_KEY {uniq!r}), not a half"
    if uniq != half.uniq_key:
        return f"the half with UNIQ_KEY {uniq!r}, not {half.uniq_key!r}"
    found = props.get(MessageConst.TRANSACTION_ID) or uniq
    if txid is not None and found != txid:
        return f"a half of transaction {found!r}"
    return None


def log_half_mismatch(txid: str | None, half: HalfRef, found: str, action: str) -> None:
    """The ERROR line of a half whose offset holds another record."""
    log.error(
        "half_message_mismatch",
        transaction_id=txid,
        offset=half.commit_log_offset,
        uniq_key=half.uniq_key,
        found=found,
        action=action,
    )


@dataclass(slots=True)
class TxRecord:
    transaction_id: str
    producer_group: str
    state: TxState = TxState.PENDING
    halves: list[HalfRef] = field(default_factory=list)
    batch_key: str | None = None
    check_times: int = 0
    last_check_ms: int = 0
    check_in_flight: bool = False
    decided_ms: int = 0
    decided_by: str = ""
    #: commit-log offset where the decision's append ends (its op record and, for a commit,
    #: the committed messages right after it), the same live and after a restart: a repeated
    #: decision waits for it to be durable before answering, exactly like the first one did.
    decision_end_offset: int = 0
    remark: str = ""
    #: Decided by an outside coordinator (two-phase commit: its halves carry ``TXMQ_2PC``):
    #: never parked for its check budget, and its decision is remembered as long as a batch's.
    two_phase: bool = False
    #: A decided record's snapshot row as :mod:`.snapshot` packed it last (with the number of
    #: halves it covers): decided records never change again, so later snapshots reuse it.
    snapshot_row: tuple[int, bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def newest_store_timestamp(self) -> int:
        return max((h.store_timestamp for h in self.halves), default=0)

    @property
    def oldest_store_timestamp(self) -> int:
        return min((h.store_timestamp for h in self.halves), default=0)

    def to_json(self, now_ms: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "transactionId": self.transaction_id,
            "producerGroup": self.producer_group,
            "state": self.state.value,
            "checkTimes": self.check_times,
            "lastCheckTimestamp": self.last_check_ms,
            "batchKey": self.batch_key,
            "decidedTimestamp": self.decided_ms,
            "decidedBy": self.decided_by,
            "remark": self.remark,
            "halves": [
                {
                    "commitLogOffset": h.commit_log_offset,
                    "queueOffset": h.queue_offset,
                    "topic": h.real_topic,
                    "queueId": h.real_queue_id,
                    "storeTimestamp": h.store_timestamp,
                    "msgId": h.uniq_key,
                    "offsetMsgId": h.offset_msg_id,
                }
                for h in self.halves
            ],
        }
        if self.two_phase:
            d["twoPhase"] = True
        if now_ms is not None and self.halves:
            d["ageMs"] = now_ms - self.oldest_store_timestamp
        return d


class OpKind(enum.Enum):
    """What an op record does."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    DISCARD = "discard"
    RESUME = "resume"
    BATCH = "batch"


class OpRecordError(ValueError):
    """A body in the op topic that is not a readable op record."""


def _position(value: Any) -> tuple[str, str, str] | None:
    if value is None:
        return None
    pipeline, start, end = value
    return (str(pipeline), str(start), str(end))


@dataclass(frozen=True)
class OpRecord:
    """One decision, as stored in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (the table at the top of this
    module).  Both the live path and recovery hand these to
    :meth:`~.machine.TransactionStateMachine.apply`."""

    kind: OpKind
    group: str
    #: the transactions decided (for BATCH: the rolled-back ones)
    txids: tuple[str, ...]
    #: commit-log offsets of the halves whose real messages follow the record
    halves: tuple[int, ...] = ()
    #: who decided and why, e.g. ``"producer"``, ``"operator: ticket 42"``
    remark: str = ""
    #: broker time of the decision, ms
    ts: int = 0
    batch_key: str | None = None
    #: BATCH: the committed transactions
    committed: tuple[str, ...] = ()
    #: BATCH: ``(pipeline, start, end)``, the input range a pipeline's batch consumed
    position: tuple[str, str, str] | None = None
    #: BATCH: the pipeline whose batch this is (also in a cluster, where ``position`` is not)
    pipeline: str | None = None
    #: BATCH: pending transactions of the pipeline's other runs, rolled back as orphans
    orphans: tuple[str, ...] = ()

    @property
    def by(self) -> str:
        """The decider: the remark up to its first colon."""
        return self.remark.split(":", 1)[0].strip()

    def encode(self) -> bytes:
        """The record's body: a msgpack map with the keys in the table above, in that order."""
        doc: dict[str, Any] = {
            "v": OP_FORMAT_VERSION,
            "k": self.kind.value,
            "g": self.group,
            "t": list(self.txids),
            "h": list(self.halves),
            "r": self.remark,
            "ts": self.ts,
        }
        if self.batch_key is not None:
            doc["bk"] = self.batch_key
        if self.kind is OpKind.BATCH:
            doc["c"] = list(self.committed)
            if self.position is not None:
                doc["pp"] = list(self.position)
            if self.pipeline is not None:
                doc["pl"] = self.pipeline
            if self.orphans:
                doc["o"] = list(self.orphans)
        packed: bytes = msgpack.packb(doc, use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, body: bytes) -> OpRecord:
        """Raises :class:`OpRecordError` for anything that is not a version-1 op record."""
        try:
            doc = msgpack.unpackb(body, raw=False)
        except Exception as exc:  # msgpack raises a zoo of types on garbage
            raise OpRecordError(f"not msgpack: {exc}") from None
        if not isinstance(doc, dict) or doc.get("v") != OP_FORMAT_VERSION:
            raise OpRecordError("not a txmq op record (version 1)")
        try:
            kind = OpKind(doc["k"])
            bk = doc.get("bk")
            pl = doc.get("pl")
            return cls(
                kind=kind,
                group=str(doc.get("g", "")),
                txids=tuple(str(t) for t in doc.get("t", [])),
                halves=tuple(int(h) for h in doc.get("h", [])),
                remark=str(doc.get("r", "")),
                ts=int(doc.get("ts", 0)),
                batch_key=None if bk is None else str(bk),
                committed=tuple(str(t) for t in doc.get("c", [])) if kind is OpKind.BATCH else (),
                position=_position(doc.get("pp")) if kind is OpKind.BATCH else None,
                pipeline=None if pl is None or kind is not OpKind.BATCH else str(pl),
                orphans=tuple(str(t) for t in doc.get("o", [])) if kind is OpKind.BATCH else (),
            )
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise OpRecordError(f"malformed op record: {exc!r}") from None


def pipeline_run(pipeline: str, batch_key: str | None) -> str | None:
    """The run of ``pipeline`` that wrote under ``batch_key`` (``<pipeline>-<run>-<batchId>``,
    the run a token without ``-``, the batch id decimal digits), or None when the key is not
    one of that pipeline's."""
    if batch_key is None or not batch_key.startswith(pipeline + "-"):
        return None
    run, sep, batch_id = batch_key[len(pipeline) + 1 :].partition("-")
    if not sep or not run or not batch_id.isdigit():
        return None
    return run


def orphan_remark(pipeline: str, old_batch_key: str | None, run: str | None) -> str:
    """The remark of a transaction rolled back as an orphan of a superseded pipeline run."""
    old = pipeline_run(pipeline, old_batch_key)
    return (
        f"pipeline: orphan of pipeline {pipeline!r} run {old}, superseded by run {run}"
        if old is not None
        else f"pipeline: orphan of pipeline {pipeline!r}, superseded by run {run}"
    )
