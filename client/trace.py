"""Client-side message trace (``ClientConfig(enable_trace=True)``): a producer records a ``Pub``
record per message it sent, in RocketMQ's encoding (:mod:`txmq.protocol.trace`), and sends
them in batches to ``RMQ_SYS_TRACE_TOPIC`` as RocketMQ's ``AsyncTraceDispatcher`` does (the
records' message ids and keys in the trace message's KEYS, so ``txmq trace <msgId>`` finds
them).

Best effort, as in RocketMQ: records are sent about every :data:`FLUSH_INTERVAL` seconds (and at
shutdown); a trace send that fails is logged and dropped, never failing the producer's sends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

from txmq.protocol.errors import TxmqError
from txmq.protocol.message import Message
from txmq.protocol.trace import TRACE_TOPIC, MessageType, TraceRecord, TraceType, encode, keys_of

from .logs import get_logger


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


class ProducerTrace:
    """The trace records of one producer, sent by a task of their own."""

    def __init__(self, producer: _Producer) -> None:
        self.producer = producer
        self._records: list[TraceRecord] = []
        self._task: asyncio.Task[None] | None = None
        #: trace messages sent (tests)
        self.messages_sent = 0

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
            self._records.append(
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
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-trace")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            await self.flush()

    async def flush(self) -> None:
        """Send the records gathered so far."""
        records, self._records = self._records, []
        for i in range(0, len(records), MAX_RECORDS):
            chunk = records[i : i + MAX_RECORDS]
            body = "".join(map(encode, chunk)).encode("utf-8")
            try:
                await self.producer.send(Message(TRACE_TOPIC, body, keys=keys_of(chunk)))
                self.messages_sent += 1
            except TxmqError as exc:
                log.warning("trace_send_failed", records=len(chunk), error=str(exc))

    async def close(self) -> None:
        """Stop the task and send what is left (before the producer's connection closes)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=5)
        await self.flush()
