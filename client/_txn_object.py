"""A multi-message transaction (:class:`AsyncTransaction`): its halves sent together, its
consumer offsets (``send_offsets``), its decision in one broker group or across groups, and
the ``async with producer.transaction()`` block that makes it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txmq.protocol.errors import BrokerSystemError, FencedError, TransactionFailedError, TxmqError
from txmq.protocol.message import (
    Message,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_offset_msg_id,
)
from txmq.protocol.txn_offsets import TXN_OFFSETS_TOPIC, QueueOffset, TxnOffsets

from ._txn_common import LocalTransactionState, TransactionInDoubtError, _pause_point
from .errors import InvalidMessageError
from .logs import get_logger
from .producer import SendResult, SendStatus, new_uniq_id
from .two_phase import PreparedTransaction

if TYPE_CHECKING:
    from ._queues import ProcessQueue
    from .orderly import AsyncOrderlyPushConsumer
    from .transaction import AsyncTransactionProducer

# The transaction module's logger: an application's settings for it cover these events too.
log = get_logger("txmq.client.transaction")


class _TransactionBlock:
    """``async with producer.transaction()``: the transaction is made on entry (a transaction
    across groups checks for a cluster then), committed after a clean exit, rolled back after
    an exception, which then goes on (what an ``asynccontextmanager`` around a ``yield``
    does, without a generator per transaction)."""

    __slots__ = ("_producer", "_transaction_id", "_across_groups", "_two_phase", "_txn")

    def __init__(
        self,
        producer: AsyncTransactionProducer,
        transaction_id: str | None,
        across_groups: bool,
        two_phase: bool = False,
    ) -> None:
        self._producer = producer
        self._transaction_id = transaction_id
        self._across_groups = across_groups
        self._two_phase = two_phase
        self._txn: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        self._txn = new_transaction(
            self._producer, self._transaction_id, self._across_groups, self._two_phase
        )
        return self._txn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        assert self._txn is not None
        if exc_type is not None and exc is None:
            exc = exc_type()
        await self._txn.finish(exc)
        return False  # an exception goes on


def new_transaction(
    producer: AsyncTransactionProducer,
    transaction_id: str | None,
    across_groups: bool,
    two_phase: bool,
) -> AsyncTransaction:
    """A transaction of ``producer`` (a new id unless one is given); one across groups checks
    for a cluster first."""
    if across_groups:
        producer.require_cluster()
    return AsyncTransaction(
        producer,
        transaction_id or new_uniq_id(),
        across_groups=across_groups,
        two_phase=two_phase,
    )


@dataclass
class _PendingHalf:
    msg: Message
    queue_id: int | None
    sharding_key: str | None
    result: asyncio.Future[SendResult]
    #: The broker group this half must go to (the offsets half: the consumed queues' group).
    broker: str | None = None


def _fail_halves(halves: list[_PendingHalf], exc: BaseException) -> None:
    """Halves that were not sent: their senders get ``exc`` (or are cancelled with the task)."""
    for p in halves:
        if isinstance(exc, asyncio.CancelledError):
            p.result.cancel()
        elif not p.result.done():
            p.result.set_exception(exc)


class AsyncTransaction:
    """A multi-message transaction; made by :meth:`AsyncTransactionProducer.transaction`.

    Halves sent concurrently (e.g. ``asyncio.gather(txn.send(m1), txn.send(m2))``) travel in
    one SEND_BATCH_MESSAGE per topic and queue choice: one acknowledged round trip for all of
    them instead of one each.  Each ``send`` still returns once its half is stored.

    With ``across_groups`` the halves are not kept in one broker group: each goes where a plain
    send would, tagged with the transaction id as batch key, and :meth:`commit` /
    :meth:`rollback` decide them through the decision record of the cluster (see
    :meth:`_decide_across`).
    """

    def __init__(
        self,
        producer: AsyncTransactionProducer,
        transaction_id: str,
        *,
        across_groups: bool = False,
        two_phase: bool = False,
    ) -> None:
        self.producer = producer
        self.transaction_id = transaction_id
        self.across_groups = across_groups
        #: Decided by an outside coordinator: its halves carry ``TXMQ_2PC``; see :meth:`prepare`.
        self.two_phase = two_phase
        #: The handle :meth:`prepare` returned (a two-phase transaction once prepared).
        self.handle: PreparedTransaction | None = None
        self.halves: list[SendResult] = []
        self.state: LocalTransactionState | None = None
        self._pending: list[_PendingHalf] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: The broker group holding this transaction's halves: the first half's, chosen as a
        #: plain send would; the others follow it, so one decision covers them all.
        self.broker: str | None = None
        self._pinning: asyncio.Future[str | None] | None = None
        #: Consumer offsets committed with this transaction (:meth:`send_offsets`).
        self._offsets_consumer: AsyncOrderlyPushConsumer | None = None
        self._offsets_generation = 0
        self._offsets_client_id = ""
        #: per queue: its process queue, the committed offset it started from, the next offset
        self._offsets: dict[tuple[str, str, int], tuple[ProcessQueue, int, int]] = {}

    def send_offsets(self, consumer: AsyncOrderlyPushConsumer, msg: MessageExt) -> None:
        """Commit ``consumer``'s offset past ``msg`` with this transaction (Kafka's
        ``sendOffsetsToTransaction``): it moves if and only if the transaction commits.

        ``consumer`` is an orderly push consumer made with ``transactional_offsets=True``.
        At commit the broker refuses (and rolls back the whole transaction, raising
        :class:`~txmq.client.FencedError`) when the group rebalanced since the consumer took
        the queue, when the consumer left the group, or when the queue's committed offset is
        no longer the one this step started from.

        In a cluster the offsets go to the broker group holding the consumed queues.  A plain
        ``transaction()`` keeps everything in one group, so its outputs must be in that group
        too; with outputs in other groups use ``transaction(across_groups=True)``: the offsets
        and the outputs are decided together by one decision record in etcd, fenced there per
        queue (see docs/transactions.md).  The consumed queues of one transaction are in one
        broker group.

        Raises:
            FencedError: the consumer does not hold ``msg``'s queue (any more).
            ValueError: a two-phase transaction; another consumer than the transaction's;
                a queue in another broker group than the transaction's other consumed queues.
        """
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self.two_phase:
            raise ValueError(
                "consumer offsets cannot be committed in a two-phase transaction (its "
                "coordinator's decision does not check them); use transaction()"
            )
        if self._offsets_consumer is not None and self._offsets_consumer is not consumer:
            raise ValueError("one transaction commits the offsets of one consumer")
        pq, generation = consumer.transactional_position(msg)
        for other, _, _ in self._offsets.values():
            if other.broker != pq.broker:
                raise ValueError(
                    f"the consumed queues of one transaction are in one broker group: "
                    f"{msg.topic}:{msg.queue_id} is in {pq.broker}, {other.topic}:"
                    f"{other.queue_id} in {other.broker}; commit them in separate transactions"
                )
        self._offsets_client_id = consumer.client_id or ""
        if self._offsets_consumer is None:
            self._offsets_generation = generation
        else:
            self._offsets_generation = min(self._offsets_generation, generation)
        self._offsets_consumer = consumer
        key = (pq.topic, pq.broker, pq.queue_id)
        start = self._offsets[key][1] if key in self._offsets else pq.committed
        self._offsets[key] = (pq, -1 if start is None else start, msg.queue_offset + 1)

    async def send(
        self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> SendResult:
        return await self._send(msg, None, queue_id=queue_id, sharding_key=sharding_key)

    async def _send(
        self,
        msg: Message,
        broker: str | None,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self.handle is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is prepared; no message can join it"
            )
        pending = _PendingHalf(
            msg, queue_id, sharding_key, asyncio.get_running_loop().create_future(), broker
        )
        self._pending.append(pending)
        if not self._flush_scheduled:
            # Sends started in this turn of the loop are sent together once it ends: the first
            # one waits for the next turn and sends them (its own half from this task when it
            # is alone, as ``await txn.send(m)`` is: no task, no extra turn).
            self._flush_scheduled = True
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pending.result.cancel()
                self._flush()  # the others still go
                raise
            if len(self._pending) == 1 and not self.across_groups:
                self._flush_scheduled = False
                self._pending = []
                await self._send_group([pending])
            else:
                self._flush()
        result = await pending.result
        if result.status is not SendStatus.SEND_OK:
            raise TransactionFailedError(
                f"half message of transaction {self.transaction_id} not stored durably "
                f"({result.status.value})"
            )
        self.halves.append(result)
        return result

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        groups: dict[tuple[str, int | None, str | None], list[_PendingHalf]] = {}
        for p in pending:
            if not p.result.done():  # its sender was cancelled meanwhile
                groups.setdefault((p.msg.topic, p.queue_id, p.sharding_key), []).append(p)
        for group in groups.values():
            task = asyncio.get_running_loop().create_task(self._send_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _batchable(self, msg: Message) -> bool:
        over = self.producer.producer.config.compress_over
        return not (over and len(msg.payload) >= over)

    async def _pin(self, first: _PendingHalf) -> str | None:
        """The broker group of this transaction, chosen with its first half."""
        if self.across_groups:
            self.producer.require_cluster()
            return None  # each half goes where a plain send would
        if self._pinning is None:
            if self.producer.producer.connection.group_name is None:  # one broker: no choice
                return None
            self._pinning = asyncio.ensure_future(self._choose_broker(first))
        self.broker = await asyncio.shield(self._pinning)
        return self.broker

    async def _choose_broker(self, first: _PendingHalf) -> str | None:
        producer = self.producer.producer
        conn = producer.connection
        if conn.group_name is None:
            return None  # a single broker
        route = await producer._route_for(first.msg.topic)
        if not route.exists:
            return conn.group_name  # created on its first send, in the connected group
        mq = producer._select_queue(
            route, first.msg, first.queue_id, first.sharding_key, None, None, None
        )
        return mq.broker

    async def _send_group(self, group: list[_PendingHalf]) -> None:
        extra = {MessageConst.TRANSACTION_ID: self.transaction_id}
        if self.across_groups:
            # The transaction is a batch of one: its id is the key of its decision record.
            extra[MessageConst.TXMQ_BATCH_KEY] = self.transaction_id
        if self.two_phase:
            # The broker keeps it pending for its coordinator; checks go to the resolver.
            extra[MessageConst.TXMQ_2PC] = "1"
        first = group[0]
        try:
            broker = (
                first.broker
                if first.broker is not None and self.across_groups
                else await self._pin(first)
            )
        except (asyncio.CancelledError, Exception) as exc:
            _fail_halves(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if len(group) == 1:
            await self._send_one(first, extra, broker)
            return
        batch: list[_PendingHalf] = []
        single: list[_PendingHalf] = []
        for p in group:
            (batch if self._batchable(p.msg) else single).append(p)
        if len(batch) == 1:
            single, batch = [*single, *batch], []
        if batch:
            await self._send_batch(batch, extra, first.queue_id, first.sharding_key, broker)
        for p in single:
            await self._send_one(p, extra, broker)

    async def _send_one(self, p: _PendingHalf, extra: dict[str, str], broker: str | None) -> None:
        try:
            result = await self.producer._send_half(
                p.msg, extra, queue_id=p.queue_id, sharding_key=p.sharding_key, broker=broker
            )
        except asyncio.CancelledError:
            p.result.cancel()
            raise
        except Exception as exc:
            if not p.result.done():
                p.result.set_exception(exc)
            return
        if not p.result.done():
            p.result.set_result(result)

    async def _send_batch(
        self,
        batch: list[_PendingHalf],
        extra: dict[str, str],
        queue_id: int | None,
        sharding_key: str | None,
        broker: str | None,
    ) -> None:
        tx = self.producer
        props = {MessageConst.TRAN_MSG: "true", MessageConst.PGROUP: tx.group, **extra}
        try:
            result = await tx.producer.send_messages(
                [p.msg for p in batch],
                queue_id=queue_id,
                sharding_key=sharding_key,
                sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
                extra_properties=props,
                broker=broker,
            )
        except InvalidMessageError:
            # e.g. the halves together exceed the size limit: send them one by one
            for p in batch:
                await self._send_one(p, extra, broker)
            return
        except (asyncio.CancelledError, Exception) as exc:
            _fail_halves(batch, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        offset_ids = result.offset_msg_ids
        for i, p in enumerate(batch):
            if p.result.done():
                continue
            oid = offset_ids[i] if i < len(offset_ids) else ""
            p.result.set_result(
                SendResult(
                    status=result.status,
                    msg_id=result.msg_ids[i],
                    offset_msg_id=oid,
                    topic=result.topic,
                    queue_id=result.queue_id,
                    # the halves of one request are stored consecutively in one half queue
                    queue_offset=result.queue_offset + i,
                    transaction_id=result.transaction_id,
                    msg_ids=[result.msg_ids[i]],
                    offset_msg_ids=[oid] if oid else [],
                    broker_name=result.broker_name,
                )
            )

    async def commit(self) -> None:
        await self._decide(LocalTransactionState.COMMIT_MESSAGE, None)

    async def prepare(self) -> PreparedTransaction:
        """First phase of a two-phase transaction (``transaction(two_phase=True)``): its halves
        are stored durably (each :meth:`send` returned once its half was); the handle names
        them for :meth:`AsyncTransactionProducer.commit` / ``rollback`` from any process of the
        producer group.  No message can join it afterwards.  Preparing again returns the
        same handle.

        Raises:
            ValueError: not a two-phase transaction, or no message was sent in it.
            TransactionFailedError: it was decided already.
        """
        if not self.two_phase:
            raise ValueError("prepare() is for transaction(two_phase=True)")
        if self.handle is not None:
            return self.handle
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self._pending:
            raise ValueError("prepare() while sends of the transaction are still running")
        if not self.halves:
            raise ValueError(
                f"transaction {self.transaction_id} has no message to prepare (send one first)"
            )
        half = self.halves[0]
        _, offset = decode_offset_msg_id(half.offset_msg_id)
        in_cluster = self.producer.producer.connection.group_name is not None
        self.handle = PreparedTransaction(
            self.transaction_id,
            self.producer.group,
            # the broker group to decide it in; a single broker needs none
            half.broker_name if in_cluster else "",
            offset,
            half.queue_offset,
            half.msg_id,
        )
        log.info(
            "transaction_prepared", transaction_id=self.transaction_id, handle=str(self.handle)
        )
        return self.handle

    async def finish(self, exc: BaseException | None) -> None:
        """End of a ``transaction()`` block: commit after a clean exit; after an exception,
        roll back (a failed rollback is logged, the original exception wins).  A prepared
        two-phase transaction is left to its coordinator; one never prepared is rolled back
        (and, after a clean exit, :class:`TransactionFailedError` says so)."""
        if self.state is not None or self.handle is not None:
            return
        if self.two_phase and exc is None:
            if self.halves:
                await self.rollback("two-phase transaction block ended without prepare()")
            raise TransactionFailedError(
                f"two-phase transaction {self.transaction_id} ended without prepare(); "
                "it was rolled back"
            )
        if not (self.halves or self._offsets):
            return
        if exc is None:
            await self._decide(LocalTransactionState.COMMIT_MESSAGE, None)
            return
        try:
            await self.rollback(f"rolled back on {type(exc).__name__}: {exc}")
        except TxmqError as rb_exc:
            log.warning(
                "transaction_rollback_failed", transaction_id=self.transaction_id, error=str(rb_exc)
            )

    async def rollback(self, remark: str | None = None) -> None:
        await self._decide(LocalTransactionState.ROLLBACK_MESSAGE, remark)

    async def _decide(self, state: LocalTransactionState, remark: str | None) -> None:
        committing = state is LocalTransactionState.COMMIT_MESSAGE
        if committing and self._offsets:
            await self._send_offsets_half()
        if not self.halves:
            self.state = state
            return
        if self.across_groups:
            await self._decide_across(state)
            return
        await self.producer.end_transaction(
            self.halves[0], state, remark, transaction_id=self.transaction_id
        )
        self.state = state
        if committing:
            self._offsets_committed()

    def _offsets_committed(self) -> None:
        for pq, start, offset in self._offsets.values():
            if pq.committed == start or pq.committed is None:
                pq.committed = offset

    @property
    def groups(self) -> list[str]:
        """The broker groups holding this transaction's halves, in the order of their first
        half."""
        return list(dict.fromkeys(h.broker_name for h in self.halves))

    async def _decide_across(self, state: LocalTransactionState) -> None:
        """Decide a transaction across broker groups.

        1. The first group holding a half is asked (TXMQ_DECIDE_BATCH, the transaction id as
           batch key): its leader records the decision in etcd, create-if-absent, which is the
           commit point (the first decision recorded wins, whoever made it: this call or a
           check-back answer), and applies it to its halves.
        2. Every other group holding halves is asked in turn; each leader also applies a
           recorded decision by itself (from its watch of etcd, and a new leader after a
           failover), so a group not reached here still gets it.

        Each request is repeated through a group's leader change for up to the producer's
        ``decision_timeout`` (a repeat returns the decision in force).

        Raises:
            TransactionInDoubtError: the first group could not be reached: the decision may or
                may not be recorded.
            TransactionFailedError: another decision was recorded first (e.g. a check-back
                answer rolled the transaction back): it holds in every group.
        """
        tx = self.producer
        want = state is LocalTransactionState.COMMIT_MESSAGE
        groups = self.groups
        offsets_group = self._offsets_group()
        if offsets_group in groups:
            # The group holding the consumed queues records the decision: it fences their
            # offsets in the same etcd transaction.
            groups.remove(offsets_group)
            groups.insert(0, offsets_group)
        deadline = time.monotonic() + tx.decision_timeout
        await _pause_point("commit-point")
        fenced: str | None = None
        try:
            committed, fenced = await self._decide_in(
                groups[0], want, deadline, offsets=offsets_group == groups[0]
            )
        except TxmqError as exc:
            raise TransactionInDoubtError(
                f"the {'commit' if want else 'rollback'} of transaction {self.transaction_id} "
                f"(halves in broker groups {', '.join(groups)}) is in doubt: broker group "
                f"{groups[0]} did not confirm it ({exc}). If the decision was recorded, every "
                "group's leader applies it by itself; if not, the groups ask producer group "
                f"{tx.group} (check-back) and its first answer is recorded and applied in every "
                "group"
            ) from exc
        self.state = (
            LocalTransactionState.COMMIT_MESSAGE
            if committed
            else LocalTransactionState.ROLLBACK_MESSAGE
        )
        await _pause_point("after-commit-point")
        for group in groups[1:]:
            await _pause_point(f"group:{group}")
            try:
                await self._decide_in(group, committed, max(deadline, time.monotonic() + 1.0))
            except TxmqError as exc:
                # Recorded already: the group's leader applies it from the record by itself.
                log.warning(
                    "transaction_group_unconfirmed",
                    transaction_id=self.transaction_id,
                    group=group,
                    decided="COMMIT" if committed else "ROLLBACK",
                    error=str(exc),
                )
        if committed and self._offsets:
            self._offsets_committed()
        if fenced is not None and not committed:
            raise FencedError(
                f"fenced: {fenced}; transaction {self.transaction_id} was rolled back in every "
                "broker group"
            )
        if committed != want:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} was "
                f"{'committed' if committed else 'rolled back'} before this "
                f"{'commit' if want else 'rollback'} (an earlier decision, e.g. a check-back "
                "answer, was recorded first); that outcome holds in every broker group"
            )

    async def _decide_in(
        self, group: str, commit: bool, deadline: float, *, offsets: bool = False
    ) -> tuple[bool, str | None]:
        """Ask broker group ``group`` to take the decision, again (through its leader's
        changes) until ``deadline``; the decision in force there, and why it fenced the
        consumer offsets if that rolled the transaction back."""
        tx = self.producer
        wait = 0.2
        while True:
            remaining = deadline - time.monotonic()
            try:
                conn = await tx.producer.connection_for_group(group)
                timeout = max(min(tx.producer.config.request_timeout, remaining), 0.5)
                return await tx._decide_across_answer(
                    conn, self.transaction_id, commit, timeout, offsets
                )
            except TxmqError as exc:
                # A repeat is harmless (the first decision recorded wins): repeat what may
                # pass later (no leader, a leader change, etcd not reached), until the deadline.
                again = exc.retriable or isinstance(exc, BrokerSystemError)
                if not again or time.monotonic() + wait >= deadline:
                    raise
                log.info(
                    "transaction_decision_retried",
                    transaction_id=self.transaction_id,
                    group=group,
                    error=str(exc),
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, 1.0)

    def _offsets_group(self) -> str | None:
        """The broker group holding the consumed queues of :meth:`send_offsets` (the queues'
        ``brokerName``; None without offsets)."""
        for pq, _, _ in self._offsets.values():
            return pq.broker or None
        return None

    async def _send_offsets_half(self) -> None:
        consumer = self._offsets_consumer
        assert consumer is not None
        where = self._offsets_group()
        doc = TxnOffsets(
            group=consumer.group,
            generation=self._offsets_generation,
            client_id=self._offsets_client_id,
            offsets=tuple(
                QueueOffset(pq.topic, pq.broker, pq.queue_id, offset, start)
                for pq, start, offset in self._offsets.values()
            ),
        )
        try:
            in_cluster = self.producer.producer.connection.group_name is not None
            if not self.across_groups and not in_cluster:
                where = None  # a single broker: no choice
            if where is not None and not self.across_groups:
                if self._pinning is None:  # nothing sent yet: the offsets choose the group
                    self._pinning = asyncio.get_running_loop().create_future()
                    self._pinning.set_result(where)
                elif self.broker is not None and self.broker != where:
                    raise ValueError(
                        f"transaction {self.transaction_id} consumed queues of broker group "
                        f"{where} and wrote to broker group {self.broker}: a plain "
                        "transaction() stays in one group; use "
                        "transaction(across_groups=True) to commit the offsets and the "
                        "outputs together across groups"
                    )
            conn = self.producer.producer.connection
            if (
                where is not None
                and conn.group_name not in (None, where)
                and where not in conn.group_addresses
            ):
                await self.producer._cluster_groups()  # no route named the group to this producer
            # the offsets topic has one queue
            await self._send(Message(TXN_OFFSETS_TOPIC, doc.encode()), where, queue_id=0)
        except BaseException as exc:
            if self.halves:
                await self.finish(exc)
            raise
