"""The orderly push consumer: one callback at a time per queue, in queue order, on queues this
member has locked on the broker (RocketMQ's ``ConsumeMessageOrderlyService``).

A producer that sends the messages of one sharding key to one queue (``send`` with a selector
or a queue) gets them handled in the order sent, by one member at a time:

* **Locks.** Before consuming a queue it was assigned, the member locks it on the broker
  (LOCK_BATCH_MQ); a queue whose lock is refused (another member still holds it) is not taken,
  and is asked for again at the next rebalance (1 s, doubling up to ``rebalance_interval``).
  Every ``lock_interval`` (20 s, as RocketMQ) the member renews the locks of all its queues.  A
  queue whose renewal is refused (another member holds it now) is given up at once: no more
  callbacks, no more commits, and it is taken again, from the group's committed offset, once the
  broker grants its lock.  A queue not renewed for :data:`LOCK_LOCAL_LIVE_S` (the broker did not
  answer) pauses until it is locked again.  The broker lets a lock lapse after 60 s without
  renewal, and at once when the member's connection closes: a queue locked before a reconnect
  therefore pauses until it is locked again on the new connection (a callback running when the
  connection dropped may still overlap the first message of a member that took the queue
  meanwhile).
* **Order.** Each queue has one consuming task: it hands the queue's smallest pending message
  to the callback, waits for it to return, then goes on with the next.  Sync callbacks run in a
  pool of ``consume_thread_max`` threads (so queues are consumed in parallel), async ones on the
  event loop.
* **Failures.** A callback that raises suspends its queue for ``suspend_interval`` and gets the
  same message again, in place (nothing behind it is handled meanwhile), up to
  ``max_reconsume_times`` times more; then the message goes to ``%DLQ%<group>`` through the
  broker's send-back and the queue moves on.  RocketMQ's orderly default retries without end,
  which stalls a queue behind one bad message for good: the default here is 16 (with the 1 s
  pause, a queue waits about 16 s before the message is parked in the dead-letter queue).
* **Offsets.** A message's offset is committed only once its callback returned (or it was
  parked in the DLQ).  When a rebalance takes a queue away, the member stops handing out its
  messages, waits for the running callback to end, commits, and only then unlocks the queue:
  the next owner starts where it stopped and never runs beside it.
* **Transactional offsets** (``transactional_offsets=True``, consume-transform-produce exactly
  once): the member never commits offsets itself (no periodic commit, none with pulls or on
  release; only the start of a queue the group never committed is pinned).  The callback
  commits them inside its producer's transaction with
  :meth:`AsyncTransaction.send_offsets <txmq.client.AsyncTransaction.send_offsets>`; the
  broker moves them if and only if the transaction commits, and refuses (rolls back) a commit
  from a member that is not the queue's owner any more (see ``docs/transactions.md``).  A
  callback that raises is retried in place after the committed offset is read again, so a
  message whose transaction did commit (its answer was lost) is not handled twice.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.codes import RequestCode
from txmq.protocol.errors import FencedError, TxmqError
from txmq.protocol.headers import ConsumerSendMsgBackRequestHeader
from txmq.protocol.locks import LockBatchRequest, decode_lock_response
from txmq.protocol.message import MessageExt

from . import telemetry
from ._queues import ProcessQueue
from .config import DEFAULT_BROKER
from .consumer import AsyncPushConsumer, _Subscription
from .errors import ClientStateError
from .logs import EventLogger, get_logger
from .pull_consumer import query_committed_offset, update_committed_offset
from .remoting import BrokerConnection
from .route import MessageQueue

log = get_logger(__name__)

#: How long a granted lock is trusted without a renewal (RocketMQ's client-side
#: ``rocketmq.client.rebalance.lockMaxLiveTime``); the broker keeps it 60 s.
LOCK_LOCAL_LIVE_S = 30.0


class QueueLockedError(TxmqError):
    """The broker did not grant this member the lock on a queue (another member holds it)."""


@dataclass(eq=False)
class _QueueState:
    """What the orderly consumer keeps per queue besides its :class:`ProcessQueue`."""

    #: The connection to the queue's broker group.
    conn: BrokerConnection
    locked: bool = False
    #: ``time.monotonic()`` of the last grant or renewal.
    locked_at: float = 0.0
    #: ``conn.reconnects`` when the lock was granted: the broker frees a lock with the
    #: connection it was taken on, so a lock granted before a reconnect is gone.
    generation: int = -1
    #: Set when there is something for the consuming task to look at (messages, a drop).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Failed deliveries so far, by queue offset.
    failures: dict[int, int] = field(default_factory=dict)

    def granted(self) -> None:
        self.locked, self.locked_at = True, time.monotonic()
        self.generation = self.conn.reconnects

    def lock_valid(self) -> bool:
        return (
            self.locked
            and self.conn.connected
            and self.conn.reconnects == self.generation
            and time.monotonic() - self.locked_at < LOCK_LOCAL_LIVE_S
        )


class AsyncOrderlyPushConsumer(AsyncPushConsumer):
    """A clustering consumer that handles each queue's messages one at a time, in order, on
    queues it holds the broker's lock of; the lifecycle methods are coroutines.

    Args:
        group: the consumer group; the group's queues are shared among its live members.
        broker: ``"host:port"`` of the broker.
        consume_from: where to start in a queue the group has no committed offset for.
        max_reconsume_times: how many times a failing message is handed to the callback again
            (in place, after ``suspend_interval``) before it goes to ``%DLQ%<group>``; the
            callback runs at most ``1 + max_reconsume_times`` times per message.
        suspend_interval: seconds a queue waits after a failed callback before the retry
            (RocketMQ's ``suspendCurrentQueueTimeMillis``).
        lock_interval: seconds between lock renewals (under :data:`LOCK_LOCAL_LIVE_S`).
        transactional_offsets: the callback commits offsets inside a producer transaction
            (:meth:`AsyncTransaction.send_offsets`); the member commits none itself.
        options: the rest as for :class:`AsyncPushConsumer` (``config=``, ``**settings``;
            ``message_model`` stays CLUSTERING: an orderly group shares its queues).
    """

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        suspend_interval: float = 1.0,
        lock_interval: float = 20.0,
        transactional_offsets: bool = False,
        **options: Any,
    ) -> None:
        if options.get("message_model", "CLUSTERING") != "CLUSTERING":
            raise ValueError("an orderly consumer shares its group's queues: CLUSTERING only")
        super().__init__(group, broker, **options)
        if suspend_interval < 0:
            raise ValueError("suspend_interval must not be negative")
        if not 0 < lock_interval < LOCK_LOCAL_LIVE_S:
            raise ValueError(f"lock_interval must be above 0 and below {LOCK_LOCAL_LIVE_S} s")
        self.suspend_interval = suspend_interval
        self.transactional_offsets = transactional_offsets
        #: The queue of each message handed to a callback now (by ``id(msg)``): a message from
        #: the retry topic carries its original topic, not its queue's.
        self._handling: dict[int, ProcessQueue] = {}
        self.lock_interval = lock_interval
        self._states: dict[ProcessQueue, _QueueState] = {}
        #: Queues taken away whose callback has not ended or whose lock is not given up yet.
        self._releasing: dict[MessageQueue, asyncio.Task[Any]] = {}
        self._executor: ThreadPoolExecutor | None = None
        #: Messages parked in the dead-letter queue after their last failed delivery.
        self.dead_lettered_count = 0

    # -- locks -----------------------------------------------------------------------------------

    async def _lock(self, conn: BrokerConnection, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """Lock (or renew) ``mqs`` on ``conn``'s broker; returns those granted.

        Raises:
            TxmqError: the request failed.
        """
        req = LockBatchRequest(self.group, self.connection.client_id, frozenset(mqs))
        resp = await conn.invoke(RequestCode.LOCK_BATCH_MQ, body=req.encode())
        return {MessageQueue(*mq) for mq in decode_lock_response(resp.body)}

    async def _unlock(self, conn: BrokerConnection | None, mq: MessageQueue) -> None:
        me = self._conn
        if me is None:
            return
        req = LockBatchRequest(self.group, me.client_id, frozenset([mq]))
        try:
            await (conn or me).invoke(RequestCode.UNLOCK_BATCH_MQ, body=req.encode())
        except TxmqError as exc:  # the lock lapses on the broker by itself
            log.warning("queue_unlock_failed", group=self.group, queue=mq, error=str(exc))
            return
        log.info("queue_unlocked", group=self.group, topic=mq.topic, queue_id=mq.queue_id)

    async def _renew_locks(self) -> None:
        """Renew the locks of every queue consumed now, one request per broker group."""
        by_conn: dict[int, tuple[BrokerConnection, list[ProcessQueue]]] = {}
        for pq in list(self._pqs.values()):
            conn = pq.conn or self.connection
            by_conn.setdefault(id(conn), (conn, []))[1].append(pq)
        for conn, pqs in by_conn.values():
            try:
                granted = await self._lock(conn, [pq.key for pq in pqs])
            except TxmqError as exc:
                log.warning("queue_lock_renewal_failed", group=self.group, error=str(exc))
                continue
            for pq in pqs:
                state = self._states.get(pq)
                if state is None or pq.dropped:
                    continue
                if pq.key in granted:
                    state.granted()
                    state.wake.set()
                else:
                    self._lock_lost(pq, state)

    def _lock_lost(self, pq: ProcessQueue, state: _QueueState) -> None:
        """Another member holds ``pq`` now: stop consuming it, commit nothing more (its offset
        is the holder's to move) and take it again once the broker grants its lock."""
        state.locked = False
        log.warning("queue_lock_lost", group=self.group, topic=pq.topic, queue_id=pq.queue_id)
        if self._pqs.get(pq.key) is pq:
            self._drop(pq)
        self._request_rebalance()

    async def _lock_loop(self) -> None:
        while not await self._sleep(self.lock_interval):
            try:
                await self._renew_locks()
            except ClientStateError:  # shutting down
                return

    # -- taking and releasing queues -------------------------------------------------------------

    async def _take(self, mq: MessageQueue, conn: BrokerConnection) -> None:
        if mq in self._releasing:
            raise QueueLockedError(f"{mq} is still being released by this member")
        if mq not in await self._lock(conn, [mq]):
            raise QueueLockedError(f"the broker did not grant the lock of {mq}")
        try:
            await super()._take(mq, conn)
        except BaseException:
            self._spawn(self._unlock(conn, mq))
            raise
        pq = self._pqs[mq]
        state = self._states[pq] = _QueueState(conn)
        state.granted()
        self._spawn(self._consume_loop(pq, state))

    def _release(self, pq: ProcessQueue) -> None:
        super()._release(pq)
        state = self._states.get(pq)
        if state is not None:
            state.wake.set()

    def _after_drop(self, pq: ProcessQueue) -> None:
        """Once the callback running on ``pq`` ended (however long it takes), commit and unlock
        it."""

        async def finish() -> None:
            try:
                await pq.idle.wait()
                await self._queues_released([pq])
            finally:
                self._releasing.pop(pq.key, None)

        self._releasing[pq.key] = self._spawn(finish())

    async def _queues_released(self, pqs: list[ProcessQueue]) -> None:
        """Commit, then unlock the queues whose callback ended (one still running at shutdown
        keeps its lock until the connection closes)."""
        await super()._queues_released(pqs)
        for pq in pqs:
            state = self._states.pop(pq, None)
            if state is not None and state.locked and pq.idle.is_set():
                await self._unlock(pq.conn, pq.key)

    async def _commit(self, pq: ProcessQueue) -> None:
        if self.transactional_offsets:
            return  # offsets move only with the transactions that send them
        state = self._states.get(pq)
        if state is not None and not state.locked:
            return  # another member may own the queue now: its offset is not ours to move
        await super()._commit(pq)

    def _pull_commit_offset(self, pq: ProcessQueue) -> int | None:
        if self.transactional_offsets:
            return None
        return super()._pull_commit_offset(pq)

    # -- transactional offsets ----------------------------------------------------------------

    def transactional_position(self, msg: MessageExt) -> tuple[ProcessQueue, int]:
        """The queue ``msg`` came from and the group generation this member holds it under,
        for :meth:`AsyncTransaction.send_offsets`.

        Raises:
            ClientStateError: this consumer was not made with ``transactional_offsets=True``.
            FencedError: this member does not hold the queue (any more).
        """
        if not self.transactional_offsets:
            raise ClientStateError(
                "send_offsets needs a consumer made with transactional_offsets=True"
            )
        pq = self._handling.get(id(msg))
        if pq is None:
            for pq in self._pqs.values():
                if pq.topic == msg.topic and pq.queue_id == msg.queue_id:
                    break
            else:
                raise FencedError(
                    f"fenced: {msg.topic}:{msg.queue_id} is not held by this member (any more)"
                )
        state = self._states.get(pq)
        if pq.dropped or state is None or not state.lock_valid():
            raise FencedError(f"fenced: the lock of {msg.topic}:{msg.queue_id} is not held")
        if pq.generation is None:
            raise FencedError(
                f"fenced: no group generation known for {msg.topic}:{msg.queue_id} (the broker "
                "does not tell one)"
            )
        return pq, pq.generation

    async def _resync(self, pq: ProcessQueue, offset: int) -> bool:
        """After a failed callback (transactional offsets): read the group's committed offset
        again; when it is past ``offset`` (the message's transaction did commit, its answer
        was lost), drop what is below it and return True."""
        try:
            committed = await query_committed_offset(
                pq.conn or self.connection, self.group, pq.topic, pq.queue_id
            )
        except TxmqError as exc:
            log.info("committed_offset_query_failed", queue=pq.key, error=str(exc))
            return False
        if committed is None or committed <= offset:
            return False
        threshold = self.config.pull_threshold_for_queue
        for o in [o for o in pq.msgs if o < committed]:
            pq.remove(o, threshold)
        pq.committed = committed
        if pq.next_offset < committed:
            pq.offset_moved(committed)
        log.info("queue_resynced", queue=pq.key, offset=committed)
        return True

    # -- consuming -------------------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        if self._executor is None and any(not s.is_async for s in self._subs.values()):
            self._executor = ThreadPoolExecutor(
                self.config.consume_thread_max, thread_name_prefix=f"txmq-orderly-{self.group}"
            )

    def _dispatch(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self._add_pulled(pq, msgs)
        state = self._states.get(pq)
        if state is not None:
            state.wake.set()

    async def _consume_loop(self, pq: ProcessQueue, state: _QueueState) -> None:
        threshold = self.config.pull_threshold_for_queue
        while not pq.dropped:
            if not pq.msgs:
                state.wake.clear()
                await state.wake.wait()
                continue
            if not state.lock_valid():
                if await self._sleep(self.suspend_interval) or pq.dropped:
                    return
                await self._relock(pq, state)
                continue
            offset = pq.offset_to_commit()
            msg = pq.msgs[offset]
            sub = self._wanted(pq, msg)
            if sub is None:
                pq.remove(offset, threshold)
                continue
            if state.failures.get(offset, 0) > self.max_reconsume_times:
                if await self._dead_letter(pq, msg):
                    state.failures.pop(offset, None)
                    pq.remove(offset, threshold)
                    if self.transactional_offsets:
                        await self._commit_dead_lettered(pq, offset + 1)
                    self.consumed_count += 1
                    self.dead_lettered_count += 1
                elif await self._sleep(self.suspend_interval):
                    return
                continue
            pq.begin()
            self._handling[id(msg)] = pq
            try:
                error = await self._call(sub, msg)
                if error is None:
                    state.failures.pop(offset, None)
                    pq.remove(offset, threshold)
                    self.consumed_count += 1
                    continue
                if self.transactional_offsets and await self._resync(pq, offset):
                    state.failures.pop(offset, None)
                    continue
                if self.transactional_offsets and isinstance(error, FencedError):
                    # not the message's fault: this member's view of the group is behind (or
                    # it lost the queue); it rebalances, and the message does not near the DLQ
                    log.info("message_commit_fenced", queue=pq.key, offset=offset, error=str(error))
                    self._request_rebalance()
                    failures = 0
                else:
                    failures = state.failures[offset] = state.failures.get(offset, 0) + 1
                    msg.reconsume_times += 1
                    self._offset_log(pq, msg).info(
                        "message_consume_failed", failures=failures, error=repr(error)
                    )
            finally:
                self._handling.pop(id(msg), None)
                pq.end()
            if failures <= self.max_reconsume_times and await self._sleep(self.suspend_interval):
                return

    async def _commit_dead_lettered(self, pq: ProcessQueue, offset: int) -> None:
        """Transactional offsets: a message parked in the dead-letter queue produced nothing;
        move the group past it (the next transaction expects this offset)."""
        try:
            await update_committed_offset(
                pq.conn or self.connection, self.group, pq.topic, pq.queue_id, offset
            )
        except TxmqError as exc:
            log.warning("offset_commit_failed", queue=pq.key, offset=offset, error=str(exc))
            return
        pq.committed = offset

    async def _call(self, sub: _Subscription, msg: MessageExt) -> BaseException | None:
        """Run the callback on ``msg``; the exception it raised, or None."""
        assert sub.callback is not None
        if self._trace is not None:
            self._trace.before(msg)
        error = await self._run_callback(sub, msg)
        if self._trace is not None:
            self._trace.after(msg, error is None)
        return error

    async def _run_callback(self, sub: _Subscription, msg: MessageExt) -> BaseException | None:
        assert sub.callback is not None
        try:
            if telemetry.AVAILABLE:
                with telemetry.process_span(msg, self.group):
                    await self._invoke_callback(sub, msg)
            else:
                await self._invoke_callback(sub, msg)
        except Exception as exc:  # the callback asked for a retry
            return exc
        return None

    async def _invoke_callback(self, sub: _Subscription, msg: MessageExt) -> None:
        assert sub.callback is not None
        if sub.is_async:
            assert self._async_slots is not None
            async with self._async_slots:
                await sub.callback(msg)
        else:
            self._ensure_workers()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, sub.callback, msg)

    async def _relock(self, pq: ProcessQueue, state: _QueueState) -> None:
        try:
            granted = await self._lock(state.conn, [pq.key])
        except TxmqError as exc:
            log.warning("queue_lock_failed", group=self.group, queue=pq.key, error=str(exc))
            return
        if pq.key in granted:
            state.granted()
        elif not pq.dropped:
            self._lock_lost(pq, state)

    def _offset_log(self, pq: ProcessQueue, msg: MessageExt) -> EventLogger:
        """The log with the group, the topic of ``msg``, and the queue id and offset it has in
        ``pq`` on every line."""
        return log.bind(
            group=self.group, topic=msg.topic, queue_id=pq.queue_id, offset=msg.queue_offset
        )

    async def _dead_letter(self, pq: ProcessQueue, msg: MessageExt) -> bool:
        """Park ``msg`` in ``%DLQ%<group>``; False if the broker could not be told."""
        header = ConsumerSendMsgBackRequestHeader(
            offset=msg.commit_log_offset,
            group=self.group,
            delay_level=-1,  # straight to the dead-letter queue
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            unit_mode=False,
            max_reconsume_times=self.max_reconsume_times,
        )
        try:
            await (pq.conn or self.connection).invoke(RequestCode.CONSUMER_SEND_MSG_BACK, header)
        except TxmqError as exc:
            log.warning("dead_letter_failed", group=self.group, msg_id=msg.msg_id, error=str(exc))
            return False
        self._offset_log(pq, msg).warning(
            "message_dead_lettered", msg_id=msg.msg_id, deliveries=self.max_reconsume_times + 1
        )
        return True

    # -- lifecycle -------------------------------------------------------------------------------

    async def _start(self) -> None:
        await super()._start()
        self._loop_tasks.append(asyncio.get_running_loop().create_task(self._lock_loop()))

    async def _shutdown(self) -> None:
        await super()._shutdown()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False)  # running callbacks were waited for above


__all__ = ["LOCK_LOCAL_LIVE_S", "AsyncOrderlyPushConsumer", "QueueLockedError"]
