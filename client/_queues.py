"""A push consumer's queues: where a group starts in a queue (:class:`ConsumeFrom`), the share
of a topic's queues each member of the group takes (:func:`allocate_averagely`), and the state
of a queue it owns (:class:`ProcessQueue`)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from txmq.protocol.message import MessageExt

from .pull_consumer import timestamp_ms
from .remoting import BrokerConnection
from .route import MessageQueue

T = TypeVar("T")


class ConsumeFrom(enum.Enum):
    """Where a group starts in a queue it has no committed offset for."""

    #: At the queue's end: only messages sent from now on.
    LAST = "last"
    #: At the queue's first stored message.
    FIRST = "first"
    #: At the first message stored at or after a timestamp.
    TIMESTAMP = "timestamp"


_FROM_WHERE = {
    ConsumeFrom.LAST: "CONSUME_FROM_LAST_OFFSET",
    ConsumeFrom.FIRST: "CONSUME_FROM_FIRST_OFFSET",
    ConsumeFrom.TIMESTAMP: "CONSUME_FROM_TIMESTAMP",
}


def parse_consume_from(
    value: ConsumeFrom | str | int | float | datetime,
) -> tuple[ConsumeFrom, int | None]:
    """``"last"``, ``"first"``, a timestamp in ms or a datetime -> (mode, timestamp ms).

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, ConsumeFrom):
        if value is ConsumeFrom.TIMESTAMP:
            raise ValueError("give the timestamp itself (ms or a datetime) as consume_from")
        return value, None
    if isinstance(value, str):
        try:
            mode = ConsumeFrom(value.strip().lower())
        except ValueError:
            raise ValueError(
                f"consume_from must be 'last', 'first', a timestamp in ms or a datetime, "
                f"got {value!r}"
            ) from None
        if mode is ConsumeFrom.TIMESTAMP:
            raise ValueError("give the timestamp itself (ms or a datetime) as consume_from")
        return mode, None
    if isinstance(value, datetime) or (
        isinstance(value, (int, float)) and not isinstance(value, bool)
    ):
        ms = timestamp_ms(value)
        if ms < 0:
            raise ValueError(f"consume_from timestamp must not be negative, got {value!r}")
        return ConsumeFrom.TIMESTAMP, ms
    raise ValueError(
        f"consume_from must be 'last', 'first', a timestamp in ms or a datetime, got {value!r}"
    )


def allocate_averagely(queues: Sequence[T], consumer_ids: Sequence[str], me: str) -> list[T]:
    """RocketMQ's AllocateMessageQueueAveragely: consecutive blocks of the (sorted) queues, the
    first ``len(queues) % len(consumer_ids)`` consumers getting one more.

    Args:
        queues: every queue, sorted the same way by every member.
        consumer_ids: every member, sorted the same way by every member.
        me: this member's id.

    Returns:
        This member's queues (none if ``me`` is not a member).
    """
    if me not in consumer_ids or not queues:
        return []
    n, c = len(queues), len(consumer_ids)
    index = list(consumer_ids).index(me)
    mod = n % c
    if n <= c:
        size = 1
    elif mod > 0 and index < mod:
        size = n // c + 1
    else:
        size = n // c
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [queues[(start + i) % n] for i in range(max(count, 0))]


class ProcessQueue:
    """The messages of one queue pulled and not yet acknowledged (RocketMQ's ProcessQueue).

    Offsets arrive in increasing order, so the dict's first key is the smallest one still in
    processing; after an offset jump backwards (PULL_OFFSET_MOVED) ``min()`` is used instead.
    """

    def __init__(
        self, topic: str, queue_id: int, offset: int, broker: str = "", conn: Any = None
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        #: The broker group holding the queue, and the connection to its leader.
        self.broker = broker
        self.conn: BrokerConnection | None = conn
        #: The next offset to pull.
        self.next_offset = offset
        #: The last offset stored at the broker.
        self.committed: int | None = offset
        self.msgs: dict[int, MessageExt] = {}
        self.dropped = False
        #: Messages handed to callbacks (or to send-back) and not settled yet.
        self.running = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.space = asyncio.Event()
        self.space.set()
        self.pull_task: asyncio.Task[None] | None = None
        self._ordered = True
        #: The group generation of the last rebalance that kept this queue here (None until
        #: the broker tells one).
        self.generation: int | None = None

    @property
    def key(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker, self.queue_id)

    def add(self, msgs: list[MessageExt]) -> None:
        if self.msgs and msgs and msgs[0].queue_offset < next(reversed(self.msgs)):
            self._ordered = False
        for m in msgs:
            self.msgs[m.queue_offset] = m

    def remove(self, offset: int, threshold: int) -> None:
        self.msgs.pop(offset, None)
        if len(self.msgs) < threshold:
            self.space.set()

    def offset_moved(self, offset: int) -> None:
        self.next_offset = offset
        if self.msgs:
            self._ordered = False

    def offset_to_commit(self) -> int:
        """The smallest offset still in processing, or the next offset to pull."""
        if not self.msgs:
            return self.next_offset
        return next(iter(self.msgs)) if self._ordered else min(self.msgs)

    def begin(self, n: int = 1) -> None:
        self.running += n
        self.idle.clear()

    def end(self, n: int = 1) -> None:
        self.running -= n
        if self.running <= 0:
            self.running = 0
            self.idle.set()
