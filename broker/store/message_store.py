"""MessageStore: the commit log, its consume queues and the checkpoint behind one API
(RocketMQ's ``DefaultMessageStore``).

Directory layout under ``store_path_root_dir``::

    lock                                     flock'ed while a MessageStore has the folder open
    checkpoint                               see checkpoint.py
    commitlog/<20-digit offset>              see commit_log.py
    consumequeue/<topic>/<queueId>/<20-digit byte offset>   see consume_queue.py
    config/topics.json, config/consumerOffset.json          TopicConfigManager,
                                                            ConsumerOffsetManager

Threads.  Appends, reads and retention run on one thread (the broker's event loop).
:meth:`MessageStore.flush` and :meth:`MessageStore.flush_consume_queues` may run concurrently on
a worker thread.  One short ``threading.Lock`` is held by an append from the first byte it
reserves until its consume-queue entries are written, and by the flush paths only while they
copy what they will fsync; no fsync ever runs under it.

Dispatch rule (RocketMQ's ``CommitLogDispatcherBuildConsumeQueue``): a message whose transaction
type (``sysFlag & 0xC``) is PREPARED (0x4) or ROLLBACK (0xC) gets no consume-queue entry (its
queue offset is 0); NOT (0x0) and COMMIT (0x8) messages do.

Recovery (:meth:`MessageStore.load`), in order:

1. Open the commit-log segments; read the checkpoint: offset ``L`` and each queue's max offset at
   ``L``.  No (readable) checkpoint means ``L`` = the commit-log minimum: rebuild everything.
2. Open every consume queue, keeping only the entries that point below ``L``.
3. A queue with fewer entries than the checkpoint says lost files; the scan must start early
   enough to rebuild it: at the end of its last surviving entry's message, or at the commit-log
   minimum.  The scan starts at the smallest of these and ``L``.
4. Scan the commit log to the end, validating every record.  Each dispatchable message whose
   queue offset equals its queue's next offset is appended to that queue (already indexed
   messages are skipped; a jump forward means older offsets are gone and the queue restarts
   there).  The first invalid record at or after ``L`` ends the log: its segment is zeroed from
   there and later segments are deleted.  Below ``L`` the data was fsynced: a bad record there
   is a damaged disk, not a torn write; it is logged and skipped, never cut.
5. A queue still short of its checkpoint offsets lost messages for good; it keeps its offsets
   (restarting at the checkpoint's offset if all its messages are gone, else with *hole*
   entries that reads skip), so offsets consumers committed are never reused.
6. Move each queue's minimum to its first message still in the commit log, fsync what recovery
   changed and write a new checkpoint.
"""

from __future__ import annotations

import enum
import fcntl
import os
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import structlog

from txmq.protocol.errors import (
    MessageIllegalError,
    ProtocolError,
    QueryNotFoundError,
    ServiceNotAvailableError,
)
from txmq.protocol.message import (
    FIXED_SIZE,
    POS_PHYSICAL_OFFSET,
    STORED_HEAD,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    encode_tail,
    pack_host,
)

from .checkpoint import StoreCheckpoint
from .commit_log import (
    BLANK_MAGIC,
    FORMAT_VERSION,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    CommitLog,
    DispatchInfo,
    parse_dispatch_info,
)
from .config import StoreConfig
from .consume_queue import CQ_ENTRY, HOLE_SIZE, ConsumeQueue, FlushTracker
from .disk import DiskGuard, read_only_error
from .errors import StoreIOError, StoreLockedError
from .fileio import fsync_dir
from .mapped_file import MappedFile
from .recovery import (
    TX_NO_DISPATCH,
    RecoveryDispatcher,
    RecoveryReport,
    queue_log,
    recover,
    valid_destination,
)
from .retention import delete_expired_files
from .tags import tags_code_of

log = structlog.get_logger(__name__)

#: How many consume-queue entries one get may scan past filtered ones (RocketMQ's
#: maxFilterMessageSize of 16000 bytes = 800 entries).
MAX_FILTER_SCAN = 800


_I64 = struct.Struct(">q")


class GetMessageStatus(enum.Enum):
    """Outcome of :meth:`MessageStore.get_messages` (RocketMQ's names)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"


@dataclass(frozen=True)
class PutMessageResult:
    """Where a message was stored.

    Attributes:
        commit_log_offset: offset of its record in the commit log (the offsetMsgId's offset).
        size: stored-message bytes.
        queue_offset: its offset in its consume queue (0 for PREPARED/ROLLBACK messages).
        store_timestamp: ms, the store's clock.
        offset_msg_id: RocketMQ's offsetMsgId (store host + commit-log offset).
        end_offset: the commit-log offset a flush must reach for the message to be durable.
    """

    commit_log_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    offset_msg_id: str
    end_offset: int


class EncodedMessage(NamedTuple):
    """A message as the store appends it: every field of its stored form except those the
    store sets (queue offset, commit-log offset, store timestamp, store host), with the body's
    CRC and the tail (topic and properties, :func:`~txmq.protocol.message.encode_tail`)
    encoded.  A tuple: a batch decision makes 100,000s."""

    topic: str
    queue_id: int
    magic: int
    body_crc: int
    body: bytes
    #: topic and properties as stored
    tail: bytes
    flag: int
    sys_flag: int
    born_timestamp: int
    #: :func:`~txmq.protocol.message.pack_host`
    born_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    #: the consume-queue tag code of its TAGS
    tags_code: int


def encode_for_store(m: MessageExt) -> EncodedMessage:
    """The :data:`EncodedMessage` of ``m`` (what :meth:`MessageStore.put_messages` stores).

    Raises:
        MessageIllegalError: the topic or the properties cannot be encoded.
    """
    try:
        magic, tail = encode_tail(m)
    except ProtocolError as exc:
        raise MessageIllegalError(f"cannot store message: {exc}") from None
    body = m.body if m.body.__class__ is bytes else bytes(m.body)
    return EncodedMessage(
        m.topic,
        m.queue_id,
        magic,
        zlib.crc32(body) & 0x7FFFFFFF,
        body,
        tail,
        m.flag,
        m.sys_flag,
        m.born_timestamp,
        pack_host(m.born_host),
        m.reconsume_times,
        m.prepared_transaction_offset,
        tags_code_of(m.properties.get(MessageConst.TAGS)),
    )


@dataclass(slots=True)
class AppendResult:
    """Where :meth:`MessageStore.put_encoded` stored its records.

    Attributes:
        placed: ``(commit-log offset, size, queue offset)`` of each record, in order.
        store_timestamp: ms, the store's clock, the same for every record.
        end_offset: the commit-log offset a flush must reach for all of them to be durable.
        per_destination: ``(topic, queue id) -> records``.
        payload_bytes: stored-message bytes (the records without their 12-byte headers).
    """

    placed: list[tuple[int, int, int]]
    store_timestamp: int
    end_offset: int
    per_destination: dict[tuple[str, int], int]
    payload_bytes: int


_body_of = itemgetter(4)
_tail_of = itemgetter(5)


def _put_result(
    commit_log_offset: int,
    size: int,
    queue_offset: int,
    store_timestamp: int,
    offset_msg_id: str,
    end_offset: int,
) -> PutMessageResult:
    """A :class:`PutMessageResult` (a batch decision makes 100,000s).  Compiled, the frozen
    dataclass is a native class whose constructor sets its fields directly; as Python, one
    write of ``__dict__`` instead of the frozen dataclass's ``object.__setattr__`` per field."""
    if _NATIVE_RESULT:
        return PutMessageResult(
            commit_log_offset, size, queue_offset, store_timestamp, offset_msg_id, end_offset
        )
    r = object.__new__(PutMessageResult)
    object.__setattr__(
        r,
        "__dict__",
        {
            "commit_log_offset": commit_log_offset,
            "size": size,
            "queue_offset": queue_offset,
            "store_timestamp": store_timestamp,
            "offset_msg_id": offset_msg_id,
            "end_offset": end_offset,
        },
    )
    return r


#: Whether PutMessageResult is a compiled (native) class: one without an instance __dict__.
_NATIVE_RESULT = "__dict__" not in dir(PutMessageResult)


@dataclass
class GetMessageResult:
    """Messages read from one consume queue.

    Attributes:
        status: what happened.
        messages: raw stored messages (RocketMQ's layout, decodable with
            ``txmq.protocol.message.decode_message``), in queue order; empty when they were
            asked for joined.
        next_begin_offset: the offset to ask for next.
        min_offset: the queue's minimum offset.
        max_offset: the queue's next offset to be written.
        joined: the messages back to back in one buffer (a PULL answer's body), when asked for
            so (``get_messages(..., joined=True)``).
        count: how many messages were read.
    """

    status: GetMessageStatus
    messages: list[bytes] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    joined: bytes = b""
    count: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(len(m) for m in self.messages) + len(self.joined)


class MessageStore:
    """The durable store: commit log, consume queues, checkpoint.

    Args:
        config: where and how to store.
        store_host: this broker's address, written into every message (STOREHOST) and its
            offsetMsgId.
        clock: seconds since the epoch; the store timestamp of each message (a seam for tests).
    """

    def __init__(
        self,
        config: StoreConfig,
        store_host: tuple[str, int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store_host = store_host
        self._clock = clock
        root = config.store_path_root_dir
        self._root = root
        self._cq_dir = os.path.join(root, "consumequeue")
        self._checkpoint_path = os.path.join(root, "checkpoint")
        self._lock_path = os.path.join(root, "lock")
        self._lock = threading.Lock()
        self._cq_flush_lock = threading.Lock()
        self._commit_log = CommitLog(
            os.path.join(root, "commitlog"), config.mapped_file_size_commit_log, self._lock
        )
        self._tracker = FlushTracker(config.max_open_consume_queue_files)
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._topics: dict[str, dict[int, ConsumeQueue]] = {}
        self._host_bytes = pack_host(store_host)
        self._msg_id_prefix = self._host_bytes.hex().upper()
        self._lock_fd: int | None = None
        self._open = False
        #: Whether the disk takes writes (read-only, full): every write asks it first.
        self.disk = DiskGuard(root, config, self._commit_log.probe_write)
        self._last_checkpoint: tuple[int, dict[tuple[str, int], int]] | None = None
        self._put_count = 0
        self._put_bytes = 0
        self._get_found = 0
        self._get_miss = 0
        #: Consumers read only records that end at or below this commit-log offset (None: every
        #: record). A cluster leader sets it to what its in-sync replicas confirmed, so a
        #: message the group could still lose in a failover is never handed to a consumer.
        self.visible_end: int | None = None
        self._replica_dispatcher: RecoveryDispatcher | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self) -> RecoveryReport:
        """Open (or create) the store folder, lock it and recover.

        Raises:
            StoreLockedError: another MessageStore (in any process) has the folder open.
            StoreCorruptError: the checkpoint is from an incompatible format version.
        """
        if self._open:
            raise RuntimeError("the message store is already loaded")
        t0 = time.monotonic()
        for d in (
            self._root,
            self._commit_log.directory,
            self._cq_dir,
            os.path.join(self._root, "config"),
        ):
            os.makedirs(d, exist_ok=True)
        self._acquire_lock()
        try:
            fsync_dir(self._root)
            report = self._recover(t0)
        except BaseException:
            self._close_files()
            self._release_lock()
            raise
        self._open = True
        self.check_space()
        return report

    def _acquire_lock(self) -> None:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            # flock locks belong to the open file description, so a second MessageStore in the
            # same process is refused as well as one in another process.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"the store at {os.path.abspath(self._root)} is in use by another process "
                f"(lock file {self._lock_path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _recover(self, t0: float) -> RecoveryReport:
        return recover(
            self._commit_log,
            self._cqs,
            self._new_cq,
            self._cq_dir,
            self._checkpoint_path,
            self._flush_consume_queues,
            self._root,
            t0,
        )

    def raise_queue_floors(
        self, floors: dict[tuple[str, int], int], source: str
    ) -> dict[tuple[str, int], int]:
        """Offsets already handed out must never be handed out again: a queue whose next offset
        is below its floor (a consumer committed past the end the log kept: an unsynced tail
        lost with a failed disk under ASYNC_FLUSH) goes on from the floor, the offsets between
        filled as holes (reads skip them).  Logged per queue as an error naming the gap and
        ``source``; returns the offsets skipped per queue."""
        skipped: dict[tuple[str, int], int] = {}
        with self._lock:
            for key, floor in sorted(floors.items()):
                if not valid_destination(*key):
                    continue
                cq = self._cqs.get(key) or self._new_cq(key)
                if cq.max_offset >= floor:
                    continue
                queue_log(key).error(
                    "queue_offsets_gap",
                    from_offset=cq.max_offset,
                    to_offset=floor,
                    source=source,
                    action="new messages start above every offset handed out",
                )
                skipped[key] = floor - cq.max_offset
                if cq.last_entry() is None:
                    cq.reset_to(floor)
                else:
                    cq.fill_holes(floor, self._commit_log.write_pos)
        if skipped:
            self._flush_consume_queues()
        return skipped

    def close(self) -> None:
        """Flush the commit log and the consume queues, write the checkpoint, close the files
        and release the lock.  Idempotent."""
        if not self._open:
            return
        try:
            self._flush_consume_queues()
        finally:
            self._open = False
            self._close_files()
            self._release_lock()
        log.info("store_closed", path=self._root, max_phy_offset=self._commit_log.write_pos)

    def _close_files(self) -> None:
        with self._cq_flush_lock, self._lock:
            for cq in self._cqs.values():
                cq.close()
            _segs, _dirs, retired = self._tracker.take()
            for seg in retired:
                seg.close()
            self._cqs.clear()
            self._topics.clear()
        self._commit_log.close()

    def _check_open(self) -> None:
        if not self._open:
            raise ServiceNotAvailableError("the message store is not open")

    def _check_writable(self) -> None:
        if not self._open:
            raise ServiceNotAvailableError("the message store is not open")
        if self.disk.writes_refused is not None:
            raise ServiceNotAvailableError(self.disk.writes_refused)

    def _new_cq(self, key: tuple[str, int]) -> ConsumeQueue:
        cq = ConsumeQueue(
            self._cq_dir, key[0], key[1], self.config.mapped_file_size_consume_queue, self._tracker
        )
        self._cqs[key] = cq
        self._topics.setdefault(key[0], {})[key[1]] = cq
        return cq

    # -- writing --------------------------------------------------------------------------------

    def put_message(self, msg: MessageExt) -> PutMessageResult:
        """Append one message; see :meth:`put_messages`."""
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: list[MessageExt]) -> list[PutMessageResult]:
        """Append messages as one contiguous write, all or none.

        The store sets ``store_timestamp``, ``store_host``, ``commit_log_offset``,
        ``queue_offset`` and ``store_size`` on each message object (and in the stored bytes).
        The append is written to the file (visible to readers, survives the death of the
        process) but not yet fsynced: call :meth:`flush` until ``flushed_offset`` reaches the
        results' ``end_offset`` for that.

        Raises:
            MessageIllegalError: a message is larger than ``max_message_size``, has an invalid
                topic or queue id, or the batch does not fit in one commit-log segment; nothing
                is written.
            StoreIOError: the write failed; nothing is visible.
            ServiceNotAvailableError: the store is not open, or writes are refused (the disk is
                full: see :meth:`check_space`).
        """
        self._check_writable()
        if not msgs:
            return []
        max_size = self.config.max_message_size
        # First every check (nothing is reserved or written before all messages pass): the
        # destination, the tail of the stored form (topic and properties), the size.
        records: list[EncodedMessage] = []
        counts: dict[tuple[str, int], int] = {}  # dispatchable messages per consume queue
        valid: set[tuple[str, int]] = set()  # destinations checked already (a batch has few)
        total = 0
        for m in msgs:
            dest = (m.topic, m.queue_id)
            if dest not in valid:
                if not valid_destination(m.topic, m.queue_id):
                    raise MessageIllegalError(
                        f"cannot store a message for topic {m.topic!r} queue {m.queue_id}: "
                        f"invalid topic name or queue id"
                    )
                valid.add(dest)
            r = encode_for_store(m)
            n = FIXED_SIZE + len(r.body) + len(r.tail)
            if n > max_size:
                raise MessageIllegalError(
                    f"message size {n} bytes exceeds the maximum message size of {max_size} bytes"
                )
            total += RECORD_HEADER_SIZE + n
            if m.sys_flag & MessageSysFlag.TRANSACTION_MASK not in TX_NO_DISPATCH:
                counts[dest] = counts.get(dest, 0) + 1
            records.append(r)
        self._check_fits(total, len(msgs))
        placed, now_ms = self._append(records, total, counts)
        results = []
        store_host, prefix = self.store_host, self._msg_id_prefix
        for (phy, n, qo), m, r in zip(placed, msgs, records, strict=True):
            m.store_timestamp = now_ms
            m.store_host = store_host
            m.commit_log_offset = phy
            m.queue_offset = qo
            m.store_size = n
            m.body_crc = r.body_crc
            results.append(
                _put_result(phy, n, qo, now_ms, f"{prefix}{phy:016X}", phy + RECORD_HEADER_SIZE + n)
            )
        return results

    def put_encoded(self, records: list[EncodedMessage], *, one_run: bool = False) -> AppendResult:
        """:meth:`put_messages` of messages already encoded (:func:`encode_for_store`, or built
        field by field the same way): the same checks, the same stored bytes, all or none; no
        message objects and no per-message results, just where each record went.

        ``one_run``: the caller vouches that every record has the first one's topic, queue id
        and sys flag (a batch from one request): checked as a whole, in C, not record by record.

        Raises:
            MessageIllegalError, StoreIOError, ServiceNotAvailableError: as :meth:`put_messages`.
        """
        self._check_writable()
        if not records:
            pos = self._commit_log.write_pos
            return AppendResult([], int(self._clock() * 1000), pos, {}, 0)
        max_size = self.config.max_message_size
        if one_run:
            return self._put_run(records, max_size)
        per_dest: dict[tuple[str, int], int] = {}
        counts: dict[tuple[str, int], int] = {}  # dispatchable records per consume queue
        total = 0
        # Records come in runs to one destination: counted per run, checked once.
        dest = ("", -1)
        run = dispatched = 0
        tx_mask = MessageSysFlag.TRANSACTION_MASK
        for (
            topic,
            queue_id,
            _magic,
            _crc,
            body,
            tail,
            _flag,
            sys_flag,
            _born_ts,
            _born_host,
            _reconsume,
            _prepared,
            _tags,
        ) in records:
            if queue_id != dest[1] or topic != dest[0]:
                if run:
                    per_dest[dest] = per_dest.get(dest, 0) + run
                    if dispatched:
                        counts[dest] = counts.get(dest, 0) + dispatched
                dest = (topic, queue_id)
                run = dispatched = 0
                if dest not in per_dest and not valid_destination(topic, queue_id):
                    raise MessageIllegalError(
                        f"cannot store a message for topic {topic!r} queue {queue_id}: "
                        f"invalid topic name or queue id"
                    )
            run += 1
            n = FIXED_SIZE + len(body) + len(tail)
            if n > max_size:
                raise MessageIllegalError(
                    f"message size {n} bytes exceeds the maximum message size of {max_size} bytes"
                )
            total += RECORD_HEADER_SIZE + n
            if sys_flag & tx_mask not in TX_NO_DISPATCH:
                dispatched += 1
        per_dest[dest] = per_dest.get(dest, 0) + run
        if dispatched:
            counts[dest] = counts.get(dest, 0) + dispatched
        self._check_fits(total, len(records))
        placed, now_ms = self._append(records, total, counts)
        last, size, _qo = placed[-1]
        return AppendResult(
            placed,
            now_ms,
            last + RECORD_HEADER_SIZE + size,
            per_dest,
            total - RECORD_HEADER_SIZE * len(records),
        )

    def _put_run(self, records: list[EncodedMessage], max_size: int) -> AppendResult:
        """:meth:`put_encoded` of records to one destination with one sys flag: the same
        checks and errors (the first record found too large is the one named), made with a
        few passes in C over the bodies and tails."""
        first = records[0]
        topic, queue_id, sys_flag = first[0], first[1], first[7]
        if not valid_destination(topic, queue_id):
            raise MessageIllegalError(
                f"cannot store a message for topic {topic!r} queue {queue_id}: "
                f"invalid topic name or queue id"
            )
        count = len(records)
        body_lens = list(map(len, map(_body_of, records)))
        tail_lens = list(map(len, map(_tail_of, records)))
        if FIXED_SIZE + max(body_lens) + max(tail_lens) > max_size:
            for b, t in zip(body_lens, tail_lens, strict=True):
                n = FIXED_SIZE + b + t
                if n > max_size:
                    raise MessageIllegalError(
                        f"message size {n} bytes exceeds the maximum message size of "
                        f"{max_size} bytes"
                    )
        payload = FIXED_SIZE * count + sum(body_lens) + sum(tail_lens)
        total = payload + RECORD_HEADER_SIZE * count
        dest = (topic, queue_id)
        dispatched = sys_flag & MessageSysFlag.TRANSACTION_MASK not in TX_NO_DISPATCH
        self._check_fits(total, count)
        placed, now_ms = self._append(records, total, {dest: count} if dispatched else {})
        last, size, _qo = placed[-1]
        return AppendResult(
            placed, now_ms, last + RECORD_HEADER_SIZE + size, {dest: count}, payload
        )

    def _check_fits(self, total: int, count: int) -> None:
        segment = self.config.mapped_file_size_commit_log
        if total > segment:
            what = "the message" if count == 1 else f"the batch of {count} messages"
            raise MessageIllegalError(
                f"{what} needs {total} bytes, more than a commit-log segment of "
                f"{segment} bytes holds"
            )

    def _append(
        self,
        records: list[EncodedMessage],
        total: int,
        counts: dict[tuple[str, int], int],
    ) -> tuple[list[tuple[int, int, int]], int]:
        """:meth:`_append_records`; a write the filesystem refuses as read-only turns writes
        off (ServiceNotAvailableError saying so) until it takes writes again."""
        try:
            return self._append_records(records, total, counts)
        except OSError as exc:
            refused = self.refusal(exc)
            if refused is None:
                raise
            raise refused from exc

    def _append_records(
        self,
        records: list[EncodedMessage],
        total: int,
        counts: dict[tuple[str, int], int],
    ) -> tuple[list[tuple[int, int, int]], int]:
        """Write checked records (``total`` bytes with their record headers; ``counts``: how
        many go to each consume queue) as one contiguous append.  Each record is built with its
        final offsets: record header, fixed head, body (not copied here) and tail, joined once
        by the write.  Returns ``(commit-log offset, size, queue offset)`` of each record and
        the store timestamp."""
        parts: list[bytes | bytearray] = []
        placed: list[tuple[int, int, int]] = []
        host = self._host_bytes
        pack_head = STORED_HEAD.pack
        pack_record = RECORD_HEADER.pack
        pack_entry = CQ_ENTRY.pack
        crc32 = zlib.crc32
        no_v6 = ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)
        tx_mask = MessageSysFlag.TRANSACTION_MASK
        no_dispatch = TX_NO_DISPATCH
        hsize = RECORD_HEADER_SIZE
        with self._lock:
            now_ms = int(self._clock() * 1000)
            cl = self._commit_log
            phy = cl.reserve(total)
            base = phy
            # per consume queue: [next queue offset, packed entries], and the queue
            queues: dict[tuple[str, int], list[Any]] = {}
            filled: list[tuple[ConsumeQueue, list[bytes]]] = []
            for key, count in counts.items():
                cq = self._cqs.get(key) or self._new_cq(key)
                try:
                    cq.prepare_range(cq.max_offset, count)
                except OSError as exc:
                    raise StoreIOError(
                        f"cannot extend consume queue {key[0]}/{key[1]}: {exc}"
                    ) from exc
                packed: list[bytes] = []
                queues[key] = [cq.max_offset, packed]
                filled.append((cq, packed))
            slot: list[Any] = []
            slot_topic, slot_qid = "", -1
            for (
                topic,
                queue_id,
                magic,
                crc,
                body,
                tail,
                flag,
                sys_flag,
                born_ts,
                born_host,
                reconsume,
                prepared,
                tags,
            ) in records:
                n = FIXED_SIZE + len(body) + len(tail)
                if sys_flag & tx_mask in no_dispatch:
                    qo = 0
                else:
                    if queue_id != slot_qid or topic != slot_topic:
                        slot = queues[(topic, queue_id)]
                        slot_topic, slot_qid = topic, queue_id
                    qo = slot[0]
                    slot[0] = qo + 1
                    slot[1].append(pack_entry(phy, n, tags))
                head = pack_head(
                    n,
                    magic,
                    crc,
                    queue_id,
                    flag,
                    qo,
                    phy,
                    sys_flag & no_v6,
                    born_ts,
                    born_host,
                    now_ms,
                    host,
                    reconsume,
                    prepared,
                    len(body),
                )
                parts += (
                    pack_record(RECORD_MAGIC, n, crc32(tail, crc32(body, crc32(head)))),
                    head,
                    body,
                    tail,
                )
                placed.append((phy, n, qo))
                phy += hsize + n
            cl.write(base, parts)
            for cq, packed in filled:
                cq.append_many(b"".join(packed))
        self._put_count += len(records)
        self._put_bytes += total
        return placed, now_ms

    # -- replication (owner thread) --------------------------------------------------------------

    def read_replica_chunk(self, pos: int, max_bytes: int) -> tuple[bytes, int]:
        """A leader's side: whole commit-log records from ``pos`` as stored, see
        :meth:`CommitLog.read_raw`."""
        self._check_open()
        return self._commit_log.read_raw(pos, max_bytes)

    def append_replicated(self, pos: int, data: bytes, next_pos: int) -> int:
        """A follower's side: write records read from the leader at the same offsets (so the
        two logs stay byte-identical) and index them in the consume queues.  Every record is
        checked (framing, CRC, its own offset) before anything is written.  Returns the new
        end of the log.

        Raises:
            ValueError: the chunk does not continue this log or a record is damaged; nothing
                is written.
        """
        self._check_open()
        records: list[tuple[int, int, DispatchInfo]] = []
        mv = memoryview(data)
        cur = 0
        while cur < len(data):
            if len(data) - cur < RECORD_HEADER_SIZE:
                raise ValueError(f"replicated chunk at {pos} ends inside a record header")
            magic, length, crc = RECORD_HEADER.unpack_from(mv, cur)
            if magic == BLANK_MAGIC:
                if cur + RECORD_HEADER_SIZE != len(data):
                    raise ValueError(f"replicated chunk at {pos} goes on after a blank record")
                break
            end = cur + RECORD_HEADER_SIZE + length
            if magic != RECORD_MAGIC or end > len(data):
                raise ValueError(f"replicated chunk at {pos}: no record at {pos + cur}")
            payload = mv[cur + RECORD_HEADER_SIZE : end]
            if zlib.crc32(payload) != crc:
                raise ValueError(f"replicated record at {pos + cur} fails its CRC check")
            phy = _I64.unpack_from(payload, POS_PHYSICAL_OFFSET)[0]
            if phy != pos + cur:
                raise ValueError(
                    f"replicated record at {pos + cur} says it belongs at offset {phy}"
                )
            records.append((pos + cur, length, parse_dispatch_info(payload)))
            cur = end
        mv.release()
        with self._lock:
            cl = self._commit_log
            cl.write_replicated(pos, data, next_pos)
            if self._replica_dispatcher is None:
                self._replica_dispatcher = RecoveryDispatcher(
                    self._cqs, self._new_cq, 0, cl.min_offset
                )
            self._replica_dispatcher.dispatch_many(records)
            self._put_count += len(records)
            self._put_bytes += len(data)
            return cl.write_pos

    def truncate(self, offset: int) -> int:
        """Cut the commit log (and the consume-queue entries pointing into the cut part) back
        to ``offset``, a record boundary: what a rejoining replica does with records its
        leader never acknowledged.  The store is closed and reopened around the cut.  Returns
        the number of bytes cut."""
        self._check_open()
        if offset >= self._commit_log.write_pos:
            return 0
        old_end = self._commit_log.write_pos
        self.close()
        cl = CommitLog(
            self._commit_log.directory, self.config.mapped_file_size_commit_log, threading.Lock()
        )
        cl.load()
        if offset <= cl.min_offset:
            cl.close()
            shutil.rmtree(self._commit_log.directory, ignore_errors=True)
            shutil.rmtree(self._cq_dir, ignore_errors=True)
            if os.path.exists(self._checkpoint_path):
                os.unlink(self._checkpoint_path)
            fsync_dir(self._root)
        else:
            cl._truncate(offset)
            cl.close()
            cp = StoreCheckpoint.read(self._checkpoint_path)
            logic = min(cp.logic_offset, offset) if cp is not None else offset
            StoreCheckpoint(logic, logic, int(time.time() * 1000), {}).write(self._checkpoint_path)
        log.warning("store_truncated", path=self._root, offset=offset, cut_bytes=old_end - offset)
        self._replica_dispatcher = None
        self.load()
        return old_end - offset

    # -- flushing (any thread) ------------------------------------------------------------------

    def flush(self) -> int:
        """fsync the commit log up to the write position seen at the start of the call.

        Thread-safe with respect to appends on the owner thread.

        Returns:
            The new flushed offset.
        """
        try:
            return self._commit_log.flush()
        except OSError as exc:
            if read_only_error(exc):
                self.disk.note_read_only(exc)
            raise

    def flush_consume_queues(self) -> None:
        """fsync the consume queues (and the commit log up to the same point), then write the
        checkpoint.  Thread-safe with respect to appends on the owner thread."""
        if self._open:
            self._flush_consume_queues()

    def _flush_consume_queues(self) -> None:
        with self._cq_flush_lock:
            with self._lock:
                logic = self._commit_log.write_pos
                table = {key: cq.max_offset for key, cq in self._cqs.items()}
                segs, dirs, retired = self._tracker.take()
            for seg in segs:
                seg.sync()
            for d in dirs:
                try:
                    fsync_dir(d)
                except FileNotFoundError:
                    pass
            for seg in retired:
                seg.close_fd()
            physic = self._commit_log.flush()
            if self._last_checkpoint == (logic, table):
                return
            StoreCheckpoint(logic, physic, int(time.time() * 1000), table).write(
                self._checkpoint_path
            )
            self._last_checkpoint = (logic, table)

    @property
    def msg_id_prefix(self) -> str:
        """What every offsetMsgId of this store starts with (its host, 16 hex digits); the
        commit-log offset follows as 16 more."""
        return self._msg_id_prefix

    @property
    def flushed_offset(self) -> int:
        """Commit-log offset below which everything is fsynced."""
        return self._commit_log.flushed

    @property
    def max_phy_offset(self) -> int:
        """End of the commit log (the next append position)."""
        return self._commit_log.write_pos

    @property
    def min_phy_offset(self) -> int:
        """Offset of the oldest message still stored."""
        return self._commit_log.min_offset

    def commit_log_segments(self) -> list[MappedFile]:
        """The commit-log segments, oldest first (a copy of the list; owner thread)."""
        return self._commit_log.segments

    # -- reading --------------------------------------------------------------------------------

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        tag_codes: frozenset[int] | None = None,
        max_bytes: int = 4 * 1024 * 1024,
        joined: bool = False,
        message_filter: Callable[[bytes], bool] | None = None,
        for_consumer: bool = False,
    ) -> GetMessageResult:
        """Read up to ``max_msgs`` messages (and about ``max_bytes``) from a queue, starting at
        queue offset ``offset``.

        Statuses follow RocketMQ's ``DefaultMessageStore.getMessage``; a queue the store has
        never written (but could) is an empty queue, NO_MESSAGE_IN_QUEUE, so the broker can
        hold a long-polling pull on it; NO_MATCHED_LOGIC_QUEUE is for a topic or queue id that
        cannot exist.

        Args:
            topic: the topic.
            queue_id: the queue.
            offset: the first queue offset wanted.
            max_msgs: most messages returned.
            tag_codes: tag codes to keep (None: all messages).
            max_bytes: stop before exceeding this many bytes (the first message is returned
                whatever its size).
            joined: return the messages back to back in one buffer (``joined``), copied once
                from the commit log, rather than one bytes object each.
            message_filter: keep only the stored records it accepts (a SQL92 filter), read
                and tested one by one; the next offset moves past the ones it refused.
            for_consumer: a read for a consumer: only records below :attr:`visible_end` (the
                rest is answered as not there yet, OFFSET_OVERFLOW_ONE, the offset unchanged).
                The broker's own readers (recovery, timers, dedup) read everything.
        """
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            self._get_miss += 1
            status = (
                GetMessageStatus.NO_MESSAGE_IN_QUEUE
                if valid_destination(topic, queue_id)
                else GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
            )
            return GetMessageResult(status, [], 0, 0, 0)
        min_o, max_o = cq.min_offset, cq.max_offset
        visible = self.visible_end
        end = max_o if visible is None or not for_consumer else self._visible_max(cq, visible)
        if max_o == 0:
            status, next_offset = GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0
        elif offset < min_o:
            status, next_offset = GetMessageStatus.OFFSET_TOO_SMALL, min_o
        elif offset == end or end < offset <= max_o:
            # past the end, or in the part not yet confirmed: wait for it, offset unchanged
            status, next_offset = GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
        elif offset > max_o:
            status, next_offset = GetMessageStatus.OFFSET_OVERFLOW_BADLY, max_o
        else:
            return self._read_queue(
                cq, offset, max_msgs, tag_codes, max_bytes, joined, message_filter, end
            )
        self._get_miss += 1
        return GetMessageResult(status, [], next_offset, min_o, end)

    @staticmethod
    def _visible_max(cq: ConsumeQueue, visible_end: int) -> int:
        """The queue offset past the last entry whose record ends at or below ``visible_end``
        (entries of a queue are in commit-log order: a binary search over the tail)."""
        lo, hi = cq.min_offset, cq.max_offset

        def visible(idx: int) -> bool:
            entry = cq.read(idx, 1)
            if not entry:
                return True  # outside the files: nothing to hold back
            phy, size, _tags = CQ_ENTRY.unpack_from(entry)
            return bool(size >= HOLE_SIZE or phy + size <= visible_end)

        if hi <= lo or visible(hi - 1):
            return hi
        while lo < hi:  # the first offset that is not visible
            mid = (lo + hi) // 2
            if visible(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _read_queue(
        self,
        cq: ConsumeQueue,
        offset: int,
        max_msgs: int,
        tag_codes: frozenset[int] | None,
        max_bytes: int,
        joined: bool = False,
        message_filter: Callable[[bytes], bool] | None = None,
        end: int | None = None,
    ) -> GetMessageResult:
        cl = self._commit_log
        cl_min = cl.min_offset
        max_o = cq.max_offset if end is None else end
        limit = min(max_o, offset + max(MAX_FILTER_SCAN, max_msgs))
        messages: list[bytes] = []
        #: joined: the records to read (read together at the end).
        wanted: list[tuple[int, int]] = []
        total = 0
        found_null = False
        idx = offset
        full = False
        while idx < limit:  # (not `while not full and ...`: mypyc mis-compiles that loop)
            chunk = cq.read(idx, limit - idx)
            if not chunk:  # outside the queue's files: nothing there
                found_null = True
                idx += 1
                continue
            for phy, size, tags in CQ_ENTRY.iter_unpack(chunk):
                if len(messages) + len(wanted) >= max_msgs:
                    full = True
                    break
                if size >= HOLE_SIZE or 0 <= phy < cl_min:  # filler, hole, or deleted
                    found_null = True
                    idx += 1
                    continue
                if (messages or wanted) and total + size > max_bytes:
                    full = True
                    break
                idx += 1
                if tag_codes is not None and tags not in tag_codes:
                    continue
                if joined and message_filter is None:
                    wanted.append((phy, size))
                    total += size
                    continue
                payload = cl.read_payload(phy, size)
                if payload is None:
                    fixed = self._repair_entry(cq, idx - 1)
                    if fixed is not None:
                        phy, size = fixed
                        payload = cl.read_payload(phy, size)
                if payload is None:
                    found_null = True
                    self._log_read_failed(cq, idx - 1, phy, size)
                    continue
                if message_filter is not None and not message_filter(payload):
                    continue
                messages.append(payload)
                total += size
            if full:
                break
        body = b""
        count = len(messages)
        if joined and messages:  # filtered: read one by one, joined here
            body, messages = b"".join(messages), []
        if wanted:
            read = cl.read_payloads(wanted)
            if read is None:
                # A record that cannot be read (damaged on disk) is left out and the read goes
                # on past it: read one by one, as a separate read does (and logs).
                separate = self._read_queue(cq, offset, max_msgs, tag_codes, max_bytes, end=max_o)
                separate.joined = b"".join(separate.messages)
                separate.messages = []
                return separate
            body, count = read, len(wanted)
        if count:
            status = GetMessageStatus.FOUND
            self._get_found += 1
        else:
            status = (
                GetMessageStatus.OFFSET_FOUND_NULL
                if found_null
                else GetMessageStatus.NO_MATCHED_MESSAGE
            )
            self._get_miss += 1
        return GetMessageResult(status, messages, idx, cq.min_offset, max_o, body, count)

    def _repair_entry(self, cq: ConsumeQueue, index: int) -> tuple[int, int] | None:
        """The entry at ``index`` names no intact record: a damaged entry (the consume queue
        is derived from the commit log) or a damaged record.  Look for the message between its
        neighbours' records; when found, rewrite the entry (logged) and return ``(offset,
        size)``; None when the record itself is gone."""
        cl = self._commit_log
        start, end = cl.min_offset, cl.write_pos
        before = cq.entry(index - 1) if index > cq.min_offset else None
        if before is not None and before[1] < HOLE_SIZE and cl.read_payload(before[0], before[1]):
            start = before[0] + before[1]
        after = cq.entry(index + 1) if index + 1 < cq.max_offset else None
        if after is not None and after[1] < HOLE_SIZE and cl.read_payload(after[0], after[1]):
            end = after[0]
        topic, qid = cq.topic, cq.queue_id
        hit = cl.find_record(
            start,
            end,
            lambda i: i.queue_offset == index and i.queue_id == qid and i.topic == topic,
        )
        if hit is None:
            return None
        offset, size, info = hit
        if cq.repair(index, offset, size, info.tags_code):
            queue_log((topic, qid)).warning(
                "consume_queue_entry_repaired", queue_offset=index, commit_log_offset=offset
            )
        return offset, size

    def _log_read_failed(self, cq: ConsumeQueue, queue_offset: int, phy: int, size: int) -> None:
        seg = self._commit_log._segment_for(phy)
        queue_log((cq.topic, cq.queue_id)).error(
            "message_read_failed",
            queue_offset=queue_offset,
            commit_log_offset=phy,
            size=size,
            file=seg.path if seg is not None else "(no segment holds it)",
        )

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (0 for a queue never written)."""
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue's first offset whose message is still stored."""
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``; the
        max offset when there is none.  Assumes store timestamps grow with offsets (they do
        unless the clock jumps back)."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        cl = self._commit_log
        while lo < hi:
            mid = (lo + hi) // 2
            e = cq.entry(mid)
            ts = cl.read_store_timestamp(e[0]) if e is not None else None
            if ts is not None and ts >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def read_message_bytes(self, commit_log_offset: int) -> bytes:
        """The raw stored message at a commit-log offset.

        Raises:
            QueryNotFoundError: no intact message starts there.
        """
        payload = self._commit_log.read_payload(commit_log_offset)
        if payload is None:
            raise QueryNotFoundError(f"no message at commit-log offset {commit_log_offset}")
        return payload

    def lookup_message(self, commit_log_offset: int) -> MessageExt:
        """The message at a commit-log offset (an offsetMsgId's offset), decoded.

        Raises:
            QueryNotFoundError: no intact message starts there.
        """
        payload = self.read_message_bytes(commit_log_offset)
        try:
            return decode_message(payload)
        except ProtocolError:
            raise QueryNotFoundError(
                f"no message at commit-log offset {commit_log_offset}"
            ) from None

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The store timestamp (ms) of the message at ``offset`` of a queue, or None when the
        queue holds no such offset."""
        cq = self._cqs.get((topic, queue_id))
        e = cq.entry(offset) if cq is not None else None
        return self._commit_log.read_store_timestamp(e[0]) if e is not None else None

    def queue_ids(self, topic: str) -> list[int]:
        """Ids of the topic's consume queues, sorted."""
        return sorted(self._topics.get(topic, {}))

    def topics(self) -> list[str]:
        """Topics that have consume queues, sorted."""
        return sorted(self._topics)

    def delete_topic(self, topic: str) -> int:
        """Drop the consume queues of ``topic``: their files and folders go (owner thread).
        The messages stay in the commit log until retention deletes them.  Call
        :meth:`flush_consume_queues` next (it may run on a worker thread): the checkpoint it
        writes no longer lists the queues.  Returns the number of queues dropped."""
        self._check_open()
        with self._cq_flush_lock, self._lock:
            queues = self._topics.pop(topic, {})
            for qid, cq in queues.items():
                del self._cqs[(topic, qid)]
                cq.destroy()
        try:
            os.rmdir(os.path.join(self._cq_dir, topic))
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("topic_folder_not_removed", topic=topic)
        if queues:
            log.info("topic_queues_deleted", topic=topic, queues=len(queues))
        return len(queues)

    # -- retention and the disk -------------------------------------------------------------------

    def delete_expired_files(self, now: float | None = None) -> int:
        """Delete old commit-log segments and what points into them (:mod:`.retention`);
        returns how many segments went."""
        self._check_open()
        deleted = delete_expired_files(
            self._commit_log, self._cqs.values(), self.disk, self._lock, now
        )
        self.check_space()
        return deleted

    @property
    def writes_refused(self) -> str | None:
        """Why writes are refused now (None: accepted); see :class:`~.disk.DiskGuard`."""
        return self.disk.writes_refused

    @property
    def writes_refused_cause(self) -> str | None:
        """``disk_full`` or ``read_only`` while writes are refused."""
        return self.disk.writes_refused_cause

    @property
    def statvfs(self) -> Callable[[str], os.statvfs_result]:
        """How the filesystem's flags are read (a seam for tests)."""
        return self.disk.statvfs

    @statvfs.setter
    def statvfs(self, fn: Callable[[str], os.statvfs_result]) -> None:
        self.disk.statvfs = fn

    def refusal(self, exc: BaseException) -> ServiceNotAvailableError | None:
        """The retriable refusal for a write of any store file that failed because the disk
        takes no writes (:meth:`.disk.DiskGuard.refusal`); None for any other error."""
        return self.disk.refusal(exc)

    def check_space(self, freed: int = 0) -> str | None:
        """Look at the disk (:meth:`.disk.DiskGuard.check`): why writes are refused, None
        while they are accepted."""
        if not self._open:
            return self.disk.writes_refused
        return self.disk.check(freed)

    # -- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, int | float | str]:
        """Key figures of the store (flat, for status commands and metrics)."""
        cl = self._commit_log
        return {
            "store_path": self._root,
            "format_version": FORMAT_VERSION,
            "commit_log_min_offset": cl.min_offset,
            "commit_log_max_offset": cl.write_pos,
            "commit_log_flushed_offset": cl.flushed,
            "commit_log_unflushed_bytes": cl.write_pos - cl.flushed,
            "commit_log_segments": len(cl.segments),
            "checkpoint_offset": self._last_checkpoint[0] if self._last_checkpoint else -1,
            "topics": len(self._topics),
            "consume_queues": len(self._cqs),
            "put_messages_total": self._put_count,
            "put_bytes_total": self._put_bytes,
            "get_found_total": self._get_found,
            "get_miss_total": self._get_miss,
            "disk_used_ratio": round(self.disk.used_ratio(), 2) if self._open else 0.0,
        }
