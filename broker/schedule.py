"""Delayed delivery (RocketMQ's ScheduleMessageService).

A message with a ``DELAY`` level is stored in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with
its real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``.  One task per level reads its queue
in order and, once ``store timestamp + delay`` has passed, stores a copy in the real topic.  The
read position per level is kept as a consumer offset of the group ``%SCHEDULE%``, so delivery
resumes after a restart (at least once: a copy may be delivered twice after a crash).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from txmq.protocol.aio import wait_event
from txmq.protocol.message import MessageConst, MessageExt, decode_message

from .messaging.write import WritePath
from .redelivery import redelivered
from .store import ConsumerOffsetManager, GetMessageStatus, MessageStore
from .topics import SCHEDULE_TOPIC

log = structlog.get_logger(__name__)

SCHEDULE_GROUP = "%SCHEDULE%"
#: Longest sleep between two looks at a level's queue while it holds a message not due yet (s).
MAX_IDLE = 1.0
#: Longest sleep while a level's queue is empty (s): a put to the level wakes it at once
#: (:meth:`ScheduleMessageService.notify`), so this is only a safety net, and an idle broker
#: does not wake every level every second.
EMPTY_IDLE = 60.0


@dataclass(eq=False)
class ScheduleMessageService:
    store: MessageStore
    offsets: ConsumerOffsetManager
    write: WritePath
    clock: Callable[[], float]
    levels_ms: list[int]
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _wake: list[asyncio.Event] = field(init=False)

    def __post_init__(self) -> None:
        # set here too: a compiled dataclass does not fill in the defaults of init=False fields
        self._tasks = []
        self._wake = [asyncio.Event() for _ in self.levels_ms]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(i), name=f"txmq-delay-{i + 1}")
            for i in range(len(self.levels_ms))
        ]

    def notify(self, queue_id: int) -> None:
        if 0 <= queue_id < len(self._wake):
            self._wake[queue_id].set()

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """The write path's subscriber: a level whose queue got a message looks at it."""
        for topic, qid in destinations:
            if topic == SCHEDULE_TOPIC:
                self.notify(qid)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, qid: int) -> None:
        delay = self.levels_ms[qid]
        store, offsets = self.store, self.offsets
        while True:
            offset = max(offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid), 0)
            r = store.get_messages(SCHEDULE_TOPIC, qid, offset, 64)
            sleep = EMPTY_IDLE
            if r.status is GetMessageStatus.FOUND:
                now = int(self.clock() * 1000)
                for raw in r.messages:
                    m = decode_message(raw)
                    due = m.store_timestamp + delay
                    if due > now:
                        sleep = min(MAX_IDLE, (due - now) / 1000.0)
                        break
                    try:
                        self._deliver(m)
                    except Exception as exc:  # a broken record must not stall the level
                        log.error(
                            "delayed_message_dropped", offset=m.commit_log_offset, error=repr(exc)
                        )
                    offset = m.queue_offset + 1
                    offsets.commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, offset)
                else:
                    sleep = 0.0
            elif r.next_begin_offset > offset:
                offsets.commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, r.next_begin_offset)
                sleep = 0.0
            if sleep > 0:
                self._wake[qid].clear()
                await wait_event(self._wake[qid], sleep)
            else:
                await asyncio.sleep(0)

    def _deliver(self, m: MessageExt) -> None:
        props = dict(m.properties)
        topic = props.pop(MessageConst.REAL_TOPIC)
        qid = int(props.pop(MessageConst.REAL_QID, "0"))
        props.pop(MessageConst.DELAY, None)
        self.write.put_message(redelivered(m, topic, qid, props))
