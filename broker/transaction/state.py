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

OP_FORMAT_VERSION = 1
OP_TAG = "d"


class TxState(enum.Enum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"

    @property
    def decided(self) -> bool:
        return self in (TxState.COMMITTED, TxState.ROLLED_BACK)


class Decision(enum.IntEnum):
    """``commitOrRollback`` values (RocketMQ's sysFlag transaction bits)."""

    UNKNOWN = 0x0
    COMMIT = 0x8
    ROLLBACK = 0xC


@dataclass
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


@dataclass
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
    #: commit-log end offset of the decision's op record: a repeated decision waits for it to
    #: be durable before answering, exactly like the first one did.
    decision_end_offset: int = 0
    remark: str = ""

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
        if now_ms is not None and self.halves:
            d["ageMs"] = now_ms - self.oldest_store_timestamp
        return d


def encode_op(
    kind: str,
    group: str,
    txids: list[str],
    halves: list[int],
    remark: str,
    ts: int,
    batch_key: str | None = None,
    committed: list[str] | None = None,
) -> bytes:
    doc: dict[str, Any] = {
        "v": OP_FORMAT_VERSION,
        "k": kind,
        "g": group,
        "t": txids,
        "h": halves,
        "r": remark,
        "ts": ts,
    }
    if batch_key is not None:
        doc["bk"] = batch_key
    if committed is not None:
        doc["c"] = committed
    packed: bytes = msgpack.packb(doc, use_bin_type=True)
    return packed


def decode_op(body: bytes) -> dict[str, Any]:
    doc = msgpack.unpackb(body, raw=False)
    if not isinstance(doc, dict) or doc.get("v") != OP_FORMAT_VERSION:
        raise ValueError("not a txmq op record")
    return doc
