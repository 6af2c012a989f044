""":class:`MessagingCore`: what a send, a batch, a transaction decision, a delay, a consumer's
send-back and a dead letter do, written once for both front ends.

The front ends (remoting processors, the gRPC service) parse their request, build the
:class:`~txmq.protocol.message.MessageExt` of each message, call the core and translate what it
returns or raises (a :class:`~txmq.protocol.errors.TxmqError`) into their answer.  Nothing here
knows a wire format; everything here is testable without a socket.
"""

from __future__ import annotations

import random
from typing import Any

import structlog

from txmq.protocol.errors import (
    FlushDiskTimeoutError,
    IllegalOperationError,
    MessageIllegalError,
    ProtocolError,
    ServiceNotAvailableError,
    TopicNotExistError,
)
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_batch,
)
from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

from ..context import BrokerContext
from ..delivery import (
    START_DELIVER_TIME,
    TIMER_DEL_UNIQKEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_PROPERTIES,
    DeliveryTimeError,
    check_timer_delay,
    route_to_timer,
    timer_deliver_ms,
)
from ..store import PutMessageResult, TopicConfig
from ..topics import SCHEDULE_TOPIC, TIMER_TOPIC, dlq_topic, retry_topic
from ..transaction.service import TransactionalMessageService
from ..transaction.state import Decision, TxRecord
from .admission import Caller, SendAdmission
from .dedup import DedupIndex, Key, Stored
from .fastpath import FastPaths
from .fastpath_one import HalfSend
from .outcome import SendOutcome, SendReceipt, StoredBatch
from .pop import PopService
from .read import ReadSide
from .timer import TimerService, parse_recall_handle, recall_handle
from .trace import BrokerTrace

__all__ = [
    "START_DELIVER_TIME",
    "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "DeliveryTimeError",
    "MessagingCore",
    "SendOutcome",
    "SendReceipt",
    "StoredBatch",
]

log = structlog.get_logger(__name__)

#: Any of these asks for a delivery time (a plain send has none: one set test skips the rest).
_TIMER_KEYS = frozenset(TIMER_PROPERTIES)


def _first_receipt(key: Key, s: Stored) -> SendReceipt:
    """The receipt of a resend: its first send's."""
    return SendReceipt(
        s.msg_id,
        key[1],
        s.queue_id,
        s.queue_offset,
        s.transaction_id,
        s.end_offset,
        s.commit_log_offset,
    )


def is_transactional(props: dict[str, str]) -> bool:
    return props.get(MessageConst.TRAN_MSG, "").lower() == "true"


class MessagingCore:
    """The broker's use cases over its components (see :mod:`txmq.broker.messaging`)."""

    def __init__(
        self,
        ctx: BrokerContext,
        transactions: TransactionalMessageService,
        trace: BrokerTrace | None = None,
        *,
        timer: TimerService | None = None,
        admission: SendAdmission | None = None,
    ) -> None:
        self.ctx = ctx
        self.tx = transactions
        #: The timer service (recalls go to it).
        self.timer = timer
        #: the broker's message trace (:mod:`.trace`), None when ``traceTopicEnable`` is off;
        #: the transaction service tells the same one of its transactions' steps
        self.trace = trace
        #: SYNC_FLUSH: a request's trace records are fsynced with it, before its answer (under
        #: ASYNC_FLUSH they are appended at the end of the loop turn that handled it)
        self.trace_waits = self.trace if ctx.config.sync_flush else None
        cfg = ctx.config
        self.dedup = DedupIndex(
            cfg.duplicate_window_seconds * 1000,
            cfg.duplicate_window_max_entries,
            ctx.metrics,
            ctx.store.lookup_message,
        )
        #: the ACL and quotas a send is admitted by (:mod:`.admission`), None when neither
        #: is in force
        self.admission = admission
        #: the direct paths (:mod:`.fastpath`), behind :meth:`send_direct` and
        #: :meth:`send_batch`
        self.fast = FastPaths(ctx, transactions, self.dedup, trace)
        #: the read side: pulls, and what every read counts (metrics, trace)
        self.reads = ReadSide(ctx, self.trace)
        #: POP consumption (the read side of RocketMQ 5 clients, both front ends)
        self.pop = PopService(ctx, self.dead_letter_now, self.reads)

    def recover(self) -> int:
        """After the store is open: rebuild what is derived from the commit log (the
        idempotent-send window, POP consumption's state)."""
        self.pop.recover()
        return self.dedup.rebuild(self.ctx.store, self.ctx.now_ms())

    # -- validation and routing ----------------------------------------------------------------

    def check_body(self, body: bytes) -> None:
        limit = self.ctx.config.max_message_size
        if len(body) > limit:
            raise MessageIllegalError(
                f"message body size {len(body)} exceeds the limit of {limit} bytes (maxMessageSize)"
            )

    async def topic_for_send(self, topic: str, queue_nums: int) -> TopicConfig:
        """The topic's config, created if the broker auto-creates topics; a creation is durable
        before this returns (the send that created it is answered after)."""
        tc = self.ctx.topics.for_send(topic, queue_nums)
        if self.ctx.topics.table.dirty:
            await self.ctx.persist_topics()
        return tc

    @staticmethod
    def queue_id(requested: int, write_queues: int, topic: str) -> int:
        """The queue a send goes to: the requested one (checked), any when none is asked."""
        if requested < 0:
            return random.randrange(write_queues)
        if requested >= write_queues:
            raise MessageIllegalError(
                f"request queueId[{requested}] is illegal, topic {topic} has {write_queues} "
                "write queues"
            )
        return requested

    def prepare(self, msg: MessageExt, producer_group: str) -> None:
        """Turn an incoming message into what is stored: a half message of a transaction
        (``TRAN_MSG``), or a plain one routed through the delay levels when it asks for a
        delay or a delivery time.

        Raises:
            MessageIllegalError: the sys flag contradicts the properties, or a delay is bad.
            NoPermissionError: transactional messages are refused on this broker.
        """
        if is_transactional(msg.properties):
            self.tx.prepare_half(msg, producer_group)
            return
        if MessageSysFlag.transaction_value(msg.sys_flag) != MessageSysFlag.TRANSACTION_NOT_TYPE:
            raise MessageIllegalError("sysFlag marks a transaction but TRAN_MSG is not set")
        self.route_delay(msg)

    def deliver_at(self, msg: MessageExt, deliver_ms: int) -> None:
        """Ask for ``msg`` to be delivered at ``deliver_ms`` (epoch ms), exactly: the timer
        (:mod:`.timer`) stores it in the real topic then.  A time not in the future asks for
        nothing.

        Raises:
            DeliveryTimeError: the time is further ahead than ``timerMaxDelaySec``.
        """
        now = self.ctx.now_ms()
        if deliver_ms <= now:
            return
        check_timer_delay(deliver_ms, now, self.ctx.config.timer_max_delay_sec)
        msg.properties[TIMER_DELIVER_MS] = str(deliver_ms)

    def _timer_deliver_ms(self, props: dict[str, str]) -> int | None:
        """The delivery time a message's timer properties ask for (epoch ms), or None."""
        return timer_deliver_ms(props, self.ctx.now_ms())

    def route_delay(self, msg: MessageExt) -> None:
        """Route a message with a ``DELAY`` level to the schedule topic (RocketMQ's scheme:
        queue ``level - 1``, the real topic and queue in properties), one with a delivery time
        still ahead to the timer topic."""
        props = msg.properties
        if TIMER_DEL_UNIQKEY in props:  # a single send's marker recalls (:meth:`_send_one`)
            raise MessageIllegalError(
                f"{TIMER_DEL_UNIQKEY} (recalling a timer message) is served for one message "
                "sent alone, not in a batch or a transaction"
            )
        if MessageConst.DELAY not in props:
            if _TIMER_KEYS.isdisjoint(props):
                return  # the usual message: no delay asked for
            deliver = self._timer_deliver_ms(props)
            if deliver is None or deliver <= self.ctx.now_ms():
                return  # no time asked, or due already
            self.deliver_at(msg, deliver)
            route_to_timer(msg, deliver)
            return
        level_s = props[MessageConst.DELAY]
        try:
            level = int(level_s)
        except ValueError:
            raise MessageIllegalError(f"DELAY property {level_s!r} is not a level number") from None
        if level <= 0:
            props.pop(MessageConst.DELAY, None)
            return
        level = min(level, len(self.ctx.delay_levels))
        props[MessageConst.DELAY] = str(level)
        props[MessageConst.REAL_TOPIC] = msg.topic
        props[MessageConst.REAL_QID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1

    # -- sends ---------------------------------------------------------------------------------

    def _receipt(self, msg: MessageExt, r: PutMessageResult) -> SendReceipt:
        props = msg.properties
        half = msg.topic == self.tx.half_topic
        handle = ""
        if msg.topic == TIMER_TOPIC:
            real = props.get(MessageConst.REAL_TOPIC, "")
            uniq = props.get(MessageConst.UNIQ_KEY)
            if uniq and not real.startswith(RETRY_GROUP_TOPIC_PREFIX):
                handle = recall_handle(
                    real, self.ctx.config.broker_name, int(props[TIMER_DELIVER_MS]), uniq
                )
        return SendReceipt(
            offset_msg_id=r.offset_msg_id,
            uniq_key=props.get(MessageConst.UNIQ_KEY, ""),
            queue_id=int(props.get(MessageConst.REAL_QID, msg.queue_id))
            if half or msg.topic in (SCHEDULE_TOPIC, TIMER_TOPIC)
            else msg.queue_id,
            queue_offset=r.queue_offset,
            transaction_id=self.tx.transaction_id_of(props) if half else None,
            end_offset=r.end_offset,
            commit_log_offset=r.commit_log_offset,
            recall_handle=handle,
        )

    def durable_at_once(self) -> bool:
        """Whether what a send stores is durable as soon as it is written (ASYNC_FLUSH, no
        replication, no trace records to wait for): :meth:`durable` would return at once."""
        flush = self.ctx.flush
        return self.trace_waits is None and not flush.sync and flush.replication is None

    async def durable(self, outcome: SendOutcome) -> SendOutcome:
        """Wait until everything ``outcome`` stored is durable (flushed, replicated) under the
        flush mode in force; a timeout is reported in the outcome, not raised."""
        end = outcome.end_offset
        if self.trace_waits is not None and (written := self.trace_waits.written()) is not None:
            traced = await written  # the request's trace records, durable with it
            end = traced if end is None else max(end, traced)
        if end is not None:
            try:
                await self.ctx.flush.wait_durable(end)
            except FlushDiskTimeoutError as exc:
                outcome.flush_error = exc
        return outcome

    def store_prepared(self, msgs: list[MessageExt]) -> list[SendReceipt]:
        """Store prepared messages (:meth:`prepare`) in one append; halves join their
        transactions.  Not yet durable: see :meth:`durable`."""
        results = self.ctx.write.put_messages(msgs)
        half_topic = self.tx.half_topic
        if len(msgs) == 1:
            m, r = msgs[0], results[0]
            if m.topic == half_topic:
                self.tx.on_halves_stored(msgs, results)
            receipts = [self._receipt(m, r)]
        else:
            halves = [(m, r) for m, r in zip(msgs, results, strict=True) if m.topic == half_topic]
            if halves:
                self.tx.on_halves_stored([m for m, _ in halves], [r for _, r in halves])
            receipts = [self._receipt(m, r) for m, r in zip(msgs, results, strict=True)]
        if self.trace is not None:
            self.trace.stored(msgs, receipts)
        return receipts

    def _remember(self, keys: list[Key | None], receipts: list[SendReceipt], now: int) -> None:
        add = self.dedup.add
        for key, r in zip(keys, receipts, strict=True):
            add(key, r.commit_log_offset, now)

    def _first_sends(self, keys: list[Key | None]) -> list[SendReceipt | None]:
        """The receipts of the messages of ``keys`` stored before within the window."""
        now = self.ctx.now_ms()
        get = self.dedup.get
        out: list[SendReceipt | None] = []
        for key in keys:
            s = get(key, now)
            out.append(None if s is None or key is None else _first_receipt(key, s))
        return out

    async def send(
        self, msgs: list[MessageExt], producer_group: str, caller: Caller | None = None
    ) -> SendOutcome:
        """Prepare, store and make durable the messages of one request (all or none is
        stored: every message is prepared before the first is stored).  A message stored
        before within the duplicate window (a resend) is not stored again: its receipt is the
        first send's (:mod:`.dedup`).  ``caller``: admitted first, unless it was (the front
        ends admit it before they look a topic up, :meth:`admit`)."""
        if caller is not None and not caller.admitted:
            halves = any(is_transactional(m.properties) for m in msgs)
            await self.admit(caller, [m.topic for m in msgs], producer_group if halves else "")
        dedup = self.dedup
        if len(msgs) == 1:
            return await self._send_one(msgs[0], producer_group)
        keys = [dedup.key(m.topic, m.properties) for m in msgs]
        if not any(keys):
            for m in msgs:
                self.prepare(m, producer_group)
            return await self.durable(SendOutcome(self.store_prepared(msgs)))
        first = self._first_sends(keys)
        # A message repeated inside the request is stored once too: later copies take the
        # receipt of the first (``again``: its index in the request).
        at: dict[Key, int] = {}
        again: dict[int, int] = {}
        for i, (k, f) in enumerate(zip(keys, first, strict=True)):
            if f is None and k is not None:
                if k in at:
                    again[i] = at[k]
                else:
                    at[k] = i
        new = [i for i, f in enumerate(first) if f is None and i not in again]
        for i in new:
            self.prepare(msgs[i], producer_group)
        stored = self.store_prepared([msgs[i] for i in new]) if new else []
        if stored:
            self._remember([keys[i] for i in new], stored, self.ctx.now_ms())
        receipts: list[SendReceipt | None] = list(first)
        for i, r in zip(new, stored, strict=True):
            receipts[i] = r
        for i, j in again.items():
            receipts[i] = receipts[j]
        return await self.durable(SendOutcome([r for r in receipts if r is not None]))

    async def _send_one(self, msg: MessageExt, producer_group: str) -> SendOutcome:
        """:meth:`send` of one message: one key, one lookup, one insert."""
        if TIMER_DEL_UNIQKEY in msg.properties and not is_transactional(msg.properties):
            return await self._recall_marker(msg)
        dedup = self.dedup
        key = dedup.key(msg.topic, msg.properties)
        if key is not None:
            s = dedup.get(key, self.ctx.now_ms())
            if s is not None:
                return await self.durable(SendOutcome([_first_receipt(key, s)]))
        self.prepare(msg, producer_group)
        stored = self.store_prepared([msg])
        if key is not None:  # remembered at its store timestamp, as a rebuild finds it
            dedup.add(key, stored[0].commit_log_offset, msg.store_timestamp)
        return await self.durable(SendOutcome(stored))

    async def _recall_marker(self, msg: MessageExt) -> SendOutcome:
        """A message carrying ``TIMER_DEL_UNIQKEY`` (``<topic>+<UNIQ_KEY>``) and the recalled
        timer's ``TIMER_DELIVER_MS``: RocketMQ 5's marker that recalls a pending timer
        message.  The answer is the recall record's, with the recalled message's id."""
        props = msg.properties
        topic, sep, uniq = props[TIMER_DEL_UNIQKEY].partition("+")
        if not sep or topic != msg.topic or not uniq:
            raise MessageIllegalError(
                f"{TIMER_DEL_UNIQKEY} {props[TIMER_DEL_UNIQKEY]!r} is not <topic>+<message id> "
                f"of this message's topic {msg.topic}"
            )
        try:
            deliver = int(props.get(TIMER_DELIVER_MS, ""))
        except ValueError:
            raise MessageIllegalError(
                f"{TIMER_DEL_UNIQKEY} needs the recalled message's {TIMER_DELIVER_MS}"
            ) from None
        r = self._recall(topic, uniq, deliver)
        receipt = SendReceipt(
            r.offset_msg_id if r is not None else "",
            uniq,
            0,
            r.queue_offset if r is not None else 0,
            None,
            r.end_offset if r is not None else self.ctx.store.max_phy_offset,
            r.commit_log_offset if r is not None else 0,
        )
        return await self.durable(SendOutcome([receipt]))

    def _recall(self, topic: str, uniq: str, deliver_ms: int) -> PutMessageResult | None:
        timer = self.timer
        if timer is None:
            raise ServiceNotAvailableError("recall failed, the timer service is not running")
        return timer.recall(topic, uniq, deliver_ms)

    async def recall(self, topic: str, handle: str) -> str:
        """Recall the pending timer message a recall handle names (RocketMQ 5.3's
        RECALL_MESSAGE / RecallMessage): it is never delivered.  Returns its message id once
        the recall is durable.

        Raises:
            TopicNotExistError: ``topic`` does not exist.
            IllegalOperationError: the handle is invalid, of another topic or broker, or the
                message's time has passed (it was delivered).
            QueryNotFoundError: no such timer message is pending.
            FlushDiskTimeoutError: the recall was not durable in time.
        """
        if self.ctx.topics.get(topic) is None:
            raise TopicNotExistError(f"recall failed, the topic[{topic}] not exist")
        h_topic, broker, ts, uniq = parse_recall_handle(handle)
        if h_topic != topic:
            raise IllegalOperationError(
                f"recall failed, topic not match: the handle is of topic {h_topic}"
            )
        name = self.ctx.config.broker_name
        if broker != name:
            raise IllegalOperationError(
                f"recall failed, the handle is of broker {broker}, this is {name}"
            )
        try:
            deliver = int(ts)
        except ValueError:
            raise IllegalOperationError("recall failed, timestamp invalid") from None
        r = self._recall(topic, uniq, deliver)
        await self.ctx.flush.wait_durable(
            r.end_offset if r is not None else self.ctx.store.max_phy_offset
        )
        return uniq

    async def admit(self, caller: Caller, topics: list[str], group: str = "") -> None:
        """The first step of a send: its permission and produce quota (:mod:`.admission`),
        before its topic is looked up or created; once per request.

        Raises:
            AclDenied: the caller may not send to a topic or as the group.
            SystemBusyError: the caller's produce quota is exhausted.
        """
        if self.admission is not None:
            await self.admission.admit(caller, topics, group)

    async def send_direct(
        self,
        v2: bool,
        ext: dict[str, Any],
        body: bytes,
        born_host: tuple[str, int],
        caller: Caller | None = None,
    ) -> SendOutcome | None:
        """The send use case of a SEND_MESSAGE(_V2) request as it came (its header fields and
        body), through the one seam of the direct paths (:class:`~.fastpath.FastPaths`): a
        plain message or a half stored from its header -- the same record, the same answer,
        the duplicate window and the trace told -- and durable.  None: no direct path takes
        it, nothing was stored; the front end translates the request and calls :meth:`send`.

        Raises:
            TxmqError: as :meth:`topic_for_send` and :meth:`queue_id`.
        """
        fast = self.fast
        p = fast.read_one(v2, ext, body)
        if p is None:
            return None
        if caller is not None:
            await self.admit(caller, [p.topic], p.group if p.__class__ is HalfSend else "")
        # topic_for_send, inline (one coroutine less per send on the hottest path)
        topics = self.ctx.topics
        tc = topics.for_send(p.topic, p.queue_nums)
        if topics.table.dirty:
            await self.ctx.persist_topics()
        outcome = fast.try_store(
            p, self.queue_id(p.queue_id, tc.write_queue_nums, p.topic), born_host
        )
        if outcome is None or self.durable_at_once():
            return outcome
        return await self.durable(outcome)

    async def send_batch(
        self,
        h: SendMessageRequestHeader,
        queue_id: int,
        body: bytes,
        born_host: tuple[str, int],
        caller: Caller | None = None,
    ) -> SendOutcome:
        """A SEND_BATCH_MESSAGE body: plain messages, or the halves of one transaction.

        The direct paths (:mod:`.fastpath`) store it straight from the body when they can (the
        same bytes as the generic path); otherwise each entry becomes a message here.  A resend of a batch
        stored within the duplicate window is answered with the first send's receipts.

        Raises:
            MessageIllegalError: the body is malformed, empty, mixes plain messages and halves
                (or halves of several transactions), a body is too large, or a plain message
                has a delay.
        """
        if caller is not None and not caller.admitted:
            prepared = h.sys_flag & MessageSysFlag.TRANSACTION_PREPARED_TYPE
            await self.admit(caller, [h.topic], h.producer_group if prepared else "")
        fast = self.fast
        batch = fast.read_batch(h, queue_id, body, born_host)
        outcome = fast.try_store(batch, queue_id, born_host) if batch is not None else None
        if outcome is None:
            # No direct path, or a resend (or partly one, or a message twice): the generic
            # path stores what is new, once.
            msgs = self.batch_messages(h, queue_id, body, born_host, prepare=False)
            return await self.send(msgs, h.producer_group, caller)
        return await self.durable(outcome)

    def batch_messages(
        self,
        h: SendMessageRequestHeader,
        qid: int,
        data: bytes,
        born_host: tuple[str, int],
        *,
        prepare: bool = True,
    ) -> list[MessageExt]:
        """The messages of a SEND_BATCH_MESSAGE body, checked (halves prepared unless
        ``prepare`` is False: :meth:`send` prepares them)."""
        tx = self.tx
        try:
            entries = decode_batch(data)
        except ProtocolError as exc:
            raise MessageIllegalError(f"bad batch body: {exc}") from None
        if not entries:
            raise MessageIllegalError("the batch is empty")
        transactional = is_transactional(entries[0][2])
        txid = tx.transaction_id_of(entries[0][2]) if transactional else None
        msgs = []
        for body, flag, props in entries:
            self.check_body(body)
            if is_transactional(props) != transactional or (
                transactional and tx.transaction_id_of(props) != txid
            ):
                raise MessageIllegalError(
                    "a batch is either plain or the half messages of one transaction (same "
                    "transaction id); this one mixes them"
                )
            if props.get(MessageConst.DELAY) and not transactional:
                raise MessageIllegalError("delayed messages cannot be sent as a batch")
            msg = MessageExt(
                topic=h.topic,
                body=body,
                queue_id=qid,
                flag=flag,
                sys_flag=h.sys_flag & ~0xC,
                born_timestamp=h.born_timestamp,
                born_host=born_host,
                reconsume_times=h.reconsume_times or 0,
                properties=props,
            )
            if transactional and prepare:
                tx.prepare_half(msg, h.producer_group)
            msgs.append(msg)
        return msgs

    # -- transactions --------------------------------------------------------------------------

    async def end_transaction(
        self, rec: TxRecord, decision: Decision, *, from_check: bool, remark: str = ""
    ) -> str:
        """A producer's (or a check answer's) decision on ``rec``, durable before this
        returns; the text tells what happened.  UNKNOWN leaves the transaction as it is.

        Raises:
            IllegalOperationError: ``rec`` already has the other outcome.
            FlushDiskTimeoutError: the decision was not durable in time.
        """
        m = self.ctx.metrics
        if from_check:
            m.tx_checks_answered.inc()
            if rec.state.decided:
                m.tx_checks_unexpected.inc()
            rec.check_in_flight = False
        if self.trace is not None:
            self.trace.end_transaction(rec, decision.name, from_check)
        if decision == Decision.UNKNOWN:
            log.info(
                "transaction_unknown",
                transaction_id=rec.transaction_id,
                from_check=from_check,
                remark=remark,
            )
            return f"transaction {rec.transaction_id} stays {rec.state.value}"
        return await self.decide(rec, decision, "check" if from_check else "producer", remark)

    async def decide(self, rec: TxRecord, decision: Decision, by: str, remark: str = "") -> str:
        """Commit or roll back ``rec`` (first decision wins) and wait until it is durable."""
        already = rec.state.decided
        end = self.tx.decide(rec, decision, by, remark)
        if self.trace_waits is not None and (written := self.trace_waits.written()) is not None:
            end = max(end, await written)
        await self.ctx.flush.wait_durable(end)
        return (
            f"transaction {rec.transaction_id} {'was already ' if already else ''}{rec.state.value}"
        )

    # -- redelivery ----------------------------------------------------------------------------

    @staticmethod
    def _copy_for(topic: str, orig: MessageExt, reconsume_times: int) -> MessageExt:
        """A copy of ``orig`` for ``topic`` (retry or dead-letter), its origin recorded."""
        props = dict(orig.properties)
        props.setdefault(MessageConst.RETRY_TOPIC, orig.topic)
        props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, orig.msg_id)
        props.pop(MessageConst.DELAY, None)
        return MessageExt(
            topic=topic,
            body=orig.body,
            queue_id=0,
            flag=orig.flag,
            sys_flag=orig.sys_flag & ~0xC,
            born_timestamp=orig.born_timestamp,
            born_host=orig.born_host,
            reconsume_times=reconsume_times,
            properties=props,
        )

    def dead_letter_now(self, group: str, orig: MessageExt, attempts: int) -> SendReceipt:
        """Store a copy of ``orig`` in ``%DLQ%<group>`` (not yet durable, the topic's creation
        written by the next housekeeping: for callers that cannot wait)."""
        topic = dlq_topic(group)
        self.ctx.topics.ensure(topic, 1)
        log.warning(
            "message_dead_lettered", group=group, msg_id=orig.msg_id, reconsume_times=attempts
        )
        self.ctx.metrics.dead_lettered.labels(group).inc()
        return self.store_prepared([self._copy_for(topic, orig, attempts)])[0]

    async def dead_letter(self, group: str, orig: MessageExt, attempts: int) -> SendReceipt:
        """Park ``orig`` in ``%DLQ%<group>`` (durable before this returns)."""
        receipt = self.dead_letter_now(group, orig, attempts)
        await self.ctx.persist_topics()
        outcome = await self.durable(SendOutcome([receipt]))
        if outcome.flush_error is not None:
            raise outcome.flush_error
        return outcome.receipts[0]

    async def send_back(
        self,
        group: str,
        orig: MessageExt,
        *,
        delay_level: int,
        max_reconsume_times: int | None,
        origin_msg_id: str | None = None,
    ) -> SendReceipt:
        """A consumer could not process ``orig``: deliver it again later through
        ``%RETRY%<group>`` with growing delays, or park it in ``%DLQ%<group>`` once it has
        been tried ``max_reconsume_times`` times (or ``delay_level`` < 0)."""
        max_times = (
            max_reconsume_times
            if max_reconsume_times is not None
            else self.ctx.config.max_reconsume_times
        )
        if origin_msg_id:
            orig.properties.setdefault(MessageConst.ORIGIN_MESSAGE_ID, origin_msg_id)
        times = orig.reconsume_times + 1
        if self.trace is not None:
            self.trace.sent_back(group, orig, times > max_times or delay_level < 0)
        if times > max_times or delay_level < 0:
            return await self.dead_letter(group, orig, times)
        topic = retry_topic(group)
        self.ctx.topics.ensure(topic, 1)
        await self.ctx.persist_topics()
        msg = self._copy_for(topic, orig, times)
        level = delay_level if delay_level > 0 else 3 + orig.reconsume_times
        msg.properties[MessageConst.DELAY] = str(level)
        self.route_delay(msg)
        outcome = await self.durable(SendOutcome(self.store_prepared([msg])))
        if outcome.flush_error is not None:
            raise outcome.flush_error
        return outcome.receipts[0]
