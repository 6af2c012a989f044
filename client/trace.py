"""Client-side message trace (``ClientConfig(enable_trace=True)``), in RocketMQ's encoding
(:mod:`txmq.protocol.trace`), sent in batches to ``RMQ_SYS_TRACE_TOPIC`` as RocketMQ's
``AsyncTraceDispatcher`` does (the records' message ids and keys in the trace message's KEYS, so
``txmq trace <msgId>`` finds them):

* a producer records a ``Pub`` record per message it sent (RocketMQ's
  ``SendMessageTraceHookImpl``) and, for a transaction producer, an ``EndTransaction`` record per
  decision or check answer it sent (``EndTransactionTraceHookImpl``);
* a push consumer (concurrent or orderly) records a ``SubBefore`` record just before its
  callback runs on a message and a ``SubAfter`` record when the callback returned or raised,
  with the outcome and the time it took (``ConsumeMessageTraceHookImpl``); the two share a
  request id.  A consumer sends its trace messages with a producer of its own
  (``_INNER_TRACE_PRODUCER-<group>``, RocketMQ's name), started on the first trace message.

Best effort, as in RocketMQ: records are sent about every :data:`FLUSH_INTERVAL` seconds (and at
shutdown); a trace send that fails is logged and dropped, never failing the client's work.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from txmq.protocol.errors import TxmqError
from txmq.protocol.message import Message, MessageConst, MessageExt, MessageSysFlag
from txmq.protocol.trace import TRACE_TOPIC, MessageType, TraceRecord, TraceType, encode, keys_of

from .logs import get_logger

if TYPE_CHECKING:
    from txmq.protocol.headers import EndTransactionRequestHeader

    from .config import ClientConfig


class _Producer(Protocol):
    group: str
    broker: str

    async def send(self, msg: Message) -> Any: ...


class _Result(Protocol):
    @property
    def msg_ids(self) -> Sequence[str]: ...
    @property
    def offset_msg_id(self) -> str: ...
    @property
    def offset_msg_ids(self) -> Sequence[str]: ...
    @property
    def transaction_id(self) -> str | None: ...


log = get_logger(__name__)

#: Seconds between trace sends.
FLUSH_INTERVAL = 0.1
#: Records per trace message at most (RocketMQ's dispatcher: up to 128,000 bytes).
MAX_RECORDS = 200


class TraceDispatcher:
    """Trace records gathered and sent in batches by a task of their own (RocketMQ's
    ``AsyncTraceDispatcher``); ``send`` stores one trace message."""

    def __init__(self, send: Callable[[Message], Awaitable[Any]]) -> None:
        self._send = send
        self._records: list[TraceRecord] = []
        self._task: asyncio.Task[None] | None = None
        #: the task's flush under way (not cancelled with the task: its records are sent)
        self._flushing: asyncio.Future[None] | None = None
        self._closed = False
        #: trace messages sent (tests)
        self.messages_sent = 0

    def add(self, record: TraceRecord) -> None:
        """Queue ``record`` (on the event loop's thread)."""
        self._records.append(record)
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-trace")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            self._flushing = asyncio.ensure_future(self.flush())
            await asyncio.shield(self._flushing)

    async def flush(self) -> None:
        """Send the records gathered so far."""
        records, self._records = self._records, []
        for i in range(0, len(records), MAX_RECORDS):
            chunk = records[i : i + MAX_RECORDS]
            body = "".join(map(encode, chunk)).encode("utf-8")
            try:
                await self._send(Message(TRACE_TOPIC, body, keys=keys_of(chunk)))
                self.messages_sent += 1
            except TxmqError as exc:
                log.warning("trace_send_failed", records=len(chunk), error=str(exc))

    async def close(self) -> None:
        """Stop the task and send what is left."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=5)
        if self._flushing is not None and not self._flushing.done():
            await asyncio.wait({self._flushing}, timeout=5)  # the records it took
        await self.flush()


class ProducerTrace(TraceDispatcher):
    """The trace records of one producer, sent through the producer itself."""

    def __init__(self, producer: _Producer) -> None:
        super().__init__(producer.send)
        self.producer = producer

    def sent(self, msg: Message, result: _Result, started: float) -> None:
        """``msg`` was stored (``started``: ``time.monotonic()`` when its send began).  For a
        batch ``msg`` is its first message: the other messages' records carry their ids but
        no tags, keys or body length."""
        if msg.topic == TRACE_TOPIC:
            return
        cost = int((time.monotonic() - started) * 1000)
        now = int(time.time() * 1000)
        kind = MessageType.NORMAL if result.transaction_id is None else MessageType.TRANS_HALF
        ids = result.offset_msg_ids or [result.offset_msg_id]
        for i, msg_id in enumerate(result.msg_ids):
            self.add(
                TraceRecord(
                    TraceType.PUB,
                    timestamp=now,
                    group=self.producer.group,
                    topic=msg.topic,
                    msg_id=msg_id,
                    tags=(msg.tags or "") if i == 0 else "",
                    keys=(msg.keys or "") if i == 0 else "",
                    store_host=self.producer.broker,
                    body_length=len(msg.payload) if i == 0 else 0,
                    cost_time=cost,
                    msg_type=kind,
                    offset_msg_id=ids[i] if i < len(ids) else "",
                )
            )

    def ended(self, header: EndTransactionRequestHeader, broker: str) -> None:
        """A transaction producer's END_TRANSACTION was accepted by ``broker``."""
        state = _STATES.get(header.commit_or_rollback, "UNKNOW")
        self.add(
            TraceRecord(
                TraceType.END_TRANSACTION,
                timestamp=int(time.time() * 1000),
                group=header.producer_group,
                msg_id=header.msg_id or "",
                store_host=broker,
                msg_type=MessageType.TRANS_COMMIT,
                transaction_id=header.transaction_id or "",
                transaction_state=state,
                from_transaction_check=bool(header.from_transaction_check),
            )
        )


#: LocalTransactionState names (RocketMQ's spelling) by END_TRANSACTION's commitOrRollback.
_STATES = {
    MessageSysFlag.TRANSACTION_COMMIT_TYPE: "COMMIT_MESSAGE",
    MessageSysFlag.TRANSACTION_ROLLBACK_TYPE: "ROLLBACK_MESSAGE",
}

#: RocketMQ's ``ConsumeReturnType`` ordinals a SubAfter record's contextCode holds.
CONTEXT_SUCCESS = 0
CONTEXT_EXCEPTION = 2


class ConsumerTrace:
    """The SubBefore / SubAfter records of one push consumer's callbacks.  :meth:`before` and
    :meth:`after` run on the event loop's thread."""

    def __init__(self, group: str, broker: str, config: ClientConfig) -> None:
        self.group = group
        self.broker = broker
        self.config = config
        self._producer: Any = None
        self._starting = asyncio.Lock()
        self.dispatcher = TraceDispatcher(self._send)
        #: the callback running on each message (by ``id(msg)``): its request id, when it began
        self._running: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count(1)
        self._prefix = os.urandom(6).hex().upper()

    async def _send(self, msg: Message) -> Any:
        async with self._starting:
            if self._producer is None:
                import dataclasses

                from .producer import AsyncProducer

                cfg = dataclasses.replace(self.config, enable_trace=False)
                group = f"_INNER_TRACE_PRODUCER-{self.group}"
                producer = AsyncProducer(group, self.broker, config=cfg)
                await producer.start()
                self._producer = producer
        return await self._producer.send(msg)

    def before(self, msg: MessageExt) -> None:
        """The callback is about to run on ``msg``."""
        if msg.topic == TRACE_TOPIC:
            return
        request_id = f"{self._prefix}{next(self._ids):010X}"
        self._running[id(msg)] = (request_id, time.monotonic())
        self.dispatcher.add(
            TraceRecord(
                TraceType.SUB_BEFORE,
                timestamp=int(time.time() * 1000),
                group=self.group,
                request_id=request_id,
                msg_id=_msg_id(msg),
                retry_times=msg.reconsume_times,
                keys=msg.properties.get(MessageConst.KEYS, ""),
            )
        )

    def after(self, msg: MessageExt, success: bool | None) -> None:
        """The callback on ``msg`` returned (``success``) or raised; None: it did not run
        (its queue was taken away meanwhile)."""
        started = self._running.pop(id(msg), None)
        if started is None or success is None:
            return
        request_id, t0 = started
        self.dispatcher.add(
            TraceRecord(
                TraceType.SUB_AFTER,
                request_id=request_id,
                msg_id=_msg_id(msg),
                cost_time=int((time.monotonic() - t0) * 1000),
                success=success,
                keys=msg.properties.get(MessageConst.KEYS, ""),
                context_code=CONTEXT_SUCCESS if success else CONTEXT_EXCEPTION,
                timestamp=int(time.time() * 1000),
                group=self.group,
            )
        )

    async def close(self) -> None:
        """Send what is left, then stop the trace's producer."""
        await self.dispatcher.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.shutdown()


def _msg_id(msg: MessageExt) -> str:
    return msg.properties.get(MessageConst.UNIQ_KEY) or msg.offset_msg_id
