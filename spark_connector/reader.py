"""The source: ``spark.readStream.format("txmq")`` and ``spark.read.format("txmq")``.

Offsets are a JSON object ``{"topic": {"queueId": offset}}`` (the next offset to read per
queue) and live in Spark's checkpoint, so a restarted query goes on exactly where its last
committed batch ended.  A micro-batch reads, per queue, the messages from its start offset up to
(not including) its end offset, one Spark partition per queue with work.

Consumers of a topic's queues only ever see committed messages: half messages live in a system
topic until they are committed, so the source never sees a half or a rolled-back message.

Queues (or topics) that appear while a query runs are read from offset 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txmq.client.bridge import LoopThread
from txmq.client.pull_consumer import PullStatus
from txmq.protocol.errors import TxmqError
from txmq.protocol.message import MessageExt

from .options import (
    EARLIEST,
    EARLIEST_OFFSET,
    LATEST,
    LATEST_OFFSET,
    OffsetMap,
    SourceOptions,
    normalize_offsets,
    share_budget,
)
from .session import BrokerSession, run

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = ReadLimit = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the reader class can be declared the same way on older pyspark."""


log = structlog.get_logger(__name__)

#: The source's columns.  Timestamps are Spark TIMESTAMPs (from the broker's milliseconds).
SOURCE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("tags", StringType(), True),
        StructField("keys", StringType(), True),
        StructField("body", BinaryType(), False),
        StructField("properties", MapType(StringType(), StringType()), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
    ]
)


class TxmqInputPartition(InputPartition):
    """One queue's offset range ``[start, end)``."""

    def __init__(self, topic: str, queue_id: int, start: int, end: int) -> None:
        super().__init__((topic, queue_id, start, end))
        self.topic = topic
        self.queue_id = queue_id
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"TxmqInputPartition({self.topic}/{self.queue_id} [{self.start}, {self.end}))"


# --- offsets ----------------------------------------------------------------------------------


async def _all_offsets(session: BrokerSession, topics: Sequence[str], latest: bool) -> OffsetMap:
    maps = await asyncio.gather(*(session.queue_offsets(t, latest=latest) for t in topics))
    return dict(zip(topics, maps, strict=True))


def latest_offsets(options: SourceOptions) -> OffsetMap:
    """Every queue's next free offset, for every topic read (no entry for queues of topics that
    do not exist)."""

    async def go() -> OffsetMap:
        async with BrokerSession(options.broker, options.request_timeout, options.credentials) as s:
            return await _all_offsets(s, options.topics, latest=True)

    return normalize_offsets(run(go))


def initial_offsets(options: SourceOptions) -> OffsetMap:
    """Where a new query starts, from ``startingOffsets``."""
    start = options.starting_offsets

    async def go() -> OffsetMap:
        async with BrokerSession(options.broker, options.request_timeout, options.credentials) as s:
            if start == LATEST:
                return await _all_offsets(s, options.topics, latest=True)
            earliest = await _all_offsets(s, options.topics, latest=False)
            if start == EARLIEST:
                return earliest
            assert isinstance(start, dict)
            latest = await _all_offsets(s, options.topics, latest=True)
            out: OffsetMap = {}
            for topic in options.topics:
                queues = dict(earliest.get(topic, {}))
                for q, offset in start.get(topic, {}).items():
                    if offset == EARLIEST_OFFSET:
                        queues[q] = earliest.get(topic, {}).get(q, 0)
                    elif offset == LATEST_OFFSET:
                        queues[q] = latest.get(topic, {}).get(q, 0)
                    else:
                        queues[q] = offset
                out[topic] = queues
            return out

    return normalize_offsets(run(go))


def plan_end(start: OffsetMap, latest: OffsetMap, max_rows: int | None) -> OffsetMap:
    """The end offsets of the next batch: ``latest`` per queue, never behind ``start``, and at
    most ``max_rows`` messages in all (shared fairly over the queues with a backlog)."""
    end: OffsetMap = {}
    backlog: dict[tuple[str, str], int] = {}
    for topic in sorted(set(start) | set(latest)):
        s_q, l_q = start.get(topic, {}), latest.get(topic, {})
        queues: dict[str, int] = {}
        for q in set(s_q) | set(l_q):
            s = s_q.get(q, 0)
            queues[q] = s
            backlog[(topic, q)] = max(0, l_q.get(q, s) - s)
        end[topic] = queues
    if max_rows is None:
        grant = backlog
    else:
        grant = share_budget(backlog, max_rows)
    for (topic, q), n in grant.items():
        end[topic][q] += n
    return normalize_offsets(end)


def plan_partitions(start: OffsetMap, end: OffsetMap) -> list[TxmqInputPartition]:
    """One partition per queue whose end is beyond its start."""
    parts = []
    for topic, queues in end.items():
        for q, e in queues.items():
            s = start.get(topic, {}).get(q, 0)
            if e > s:
                parts.append(TxmqInputPartition(topic, int(q), s, e))
    return parts


# --- reading ----------------------------------------------------------------------------------


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def to_row(m: MessageExt) -> tuple[Any, ...]:
    """A stored message as a row of :data:`SOURCE_SCHEMA`."""
    return (
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.msg_id,
        m.tags,
        m.keys,
        m.body,
        m.user_properties,
        _ts(m.born_timestamp),
        _ts(m.store_timestamp),
    )


def read_range(options: SourceOptions, part: TxmqInputPartition) -> Iterator[tuple[Any, ...]]:
    """The rows of one queue's range, pulled ``pullBatchSize`` messages at a time.

    Raises:
        TxmqError: a pull failed, messages in the range were deleted (unless
            ``failOnDataLoss=false``), or the queue ends before the range does.
    """
    runner = LoopThread(name="txmq-spark-read")
    session = BrokerSession(options.broker, options.request_timeout, options.credentials)
    try:
        runner.run(session.__aenter__())
        offset = part.start
        while offset < part.end:
            want = min(options.pull_batch_size, part.end - offset)
            result = runner.run(session.pull(part.topic, part.queue_id, offset, want))
            if result.status is PullStatus.FOUND:
                for m in result.messages:
                    if m.queue_offset >= part.end:
                        break
                    if m.queue_offset >= offset:
                        yield to_row(m)
                next_offset = result.next_begin_offset
            elif result.status is PullStatus.NO_MATCHED_MSG:
                next_offset = result.next_begin_offset
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                if options.fail_on_data_loss or result.next_begin_offset <= offset:
                    raise TxmqError(
                        f"{part.topic}/{part.queue_id}: offset {offset} is no longer stored "
                        f"(oldest {result.min_offset}); messages were deleted by retention. Set "
                        "failOnDataLoss=false to skip them"
                    )
                log.warning(
                    "source_data_lost",
                    topic=part.topic,
                    queue_id=part.queue_id,
                    skipped_from=offset,
                    to=result.next_begin_offset,
                )
                next_offset = result.next_begin_offset
            else:
                raise TxmqError(
                    f"{part.topic}/{part.queue_id}: no message at offset {offset}, but the batch "
                    f"reads up to {part.end} (queue max {result.max_offset})"
                )
            if next_offset <= offset:
                raise TxmqError(
                    f"{part.topic}/{part.queue_id}: the broker did not move past offset {offset}"
                )
            offset = next_offset
    finally:
        try:
            runner.run(session.__aexit__(None, None, None))
        finally:
            runner.stop()


# --- Spark readers ----------------------------------------------------------------------------


class TxmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets per queue, capped by ``maxMessagesPerTrigger``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        #: The end an ``availableNow`` query must stop at (set by
        #: :meth:`prepareForTriggerAvailableNow`).
        self._target: OffsetMap | None = None
        #: The last end offset handed out (for pyspark < 4.2, whose latestOffset has no start).
        self._last: OffsetMap | None = None

    def initialOffset(self) -> dict[str, Any]:
        offsets = initial_offsets(self.options)
        self._last = offsets
        return offsets

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is None:  # pragma: no cover - pyspark < 4.2
            return None
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = latest_offsets(self.options)

    def _latest(self) -> OffsetMap:
        latest = latest_offsets(self.options)
        if self._target is not None:
            target = self._target
            latest = {
                t: {q: min(o, target.get(t, {}).get(q, 0)) for q, o in queues.items()}
                for t, queues in latest.items()
            }
        return latest

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        """The end of the next batch: the queues' max offsets, capped by the read limit."""
        if start is None:  # pyspark < 4.2: no admission control from Spark
            start = self._last or {}
            max_rows = self.options.max_messages_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = int(limit.max_rows)
        else:
            max_rows = None
        end = plan_end(normalize_offsets(start), self._latest(), max_rows)
        self._last = end
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return plan_partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TxmqInputPartition)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in the broker."""


class TxmqBatchReader(DataSourceReader):
    """Reads ``startingOffsets`` (default earliest) up to the offsets at planning time."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        start = initial_offsets(self.options)
        return plan_partitions(start, plan_end(start, latest_offsets(self.options), None))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TxmqInputPartition)
        return read_range(self.options, partition)
