"""Check-back: asking a live producer what became of a transaction whose outcome is unknown
(RocketMQ's TransactionalMessageCheckService, with txmq's rules).

* Age is measured on the broker's clock (the half's store timestamp); a half is due once it is
  older than ``transactionTimeOut`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``).
* Only a check delivered to a live producer of the group counts against
  ``transactionCheckMax``; a transaction out of budget (or older than ``fileReservedTime``) is
  parked in ``TRANS_CHECK_MAX_TIME_TOPIC`` for an operator.
* One check in flight per transaction; rounds never overlap.

The service gets only what it uses: the state machine, a way to read a stored half, the live
producer channels of a group, the transaction service's park operation, the clock and the
metrics.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

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
from .state import TxRecord, TxState

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


class CheckService:
    """The check loop over the pending transactions of a :class:`TransactionStateMachine`.

    Args:
        machine: the state machine (read, and told of delivered checks).
        sender: how a check reaches a producer.
        lookup_message: reads a stored message by commit-log offset.
        producer_channels: the live connections of a producer group.
        park: parks a transaction out of budget (appends its discard record); gets the record
            and the reason.
        on_checked: called after a check was counted (the check-state index is dirty).
        now_ms: the broker's clock.
        interval_ms, time_out_ms, check_max, reserved_ms: ``transactionCheckInterval``,
            ``transactionTimeOut``, ``transactionCheckMax``, ``fileReservedTime`` in ms.
        after_round: called after every round (persist the check state, update gauges).
    """

    def __init__(
        self,
        machine: TransactionStateMachine,
        sender: CheckSender,
        *,
        lookup_message: Callable[[int], MessageExt],
        producer_channels: Callable[[str], list[ClientChannel]],
        park: Callable[[TxRecord, str], None],
        on_checked: Callable[[], None],
        after_round: Callable[[], Awaitable[None]],
        now_ms: Callable[[], int],
        metrics: BrokerMetrics,
        interval_ms: int,
        time_out_ms: int,
        check_max: int,
        reserved_ms: int,
    ) -> None:
        self.machine = machine
        self.sender = sender
        self._lookup = lookup_message
        self._channels = producer_channels
        self._park = park
        self._on_checked = on_checked
        self._after_round = after_round
        self._now_ms = now_ms
        self._metrics = metrics
        self.interval_ms = interval_ms
        self.time_out_ms = time_out_ms
        self.check_max = check_max
        self.reserved_ms = reserved_ms
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None
        self._round_lock = asyncio.Lock()
        self._wake = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-tx-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def on_producer_registered(self, group: str) -> None:
        """A producer (re)connected: if it has halves waiting for a check, check soon."""
        now = self._now_ms()
        pending = self.machine.pending.values()
        if any(r.producer_group == group and self.due(r, now) for r in pending):
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self.interval_ms / 1000.0)
            self._wake.clear()
            try:
                await self.check_round()
            except Exception as exc:
                log.error("check_round_failed", error=repr(exc))

    # -- rounds ---------------------------------------------------------------------------------

    def due(self, rec: TxRecord, now: int) -> bool:
        threshold = self.time_out_ms
        immunities = [h.immunity_ms for h in rec.halves if h.immunity_ms is not None]
        if immunities:
            threshold = max(immunities)
        return now - rec.newest_store_timestamp >= threshold

    async def check_round(self) -> dict[str, int]:
        """One pass over the pending transactions."""
        async with self._round_lock:
            now = self._now_ms()
            stats = {"due": 0, "sent": 0, "no_producer": 0, "discarded": 0, "not_delivered": 0}
            due: list[tuple[TxRecord, ClientChannel]] = []
            for rec in list(self.machine.pending.values()):
                if not rec.halves or not self.due(rec, now):
                    continue
                too_old = now - rec.oldest_store_timestamp > self.reserved_ms
                if rec.check_times >= self.check_max or too_old:
                    self._park(rec, "fileReservedTime" if too_old else "transactionCheckMax")
                    stats["discarded"] += 1
                    continue
                stats["due"] += 1
                channels = self._channels(rec.producer_group)
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
            await self._after_round()
            if any(stats.values()):
                log.info("check_round_finished", **stats)
            return stats

    async def _send_check(self, rec: TxRecord, ch: ClientChannel) -> bool:
        if rec.state is not TxState.PENDING or rec.check_in_flight:
            return False
        half = rec.halves[0]
        try:
            stored = self._lookup(half.commit_log_offset)
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
            delivered = await self.sender(ch, header, encode_message(stored))
        finally:
            rec.check_in_flight = False
        if delivered:
            # counted even when the answer overtook the acknowledgement
            self._metrics.tx_checks_sent.inc()
        if delivered and self.machine.record_check(rec, self._now_ms()):
            self._on_checked()
            log.info(
                "check_sent",
                transaction_id=rec.transaction_id,
                client_id=ch.client_id,
                check_times=rec.check_times,
            )
        return delivered


__all__ = ["CHECK_CONCURRENCY", "CheckSender", "CheckService", "RemotingCheckSender"]
