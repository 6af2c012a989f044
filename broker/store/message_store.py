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

import fcntl
import os
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable

import structlog

from txmq.protocol.errors import ServiceNotAvailableError
from txmq.protocol.message import POS_PHYSICAL_OFFSET, pack_host

from .appends import Appends
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
from .consume_queue import ConsumeQueue, FlushTracker
from .disk import DiskGuard, read_only_error
from .errors import StoreLockedError
from .fileio import fsync_dir
from .mapped_file import MappedFile
from .recovery import (
    RecoveryDispatcher,
    RecoveryReport,
    queue_log,
    recover,
    valid_destination,
)
from .retention import delete_expired_files

log = structlog.get_logger(__name__)

_I64 = struct.Struct(">q")


class MessageStore(Appends):
    """The durable store: commit log, consume queues, checkpoint.  Its appends are
    :class:`~.appends.Appends`, its reads :class:`~.reads.QueueReads` (the base of the
    appends); the state is here.

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

    # -- topics and queues ----------------------------------------------------------------------

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
