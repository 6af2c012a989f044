"""The broker's own message trace (``traceTopicEnable``): what it stored, every step of a
transaction's life and each send-back, written to the trace topic in RocketMQ's encoding
(:mod:`txmq.protocol.trace`), read with ``txmq trace <msgId>``.

What is recorded, and where the hook is:

* ``Pub``: every message a producer's request stored (halves as ``Trans_Msg_Half``, delayed
  and timer messages as ``Delay_Msg``) -- :class:`~.core.MessagingCore`;
* ``EndTransaction``: a producer's decision or a check-back's answer, UNKNOW included
  (``fromTransactionCheck`` tells which) -- :meth:`~.core.MessagingCore.end_transaction`;
* ``TxEvent`` (txmq's type): a check-back delivered (to which client, the how-many-th), the
  decision applied with its source (``producer``, ``check``, ``operator``, ``batch``), the
  check budget running out (``timed-out``), an operator's resume --
  :class:`~txmq.broker.transaction.service.TransactionalMessageService`;
* ``SubBefore``: a pull served a message to a consumer group (requestId ``pull``) --
  :class:`~txmq.broker.processors.pull.PullMessageProcessor`;
* ``SubAfter`` (success false): a consumer group sent a message back (retry or dead letter),
  or a RocketMQ 5 client forwarded one to the dead-letter queue or changed its invisible
  duration (requestId ``invisible``: delivered again later) over gRPC; (success true, requestId
  ``ack``) a RocketMQ 5 client acked it -- :mod:`txmq.broker.messaging.pop`.

The hooks only append a small tuple or record to a list (when tracing is off they are not
called: the owner holds None and checks it once); the records are encoded at the write, in
bulk.  Under ``SYNC_FLUSH`` they are appended to the trace topic in one write per turn of the
event loop, for all the requests of that turn: a request whose records are pending waits for
that write (:meth:`BrokerTrace.written`) and its answer waits for the fsync that covers them:
what a client was told is traced is durable when its answer is.  Under ``ASYNC_FLUSH`` nobody
waits: the records of :data:`ASYNC_INTERVAL` seconds are appended in one write (a crash within
that time may lose them), so a light load does not pay a trace write per request.  Events of no
request (checks, time-outs) are written the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from txmq.protocol.message import MessageConst, MessageExt, decode_messages
from txmq.protocol.trace import (
    DEFAULT_REGION,
    MessageType,
    TraceRecord,
    TraceType,
    TxEvent,
    encode,
    keys_of,
)

from ..topics import RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..transaction.state import HalfRef, TxRecord
    from .fastpath_one import PlainSend

log = structlog.get_logger(__name__)


class SendReceipt(Protocol):
    """What the trace reads of a stored message's receipt (:class:`.core.SendReceipt`)."""

    @property
    def uniq_key(self) -> str: ...
    @property
    def offset_msg_id(self) -> str: ...
    @property
    def transaction_id(self) -> str | None: ...


class StoredBatch(Protocol):
    """What the trace reads of a batch the direct paths stored (:class:`.outcome.StoredBatch`)."""

    @property
    def msg_id_prefix(self) -> str: ...
    @property
    def placed(self) -> list[tuple[int, int, int]]: ...
    @property
    def uniq_keys(self) -> list[str]: ...
    @property
    def transaction_id(self) -> str | None: ...


#: Under ``ASYNC_FLUSH``: how long records wait to be written together (s).
ASYNC_INTERVAL = 0.01
#: Largest trace message body (RocketMQ's trace dispatcher: 128,000 bytes).
MAX_BODY = 128_000
#: Most records in one trace message (RocketMQ's dispatcher sends up to 100): each trace
#: message costs a store record, a consume-queue entry and an index pass, so the fewer the
#: better; each record adds a key or more that the message index reads.
MAX_RECORDS = 100
#: The TAGS of trace messages holding txmq's own ``TxEvent`` records (RocketMQ's readers can
#: skip them by tag).
TX_EVENT_TAG = "TxEvent"

_STATE_NAMES = {"COMMIT": "COMMIT_MESSAGE", "ROLLBACK": "ROLLBACK_MESSAGE", "UNKNOWN": "UNKNOW"}


class BrokerTrace:
    """Collects trace records and writes them to the trace topic in batches."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        cfg = ctx.config
        self.topic = cfg.msg_trace_topic_name
        ctx.topics.ensure(self.topic, 1)
        host, port = ctx.store_host
        self.store_host = f"{host}:{port}"
        #: stored messages, made into records when written: (messages, receipts)
        self._stored: list[tuple[list[MessageExt], Sequence[SendReceipt]]] = []
        #: single sends stored from their header: (store timestamp, the send, its offset,
        #: the message-id prefix)
        self._plain: list[tuple[int, PlainSend, int, str]] = []
        #: batches the fast paths stored: (time, topic, group, batch)
        self._batches: list[tuple[int, str, str, StoredBatch]] = []
        #: pull answers served: (time, consumer group, the stored records sent)
        self._delivered: list[tuple[int, str, bytes | bytearray | memoryview]] = []
        #: every other record, in the order of the events
        self._records: list[TraceRecord] = []
        self._written: asyncio.Future[int] | None = None
        #: ``ASYNC_FLUSH``: the records of an interval are written together; ``SYNC_FLUSH``:
        #: at the end of the loop turn (requests wait for them)
        self._delay = 0.0 if cfg.sync_flush else ASYNC_INTERVAL
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        #: trace messages written (tests, metrics)
        self.messages_written = 0
        self.records_written = 0

    # -- hooks ----------------------------------------------------------------------------------

    def stored(self, msgs: list[MessageExt], receipts: Sequence[SendReceipt]) -> None:
        """A request stored ``msgs`` (in the store's form: halves in the half topic)."""
        if msgs[0].topic != self.topic:  # a client's own trace messages are not traced
            self._stored.append((msgs, receipts))  # timed by their store timestamps
            if self._written is None:
                self._schedule()

    def stored_plain(self, p: PlainSend, phy: int, store_timestamp: int, prefix: str) -> None:
        """The single-send path stored ``p`` at commit-log offset ``phy`` (no message object)."""
        if p.topic != self.topic:
            self._plain.append((store_timestamp, p, phy, prefix))
            if self._written is None:
                self._schedule()

    def stored_batch(self, topic: str, group: str, batch: StoredBatch) -> None:
        """The batch fast paths stored ``batch`` (no message objects)."""
        if topic != self.topic:
            self._batches.append((self.ctx.now_ms(), topic, group, batch))
            self._schedule()

    def end_transaction(self, rec: TxRecord, state: str, from_check: bool) -> None:
        """A producer's decision, or its answer to a check (``state``: COMMIT, ROLLBACK,
        UNKNOWN)."""
        self._per_half(
            rec,
            TraceType.END_TRANSACTION,
            msg_type=MessageType.TRANS_HALF,
            transaction_state=_STATE_NAMES.get(state, state),
            from_transaction_check=from_check,
        )

    def tx_event(self, rec: TxRecord, event: TxEvent, detail: str = "") -> None:
        """A step of ``rec``'s life on the broker."""
        self._per_half(
            rec,
            TraceType.TX_EVENT,
            event=str(event),
            detail=detail.replace("\x01", " ").replace("\x02", " "),
        )

    def _per_half(self, rec: TxRecord, kind: TraceType, **fields: Any) -> None:
        """One ``kind`` record per half of ``rec`` (one without a message when it has none)."""
        now = self.ctx.now_ms()
        for h in _halves(rec):
            self._records.append(
                TraceRecord(
                    kind,
                    timestamp=now,
                    group=rec.producer_group,
                    topic=h.real_topic if h is not None else "",
                    msg_id=h.uniq_key if h is not None else "",
                    store_host=self.store_host,
                    transaction_id=rec.transaction_id,
                    **fields,
                )
            )
        self._schedule()

    def check_sent(self, rec: TxRecord, client_id: str) -> None:
        self.tx_event(rec, TxEvent.CHECK_SENT, f"to {client_id}, check {rec.check_times + 1}")

    def delivered(self, group: str, records: bytes | bytearray | memoryview) -> None:
        """A pull served ``records`` (stored messages back to back) to consumer ``group``:
        a SubBefore record per message, made when written."""
        self._delivered.append((self.ctx.now_ms(), group, records))
        self._schedule()

    def sent_back(self, group: str, orig: MessageExt, dead_letter: bool) -> None:
        """A consumer group could not process ``orig``: it goes to retry or dead letter."""
        self._records.append(
            TraceRecord(
                TraceType.SUB_AFTER,
                timestamp=self.ctx.now_ms(),
                group=group,
                request_id="dlq" if dead_letter else "retry",
                msg_id=orig.properties.get(MessageConst.UNIQ_KEY) or orig.msg_id,
                success=False,
                keys=orig.properties.get(MessageConst.KEYS, ""),
            )
        )
        self._schedule()

    def settled(self, group: str, msg_id: str, how: str, success: bool) -> None:
        """A RocketMQ 5 client of ``group`` settled ``msg_id`` over gRPC (``how``: ``ack``,
        or ``invisible``: its invisible duration changed, to be delivered again later)."""
        if "\x01" in msg_id or "\x02" in msg_id:  # a client's id that the encoding cannot hold
            return
        self._records.append(
            TraceRecord(
                TraceType.SUB_AFTER,
                timestamp=self.ctx.now_ms(),
                group=group,
                request_id=how,
                msg_id=msg_id,
                success=success,
            )
        )
        self._schedule()

    # -- writing --------------------------------------------------------------------------------

    def written(self) -> asyncio.Future[int] | None:
        """What a request waits for before it is answered: the write of the records pending
        (its result: the commit-log offset after them), or None when none is pending."""
        return self._written

    def _schedule(self) -> None:
        if self._written is None:
            loop = asyncio.get_running_loop()
            self._written = loop.create_future()
            self._timer = (
                loop.call_later(self._delay, self.flush)
                if self._delay
                else loop.call_soon(self.flush)
            )

    def flush(self) -> int:
        """Write what is pending now (in one append); returns the commit-log offset after it
        (or the store's end when nothing was pending)."""
        if self._timer is not None:  # called directly (at shutdown): the timer is done with
            self._timer.cancel()
            self._timer = None
        fut, self._written = self._written, None
        end = self.ctx.store.max_phy_offset
        try:
            # Pub and SubBefore records: their text and keys in two lists, cut in slices of
            # MAX_RECORDS (the common case: no object or tuple per record)
            texts: list[str] = []
            keys: list[str] = []
            self._pub_texts(texts, keys)
            self._delivery_texts(texts, keys)
            msgs: list[MessageExt] = []
            for i in range(0, len(texts), MAX_RECORDS):
                part, part_keys = texts[i : i + MAX_RECORDS], keys[i : i + MAX_RECORDS]
                if sum(map(len, part)) <= MAX_BODY:
                    msgs.append(self._message(part, part_keys, False))
                else:  # long keys or tags: cut by size
                    items = [(t, k, False) for t, k in zip(part, part_keys, strict=True)]
                    msgs.extend(self._message(*_split(c)) for c in _chunks(items))
            items = [(encode(r), keys_of([r]), r.type is TraceType.TX_EVENT) for r in self._records]
            msgs.extend(self._message(*_split(c)) for c in _chunks(items))
            if msgs:
                end = self.ctx.write.put_messages(msgs)[-1].end_offset
                self.messages_written += len(msgs)
                self.records_written += len(texts) + len(items)
        except Exception as exc:  # a full disk, say: the trace is best effort, never in the way
            log.warning("trace_write_failed", error=repr(exc))
        finally:
            self._stored, self._batches, self._delivered, self._records = [], [], [], []
            self._plain = []
            if fut is not None and not fut.done():
                fut.set_result(end)
        return end

    def _message(self, texts: list[str], keys: list[str], tx_event: bool) -> MessageExt:
        # the index ignores empty and repeated keys
        props = {MessageConst.KEYS: " ".join(keys)}
        if tx_event:
            props[MessageConst.TAGS] = TX_EVENT_TAG
        return MessageExt(
            topic=self.topic,
            body="".join(texts).encode("utf-8"),
            queue_id=0,
            born_timestamp=self.ctx.now_ms(),
            born_host=self.ctx.store_host,
            properties=props,
        )

    def _delivery_texts(self, texts: list[str], found_by: list[str]) -> None:
        """The SubBefore records of the deliveries: their texts and keys appended."""
        text, key = texts.append, found_by.append
        for now, group, records in self._delivered:
            for m in decode_messages(records):
                msg_id = m.properties.get(UNIQ_KEY) or m.msg_id
                keys = m.properties.get(KEYS, "")
                text(
                    f"SubBefore\x01{now}\x01{DEFAULT_REGION}\x01{group}\x01pull\x01{msg_id}"
                    f"\x01{m.reconsume_times}\x01{keys}\x02"
                )
                key(f"{msg_id} {keys}")

    def _pub_texts(self, texts: list[str], found_by: list[str]) -> None:
        """The Pub records of the messages stored, encoded as RocketMQ's client encodes them
        (written out here: one string per message, no record object; property values, topics
        and ids never hold the separators): their texts and keys appended."""
        tail = f"\x01{self.store_host}\x01"
        text, key = texts.append, found_by.append
        for msgs, receipts in self._stored:
            for m, r in zip(msgs, receipts, strict=True):
                get = m.properties.get
                topic = m.topic
                if topic == RMQ_SYS_TRANS_HALF_TOPIC:
                    kind, topic = 1, get(REAL_TOPIC, "")
                elif topic in _DELAY_TOPICS:
                    kind, topic = 3, get(REAL_TOPIC, "")
                else:
                    kind = 0
                offset_id = r.offset_msg_id
                msg_id = r.uniq_key or offset_id
                keys = get(KEYS, "")
                txid = r.transaction_id
                text(
                    f"Pub\x01{m.store_timestamp}\x01{DEFAULT_REGION}\x01{get(PGROUP, '')}\x01"
                    f"{topic}\x01{msg_id}\x01{get(TAGS, '')}\x01{keys}{tail}{len(m.body)}\x010"
                    f"\x01{kind}\x01{offset_id}\x01true\x02"
                )
                key(f"{msg_id} {keys} {txid or ''}" if keys or txid else msg_id)
        for ts, p, phy, prefix in self._plain:  # as above, for a plain message (kind 0)
            group, tags, keys = p.trace_fields()
            msg_id = p.uniq
            text(
                f"Pub\x01{ts}\x01{DEFAULT_REGION}\x01{group}\x01{p.topic}\x01{msg_id}\x01{tags}"
                f"\x01{keys}{tail}{len(p.body)}\x010\x010\x01{prefix}{phy:016X}\x01true\x02"
            )
            key(f"{msg_id} {keys} " if keys else msg_id)
        for now, topic, group, b in self._batches:
            kind = 0 if b.transaction_id is None else 1
            txid = b.transaction_id or ""
            prefix = b.msg_id_prefix
            head = f"Pub\x01{now}\x01{DEFAULT_REGION}\x01{group}\x01{topic}\x01"
            end = f"\x01\x01{tail}0\x010\x01{kind}\x01{prefix}"
            for (phy, _size, _qo), uniq in zip(b.placed, b.uniq_keys, strict=True):
                text(f"{head}{uniq}{end}{phy:016X}\x01true\x02")
                key(f"{uniq} {txid}" if txid else uniq)


#: One encoded record: its text, the keys it is found by (space-separated), and whether it is
#: txmq's own TxEvent.
Item = tuple[str, str, bool]
_DELAY_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})
KEYS, TAGS, PGROUP, REAL_TOPIC, UNIQ_KEY = (
    MessageConst.KEYS,
    MessageConst.TAGS,
    MessageConst.PGROUP,
    MessageConst.REAL_TOPIC,
    MessageConst.UNIQ_KEY,
)


def _halves(rec: TxRecord) -> list[HalfRef | None]:
    """The halves a transaction's records are about (one record without a message when the
    transaction has none left)."""
    return list(rec.halves) or [None]


def _split(chunk: list[Item]) -> tuple[list[str], list[str], bool]:
    """A group of items as :meth:`BrokerTrace._message` takes them."""
    return [t for t, _, _ in chunk], [k for _, k, _ in chunk], chunk[0][2]


def _chunks(items: list[Item]) -> Iterator[list[Item]]:
    """``items`` in order, in groups whose encoding stays under :data:`MAX_BODY`; txmq's own
    ``TxEvent`` records never share a group with RocketMQ's types."""
    chunk: list[Item] = []
    size = 0
    tx = False
    for item in items:
        n = len(item[0])
        if chunk and (size + n > MAX_BODY or item[2] != tx or len(chunk) == MAX_RECORDS):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
        tx = item[2]
    if chunk:
        yield chunk
