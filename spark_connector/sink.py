"""The sink's engine, shared by the data source writers and the ``foreachBatch`` helper.

How a Spark write becomes exactly-once (see docs/spark.md for the whole argument):

1. Every task attempt writes its rows as **half messages of one fresh transaction** whose id
   names the query, batch, partition and attempt plus a random nonce (partition and attempt
   numbers restart at 0 on replay, the nonce keeps ids unique).  Each half carries the batch key
   (``TXMQ_BATCH_KEY``), so the broker knows which batch the transaction belongs to.  Halves are
   invisible to consumers.
2. The attempt returns its transaction id to the driver.  Only successful attempts' ids reach
   the driver's commit.
3. The driver sends one TXMQ_DECIDE_BATCH: the broker commits exactly the listed transactions
   and rolls back every other pending transaction of the batch (the orphans of failed or
   zombie attempts), atomically and idempotently.  Once a batch is decided the broker refuses
   any new half with its key, so a late zombie cannot add to it.
4. A replayed batch (the driver crashed after step 3 but before Spark recorded the batch) asks
   the broker first; if the batch is decided it writes nothing.

Wire format of the requests: SEND_BATCH_MESSAGE with all entries of one request going to one
topic and one queue; a transaction may span several requests, topics and queues (one request
per ``(topic, queue)`` group, up to ``batchSize`` messages or ``maxRequestBytes`` bytes each).
A task keeps up to ``maxInFlight`` requests in flight.  No request is ever retried inside a
task: a failed request may have been stored, and sending it again would store its messages
twice in the same transaction.  The task fails instead; Spark retries it as a new attempt with
a new transaction, and the broker rolls back the failed attempt's halves at the batch decision.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txmq.client.logs import get_logger
from txmq.client.remoting import local_ip
from txmq.client.route import MessageQueue
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import TxmqError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    BATCH_ENTRY_OVERHEAD,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    BatchBody,
    MessageConst,
    MessageSysFlag,
    UniqIdGenerator,
    properties_to_string,
)

from .options import SinkOptions, TlsOptions, TxmqOptionError, validate_topic
from .session import BrokerSession, check_success, run

log = get_logger(__name__)

#: Queues assumed for a topic that does not exist yet; the first send creates it with as many.
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: Rows taken from a row iterator before they are encoded together.
ROW_CHUNK = 1024
#: The most bytes the properties of one message may take (a signed 16-bit length).
MAX_PROPERTIES_BYTES = 32767
#: Most rows encoded column-wise at once (:class:`PlainRows`).
PLAIN_SLICE = 32768
#: Characters of a message id (:class:`~txmq.protocol.message.UniqIdGenerator`).
ID_LENGTH = 32

_KV = NAME_VALUE_SEPARATOR.encode()
_SEP = PROPERTY_SEPARATOR.encode()
_UNIQ_PREFIX = MessageConst.UNIQ_KEY.encode() + _KV
_TAGS_PREFIX = MessageConst.TAGS.encode() + _KV
_KEYS_PREFIX = MessageConst.KEYS.encode() + _KV
_HEADER_PROPERTIES = properties_to_string({MessageConst.WAIT_STORE_MSG_OK: "true"})

_ids: tuple[int, UniqIdGenerator] | None = None


def _id_generator() -> UniqIdGenerator:
    """The process's message-id generator (made again after a fork: ids embed the pid)."""
    global _ids
    pid = os.getpid()
    if _ids is None or _ids[0] != pid:
        _ids = (pid, UniqIdGenerator(local_ip()))
    return _ids[1]


@dataclass
class PartitionResult:
    """What one task attempt reports to the driver.

    Attributes:
        producer_group: the group of the attempt's transaction.
        batch_key: the batch the transaction belongs to.
        transaction_id: the attempt's transaction, or None when it wrote nothing.
        rows: messages written as halves.
        already_decided: the batch was decided before this attempt ran (a replay after the
            sink committed); nothing was written.
        partition_id: Spark's partition id.
        attempt: Spark's attempt number.
    """

    producer_group: str
    batch_key: str
    transaction_id: str | None
    rows: int
    already_decided: bool = False
    partition_id: int = -1
    attempt: int = 0


def stream_batch_key(query_id: str, batch_id: int | str) -> str:
    """The batch key of a streaming micro-batch: stable across restarts from the checkpoint
    (which keeps the query id), and distinct between queries even when they share a producer
    group."""
    return f"{query_id}-{batch_id}"


def new_transaction_id(batch_key: str, partition_id: int, attempt: int) -> str:
    """``<batchKey>-<partition>-<attempt>-<nonce>``: readable in ``txmq txn list`` and unique,
    because partition and attempt numbers restart at 0 when a batch is replayed."""
    return f"{batch_key}-{partition_id}-{attempt}-{uuid.uuid4().hex[:12]}"


# --- input ------------------------------------------------------------------------------------

Chunk = dict[str, list[Any]]


@dataclass(frozen=True)
class PlainRows:
    """Rows of an Arrow batch that carry nothing but a body (no topic, tags, keys, properties
    or queue-column value): their messages differ only in body and message id, so they are
    encoded column-wise (:meth:`HalfWriter.write_plain`), not row by row.

    Attributes:
        body: the body column, a ``large_binary`` pyarrow array without nulls.
    """

    body: Any


#: The columns that make a row more than a body (besides the ``queueColumn``).
_ROW_EXTRAS = ("topic", "tags", "keys", "properties")


def plain_rows(batch: Any, columns: tuple[str, ...]) -> PlainRows | None:
    """``batch`` (a pyarrow RecordBatch) as :class:`PlainRows`, or None when a row has more
    than a body, or a null or non-binary body (the row-wise path handles, or refuses, those)."""
    import pyarrow as pa

    names = batch.schema.names
    if "body" not in names or batch.num_rows == 0:
        return None
    for c in columns:
        if c != "body" and c in names and batch.column(c).null_count != batch.num_rows:
            return None
    body = batch.column("body")
    if body.null_count:
        return None
    t = body.type
    if not (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        return None
    return PlainRows(body.cast(pa.large_binary()))


def chunks(batches: Iterable[Any], columns: tuple[str, ...]) -> Iterator[Chunk | PlainRows]:
    """Column lists from what Spark gives ``write()``: pyarrow RecordBatches (the Arrow
    writers) or Rows (the row writers and ``foreachBatch``); an Arrow batch of bodies alone as
    :class:`PlainRows`."""
    it = iter(batches)
    buffered: list[Any] = []
    for item in it:
        if hasattr(item, "schema") and hasattr(item, "num_rows"):  # pyarrow.RecordBatch
            plain = plain_rows(item, columns)
            if plain is not None:
                # Message ids are made per slice with one clock reading: their 16-bit counter
                # must not wrap inside one.
                for at in range(0, len(plain.body), PLAIN_SLICE):
                    yield PlainRows(plain.body.slice(at, PLAIN_SLICE))
                continue
            names = set(item.schema.names)
            yield {c: item.column(c).to_pylist() for c in columns if c in names}
            continue
        buffered.append(item)
        if len(buffered) >= ROW_CHUNK:
            yield _rows_to_chunk(buffered, columns)
            buffered = []
    if buffered:
        yield _rows_to_chunk(buffered, columns)


def _rows_to_chunk(rows: list[Any], columns: tuple[str, ...]) -> Chunk:
    first = rows[0]
    fields = set(first.__fields__) if hasattr(first, "__fields__") else set(first.asDict())
    out: Chunk = {}
    for c in columns:
        if c in fields:
            out[c] = [r[c] for r in rows]
    return out


def drain(batches: Iterable[Any]) -> None:
    """Consume the input without writing it (a batch that is decided already)."""
    for _ in batches:
        pass


# --- encoding ---------------------------------------------------------------------------------


def _text(value: Any, what: str) -> bytes:
    s = value if isinstance(value, str) else str(value)
    if NAME_VALUE_SEPARATOR in s or PROPERTY_SEPARATOR in s:
        raise ValueError(f"{what} {s!r} contains a reserved separator character (\\x01 or \\x02)")
    return s.encode("utf-8")


def _user_properties(value: Any) -> bytes:
    items = value.items() if isinstance(value, dict) else value
    parts = []
    for k, v in items:
        if v is None:
            continue
        if k in MessageConst.SYSTEM_KEYS:
            raise ValueError(
                f"property {k!r} is reserved by txmq; rename it (the 'properties' column may "
                "only carry user properties)"
            )
        parts.append(_text(k, "property name") + _KV + _text(v, f"property {k!r}") + _SEP)
    return b"".join(parts)


def queue_for_key(value: Any, queue_nums: int) -> int:
    """The queue of a row's queue-column value: ``crc32(value) % queue_nums``, as the SDK's
    ``sharding_key`` (binary values are hashed as they are, anything else as UTF-8 text)."""
    raw = value if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")
    return zlib.crc32(raw) % queue_nums


@dataclass(eq=False)
class HalfWriter:
    """Writes one task attempt's rows as half messages of one transaction.

    Args:
        session: the task's broker session.
        options: the sink options.
        group: producer group of the transaction.
        transaction_id: the attempt's transaction id.
        batch_key: the batch the transaction belongs to.
        partition_id: spreads partitions over different first queues.
    """

    session: BrokerSession
    options: SinkOptions
    group: str
    transaction_id: str
    batch_key: str
    partition_id: int = 0
    rows: int = field(default=0, init=False)
    requests: int = field(default=0, init=False)
    _const: bytes = field(init=False)
    _ids: UniqIdGenerator = field(init=False)
    _queue_nums: dict[str, int] = field(default_factory=dict, init=False)
    #: A topic's write queues over every broker group of a cluster (queue index -> group
    #: and queue id there); absent for a topic of one group or not created yet.
    _queue_refs: dict[str, list[MessageQueue]] = field(default_factory=dict, init=False)
    _cursor: dict[str, int] = field(default_factory=dict, init=False)
    _buffers: dict[tuple[str, int], BatchBody] = field(default_factory=dict, init=False)
    _ready: list[tuple[str, int, BatchBody]] = field(default_factory=list, init=False)
    _in_flight: set[asyncio.Future[None]] = field(default_factory=set, init=False)
    _checked_topics: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self._const = properties_to_string(
            {
                MessageConst.TRAN_MSG: "true",
                MessageConst.PGROUP: self.group,
                MessageConst.TRANSACTION_ID: self.transaction_id,
                MessageConst.TXMQ_BATCH_KEY: self.batch_key,
            }
        ).encode("utf-8")
        self._ids = _id_generator()

    async def _queues(self, topic: str) -> int:
        n = self._queue_nums.get(topic)
        if n is None:
            if topic not in self._checked_topics:
                validate_topic(topic, "topic column")
                self._checked_topics.add(topic)
            route = await self.session.route(topic)
            if route is not None and not route.writable:
                raise TxmqError(f"topic {topic!r} is not writable")
            n = route.write_queue_nums if route is not None else DEFAULT_TOPIC_QUEUE_NUMS
            if route is not None and len(route.brokers) > 1:
                # A topic in several broker groups: its rows spread over all their queues.
                self._queue_refs[topic] = list(route.write_queues)
                n = len(route.write_queues)
            if n < 1:
                raise TxmqError(f"topic {topic!r} has no writable queue")
            self._queue_nums[topic] = n
            self._cursor[topic] = self.partition_id % n
        return n

    async def write_chunk(self, chunk: Chunk) -> None:
        """Encode one chunk of rows into the per-queue buffers and send the full ones."""
        bodies = chunk["body"]
        n = len(bodies)
        topics = chunk.get("topic")
        tags = chunk.get("tags")
        keys = chunk.get("keys")
        props = chunk.get("properties")
        qcol = self.options.queue_column
        qkeys = chunk.get(qcol) if qcol is not None else None
        default_topic = self.options.topic
        for t in set(topics) if topics is not None else {default_topic}:
            if t is None:
                t = default_topic
            if t is None:
                raise TxmqOptionError(
                    "a row has no topic: its 'topic' column is null and no 'topic' option is set"
                )
            await self._queues(t)
        batch_size = self.options.batch_size
        max_bytes = self.options.max_request_bytes
        const = self._const
        next_id = self._ids.next_id
        queue_nums = self._queue_nums
        cursor = self._cursor
        buffers = self._buffers
        for i in range(n):
            body = bodies[i]
            if body.__class__ is not bytes:
                if body is None:
                    raise ValueError("a row has a null 'body'; every message needs a body")
                body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
            topic = default_topic if topics is None else (topics[i] or default_topic)
            assert topic is not None
            nq = queue_nums[topic]
            if qkeys is not None and qkeys[i] is not None:
                qid = queue_for_key(qkeys[i], nq)
            else:
                qid = cursor[topic]
            p = _UNIQ_PREFIX + next_id().encode() + _SEP + const
            if tags is not None and tags[i]:
                p += _TAGS_PREFIX + _text(tags[i], "tags") + _SEP
            if keys is not None and keys[i]:
                p += _KEYS_PREFIX + _text(keys[i], "keys") + _SEP
            if props is not None and props[i]:
                p += _user_properties(props[i])
            if len(p) > MAX_PROPERTIES_BYTES:
                raise ValueError(
                    f"a row's properties take {len(p)} bytes, over the limit of "
                    f"{MAX_PROPERTIES_BYTES}"
                )
            size = BATCH_ENTRY_OVERHEAD + len(body) + len(p)
            key = (topic, qid)
            buf = buffers.get(key)
            if buf is None:
                buf = buffers[key] = BatchBody()
            elif buf.size + size > max_bytes:
                self._take(key, buf)
                buf = buffers[key] = BatchBody()
            buf.add(body, p)
            if buf.count >= batch_size or buf.size >= max_bytes:
                self._take(key, buf)
                del buffers[key]
        self.rows += n
        await self._send_ready()

    async def write_plain(self, bodies: Any) -> None:
        """Encode rows of nothing but a body (``bodies``: a ``large_binary`` pyarrow array
        without nulls) into the per-queue buffers and send the full ones.

        The entries are the ones :meth:`write_chunk` makes, byte for byte (bar the message
        ids): Arrow joins each entry's head, body and properties in one call, the message ids
        are made at once, and each request takes a slice of the joined entries.
        """
        import numpy as np

        topic = self.options.topic
        if topic is None:
            raise TxmqOptionError(
                "a row has no topic: its 'topic' column is null and no 'topic' option is set"
            )
        await self._queues(topic)
        n = len(bodies)
        joined, sizes = self._plain_entries(bodies)
        offsets = np.frombuffer(joined.buffers()[1], np.int64, n + 1, joined.offset * 8)
        data = memoryview(joined.buffers()[2])
        ends = np.cumsum(sizes)
        batch_size = self.options.batch_size
        max_bytes = self.options.max_request_bytes
        buffers = self._buffers
        i = 0
        while i < n:
            key = (topic, self._cursor[topic])
            buf = buffers.get(key)
            before = int(ends[i - 1]) if i else 0
            if buf is not None and buf.size + int(sizes[i]) > max_bytes:
                # As write_chunk: the row that does not fit starts the queue's next request.
                self._take(key, buf)
                buf = buffers[key] = BatchBody()
                j = i + 1
            else:
                if buf is None:
                    buf = buffers[key] = BatchBody()
                # Row i goes in; so do the next ones while they fit in count and bytes.
                room = batch_size - buf.count
                fit = int(np.searchsorted(ends, before + max_bytes - buf.size, side="right"))
                j = max(i + 1, min(n, i + room, fit))
            buf.parts.append(data[int(offsets[i]) : int(offsets[j])].tobytes())
            buf.count += j - i
            buf.size += int(ends[j - 1]) - before
            i = j
            if buf.count >= batch_size or buf.size >= max_bytes:
                self._take(key, buf)
                del buffers[key]
        self.rows += n
        await self._send_ready()

    def _plain_entries(self, bodies: Any) -> tuple[Any, Any]:
        """The batch entries of ``bodies`` (see :meth:`write_plain`) joined by Arrow in one
        ``large_binary`` array, and each entry's size (a numpy array)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(bodies)
        # The properties of every entry: its length, UNIQ_KEY=<id>, then the constant ones.
        head = _UNIQ_PREFIX
        tail = _SEP + self._const
        plen = len(head) + ID_LENGTH + len(tail)
        if plen > MAX_PROPERTIES_BYTES:
            raise ValueError(
                f"a row's properties take {plen} bytes, over the limit of {MAX_PROPERTIES_BYTES}"
            )
        ids = "".join(self._ids.next_ids(n)).encode("ascii")
        if len(ids) != n * ID_LENGTH:  # pragma: no cover - the id format is fixed
            raise AssertionError("message ids of unexpected length")
        props = np.empty((n, 2 + plen), np.uint8)
        props[:, :2] = np.frombuffer(plen.to_bytes(2, "big"), np.uint8)
        props[:, 2 : 2 + len(head)] = np.frombuffer(head, np.uint8)
        at = 2 + len(head)
        props[:, at : at + ID_LENGTH] = np.frombuffer(ids, np.uint8).reshape(n, ID_LENGTH)
        props[:, at + ID_LENGTH :] = np.frombuffer(tail, np.uint8)
        # Each entry's head: total size, magic and CRC (0), flag (0), body length.
        lengths = pc.binary_length(bodies).to_numpy().astype(np.int64)
        sizes = BATCH_ENTRY_OVERHEAD + plen + lengths
        heads = np.zeros((n, 5), ">i4")
        heads[:, 0] = sizes
        heads[:, 4] = lengths
        fixed = pa.large_binary()
        joined = pc.binary_join_element_wise(
            _fixed_rows(heads.tobytes(), n, 20).cast(fixed),
            bodies,
            _fixed_rows(props.tobytes(), n, 2 + plen).cast(fixed),
            pa.scalar(b"", fixed),
        )
        return joined, sizes

    def _take(self, key: tuple[str, int], buf: BatchBody) -> None:
        topic, qid = key
        self._ready.append((topic, qid, buf))
        if qid == self._cursor.get(topic):
            # Spread rows over the queues: the next rows of this topic go to the next queue.
            self._cursor[topic] = (self._cursor[topic] + 1) % self._queue_nums[topic]

    async def _send_ready(self) -> None:
        ready, self._ready = self._ready, []
        for topic, qid, buf in ready:
            while len(self._in_flight) >= self.options.max_in_flight:
                done, self._in_flight = await asyncio.wait(
                    self._in_flight, return_when=asyncio.FIRST_COMPLETED
                )
                for fut in done:
                    fut.result()
            self._in_flight.add(asyncio.ensure_future(self._send(topic, qid, buf)))

    async def _send(self, topic: str, qid: int, buf: BatchBody) -> None:
        conn = self.session.connection
        refs = self._queue_refs.get(topic)
        if refs is not None:
            mq = refs[qid]
            conn = await conn.for_group(mq.broker)
            qid = mq.queue_id
        header = SendMessageRequestHeader(
            producer_group=self.group,
            topic=topic,
            default_topic_queue_nums=self._queue_nums[topic],
            queue_id=qid,
            sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            born_timestamp=int(time.time() * 1000),
            flag=0,
            properties=_HEADER_PROPERTIES,
            batch=True,
        )
        cmd = RemotingCommand.request(
            RequestCode.SEND_BATCH_MESSAGE, header.to_v2_ext_fields(), buf.encode()
        )
        resp = await conn.request(cmd, self.options.request_timeout)
        self.requests += 1
        # FLUSH_DISK_TIMEOUT is a failure here: a half that is not durable could vanish in a
        # broker crash and its row would be lost on commit.  The task fails and is retried.
        check_success(
            resp.code,
            resp.remark,
            f"storing {buf.count} half messages of transaction "
            f"{self.transaction_id} in {topic}/{qid} failed",
        )

    async def finish(self) -> None:
        """Send what is buffered and wait for every answer.

        Raises:
            TxmqError: a request failed.
        """
        for key, buf in list(self._buffers.items()):
            if buf.count:
                self._ready.append((key[0], key[1], buf))
        self._buffers.clear()
        await self._send_ready()
        pending, self._in_flight = self._in_flight, set()
        if pending:
            results = await asyncio.gather(*pending, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r

    async def cancel(self) -> None:
        """Stop waiting for the answers of requests in flight (the task is failing)."""
        for fut in self._in_flight:
            fut.cancel()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        self._in_flight.clear()


#: Columns a writer reads from its input.
def _fixed_rows(raw: bytes, n: int, width: int) -> Any:
    """``raw`` as a pyarrow array of ``n`` values of ``width`` bytes each."""
    import pyarrow as pa

    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(raw)])


def input_columns(options: SinkOptions) -> tuple[str, ...]:
    cols = ["body", "topic", "tags", "keys", "properties"]
    if options.queue_column is not None and options.queue_column not in cols:
        cols.append(options.queue_column)
    return tuple(cols)


async def _batch_decided(
    session: BrokerSession,
    options: SinkOptions,
    group: str,
    batch_key: str,
    run_id: str | None,
) -> bool:
    """Whether ``batch_key`` is decided already; with ``run_id``, the question announces that
    run of ``options.pipeline`` (see :func:`write_partition`)."""
    if run_id is None:
        answer = await session.decide_batch(group, batch_key, query_only=True)
    else:
        answer = await session.decide_batch(
            group, batch_key, query_only=True, pipeline=options.pipeline, run=run_id
        )
    return bool(answer.get("decided"))


async def _write_halves(
    writer: HalfWriter, batches: Iterable[Any], columns: tuple[str, ...]
) -> None:
    """Write every row of ``batches`` through ``writer`` and finish it; on any failure, first
    stop waiting for its requests in flight (:meth:`HalfWriter.cancel`)."""
    try:
        for chunk in chunks(batches, columns):
            if isinstance(chunk, PlainRows):
                await writer.write_plain(chunk.body)
                continue
            if "body" not in chunk:
                raise TxmqOptionError("the DataFrame written to txmq has no 'body' column")
            await writer.write_chunk(chunk)
        await writer.finish()
    except BaseException:
        await writer.cancel()
        raise


def write_partition(
    batches: Iterable[Any],
    options: SinkOptions,
    *,
    group: str,
    batch_key: str,
    transaction_id: str,
    partition_id: int = 0,
    attempt: int = 0,
    skip_if_decided: bool = True,
    run_id: str | None = None,
) -> PartitionResult:
    """Write one task attempt's input as the halves of ``transaction_id``.

    Args:
        batches: pyarrow RecordBatches or Rows.
        skip_if_decided: first ask the broker whether ``batch_key`` is decided already; if so
            write nothing (the batch is a replay of one the sink committed before).
        run_id: the run of ``options.pipeline`` that writes (the token in ``batch_key``): the
            same question announces it, and the broker first rolls back the pending halves
            of the pipeline's other runs (their batches are all run again by this one).

    Raises:
        TxmqError: a broker request failed (the task fails; Spark retries it).
        ValueError: a row cannot be sent (null body, reserved property, ...).
    """
    columns = input_columns(options)

    async def go() -> PartitionResult:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as session:
            if skip_if_decided and await _batch_decided(session, options, group, batch_key, run_id):
                log.info(
                    "sink_batch_already_decided",
                    group=group,
                    batch_key=batch_key,
                    partition=partition_id,
                    attempt=attempt,
                )
                drain(batches)
                return PartitionResult(group, batch_key, None, 0, True, partition_id, attempt)
            writer = HalfWriter(session, options, group, transaction_id, batch_key, partition_id)
            started = time.monotonic()
            await _write_halves(writer, batches, columns)
            log.info(
                "sink_partition_written",
                group=group,
                batch_key=batch_key,
                transaction_id=transaction_id,
                rows=writer.rows,
                requests=writer.requests,
                seconds=round(time.monotonic() - started, 3),
            )
            return PartitionResult(
                group,
                batch_key,
                transaction_id if writer.rows else None,
                writer.rows,
                False,
                partition_id,
                attempt,
            )

    return run(go)


# --- driver side ------------------------------------------------------------------------------


def decide_batch(
    broker: str,
    group: str,
    batch_key: str,
    results: Iterable[PartitionResult | None],
    request_timeout: float = 30.0,
    credentials: Credentials | None = None,
    tls: TlsOptions | None = None,
    position: tuple[str, str, str] | None = None,
    pipeline: str | None = None,
) -> dict[str, Any]:
    """Commit the successful attempts' transactions of a batch and roll back the rest.

    Args:
        results: the successful attempts' results (None entries are ignored).
        position: ``(pipeline, start, end)``: the input range the batch consumed, recorded
            with the decision (see :mod:`.pipeline`).
        pipeline: the batch's pipeline, when ``position`` is None (the broker rolls back the
            orphans of the pipeline's other runs with the decision).

    Returns:
        The broker's answer (``first`` is False when the batch had been decided before, which is
        the replay path).

    Raises:
        TxmqError: the broker refused the decision, or the batch had been decided before
            without this run's transactions (their rows would be lost).
    """
    commit = sorted(
        {
            r.transaction_id
            for r in results
            if r is not None and r.transaction_id and r.rows > 0 and not r.already_decided
        }
    )

    async def go() -> dict[str, Any]:
        async with BrokerSession(broker, request_timeout, credentials, tls) as session:
            if position is None:
                return await session.decide_batch(group, batch_key, commit, pipeline=pipeline)
            name, start, end = position
            return await session.decide_batch(
                group, batch_key, commit, pipeline=name, start=start, end=end
            )

    answer = run(go)
    # A cluster answers what the decision commits in every group besides its own part.
    committed = set(answer.get("batchCommitted") or answer.get("committed") or [])
    missing = [t for t in commit if t not in committed]
    if missing:
        raise TxmqError(
            f"batch {batch_key!r} of producer group {group} was decided before without "
            f"{len(missing)} transaction(s) of this run (e.g. {missing[0]}); their rows were not "
            "delivered"
        )
    log.info(
        "sink_batch_decided",
        group=group,
        batch_key=batch_key,
        committed=len(answer.get("committed") or []),
        rolled_back=len(answer.get("rolledBack") or []),
        first=answer.get("first"),
    )
    return answer


def rollback_transactions(
    broker: str,
    transaction_ids: Iterable[str],
    request_timeout: float = 30.0,
    credentials: Credentials | None = None,
    tls: TlsOptions | None = None,
) -> list[str]:
    """Roll back the given transactions (best effort: failures are logged, not raised).

    Returns:
        The ids that could not be rolled back.
    """
    ids = sorted(set(transaction_ids))
    if not ids:
        return []

    async def go() -> list[str]:
        failed: list[str] = []
        async with BrokerSession(broker, request_timeout, credentials, tls) as session:
            for txid in ids:
                try:
                    await session.rollback(txid)
                except TxmqError as exc:
                    log.warning("sink_rollback_failed", transaction_id=txid, error=str(exc))
                    failed.append(txid)
        return failed

    failed = run(go)
    log.info("sink_transactions_rolled_back", count=len(ids) - len(failed), failed=len(failed))
    return failed


__all__ = [
    "PartitionResult",
    "decide_batch",
    "new_transaction_id",
    "queue_for_key",
    "rollback_transactions",
    "stream_batch_key",
    "write_partition",
]
