"""The source: ``spark.readStream.format("txmq")`` and ``spark.read.format("txmq")``.

Offsets are a JSON object ``{"topic": {"queueId": offset}}`` (the next offset to read per
queue; in a cluster the key is ``"<group>:<queueId>"``) and live in Spark's checkpoint, so a restarted query goes on exactly where its last
committed batch ended.  A micro-batch reads, per queue, the messages from its start offset up to
(not including) its end offset, one Spark partition per queue with work.

Consumers of a topic's queues only ever see committed messages: half messages live in a system
topic until they are committed, so the source never sees a half or a rolled-back message.

Queues (or topics, also those a ``subscribePattern`` comes to match) that appear while a query
runs are read from offset 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

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
from txmq.client.logs import get_logger
from txmq.client.pull_consumer import PullResult, PullStatus
from txmq.protocol.codes import RequestCode
from txmq.protocol.errors import TxmqError
from txmq.protocol.message import MessageConst, MessageExt
from txmq.protocol.topics import SYSTEM_TOPICS

from .options import (
    EARLIEST,
    EARLIEST_OFFSET,
    LATEST,
    LATEST_OFFSET,
    OffsetMap,
    SourceOptions,
    TxmqOptionError,
    admit_batch,
    normalize_offsets,
    rows_for_bytes,
    share_budget,
    split_queue_key,
    split_ranges,
)
from .pipeline import pipeline_position, with_marker
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


log = get_logger(__name__)

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
        # The broker group that stored it (a cluster's ``brokerName``; the broker's name on a
        # single broker): with queue_id and queue_offset, the message's position.
        StructField("broker", StringType(), False),
    ]
)


class TxmqInputPartition(InputPartition):
    """One queue's offset range ``[start, end)``; ``queue`` is its offset-map key (an id, or
    ``<group>:<id>``)."""

    def __init__(self, topic: str, queue: str | int, start: int, end: int) -> None:
        super().__init__((topic, str(queue), start, end))
        self.topic = topic
        self.queue = str(queue)
        self.broker, self.queue_id = split_queue_key(self.queue)
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"TxmqInputPartition({self.topic}/{self.queue} [{self.start}, {self.end}))"


# --- offsets ----------------------------------------------------------------------------------


#: Messages sampled per queue to estimate message sizes for ``maxBytesPerTrigger``.
SIZE_SAMPLE = 16


async def resolve_topics(session: BrokerSession, options: SourceOptions) -> tuple[str, ...]:
    """The topics read: those of ``topic``, or every topic whose name ``subscribePattern``
    matches as a whole (system, retry and dead-letter topics left out), sorted."""
    if options.topic_pattern is None:
        return options.topics
    resp = await session.connection.invoke(RequestCode.GET_ALL_TOPIC_CONFIG)
    table = json.loads(resp.body)["topicConfigTable"] if resp.body else {}
    return tuple(
        sorted(
            t
            for t in table
            if t not in SYSTEM_TOPICS and not t.startswith("%") and options.wants(t)
        )
    )


async def _all_offsets(session: BrokerSession, topics: Sequence[str], latest: bool) -> OffsetMap:
    maps = await asyncio.gather(*(session.queue_offsets(t, latest=latest) for t in topics))
    return dict(zip(topics, maps, strict=True))


def latest_offsets(options: SourceOptions) -> OffsetMap:
    """Every queue's next free offset, for every topic read (no entry for queues of topics that
    do not exist)."""

    async def go() -> OffsetMap:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as s:
            return await _all_offsets(s, await resolve_topics(s, options), latest=True)

    return normalize_offsets(run(go))


async def _by_timestamp(
    s: BrokerSession, earliest: OffsetMap, stamps: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    keys = [k for k in stamps if k[1] in earliest.get(k[0], {})]
    found = await asyncio.gather(*(s.search_offset(t, q, stamps[(t, q)]) for t, q in keys))
    return dict(zip(keys, (int(o) for o in found), strict=True))


def _match_queues(
    name: str, topic: str, given: dict[str, Any], known: dict[str, int]
) -> dict[str, Any]:
    """A user's per-queue map (option ``name``) keyed like the broker's queues: in a cluster a
    plain queue id names the queue of the topic's only group.  A queue the topic does not have
    is refused."""
    out: dict[str, Any] = {}
    for q, value in given.items():
        key = q
        if q not in known and known:
            matches = [k for k in known if split_queue_key(k)[1] == int(split_queue_key(q)[1])]
            plain = split_queue_key(q)[0] is None
            if plain and len(matches) == 1:
                key = matches[0]
            else:
                raise TxmqOptionError(
                    f"option {name!r}: topic {topic!r} has no queue {q!r} (its queues: "
                    f"{', '.join(known)})"
                )
        out[key] = value
    return out


def initial_offsets(options: SourceOptions) -> OffsetMap:
    """Where a new query (or a batch read) starts: ``startingOffsets``,
    ``startingOffsetsByTimestamp`` or ``startingTimestamp``.  A time after the last message
    gives the queue's end."""
    start = options.starting_offsets

    async def go() -> OffsetMap:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as s:
            topics = await resolve_topics(s, options)
            if (
                start == LATEST
                and options.starting_timestamps is None
                and (options.starting_timestamp is None)
            ):
                return await _all_offsets(s, topics, latest=True)
            earliest = await _all_offsets(s, topics, latest=False)
            if options.starting_timestamp is not None or options.starting_timestamps is not None:
                if options.starting_timestamp is not None:
                    ts = options.starting_timestamp
                    stamps = {(t, q): ts for t in topics for q in earliest.get(t, {})}
                else:
                    assert options.starting_timestamps is not None
                    stamps = {
                        (t, q): ms
                        for t, queues in options.starting_timestamps.items()
                        for q, ms in _match_queues(
                            "startingOffsetsByTimestamp", t, queues, earliest.get(t, {})
                        ).items()
                    }
                found = await _by_timestamp(s, earliest, stamps)
                out = {t: dict(earliest.get(t, {})) for t in topics}
                for (t, q), offset in found.items():
                    out[t][q] = max(offset, earliest[t][q])
                return out
            if start == EARLIEST:
                return earliest
            assert isinstance(start, dict)
            latest = await _all_offsets(s, topics, latest=True)
            out = {}
            for topic in topics:
                queues = dict(earliest.get(topic, {}))
                given = _match_queues(
                    "startingOffsets", topic, start.get(topic, {}), earliest.get(topic, {})
                )
                for q, offset in given.items():
                    if offset == EARLIEST_OFFSET:
                        queues[q] = earliest.get(topic, {}).get(q, 0)
                    elif offset == LATEST_OFFSET:
                        queues[q] = latest.get(topic, {}).get(q, 0)
                    else:
                        queues[q] = offset
                out[topic] = queues
            return out

    return normalize_offsets(run(go))


def ending_offsets(options: SourceOptions, latest: OffsetMap) -> OffsetMap:
    """The end of a batch read: ``endingOffsets`` over ``latest`` (-1 and queues not named:
    the queue's end at planning time; an offset beyond the end is capped to it)."""
    end = options.ending_offsets
    if not isinstance(end, dict):
        return latest
    out = {t: dict(queues) for t, queues in latest.items()}
    for topic, queues in end.items():
        given = _match_queues("endingOffsets", topic, queues, latest.get(topic, {}))
        for q, offset in given.items():
            if offset != LATEST_OFFSET:
                out.setdefault(topic, {})[q] = min(offset, latest.get(topic, {}).get(q, 0))
    return normalize_offsets(out)


def sample_sizes(options: SourceOptions, start: OffsetMap, latest: OffsetMap) -> list[int]:
    """Body sizes of up to :data:`SIZE_SAMPLE` next messages of every queue with a backlog
    (for ``maxBytesPerTrigger``)."""
    wanted = [
        (t, q, s, min(SIZE_SAMPLE, latest[t][q] - s))
        for t, queues in latest.items()
        for q in queues
        for s in [start.get(t, {}).get(q, 0)]
        if latest[t][q] > s
    ]

    async def go() -> list[int]:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as s:
            results = await asyncio.gather(*(s.pull(t, q, o, n) for t, q, o, n in wanted))
        return [len(m.body) for r in results if r.status is PullStatus.FOUND for m in r.messages]

    return run(go) if wanted else []


def _backlog(start: OffsetMap, latest: OffsetMap) -> int:
    return sum(
        max(0, o - start.get(t, {}).get(q, 0))
        for t, queues in latest.items()
        for q, o in queues.items()
    )


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


def plan_partitions(
    start: OffsetMap, end: OffsetMap, min_partitions: int | None = None
) -> list[TxmqInputPartition]:
    """One partition per queue whose end is beyond its start; with ``min_partitions`` the
    largest ranges are split until there are at least that many."""
    ranges = []
    for topic, queues in end.items():
        for q, e in queues.items():
            s = start.get(topic, {}).get(q, 0)
            if e > s:
                ranges.append((topic, q, s, e))
    return [TxmqInputPartition(*r) for r in split_ranges(ranges, min_partitions)]


# --- reading ----------------------------------------------------------------------------------


_ARROW_SCHEMA: Any = None
#: Most rows of a record batch the source hands Spark (Spark's own Arrow batch size).
BATCH_ROWS = 10_000
#: A record batch is handed over once its bodies take this many bytes.
BATCH_BYTES = 16 * 1024 * 1024


def arrow_schema() -> Any:
    """:data:`SOURCE_SCHEMA` as the Arrow schema Spark expects of a reader's record batches
    (made once per process: pyarrow is imported where the reader runs, not on import)."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
    return _ARROW_SCHEMA


def concat_batches(batches: list[Any]) -> Any:
    """Record batches of one schema as one (their columns copied once)."""
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    table = pa.Table.from_batches(batches).combine_chunks()  # pragma: no cover - older pyarrow
    return table.to_batches()[0]  # pragma: no cover


def to_record_batch(messages: Sequence[MessageExt], topic: str, broker: str) -> Any:
    """Stored messages of one topic as one Arrow record batch of :data:`SOURCE_SCHEMA`.

    Each column is built from a list in one call (Spark takes the batch as it is), instead of a
    tuple per message that Spark's worker converts value by value.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    n = len(messages)
    system = MessageConst.SYSTEM_KEYS
    tags_key, keys_key, uniq_key = MessageConst.TAGS, MessageConst.KEYS, MessageConst.UNIQ_KEY
    queue_ids: list[int] = []
    offsets: list[int] = []
    ids: list[str] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    bodies: list[bytes] = []
    props: list[list[tuple[str, str]]] = []
    born: list[int] = []
    stored: list[int] = []
    for m in messages:
        p = m.properties
        queue_ids.append(m.queue_id)
        offsets.append(m.queue_offset)
        ids.append(p.get(uniq_key) or m.offset_msg_id)
        tags.append(p.get(tags_key))
        keys.append(p.get(keys_key))
        bodies.append(m.body)
        props.append([(k, v) for k, v in p.items() if k not in system])
        born.append(m.born_timestamp)
        stored.append(m.store_timestamp)
    ms = pa.int64()
    ts_type = schema.field("born_timestamp").type
    thousand = pa.scalar(1000, ms)
    columns = [
        pa.array([topic] * n, pa.string()),
        pa.array(queue_ids, pa.int32()),
        pa.array(offsets, ms),
        pa.array(ids, pa.string()),
        pa.array(tags, pa.string()),
        pa.array(keys, pa.string()),
        pa.array(bodies, pa.binary()),
        pa.array(props, schema.field("properties").type),
        pc.multiply(pa.array(born, ms), thousand).cast(ts_type),
        pc.multiply(pa.array(stored, ms), thousand).cast(ts_type),
        pa.array([broker] * n, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _pulled(
    options: SourceOptions, part: TxmqInputPartition, result: PullResult, offset: int
) -> tuple[list[MessageExt], int]:
    """The messages of a pull at ``offset`` that are in ``part``'s range, and the offset the
    next pull starts at.

    Raises:
        TxmqError: messages at ``offset`` were deleted (unless ``failOnDataLoss=false``), the
            queue ends before the range does, or the broker did not move past ``offset``.
    """
    end = part.end
    found: list[MessageExt] = []
    if result.status is PullStatus.FOUND:
        found = result.messages
        if found and (found[0].queue_offset < offset or found[-1].queue_offset >= end):
            found = [m for m in found if offset <= m.queue_offset < end]
        next_offset = result.next_begin_offset
    elif result.status is PullStatus.NO_MATCHED_MSG:
        next_offset = result.next_begin_offset
    elif result.status is PullStatus.OFFSET_ILLEGAL:
        if options.fail_on_data_loss or result.next_begin_offset <= offset:
            raise TxmqError(
                f"{part.topic}/{part.queue}: offset {offset} is no longer stored "
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
            f"{part.topic}/{part.queue}: no message at offset {offset}, but the batch "
            f"reads up to {part.end} (queue max {result.max_offset})"
        )
    if next_offset <= offset:
        raise TxmqError(f"{part.topic}/{part.queue}: the broker did not move past offset {offset}")
    return found, next_offset


def read_range(options: SourceOptions, part: TxmqInputPartition) -> Iterator[Any]:
    """The rows of one queue's range, pulled ``pullBatchSize`` messages at a time, as Arrow
    record batches of :data:`SOURCE_SCHEMA` of up to :data:`BATCH_ROWS` rows (or about
    :data:`BATCH_BYTES` of bodies): Spark and its JVM pay per batch, so a batch gathers several
    pulls.  The next pull is sent before a batch is built and handed to Spark, so the broker's
    answer is under way meanwhile.

    Raises:
        TxmqError: a pull failed, messages in the range were deleted (unless
            ``failOnDataLoss=false``), or the queue ends before the range does.
    """
    session = BrokerSession(
        options.broker, options.request_timeout, options.credentials, options.tls
    )
    runner = LoopThread(name="txmq-spark-read")
    ahead: concurrent.futures.Future[PullResult] | None = None

    def pull(at: int) -> concurrent.futures.Future[PullResult]:
        want = min(options.pull_batch_size, part.end - at)
        return asyncio.run_coroutine_threadsafe(
            session.pull(part.topic, part.queue, at, want), runner.loop
        )

    try:
        runner.run(session.__aenter__())
        broker = part.broker
        if broker is None:  # a topic in one group (or a single broker): its route names it
            route = runner.run(session.route(part.topic))
            broker = route.groups[0] if route is not None and route.groups else ""
        offset, end = part.start, part.end
        if offset < end:
            ahead = pull(offset)
        gathered: list[Any] = []  # record batches, one per pull
        gathered_rows = gathered_bytes = 0
        while ahead is not None:
            result, ahead = ahead.result(), None
            found, offset = _pulled(options, part, result, offset)
            if offset < end:
                ahead = pull(offset)
            if found:
                gathered.append(to_record_batch(found, part.topic, broker))
                gathered_rows += len(found)
                gathered_bytes += sum(len(m.body) for m in found)
            if gathered and (
                ahead is None or gathered_rows >= BATCH_ROWS or gathered_bytes >= BATCH_BYTES
            ):
                batches, gathered, gathered_rows, gathered_bytes = gathered, [], 0, 0
                yield concat_batches(batches)
    finally:
        try:
            if ahead is not None:  # the task stopped reading early
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    ahead.result(options.request_timeout)
            runner.run(session.__aexit__(None, None, None))
        finally:
            runner.stop()


# --- Spark readers ----------------------------------------------------------------------------


class TxmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets per queue, capped by ``maxMessagesPerTrigger`` and
    ``maxBytesPerTrigger``, held back by ``minOffsetsPerTrigger`` up to ``maxTriggerDelay``."""

    def __init__(self, options: SourceOptions) -> None:
        if options.ending_offsets != LATEST:
            raise TxmqOptionError(
                "option 'endingOffsets' is for batch reads (spark.read); a streaming query "
                "reads on (use Trigger.AvailableNow to stop at the end)"
            )
        self.options = options
        #: The end an ``availableNow`` query must stop at (set by
        #: :meth:`prepareForTriggerAvailableNow`).
        self._target: OffsetMap | None = None
        #: The last end offset handed out (for pyspark < 4.2, whose latestOffset has no start).
        self._last: OffsetMap | None = None
        #: The queues' ends as last seen, reported in the query progress (``latestOffset``).
        self._seen: OffsetMap | None = None
        #: When the last micro-batch was planned (``maxTriggerDelay``), None before the first.
        self._last_batch: float | None = None

    def initialOffset(self) -> dict[str, Any]:
        offsets = None
        if self.options.pipeline is not None:
            # No offsets in the checkpoint: a pipeline goes on where its last decided batch
            # ended (the checkpoint may have been lost, not the broker's record).
            offsets = pipeline_position(self.options, None)["end"]
            if offsets is not None:
                log.info("source_pipeline_resumed", pipeline=self.options.pipeline)
        if offsets is None:
            offsets = initial_offsets(self.options)
        if self.options.pipeline is not None:
            offsets = with_marker(offsets, self.options.pipeline)
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
        self._seen = latest
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
        """The end of the next batch: the queues' max offsets, capped by the read limits, or
        ``start`` (no batch) while ``minOffsetsPerTrigger`` holds it back."""
        if start is None:  # pyspark < 4.2: no admission control from Spark
            start = self._last or {}
            max_rows = self.options.max_messages_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = int(limit.max_rows)
        else:
            max_rows = None
        begin = normalize_offsets(start)
        if self.options.pipeline is not None:
            # A batch planned again from where a decided batch started (the checkpoint lost
            # its end) must end exactly where that one did: its decision holds those rows.
            decided: OffsetMap | None = pipeline_position(self.options, begin)["next"]
            if decided is not None:
                log.info("source_pipeline_replanned", pipeline=self.options.pipeline)
                self._last = decided
                return decided
        latest = self._latest()
        now = time.monotonic()
        if self._target is None and not admit_batch(
            _backlog(begin, latest),
            self.options.min_offsets_per_trigger,
            None if self._last_batch is None else now - self._last_batch,
            self.options.max_trigger_delay,
        ):
            return begin
        if self.options.max_bytes_per_trigger is not None:
            by_size = rows_for_bytes(
                self.options.max_bytes_per_trigger, sample_sizes(self.options, begin, latest)
            )
            max_rows = by_size if max_rows is None else min(max_rows, by_size)
        end = plan_end(begin, latest, max_rows)
        if self.options.pipeline is not None:
            end = with_marker(end, self.options.pipeline)
        if end != begin:
            self._last_batch = now
        self._last = end
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The queues' ends, shown as ``latestOffset`` in the query progress (see
        :func:`~txmq.spark_connector.options.offsets_behind`)."""
        return self._seen if self._seen is not None else latest_offsets(self.options)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return plan_partitions(start, end, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TxmqInputPartition):
            return iter(())  # nothing to read: Spark runs one empty partition of its own
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in the broker."""


class TxmqBatchReader(DataSourceReader):
    """Reads from the starting offsets (default earliest) up to ``endingOffsets`` (default: the
    offsets at planning time)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        start = initial_offsets(self.options)
        end = ending_offsets(self.options, latest_offsets(self.options))
        return plan_partitions(start, plan_end(start, end, None), self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TxmqInputPartition):
            return iter(())  # nothing to read: Spark runs one empty partition of its own
        return read_range(self.options, partition)
