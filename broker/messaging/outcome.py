"""What a send answers: where each message was stored (:class:`SendReceipt`), or for what the
direct paths stored, the append result itself (:class:`StoredBatch`), in one
:class:`SendOutcome` every front end translates."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from txmq.protocol.errors import FlushDiskTimeoutError


@dataclass(slots=True)
class SendReceipt:
    """Where one message was stored, as every front end reports it."""

    #: RocketMQ's offsetMsgId (store host + commit-log offset).
    offset_msg_id: str
    #: The producer's message id (UNIQ_KEY); RocketMQ 5's ``message_id``.
    uniq_key: str
    #: The queue the message is read from (a half's or delayed message's real queue).
    queue_id: int
    queue_offset: int
    #: The transaction id of a half, None for other messages.
    transaction_id: str | None
    #: The commit-log offset that must be durable before the send is acknowledged.
    end_offset: int
    #: Where the message's record starts in the commit log.
    commit_log_offset: int
    #: A timer message's recall handle (RocketMQ 5.3's), else "".
    recall_handle: str = ""


_first = itemgetter(0)


@dataclass(slots=True)
class StoredBatch:
    """A batch the fast paths stored, as its answer needs it: where each record went, no
    receipt object per message (those are made only when asked for)."""

    msg_id_prefix: str
    #: ``(commit-log offset, size, queue offset)`` of each record (the store's append result)
    placed: list[tuple[int, int, int]]
    uniq_keys: list[str]
    queue_id: int
    transaction_id: str | None
    end_offset: int

    def msg_ids(self) -> str:
        """The offsetMsgIds of the batch joined by commas (formatted in C)."""
        if len(self.placed) == 1:
            return f"{self.msg_id_prefix}{self.placed[0][0]:016X}"
        fmt = self.msg_id_prefix.replace("%", "%%") + "%016X"
        return ",".join(map(fmt.__mod__, map(_first, self.placed)))

    def receipts(self) -> list[SendReceipt]:
        prefix, qid, txid, end = (
            self.msg_id_prefix,
            self.queue_id,
            self.transaction_id,
            self.end_offset,
        )
        return [
            SendReceipt(f"{prefix}{phy:016X}", uniq, qid, qo, txid, end, phy)
            for (phy, _n, qo), uniq in zip(self.placed, self.uniq_keys, strict=True)
        ]


class SendOutcome:
    """The receipts of one send request, in request order.  ``flush_error``: the messages are
    stored but were not durable in time (the front end answers FLUSH_DISK_TIMEOUT or its
    equivalent with these receipts).

    A batch stored by the fast paths keeps its :class:`StoredBatch`: the remoting answer is
    made from it (:meth:`answer`) and :attr:`receipts` only when a caller asks."""

    __slots__ = ("_receipts", "batch", "flush_error")

    def __init__(
        self,
        receipts: list[SendReceipt] | None = None,
        flush_error: FlushDiskTimeoutError | None = None,
        *,
        batch: StoredBatch | None = None,
    ) -> None:
        self._receipts = receipts
        self.batch = batch
        self.flush_error = flush_error

    @property
    def receipts(self) -> list[SendReceipt]:
        if self._receipts is None:
            self._receipts = self.batch.receipts() if self.batch is not None else []
        return self._receipts

    @property
    def end_offset(self) -> int | None:
        """The commit-log offset that must be durable before the answer; None: nothing to
        wait for."""
        if self.batch is not None:
            return self.batch.end_offset
        receipts = self._receipts
        if not receipts:
            return None
        if len(receipts) == 1:
            return receipts[0].end_offset
        return max([r.end_offset for r in receipts])

    def answer(self) -> tuple[str, int, int, str | None]:
        """What a remoting answer says: the message ids (a batch's joined by commas), and the
        first message's queue id, queue offset and transaction id."""
        b = self.batch
        if b is not None:
            return b.msg_ids(), b.queue_id, b.placed[0][2], b.transaction_id
        receipts = self.receipts
        first = receipts[0]
        ids = (
            first.offset_msg_id
            if len(receipts) == 1
            else ",".join([r.offset_msg_id for r in receipts])
        )
        return ids, first.queue_id, first.queue_offset, first.transaction_id


__all__ = ["SendOutcome", "SendReceipt", "StoredBatch"]
