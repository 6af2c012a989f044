"""Check-back: asking a live producer what became of a transaction whose outcome is unknown
(RocketMQ's TransactionalMessageCheckService, with txmq's rules).

* Age is measured on the broker's clock (the half's store timestamp); a half is due once it is
  older than ``transactionTimeOut`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``).
* Only a check delivered to a live producer of the group counts against
  ``transactionCheckMax``; a transaction out of budget (or older than ``fileReservedTime``) is
  parked in ``TRANS_CHECK_MAX_TIME_TOPIC`` for an operator -- except a two-phase transaction
  (halves with ``TXMQ_2PC``: an outside coordinator decides it), which is kept pending and
  asked again, with a warning, until its ``fileReservedTime``.
* One check in flight per transaction; rounds never overlap.

The service gets only what it uses: the state machine, a way to read a stored half, the live
producer channels of a group, the transaction service's park operation, the clock and the
metrics.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog

from txmq.protocol.aio import wait_event
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import QueryNotFoundError, TxmqError
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.message import MessageConst, MessageExt, encode_message

from ..clients import ClientChannel
from ..metrics import BrokerMetrics
from .machine import TransactionStateMachine
from .state import TxRecord, TxState, half_mismatch, log_half_mismatch

if TYPE_CHECKING:
    from ..config import BrokerConfig

log = structlog.get_logger(__name__)

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


class CheckSchedule:
    """When each pending transaction is next due for a check: a heap of (due ms, transaction
    id) with lazy deletion, so a round looks only at what is due, however many are pending.

    * A transaction is scheduled when it becomes pending (a new half, a resume, replay at
      start, a restored snapshot: it watches the state machine's pending table), at the store
      timestamp of its newest half plus ``transactionTimeOut`` (or the longest
      ``CHECK_IMMUNITY_TIME_IN_SECONDS`` of its halves), and not before one interval after
      its last delivered check.
    * A half joining later, or a check delivered since, only moves the due time later: an
      entry popped early is pushed again at the right time.
    * An entry counts only while it is the transaction's current one (:attr:`_due`); a
      transaction that leaves the pending table (decided, parked) loses it, and its stale entry
      is dropped when popped (the heap is rebuilt when stale entries outnumber live ones).
    * A due transaction whose group has no live producer waits in a set per group until one
      registers (and stays in the heap only for ``fileReservedTime`` parking).
    """

    def __init__(self, time_out_ms: int, interval_ms: int) -> None:
        self.time_out_ms = time_out_ms
        self.interval_ms = max(1, interval_ms)
        self._heap: list[tuple[int, str]] = []
        #: transaction id -> due time of its current heap entry
        self._due: dict[str, int] = {}
        #: producer group -> transactions due but without a live producer to ask
        self.waiting: dict[str, set[str]] = {}

    # -- due times ------------------------------------------------------------------------------

    def first_due(self, rec: TxRecord) -> int:
        """When ``rec`` is first due: its newest half's age reaches the threshold."""
        threshold = self.time_out_ms
        newest = 0
        immunity: int | None = None
        for h in rec.halves:
            if h.store_timestamp > newest:
                newest = h.store_timestamp
            if h.immunity_ms is not None and (immunity is None or h.immunity_ms > immunity):
                immunity = h.immunity_ms
        if immunity is not None:
            threshold = immunity
        return newest + threshold

    def next_due(self, rec: TxRecord) -> int:
        """When ``rec`` is due now: first due, and one interval after its last check."""
        due = self.first_due(rec)
        if rec.last_check_ms:
            due = max(due, rec.last_check_ms + self.interval_ms)
        return due

    # -- the pending table's watcher ------------------------------------------------------------

    def entered(self, rec: TxRecord) -> None:
        self.push(rec.transaction_id, self.next_due(rec))

    def joined(self, rec: TxRecord) -> None:
        pass  # the due time only moves later: the entry is pushed again when popped early

    def left(self, rec: TxRecord) -> None:
        self._due.pop(rec.transaction_id, None)
        self.unwait(rec)

    # -- the heap -------------------------------------------------------------------------------

    def push(self, txid: str, due: int) -> None:
        self._due[txid] = due
        heapq.heappush(self._heap, (due, txid))
        if len(self._heap) > 2 * len(self._due) + 1024:
            self._heap = [(d, t) for t, d in self._due.items()]
            heapq.heapify(self._heap)

    def next_time(self) -> int | None:
        """The earliest due time in the heap (possibly of a stale entry), None when empty."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> Iterator[str]:
        """The transactions whose entry is due at ``now``, earliest first; each leaves the
        schedule (the caller pushes it again or drops it)."""
        heap, current = self._heap, self._due
        while heap and heap[0][0] <= now:
            due, txid = heapq.heappop(heap)
            if current.get(txid) != due:
                continue  # stale: decided, parked or moved since
            del current[txid]
            yield txid

    def scheduled(self, txid: str) -> int | None:
        """The due time of ``txid``'s current entry (None: not in the heap)."""
        return self._due.get(txid)

    def __len__(self) -> int:
        return len(self._due)

    # -- no producer ----------------------------------------------------------------------------

    def wait(self, rec: TxRecord, park_at: int) -> None:
        """``rec`` is due but its group has no live producer: it waits for one, and is looked at
        again at ``park_at`` (``fileReservedTime``) if none comes."""
        self.waiting.setdefault(rec.producer_group, set()).add(rec.transaction_id)
        self.push(rec.transaction_id, park_at)

    def unwait(self, rec: TxRecord) -> None:
        group = self.waiting.get(rec.producer_group)
        if group is not None:
            group.discard(rec.transaction_id)
            if not group:
                del self.waiting[rec.producer_group]

    def take_waiting(self, group: str) -> list[str]:
        """The transactions of ``group`` waiting for a producer (they leave the set)."""
        txids = self.waiting.pop(group, set())
        for t in txids:
            self._due.pop(t, None)  # their fileReservedTime entry: pushed again when checked
        return sorted(txids)


@dataclass(frozen=True)
class CheckLimits:
    """When a transaction is checked and when it is given up, in ms (check counts aside)."""

    #: ``transactionCheckInterval``: between rounds, and between two checks of a transaction.
    interval_ms: int
    #: ``transactionTimeOut``: the age at which a half is first checked.
    time_out_ms: int
    #: ``transactionCheckMax``: delivered checks before the transaction is parked.
    check_max: int
    #: ``fileReservedTime``: the age past which a transaction is parked.
    reserved_ms: int

    @classmethod
    def of(cls, cfg: BrokerConfig) -> CheckLimits:
        return cls(
            interval_ms=cfg.transaction_check_interval,
            time_out_ms=cfg.transaction_time_out,
            check_max=cfg.transaction_check_max,
            reserved_ms=int(cfg.file_reserved_time * 3_600_000),
        )


@dataclass(eq=False, repr=False)
class CheckService:
    """The check loop over the pending transactions of a :class:`TransactionStateMachine`.

    A round looks only at what is due (:class:`CheckSchedule`): its cost follows the number of
    transactions due, not the number pending.

    Args:
        machine: the state machine (read, and told of delivered checks).
        sender: how a check reaches a producer.
        lookup_message: reads a stored message by commit-log offset.
        producer_channels: the live connections of a producer group.
        park: parks a transaction out of budget (appends its discard record); gets the record
            and the reason.
        on_checked: called after a check was counted (the check-state index is dirty).
        now_ms: the broker's clock.
        limits: when to check and when to give up.
        after_round: called after every round (persist the check state, update gauges).
    """

    machine: TransactionStateMachine
    sender: CheckSender
    _: KW_ONLY
    lookup_message: Callable[[int], MessageExt]
    producer_channels: Callable[[str], list[ClientChannel]]
    park: Callable[[TxRecord, str], None]
    on_checked: Callable[[], None]
    after_round: Callable[[], Awaitable[None]]
    now_ms: Callable[[], int]
    metrics: BrokerMetrics
    limits: CheckLimits
    #: Told of each check as it is sent (the record, the client id): the message trace.
    on_check_sent: Callable[[TxRecord, str], None] | None = None
    #: Rounds run so far.
    rounds: int = field(default=0, init=False)
    schedule: CheckSchedule = field(init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _round_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.schedule = CheckSchedule(self.limits.time_out_ms, self.limits.interval_ms)
        self.machine.watch(self.schedule)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-tx-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def set_limits(self, limits: CheckLimits) -> None:
        """Check by ``limits`` from now on (settings changed at run time): every pending
        transaction is scheduled again by them, and the loop looks at once."""
        self.limits = limits
        sched = self.schedule
        sched.time_out_ms, sched.interval_ms = limits.time_out_ms, max(1, limits.interval_ms)
        waiting = {t for txids in sched.waiting.values() for t in txids}
        for txid, rec in self.machine.pending.items():
            if txid in waiting:
                sched.push(txid, rec.oldest_store_timestamp + limits.reserved_ms + 1)
            else:
                sched.push(txid, sched.next_due(rec))
        self._wake.set()

    def on_producer_registered(self, group: str) -> None:
        """A producer (re)connected: if halves of its group wait for one, check them now."""
        if group in self.schedule.waiting:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self.limits.interval_ms / 1000.0)
            self._wake.clear()
            try:
                await self.check_round()
            except Exception as exc:
                log.error("check_round_failed", error=repr(exc))

    # -- rounds ---------------------------------------------------------------------------------

    def due(self, rec: TxRecord, now: int) -> bool:
        """``rec`` is old enough to be checked (its first check; later ones also wait an
        interval after the last)."""
        return now >= self.schedule.first_due(rec)

    def _candidates(self, now: int) -> Iterator[str]:
        """Transactions to look at in a round: those waiting for a producer of a group that has
        one now, then those the heap says are due."""
        sched = self.schedule
        if sched.waiting:
            for group in list(sched.waiting):
                if self.producer_channels(group):
                    yield from sched.take_waiting(group)
        yield from sched.pop_due(now)

    def _checks_due(
        self, now: int, stats: dict[str, int]
    ) -> Iterator[tuple[TxRecord, ClientChannel]]:
        """The checks to send in a round started at ``now``, one per due transaction; parks
        the ones out of budget and sets aside the ones without a producer on the way."""
        sched = self.schedule
        pending = self.machine.pending
        for txid in self._candidates(now):
            rec = pending.get(txid)
            if rec is None or not rec.halves:
                continue  # decided or parked: dropped
            sched.unwait(rec)
            due = sched.next_due(rec)
            if due > now:
                sched.push(txid, due)  # a later half or a recent check moved it
                continue
            too_old = now - rec.oldest_store_timestamp > self.limits.reserved_ms
            over = rec.check_times >= self.limits.check_max
            if over and rec.two_phase and not too_old:
                # An outside coordinator owns the decision: the budget only raises a warning
                # (once per budget's worth of checks) and the transaction is asked again.
                self._two_phase_overdue(rec)
            elif over or too_old:
                self.park(rec, "fileReservedTime" if too_old else "transactionCheckMax")
                stats["discarded"] += 1
                continue
            stats["due"] += 1
            channels = self.producer_channels(rec.producer_group)
            if not channels:
                stats["no_producer"] += 1
                sched.wait(rec, rec.oldest_store_timestamp + self.limits.reserved_ms + 1)
                continue
            yield rec, random.choice(channels)

    def _two_phase_overdue(self, rec: TxRecord) -> None:
        """A two-phase transaction checked ``transactionCheckMax`` times and still undecided:
        counted, and logged at WARN when it reaches a multiple of the budget."""
        self.metrics.tx_two_phase_overdue.inc()
        budget = max(1, self.limits.check_max)
        if (rec.check_times - self.limits.check_max) % budget == 0:
            log.warning(
                "two_phase_check_budget_passed",
                transaction_id=rec.transaction_id,
                producer_group=rec.producer_group,
                check_times=rec.check_times,
                action="kept pending: its coordinator decides (no rollback, not parked)",
            )

    def _reschedule(self, rec: TxRecord) -> None:
        """After a check (delivered or not): due again one interval later."""
        if self.machine.pending.get(rec.transaction_id) is rec:
            self.schedule.push(
                rec.transaction_id,
                max(self.schedule.next_due(rec), self.now_ms() + self.schedule.interval_ms),
            )

    async def check_round(self) -> dict[str, int]:
        """One round: the due transactions are checked, CHECK_CONCURRENCY at a time."""
        async with self._round_lock:
            now = self.now_ms()
            stats = {"due": 0, "sent": 0, "no_producer": 0, "discarded": 0, "not_delivered": 0}
            checks = self._checks_due(now, stats)
            first = next(checks, None)
            if first is not None:
                # The workers share one iterator: each takes the next due check when it is free,
                # so a round holds CHECK_CONCURRENCY checks at a time, not all that are due.
                shared = itertools.chain((first,), checks)

                async def worker() -> None:
                    for rec, ch in shared:
                        try:
                            if await self._send_check(rec, ch):
                                stats["sent"] += 1
                            else:
                                stats["not_delivered"] += 1
                        finally:
                            self._reschedule(rec)

                await asyncio.gather(*(worker() for _ in range(CHECK_CONCURRENCY)))
            self.rounds += 1
            await self.after_round()
            if any(stats.values()):
                log.info("check_round_finished", **stats)
            return stats

    async def _send_check(self, rec: TxRecord, ch: ClientChannel) -> bool:
        if rec.state is not TxState.PENDING or rec.check_in_flight:
            return False
        half = rec.halves[0]
        try:
            stored = self.lookup_message(half.commit_log_offset)
        except (QueryNotFoundError, KeyError):
            log.warning(
                "half_message_missing",
                transaction_id=rec.transaction_id,
                offset=half.commit_log_offset,
            )
            return False
        why = half_mismatch(stored, half, rec.transaction_id)
        if why is not None:  # the log was cut back and written again: not this half
            log_half_mismatch(rec.transaction_id, half, why, "no check is sent")
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
        if self.on_check_sent is not None:
            self.on_check_sent(rec, ch.client_id)
        delivered = False
        try:
            delivered = await self.sender(ch, header, encode_message(stored))
        finally:
            rec.check_in_flight = False
        if delivered:
            # counted even when the answer overtook the acknowledgement
            self.metrics.tx_checks_sent.inc()
        if delivered and self.machine.record_check(rec, self.now_ms()):
            self.on_checked()
            log.info(
                "check_sent",
                transaction_id=rec.transaction_id,
                client_id=ch.client_id,
                check_times=rec.check_times,
            )
        return delivered


__all__ = [
    "CHECK_CONCURRENCY",
    "CheckSchedule",
    "CheckSender",
    "CheckService",
    "RemotingCheckSender",
]
