"""Two-phase commit with an outside coordinator (Kafka's KIP-939 for txmq).

A database or a workflow engine decides the transaction; txmq holds its messages until then:

1. ``async with producer.transaction(two_phase=True) as txn``: the halves carry ``TXMQ_2PC=1``.
2. ``handle = await txn.prepare()``: the halves are stored durably; the handle names them.
   ``str(handle)`` is its text, to keep with the business data in the coordinator's own
   transaction (e.g. a database row written in the same local transaction).
3. ``await producer.commit(handle)`` / ``await producer.rollback(handle)``: from any process
   of the producer group, also after the preparing one died and the broker restarted;
   idempotent (the same decision again succeeds, the other one raises).
4. ``await producer.recover()``: the handles still prepared (pending), for the coordinator's
   recovery.
5. A check-back of a two-phase transaction goes to the producer's *prepared resolver*
   (:meth:`AsyncTransactionProducer.set_prepared_resolver`), which answers from the
   coordinator's state; the broker never parks or rolls one back for its check budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import quote, unquote

from txmq.protocol.errors import TxmqError

if TYPE_CHECKING:
    from ._txn_common import LocalTransactionState

#: The text form's prefix (format version 1).
HANDLE_PREFIX = "txmq-2pc:1:"


class PreparedTransactionUnknownError(TxmqError, LookupError):
    """The broker does not know the prepared transaction a handle names: it was decided longer
    ago than ``transactionBatchRetention`` (its decision is final either way), or the handle
    belongs to another broker or store."""


@dataclass(frozen=True)
class PreparedTransaction:
    """A durable handle of a prepared two-phase transaction: what END_TRANSACTION needs to name
    one of its halves (any half decides the whole transaction).

    ``str(handle)`` is its text (``txmq-2pc:1:<group>/<broker>/<id>/<offset>/<queue
    offset>/<msg id>``, each part percent-encoded); :meth:`parse` reads it back.
    """

    transaction_id: str
    producer_group: str
    #: The broker group holding the halves (in a cluster); empty with a single broker.
    broker: str
    commit_log_offset: int
    queue_offset: int
    msg_id: str

    def __str__(self) -> str:
        parts = (
            self.producer_group,
            self.broker,
            self.transaction_id,
            str(self.commit_log_offset),
            str(self.queue_offset),
            self.msg_id,
        )
        return HANDLE_PREFIX + "/".join(quote(p, safe="") for p in parts)

    @classmethod
    def parse(cls, text: str | PreparedTransaction) -> PreparedTransaction:
        """A handle from its text (a handle is returned as it is).

        Raises:
            ValueError: ``text`` is not a handle's text.
        """
        if isinstance(text, PreparedTransaction):
            return text
        if not isinstance(text, str) or not text.startswith(HANDLE_PREFIX):
            raise ValueError(f"not a txmq prepared-transaction handle: {text!r}")
        parts = text[len(HANDLE_PREFIX) :].split("/")
        if len(parts) != 6:
            raise ValueError(f"a prepared-transaction handle has 6 parts, not {len(parts)}")
        group, broker, txid, offset, queue_offset, msg_id = (unquote(p) for p in parts)
        if not group or not txid:
            raise ValueError(f"prepared-transaction handle without group or id: {text!r}")
        try:
            return cls(txid, group, broker, int(offset), int(queue_offset), msg_id)
        except ValueError:
            raise ValueError(f"prepared-transaction handle with bad offsets: {text!r}") from None

    @classmethod
    def from_listing(cls, row: dict[str, Any], broker: str) -> PreparedTransaction:
        """The handle of a transaction as the broker lists it (its first half)."""
        half = row["halves"][0]
        return cls(
            str(row["transactionId"]),
            str(row["producerGroup"]),
            broker,
            int(half["commitLogOffset"]),
            int(half["queueOffset"]),
            str(half["msgId"]),
        )


#: What a producer asks on a check-back of a two-phase transaction: the coordinator's decision
#: for ``handle`` (COMMIT_MESSAGE, ROLLBACK_MESSAGE, or UNKNOW when it has none yet); a plain
#: function (run in a thread pool) or a coroutine function.
#: (``Union`` of forward references rather than one quoted expression: the names then resolve
#: wherever the alias is used, e.g. by the API reference's annotation rendering.)
PreparedResolver = Callable[
    [PreparedTransaction],
    Union["LocalTransactionState", Awaitable["LocalTransactionState"]],  # noqa: UP007
]

__all__ = [
    "HANDLE_PREFIX",
    "PreparedResolver",
    "PreparedTransaction",
    "PreparedTransactionUnknownError",
]
