"""The push consumer (clustering): rebalance, pull, consume, retry, commit.

How it works, in RocketMQ's terms:

* **Rebalance** (``RebalanceImpl``): every ``rebalance_interval``, at start, after a reconnect
  and as soon as the broker sends NOTIFY_CONSUMER_IDS_CHANGED, the consumer fetches the group's
  member ids and each subscribed topic's queues and keeps the share that
  :func:`allocate_averagely` gives it (RocketMQ's ``AllocateMessageQueueAveragely`` over sorted
  queues and sorted ids).  A queue it no longer owns stops pulling and commits its offset.
* **Pull**: one task per owned queue long-polls PULL_MESSAGE and feeds a :class:`ProcessQueue`.
  A queue holding ``pull_threshold_for_queue`` unconsumed messages pauses (flow control).
* **Consume**: sync callbacks run in a pool of ``consume_thread_max`` threads fed from one work
  queue (so a slow callback never blocks the event loop); coroutine callbacks run on the loop,
  at most ``consume_thread_max`` at a time.
* **Retry**: a callback that raises makes the consumer return the message with
  CONSUMER_SEND_MSG_BACK; the broker stores it again in ``%RETRY%<group>`` after a back-off
  (``%DLQ%<group>`` after ``max_reconsume_times``).  Every consumer of the group also subscribes
  its retry topic and restores the original topic from ``RETRY_TOPIC`` before calling back.  If
  the send-back fails the message is consumed again locally later; it stays in the process queue
  meanwhile, so its offset is not committed.
* **Offsets** (``ProcessQueue``): the offset committed for a queue is the smallest offset still
  being processed, or the next offset to pull when nothing is.  Offsets are committed every
  ``persist_offset_interval``, when a queue is dropped and at shutdown; a message is therefore
  acknowledged only after its callback returned or its send-back succeeded (at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from txmq.protocol import fastjson
from txmq.protocol.aio import wait_event
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import TxmqError
from txmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
)
from txmq.protocol.message import MessageConst, MessageExt, parse_subscription
from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX, retry_topic

from . import telemetry
from ._queues import _FROM_WHERE, ConsumeFrom, ProcessQueue, allocate_averagely, parse_consume_from
from ._sync_workers import _SKIPPED, _is_async_callable, _SyncWorkers
from ._validation import validate_topic
from .callbacks import RebalanceCallback, call_hook
from .config import DEFAULT_BROKER, ClientConfig
from .errors import ClientStateError
from .lifecycle import ConnectedClient
from .logs import EventLogger, get_logger
from .offset_store import LocalOffsetStore, OffsetStoreError, default_offset_path
from .pull_consumer import (
    PullStatus,
    check_client_config,
    expression_type,
    get_max_offset,
    get_min_offset,
    normalize_expression,
    pull_messages,
    query_committed_offset,
    search_offset,
    subscription_data,
    update_committed_offset,
)
from .remoting import BrokerConnection
from .route import MessageQueue, fetch_route
from .trace import ConsumerTrace

log = get_logger(__name__)

#: A message callback: ``f(msg)`` or ``async f(msg)``.  Returning normally acknowledges the
#: message; raising asks for it again later.
MessageCallback = Callable[[MessageExt], Any]


@dataclass
class _Subscription:
    topic: str
    expression: str
    callback: MessageCallback | None
    is_async: bool
    sub_version: int


class AsyncPushConsumer(ConnectedClient):
    """A clustering consumer that calls back for every message; the lifecycle methods are
    coroutines.

    Args:
        group: the consumer group; the group's queues are shared among its live members.
        broker: ``"host:port"`` of the broker.
        consume_from: where to start in a queue the group has no committed offset for:
            ``"last"`` (default), ``"first"``, a timestamp in ms or a datetime.
        max_reconsume_times: deliveries after which a failing message goes to ``%DLQ%<group>``
            (broadcasting: local attempts after which it is logged at ERROR and skipped).
        message_model: ``"CLUSTERING"`` (default): the group's members share its queues and
            the broker keeps the group's offsets.  ``"BROADCASTING"``: every member receives
            every message and keeps its own offsets in a local file.
        offset_store_path: broadcasting only: that file (default
            ``~/.txmq/offsets/<group>@<host>.json``; give each member on one host its own).
        on_rebalance: ``callback(assigned, revoked)`` after a rebalance changed this member's
            queues (lists of :class:`MessageQueue`, the group's retry queue included); it runs
            on the client's event loop (see :mod:`txmq.client.callbacks`).
        config: client settings; ``**settings`` override single fields, e.g.
            ``consume_thread_max=4``, ``pull_batch_size=64``, ``long_poll_timeout=5``.
    """

    _kind = "consumer"

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        consume_from: ConsumeFrom | str | int | float | datetime = ConsumeFrom.LAST,
        max_reconsume_times: int = 16,
        message_model: str = "CLUSTERING",
        offset_store_path: str | os.PathLike[str] | None = None,
        on_rebalance: RebalanceCallback | None = None,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(group, broker, config=config, **settings)
        self._on_rebalance = on_rebalance
        validate_topic(retry_topic(group))
        if message_model not in ("CLUSTERING", "BROADCASTING"):
            raise ValueError(
                f"message_model must be CLUSTERING or BROADCASTING, not {message_model!r}"
            )
        if offset_store_path is not None and message_model != "BROADCASTING":
            raise ValueError("offset_store_path is for BROADCASTING consumers")
        self.message_model = message_model
        #: Broadcasting: this member's offsets, kept locally; None when clustering.
        self.local_offsets = (
            LocalOffsetStore(offset_store_path or default_offset_path(group), group)
            if message_model == "BROADCASTING"
            else None
        )
        self.consume_from, self._from_ts = parse_consume_from(consume_from)
        if max_reconsume_times < 0:
            raise ValueError("max_reconsume_times must not be negative")
        self.max_reconsume_times = max_reconsume_times
        self.retry_topic = retry_topic(group)
        self._retry_sub = _Subscription(self.retry_topic, "*", None, False, 0)
        self._subs: dict[str, _Subscription] = {}
        #: Subscribed topics that did not exist yet when this consumer looked for them.
        self._born_later: set[str] = set()
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        #: Offsets an operator reset to (RESET_CONSUMER_CLIENT_OFFSET) for queues this member
        #: dropped and takes again from there.
        self._reset_offsets: dict[MessageQueue, int] = {}
        #: The group generation each broker (by address) gave with its member list.
        self._generations: dict[str, int | None] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop_tasks: list[asyncio.Task[None]] = []
        self._workers: _SyncWorkers | None = None
        self._async_slots: asyncio.Semaphore | None = None
        self._rebalance_wanted: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._stop: asyncio.Event | None = None
        #: Messages acknowledged so far (callback returned or send-back succeeded).
        self.consumed_count = 0
        #: SubBefore / SubAfter records of the callbacks (``enable_trace``).
        self._trace = (
            ConsumerTrace(group, self.broker, self.config) if self.config.enable_trace else None
        )

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | None, callback: MessageCallback) -> None:
        """Consume ``topic``'s messages whose tag matches ``expression``.

        Args:
            topic: the topic.
            expression: ``"*"`` (or None) for every message, tags: ``"created || paid"``, or
                a SQL92 property filter: ``sql("amount > 100 AND region = 'eu'")`` (checked
                by the broker at :meth:`start`).
            callback: ``f(msg)`` or ``async f(msg)``; return to acknowledge, raise to get the
                message again later.  Sync callbacks run in the consumer's thread pool.

        May be called before or after :meth:`start` (from the event loop's thread).
        """
        validate_topic(topic)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise ValueError(f"the retry topic {topic!r} is subscribed automatically")
        if not callable(callback):
            raise TypeError("callback must be callable")
        self._subs[topic] = _Subscription(
            topic=topic,
            expression=normalize_expression(expression),
            callback=callback,
            is_async=_is_async_callable(callback),
            sub_version=int(time.time() * 1000),
        )
        if self._started:
            self._resubscribe()

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are released at the next rebalance, which is
        requested at once when the consumer runs)."""
        self._subs.pop(topic, None)
        if self._started:
            self._resubscribe()

    def _resubscribe(self) -> None:
        async def go() -> None:
            try:
                await self.connection.send_heartbeat()
            except TxmqError as exc:
                log.warning("heartbeat_failed", group=self.group, error=str(exc))
            self._request_rebalance()

        self._spawn(go())

    def _all_subscriptions(self) -> dict[str, _Subscription]:
        subs = dict(self._subs)
        if self.local_offsets is None:  # broadcasting sends nothing back: no retry topic
            subs[self.retry_topic] = self._retry_sub
        return subs

    def _subscription_of_queue(self, topic: str) -> _Subscription | None:
        return self._retry_sub if topic == self.retry_topic else self._subs.get(topic)

    def _consumer_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": self.message_model,
            "consumeFromWhere": _FROM_WHERE[self.consume_from],
            "subscriptionDataSet": [
                subscription_data(s.topic, s.expression, s.sub_version)
                for s in self._all_subscriptions().values()
            ],
            "unitMode": False,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def client_id(self) -> str | None:
        """This member's id in the group (None before :meth:`start`)."""
        return self._conn.client_id if self._conn is not None else None

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs this member consumes now, sorted (a topic in several
        broker groups has a queue id once per group; :meth:`queues` tells them apart)."""
        return sorted((q.topic, q.queue_id) for q in self._pqs)

    def queues(self) -> list[MessageQueue]:
        """The queues (topic, broker group, queue id) this member consumes now, sorted."""
        return sorted(self._pqs)

    async def _start(self) -> None:
        """Connect, register the group and its subscriptions, take a share of the queues and
        start consuming.

        Raises:
            ClientStateError: no subscription.
            ConnectionClosedError: the broker cannot be reached.
        """
        if not self._subs:
            raise ClientStateError(f"consumer {self.group!r} has no subscription; subscribe first")
        if self.local_offsets is not None:
            await asyncio.to_thread(self.local_offsets.load)
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._rebalance_wanted = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._async_slots = asyncio.Semaphore(self.config.consume_thread_max)
        conn = BrokerConnection(self.broker, self.config)
        conn.register_consumer(self.group, self._consumer_data)
        conn.register_processor(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        conn.register_processor(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset)
        conn.on_reconnect(self._request_rebalance)
        await conn.start()
        try:
            for sub in self._subs.values():
                if expression_type(sub.expression) != "TAG":
                    await check_client_config(conn, self.group, sub.topic, sub.expression)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._ensure_workers()
        self._started = True
        complete = await self._rebalance()
        self._loop_tasks = [
            loop.create_task(self._rebalance_loop(complete)),
            loop.create_task(self._persist_loop()),
        ]
        log.info(
            "consumer_started",
            group=self.group,
            client_id=conn.client_id,
            topics=sorted(self._subs),
            queues=len(self._pqs),
        )

    async def _shutdown(self) -> None:
        """Stop pulling, let running callbacks finish (up to ``shutdown_timeout``), commit the
        offsets, unregister from the group and close the connection."""
        assert self._stop is not None
        self._stop.set()
        for task in self._loop_tasks:
            task.cancel()
        for task in self._loop_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pqs = list(self._pqs.values())
        self._pqs.clear()
        for pq in pqs:
            self._release(pq)
        await self._wait_idle(pqs, self.config.shutdown_timeout)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.config.shutdown_timeout)
        for task in list(self._tasks):
            task.cancel()
        await self._queues_released(pqs)
        if self._trace is not None:
            await self._trace.close()
        conn = self._conn
        assert conn is not None
        await conn.unregister(consumer_group=self.group)
        await conn.close()
        self._conn = None
        if self._workers is not None:
            workers, self._workers = self._workers, None
            await asyncio.to_thread(workers.stop, 1.0)
        log.info("consumer_shut_down", group=self.group, consumed=self.consumed_count)

    # -- rebalance -------------------------------------------------------------------------------

    async def _on_ids_changed(self, cmd: RemotingCommand) -> RemotingCommand | None:
        log.debug("consumer_ids_changed", group=self.group)
        self._request_rebalance()
        return None

    async def _on_reset_offset(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """RESET_CONSUMER_CLIENT_OFFSET: an operator moved the group's offsets (the broker
        committed them already).  Each queue held here is dropped without committing what it
        had (what it pulled is forgotten; a callback running finishes, its result is not
        committed) and taken again from the new offset."""
        if self.local_offsets is not None:
            return None  # broadcasting: offsets are this member's own
        try:
            table = fastjson.loads(cmd.body)["offsetTable"] or []
            group = cmd.ext_fields.get("group")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("reset_offset_unreadable", group=self.group, error=str(exc))
            return None
        if group not in (None, self.group):
            return None
        moved = 0
        for mq_doc, offset in table:
            mq = MessageQueue(mq_doc["topic"], mq_doc["brokerName"], int(mq_doc["queueId"]))
            pq = self._pqs.get(mq)
            if pq is None:
                continue
            self._reset_offsets[mq] = int(offset)
            pq.msgs.clear()
            # the drop then has nothing to commit: the new offset is committed already
            pq.next_offset = pq.committed = int(offset)
            self._drop(pq)
            moved += 1
        log.warning("consumer_offsets_reset", group=self.group, queues=moved)
        if moved:
            self._request_rebalance()
        return None

    def _request_rebalance(self) -> None:
        if self._rebalance_wanted is not None:
            self._rebalance_wanted.set()

    async def _rebalance_loop(self, complete: bool) -> None:
        assert self._rebalance_wanted is not None
        # A subscribed topic that does not exist yet is looked for again soon (doubling up to
        # the rebalance interval), so consumption starts quickly once a producer creates it.
        retry_in = 1.0
        assert self._stop is not None
        while not self._stop.is_set():
            wait = (
                self.config.rebalance_interval
                if complete
                else min(retry_in, self.config.rebalance_interval)
            )
            await wait_event(self._rebalance_wanted, wait)
            self._rebalance_wanted.clear()
            if self._stop.is_set():
                return
            complete = await self._rebalance()
            retry_in = 1.0 if complete else retry_in * 2

    async def _consumer_ids(self, conn: BrokerConnection) -> list[str]:
        resp = await conn.invoke(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            GetConsumerListByGroupRequestHeader(consumer_group=self.group),
        )
        doc = json.loads(resp.body.decode("utf-8")) if resp.body else {}
        gen = doc.get("generation")
        self._generations[conn.address] = gen if isinstance(gen, int) else None
        return sorted(str(i) for i in doc.get("consumerIdList") or [])

    async def _rebalance(self) -> bool:
        """One rebalance; True when every subscribed topic was resolved.  Calls
        ``on_rebalance`` when this member's queues changed."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            before = set(self._pqs)
            try:
                return await self._rebalance_queues()
            finally:
                hook = self._on_rebalance
                after = set(self._pqs)
                if hook is not None and after != before:
                    call_hook(hook, sorted(after - before), sorted(before - after))

    async def _rebalance_queues(self) -> bool:
        """The work of :meth:`_rebalance`, under its lock."""
        if not self._started:
            return True
        conn = self.connection
        complete = True
        subs = self._all_subscriptions()
        for key in [k for k in self._pqs if k.topic not in subs]:
            self._drop(self._pqs[key])
        ids_by_group: dict[str, list[str]] = {}
        for topic in subs:
            try:
                route = await fetch_route(conn, topic)
            except TxmqError as exc:
                log.warning("route_fetch_failed", topic=topic, error=str(exc))
                complete = False
                continue
            if route is None and topic != self.retry_topic:
                complete = False
                self._born_later.add(topic)
            queues = list(route.read_queues) if route is not None and route.readable else []
            # Every member heartbeats to every group of the topic, so each group knows the
            # whole consumer group; the members are read from the topic's first group.
            conns: dict[str, BrokerConnection] = {}
            try:
                for group in sorted({q.broker for q in queues}):
                    conns[group] = await conn.for_group(group)
                first = conns[min(conns)] if conns else conn
                ids = ids_by_group.get(first.address)
                if ids is None:
                    ids = ids_by_group[first.address] = await self._consumer_ids(first)
            except (TxmqError, ValueError) as exc:
                log.warning("rebalance_failed", group=self.group, topic=topic, error=str(exc))
                complete = False
                continue
            if conn.client_id not in ids:
                log.info("consumer_not_found_in_group", group=self.group, client_id=conn.client_id)
                complete = False
                continue
            if self.local_offsets is not None:  # broadcasting: every queue
                mine = set(queues)
            else:
                mine = set(allocate_averagely(queues, ids, conn.client_id))
            for key in [k for k in self._pqs if k.topic == topic and k not in mine]:
                self._drop(self._pqs[key])
            for key in [k for k in self._reset_offsets if k.topic == topic and k not in mine]:
                del self._reset_offsets[key]  # another member took it: the broker's offset
            for mq in sorted(mine):
                if mq in self._pqs or not self._started:
                    continue
                try:
                    await self._take(mq, conns.get(mq.broker, conn))
                except TxmqError as exc:
                    log.warning(
                        "queue_take_failed",
                        topic=topic,
                        broker=mq.broker,
                        queue_id=mq.queue_id,
                        error=str(exc),
                    )
                    complete = False
            gen = self._generations.get(first.address)
            for mq in mine:
                if mq in self._pqs:
                    self._pqs[mq].generation = gen
        return complete

    async def _take(self, mq: MessageQueue, conn: BrokerConnection) -> None:
        reset = self._reset_offsets.pop(mq, None)
        if reset is not None:
            offset = reset
        elif self.local_offsets is not None:
            offset = await self._local_initial_offset(conn, mq, self.local_offsets)
        else:
            offset = await self._initial_offset(conn, mq.topic, mq.queue_id)
        pq = ProcessQueue(mq.topic, mq.queue_id, offset, mq.broker, conn)
        pq.generation = self._generations.get(conn.address)
        self._pqs[pq.key] = pq
        pq.pull_task = asyncio.get_running_loop().create_task(self._pull_loop(pq))
        self._queue_log(pq).info("queue_assigned", broker=mq.broker, offset=offset)

    def _queue_log(self, pq: ProcessQueue) -> EventLogger:
        """The log with the group, topic and queue id of ``pq`` on every line."""
        return log.bind(group=self.group, topic=pq.topic, queue_id=pq.queue_id)

    def _message_log(self, msg: MessageExt) -> EventLogger:
        """The log with the group, topic and id of ``msg`` on every line."""
        return log.bind(group=self.group, topic=msg.topic, msg_id=msg.msg_id)

    async def _initial_offset(self, conn: BrokerConnection, topic: str, queue_id: int) -> int:
        committed = await query_committed_offset(conn, self.group, topic, queue_id)
        if committed is not None:
            return committed
        offset = await self._start_offset(conn, topic, queue_id)
        # Pin the start, so a restart before the first commit does not move it (e.g. "last"
        # would otherwise skip what was sent in between).
        await update_committed_offset(conn, self.group, topic, queue_id, offset)
        return offset

    async def _local_initial_offset(
        self, conn: BrokerConnection, mq: MessageQueue, store: LocalOffsetStore
    ) -> int:
        """Broadcasting: this member's own offset, or its start, pinned in its file."""
        offset = store.read(mq)
        if offset is None:
            offset = await self._start_offset(conn, mq.topic, mq.queue_id)
            store.update(mq, offset)
            await asyncio.to_thread(store.persist)
        return offset

    async def _start_offset(self, conn: BrokerConnection, topic: str, queue_id: int) -> int:
        """Where a queue without a committed offset starts (``consume_from``)."""
        if (
            topic == self.retry_topic
            or self.consume_from is ConsumeFrom.FIRST
            or (self.consume_from is ConsumeFrom.LAST and topic in self._born_later)
        ):
            # A topic created after this consumer subscribed holds only messages sent since
            # then: "last" means all of them (the broker creates a topic on its first send).
            offset = await get_min_offset(conn, topic, queue_id)
        elif self.consume_from is ConsumeFrom.LAST:
            offset = await get_max_offset(conn, topic, queue_id)
        else:
            assert self._from_ts is not None
            offset = await search_offset(conn, topic, queue_id, self._from_ts)
        return offset

    def _release(self, pq: ProcessQueue) -> None:
        pq.dropped = True
        pq.space.set()
        if pq.pull_task is not None:
            pq.pull_task.cancel()

    def _drop(self, pq: ProcessQueue) -> None:
        """Stop consuming ``pq``, then :meth:`_after_drop`."""
        self._pqs.pop(pq.key, None)
        self._release(pq)
        self._queue_log(pq).info("queue_released")
        self._after_drop(pq)

    def _after_drop(self, pq: ProcessQueue) -> None:
        """The last step of :meth:`_drop`: once the callbacks running on ``pq`` ended (or the
        wait for them timed out), :meth:`_queues_released`."""

        async def finish() -> None:
            await self._wait_idle([pq], self.config.shutdown_timeout)
            await self._queues_released([pq])

        self._spawn(finish())

    async def _queues_released(self, pqs: list[ProcessQueue]) -> None:
        """The last step for queues this member stopped consuming (their callbacks ended or
        the wait for them timed out): commit their offsets."""
        for pq in pqs:
            await self._commit(pq)

    @staticmethod
    async def _wait_idle(pqs: list[ProcessQueue], timeout: float) -> None:
        waits = [asyncio.ensure_future(pq.idle.wait()) for pq in pqs if not pq.idle.is_set()]
        if not waits:
            return
        _, not_done = await asyncio.wait(waits, timeout=timeout)
        for w in not_done:
            w.cancel()

    # -- offsets ---------------------------------------------------------------------------------

    async def _persist_loop(self) -> None:
        assert self._stop is not None
        while not self._stop.is_set():
            await asyncio.sleep(self.config.persist_offset_interval)
            for pq in list(self._pqs.values()):
                await self._commit(pq)

    async def _commit(self, pq: ProcessQueue) -> None:
        offset = pq.offset_to_commit()
        conn = pq.conn or self._conn
        if offset == pq.committed or self._conn is None or conn is None:
            return
        if self.local_offsets is not None:
            self.local_offsets.update(pq.key, offset)
            try:
                await asyncio.to_thread(self.local_offsets.persist)
            except OffsetStoreError as exc:
                log.warning("offset_commit_failed", group=self.group, error=str(exc))
                return
            pq.committed = offset
            return
        try:
            await update_committed_offset(conn, self.group, pq.topic, pq.queue_id, offset)
        except TxmqError as exc:
            self._queue_log(pq).warning("offset_commit_failed", offset=offset, error=str(exc))
            return
        pq.committed = offset

    # -- pulling ---------------------------------------------------------------------------------

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        cfg = self.config
        conn = pq.conn or self.connection
        while not pq.dropped:
            if len(pq.msgs) >= cfg.pull_threshold_for_queue:
                pq.space.clear()
                await pq.space.wait()
                continue
            sub = self._subscription_of_queue(pq.topic)
            if sub is None:
                return
            started = time.monotonic()
            try:
                result = await pull_messages(
                    conn,
                    self.group,
                    pq.topic,
                    pq.queue_id,
                    pq.next_offset,
                    max_nums=cfg.pull_batch_size,
                    expression=sub.expression,
                    sub_version=sub.sub_version,
                    suspend=cfg.long_poll_timeout,
                    commit_offset=self._pull_commit_offset(pq),
                )
            except TxmqError as exc:
                if pq.dropped:
                    return
                self._queue_log(pq).info("pull_failed", error=str(exc))
                await self._sleep(cfg.pull_backoff_on_error)
                continue
            if pq.dropped:
                return
            if result.status is PullStatus.OFFSET_ILLEGAL:
                self._queue_log(pq).warning(
                    "pull_offset_moved", offset=pq.next_offset, next_offset=result.next_begin_offset
                )
                pq.offset_moved(result.next_begin_offset)
                continue
            requested = pq.next_offset
            pq.next_offset = result.next_begin_offset
            msgs = [m for m in result.messages if m.queue_offset >= requested]
            if msgs:
                self._dispatch(pq, msgs)
            elif result.status is PullStatus.NO_NEW_MSG and time.monotonic() - started < 0.01:
                # The broker answered at once instead of holding the pull: do not spin.
                await self._sleep(0.05)

    def _pull_commit_offset(self, pq: ProcessQueue) -> int | None:
        """The offset a pull also commits for the group (None: none)."""
        return pq.offset_to_commit()

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True if the consumer stopped meanwhile."""
        assert self._stop is not None
        return await wait_event(self._stop, seconds)

    # -- consuming -------------------------------------------------------------------------------

    def _dispatch(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self._add_pulled(pq, msgs)
        for m in msgs:
            sub = self._wanted(pq, m)
            if sub is None:
                pq.remove(m.queue_offset, self.config.pull_threshold_for_queue)
                continue
            assert sub.callback is not None
            self._hand_over(pq, m, sub.callback, sub.is_async)

    def _add_pulled(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Add messages pulled from ``pq`` to it; those of the retry topic get back the topic
        they were first sent to."""
        if pq.topic == self.retry_topic:
            for m in msgs:
                original = m.properties.get(MessageConst.RETRY_TOPIC)
                if original:
                    m.topic = original
        pq.add(msgs)

    def _wanted(self, pq: ProcessQueue, msg: MessageExt) -> _Subscription | None:
        """The subscription ``msg`` of ``pq`` is for; None (logged) when there is none with a
        callback, or when a retried message no longer matches its subscription (it changed
        since the first delivery)."""
        sub = self._subs.get(msg.topic)
        if sub is None or sub.callback is None:
            self._message_log(msg).warning("message_without_subscription_skipped")
            return None
        sql = expression_type(sub.expression) != "TAG"
        tags = None if sql else parse_subscription(sub.expression)
        if pq.topic == self.retry_topic and tags is not None and msg.tags not in tags:
            return None
        return sub

    def _hand_over(
        self, pq: ProcessQueue, msg: MessageExt, callback: MessageCallback, is_async: bool
    ) -> None:
        """Hand one message to its callback: a task for a coroutine, a worker thread else."""
        pq.begin()
        if is_async:
            self._spawn(self._consume_async(pq, msg, callback))
        else:
            if self._trace is not None:
                self._trace.before(msg)
            self._ensure_workers()
            assert self._workers is not None
            self._workers.submit(pq, msg, callback)

    def _ensure_workers(self) -> None:
        if self._workers is None and any(not s.is_async for s in self._subs.values()):
            self._workers = _SyncWorkers(
                asyncio.get_running_loop(),
                self.config.consume_thread_max,
                f"txmq-consume-{self.group}",
                self._on_sync_result,
                self.group,
            )

    async def _consume_async(
        self, pq: ProcessQueue, msg: MessageExt, callback: MessageCallback
    ) -> None:
        assert self._async_slots is not None
        outcome: object
        async with self._async_slots:
            if pq.dropped:
                outcome = _SKIPPED
            else:
                if self._trace is not None:
                    self._trace.before(msg)
                try:
                    if telemetry.AVAILABLE:
                        with telemetry.process_span(msg, self.group):
                            await callback(msg)
                    else:
                        await callback(msg)
                    outcome = None
                except Exception as exc:  # the callback asked for a retry
                    outcome = exc
        self._settle(pq, msg, outcome)

    def _on_sync_result(self, pq: ProcessQueue, msg: MessageExt, outcome: object) -> None:
        self._settle(pq, msg, outcome)

    def _settle(self, pq: ProcessQueue, msg: MessageExt, outcome: object) -> None:
        if self._trace is not None:
            self._trace.after(msg, None if outcome is _SKIPPED else outcome is None)
        if outcome is None:
            pq.remove(msg.queue_offset, self.config.pull_threshold_for_queue)
            self.consumed_count += 1
            pq.end()
        elif outcome is _SKIPPED:
            pq.end()
        else:
            assert isinstance(outcome, BaseException)
            self._spawn(self._retry_later(pq, msg, outcome))

    async def _retry_later(self, pq: ProcessQueue, msg: MessageExt, error: BaseException) -> None:
        """Return a failed message to the broker; consume it again locally if that fails.
        Broadcasting: consume it again locally, up to ``max_reconsume_times``, then skip it
        with an ERROR line (a broadcast message has no retry topic of its own)."""
        if self.local_offsets is not None:
            await self._retry_locally(pq, msg, error)
            return
        redispatch = False
        try:
            self._message_log(msg).info(
                "message_consume_failed", reconsume_times=msg.reconsume_times, error=repr(error)
            )
            try:
                await self._send_back(pq, msg)
            except TxmqError as exc:
                log.warning("send_back_failed", group=self.group, msg_id=msg.msg_id, error=str(exc))
                if await self._sleep(self.config.send_back_retry_delay) or pq.dropped:
                    return
                msg.reconsume_times += 1
                redispatch = True
                return
            pq.remove(msg.queue_offset, self.config.pull_threshold_for_queue)
            self.consumed_count += 1
            if not any(k.topic == self.retry_topic for k in self._pqs):
                # The retry topic may have just been created: look for its queues now.
                self._request_rebalance()
        finally:
            pq.end()
            if redispatch:
                self._redispatch(pq, msg)

    async def _retry_locally(self, pq: ProcessQueue, msg: MessageExt, error: BaseException) -> None:
        redispatch = False
        try:
            if msg.reconsume_times >= self.max_reconsume_times:
                self._message_log(msg).error(
                    "broadcast_message_skipped", attempts=msg.reconsume_times + 1, error=repr(error)
                )
                pq.remove(msg.queue_offset, self.config.pull_threshold_for_queue)
                return
            self._message_log(msg).info(
                "message_consume_failed", reconsume_times=msg.reconsume_times, error=repr(error)
            )
            if await self._sleep(self.config.send_back_retry_delay) or pq.dropped:
                return
            msg.reconsume_times += 1
            redispatch = True
        finally:
            pq.end()
            if redispatch:
                self._redispatch(pq, msg)

    def _redispatch(self, pq: ProcessQueue, msg: MessageExt) -> None:
        sub = self._subs.get(msg.topic)
        if sub is None or sub.callback is None or pq.dropped:
            return
        self._hand_over(pq, msg, sub.callback, sub.is_async)

    async def _send_back(self, pq: ProcessQueue, msg: MessageExt) -> None:
        header = ConsumerSendMsgBackRequestHeader(
            offset=msg.commit_log_offset,
            group=self.group,
            delay_level=0,
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            unit_mode=False,
            max_reconsume_times=self.max_reconsume_times,
        )
        # To the group that stored the message (the offset is in its commit log).
        await (pq.conn or self.connection).invoke(RequestCode.CONSUMER_SEND_MSG_BACK, header)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


__all__ = [
    "AsyncPushConsumer",
    "ConsumeFrom",
    "MessageCallback",
    "ProcessQueue",
    "allocate_averagely",
    "parse_consume_from",
]
