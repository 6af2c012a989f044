"""Consumer offsets committed inside a transaction (consume-transform-produce, exactly once).

A transaction may hold one half whose real topic is ``TXMQ_SYS_TXN_OFFSETS``
(:mod:`txmq.protocol.txn_offsets`): a consumer group, the generation its consumer rebalanced
under, the consumer's client id and offsets.  Here:

* :meth:`TxnOffsetsLedger.fenced_reason` tells, before a commit is appended, whether the
  consumer is still the owner it was (the group's generation unchanged, the client a live
  member) and the group's committed offset of each queue is still the one the consumer started
  from; the service rolls the transaction back instead when it is not.  The check and the
  append are one synchronous step on the broker's loop, so nothing falls between them.
* :meth:`TxnOffsetsLedger.committed` is told of a commit just appended: its offsets count at
  once for the next check (:meth:`expected`), and are applied to the offset table once the
  commit is durable (flushed, replicated), so the table never holds an offset whose outputs a
  crash or a failover could lose.
* :meth:`TxnOffsetsLedger.catch_up` applies committed offsets records (the committed copies in
  queue 0 of the offsets topic) that the offset table has not applied yet, and records how far
  it got in the same table, atomically with the offsets.  It runs once a commit is durable and
  at start: the offset table is written to disk periodically, so after a crash the records
  committed since its last write are applied again from the commit log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

import structlog

from txmq.protocol.errors import ProtocolError, QueryNotFoundError, TxmqError
from txmq.protocol.message import MessageSysFlag
from txmq.protocol.txn_offsets import TXN_OFFSETS_TOPIC, TxnOffsets

from ..clients import ClientManager
from ..store import ConsumerOffsetManager, MessageStore
from ..store.reading import read_queue
from .state import TxRecord

log = structlog.get_logger(__name__)

#: Seconds between attempts to see a commit durable after a wait for it failed.
DURABLE_RETRY_S = 1.0


@dataclass(eq=False)
class TxnOffsetsLedger:
    topic: ClassVar[str] = TXN_OFFSETS_TOPIC

    store: MessageStore
    offsets: ConsumerOffsetManager
    clients: ClientManager
    wait_durable: Callable[[int], Awaitable[None]]
    #: Committed offsets records applied since start (live and replayed).
    applied: int = field(default=0, init=False)
    #: (group, topic, queue id) -> offset of commits appended but not yet durable.
    _pending: dict[tuple[str, str, int], int] = field(default_factory=dict, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def has_offsets(self, rec: TxRecord) -> bool:
        topic = self.topic
        for h in rec.halves:
            if h.real_topic == topic:
                return True
        return False

    def _docs(self, rec: TxRecord) -> list[TxnOffsets]:
        """Raises:
        ProtocolError, QueryNotFoundError, KeyError: an offsets half is unreadable."""
        return [
            TxnOffsets.decode(self.store.lookup_message(h.commit_log_offset).body)
            for h in rec.halves
            if h.real_topic == self.topic
        ]

    def expected(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset, counting commits not durable yet."""
        pending = self._pending.get((group, topic, queue_id))
        return pending if pending is not None else self.offsets.query(group, topic, queue_id)

    def fenced_reason(self, rec: TxRecord) -> str | None:
        """None when every offsets half of ``rec`` may be committed; else why not."""
        try:
            docs = self._docs(rec)
        except (ProtocolError, QueryNotFoundError, KeyError) as exc:
            return f"the offsets half of transaction {rec.transaction_id} is unreadable ({exc})"
        for doc in docs:
            reason = self.clients.fenced_reason(doc.group, doc.generation, doc.client_id)
            if reason is not None:
                return reason
            for q in doc.offsets:
                if q.expect < 0:
                    continue
                now = self.expected(doc.group, q.topic, q.queue_id)
                if now != q.expect:
                    return (
                        f"the committed offset of {q.topic}:{q.queue_id} is {now}, not "
                        f"{q.expect} (another attempt committed it)"
                    )
        return None

    def moves(self, rec: TxRecord) -> tuple[str | None, list[tuple[str, str, str, int, int, int]]]:
        """For a transaction across broker groups, decided through etcd: each offset it moves
        ``(consumer group, broker group, topic, queue id, expected, next)``, which the decision record fences
        by a compare-and-swap per queue (None, else why its offsets half is unreadable).

        The group's membership generation is not compared: it is this broker's own count (a
        consumer connected through another replica, or one that rebalanced before a
        failover, holds another broker's number), and the compare-and-swap already lets one
        attempt at most commit each input."""
        try:
            docs = self._docs(rec)
        except (ProtocolError, QueryNotFoundError, KeyError) as exc:
            return f"the offsets half of transaction {rec.transaction_id} is unreadable ({exc})", []
        return None, [
            (doc.group, q.broker_name, q.topic, q.queue_id, q.expect, q.offset)
            for doc in docs
            for q in doc.offsets
        ]

    def committed(self, rec: TxRecord, end: int) -> None:
        """``rec`` was just committed by an append ending at ``end``: its offsets count for the
        next checks now and go to the offset table once the append is durable."""
        try:
            docs = self._docs(rec)
        except (ProtocolError, QueryNotFoundError, KeyError):
            docs = []  # applied from its committed copy all the same
        for doc in docs:
            for q in doc.offsets:
                self._pending[(doc.group, q.topic, q.queue_id)] = q.offset
        task = asyncio.get_running_loop().create_task(self._apply_when_durable(docs, end))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply_when_durable(self, docs: list[TxnOffsets], end: int) -> None:
        while True:
            try:
                await self.wait_durable(end)
                break
            except TxmqError as exc:
                log.warning("txn_offsets_not_durable_yet", end_offset=end, error=str(exc))
                await asyncio.sleep(DURABLE_RETRY_S)
        self.catch_up(end)
        for doc in docs:
            for q in doc.offsets:
                key = (doc.group, q.topic, q.queue_id)
                if self._pending.get(key) == q.offset:
                    del self._pending[key]

    async def stop(self) -> None:
        """Stop waiting for durability (a restart applies what the commit log kept)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def catch_up(self, limit: int | None = None) -> int:
        """Apply the committed offsets records not applied yet (those stored before commit-log
        offset ``limit``, when given); returns how many."""
        store, topic = self.store, self.topic
        end = store.get_max_offset_in_queue(topic, 0)
        offset = self.offsets.txn_applied(topic)
        if offset > end:
            # the table was written past what the commit log kept (a torn tail cut at start)
            log.warning("txn_offsets_position_reset", applied=offset, queue_end=end)
            self.offsets.apply_txn("", [], topic, end)
            return 0
        if offset == end:
            return 0
        n = 0
        for m in read_queue(store, topic, 0, offset):
            if limit is not None and m.commit_log_offset >= limit:
                break
            entries: list[tuple[str, int, int]] = []
            group = ""
            committed = (
                MessageSysFlag.transaction_value(m.sys_flag)
                == MessageSysFlag.TRANSACTION_COMMIT_TYPE
            )
            if committed:
                try:
                    doc = TxnOffsets.decode(m.body)
                except ProtocolError as exc:
                    log.warning(
                        "txn_offsets_unreadable", queue_offset=m.queue_offset, error=str(exc)
                    )
                else:
                    group = doc.group
                    entries = [(q.topic, q.queue_id, q.offset) for q in doc.offsets]
                    n += 1
            self.offsets.apply_txn(group, entries, topic, m.queue_offset + 1)
        self.applied += n
        return n
