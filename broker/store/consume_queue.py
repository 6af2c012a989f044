"""Consume queues: one index per (topic, queueId) into the commit log (RocketMQ's
``ConsumeQueue``).

Files: ``<root>/consumequeue/<topic>/<queueId>/<20-digit start byte offset>``, each
``mapped_file_size_consume_queue`` bytes (a multiple of 20), preallocated.  The entry for queue
offset ``n`` (the offset a consumer sees) sits at byte ``n * 20`` of the queue, so segment files
are named by byte offsets and ``n`` is found by arithmetic.

Entry layout (RocketMQ's ``CQ_STORE_UNIT_SIZE`` = 20, big-endian)::

    off  size  field
    0    8     COMMITLOG_OFFSET  i64  offset of the message's record in the commit log
    8    4     SIZE              i32  stored-message bytes (the record's payload)
    12   8     TAGS_CODE         i64  hash of the TAGS property (Java String.hashCode), 0 = none

* ``SIZE == 0`` (zeros, as preallocated) means "no entry yet".
* A *hole* entry ``(offset, 0x7FFFFFFE, 0)`` stands for a message lost to a damaged commit log
  (seen only when a queue had to be rebuilt across the damage); reads skip it.
* A *filler* entry ``(0, 0x7FFFFFFF, 0)`` occupies an offset that has no message (RocketMQ's
  ``fillPreBlank``): when a queue must start at an offset in the middle of a new file (its old
  files are gone), the offsets before it are filled so that the file alone says where the queue
  ends.  Fillers are always below the queue's minimum offset.

Files are sparse; disk blocks are reserved (``posix_fallocate``) 64 KiB ahead of the entries
written, before the message's commit-log record is written (:meth:`ConsumeQueue.prepare`), so a
full disk fails the append cleanly, before anything is stored.

Open files: segments are read and written with ``pread``/``pwrite`` through
:class:`~.queue_file.QueueFile` (one descriptor each, no mapping), opened on use and closed by the
store's least-recently-used bound (``maxOpenConsumeQueueFiles``), fsynced first if written.

Durability: entries are fsynced by the store's ``flush_consume_queues``; a consume queue is only an index, and whatever it misses after a crash
is rebuilt from the commit log (``MessageStore.load``).  Entries pointing at or past the
commit-log offset the store re-dispatches from are dropped when a queue is opened, because the
recovery scan writes them again.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable

import structlog

from .fileio import nonzero_end, reserve_blocks, zero_tail
from .mapped_file import segment_files, segment_name
from .queue_file import OpenFiles, QueueFile

log = structlog.get_logger(__name__)

CQ_ENTRY = struct.Struct(">qiq")
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20
FILLER_SIZE = 0x7FFFFFFF
FILLER_ENTRY = CQ_ENTRY.pack(0, FILLER_SIZE, 0)
#: SIZE of a *hole*: an offset whose message was lost to a damaged commit log (found when a
#: queue was rebuilt).  COMMITLOG_OFFSET keeps the entries in commit-log order; reads skip it.
HOLE_SIZE = 0x7FFFFFFE
#: Disk blocks of a segment are reserved this many bytes at a time, ahead of the writes.
RESERVE_STEP = 64 * 1024


class FlushTracker:
    """What the next consume-queue flush must make durable: written segments, directories whose
    entries changed, and deleted segments whose descriptors the flush thread closes.

    Mutated only with the store lock held; the flush thread swaps the sets out under that lock
    (:meth:`take`).  It also holds the store's bound on open consume-queue files
    (:class:`OpenFiles`, ``open_files_bound``: 0 derives it from the open-files limit)."""

    def __init__(self, open_files_bound: int = 0) -> None:
        self.segments: set[QueueFile] = set()
        self.dirs: set[str] = set()
        self.retired: list[QueueFile] = []
        self.files = OpenFiles(open_files_bound)

    def written(self, seg: QueueFile) -> None:
        self.segments.add(seg)

    def created(self, seg: QueueFile) -> None:
        self.segments.add(seg)
        self.dirs.add(os.path.dirname(seg.path))

    def dir_created(self, parent: str) -> None:
        self.dirs.add(parent)

    def deleted(self, seg: QueueFile) -> None:
        self.segments.discard(seg)
        self.retired.append(seg)
        self.dirs.add(os.path.dirname(seg.path))

    def take(self) -> tuple[list[QueueFile], list[str], list[QueueFile]]:
        segs, dirs, retired = list(self.segments), sorted(self.dirs), self.retired
        self.segments, self.dirs, self.retired = set(), set(), []
        return segs, dirs, retired


def first_false(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The first index in ``[lo, hi)`` where ``pred`` is false (``pred`` is true on a prefix)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


class ConsumeQueue:
    """The queue offsets of one (topic, queueId).

    ``min_offset`` is the first offset whose message is still in the commit log; ``max_offset``
    is the next offset to write.  Owner thread only, except that the flush thread fsyncs
    segments handed to it through the :class:`FlushTracker`.

    Args:
        root: ``<root>/consumequeue``.
        topic: the topic (a safe directory name; the store validates it).
        queue_id: the queue id.
        segment_size: bytes per segment file (multiple of 20).
        tracker: where written/created/deleted segments are reported.
    """

    def __init__(
        self, root: str, topic: str, queue_id: int, segment_size: int, tracker: FlushTracker
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._root = root
        self.directory = os.path.join(root, topic, str(queue_id))
        self.segment_size = segment_size
        self._tracker = tracker
        self._segments: list[QueueFile] = []
        self._starts: list[int] = []
        self.min_offset = 0
        self.max_offset = 0
        #: Queue byte position up to which the last segment's disk blocks are reserved.
        self._reserved_end = 0

    # -- opening ----------------------------------------------------------------------------

    def load(self, below: int) -> None:
        """Open the queue's files and keep the entries that point below commit-log offset
        ``below`` (plus fillers); the rest of the queue is zeroed.

        Entries under the checkpoint were fsynced before it was written, so they form an intact
        prefix; what follows may be torn and is rebuilt by the recovery scan.
        """
        found = segment_files(self.directory)
        segs: list[QueueFile] = []
        for start, path in found:
            if start % CQ_ENTRY_SIZE or (segs and start != segs[-1].end):
                log.warning("segment_deleted", path=path, reason="gap_in_consume_queue")
                os.unlink(path)
                self._tracker.dir_created(self.directory)
                continue
            seg = QueueFile.open_existing(path, start, self.segment_size, self._tracker.files)
            seg.capacity -= seg.capacity % CQ_ENTRY_SIZE
            segs.append(seg)
        if not segs:
            return

        def entry(index: int) -> tuple[int, int, int]:
            pos = index * CQ_ENTRY_SIZE
            i = bisect.bisect_right([s.start for s in segs], pos) - 1
            seg = segs[i]
            raw = seg.pread(CQ_ENTRY_SIZE, pos - seg.start)
            if len(raw) < CQ_ENTRY_SIZE:
                return (0, 0, 0)
            phy, size, tags = CQ_ENTRY.unpack(raw)
            return phy, size, tags

        def keep(index: int) -> bool:
            phy, size, _ = entry(index)
            return size > 0 and (size == FILLER_SIZE or 0 <= phy < below)

        lo = segs[0].start // CQ_ENTRY_SIZE
        cut = first_false(lo, segs[-1].end // CQ_ENTRY_SIZE, keep)
        cut_pos = cut * CQ_ENTRY_SIZE
        keep_n = len(segs)
        for i, seg in enumerate(segs):
            if seg.start <= cut_pos < seg.end:
                if cut_pos == seg.start and i > 0:
                    keep_n = i
                else:
                    keep_n = i + 1
                    rel = cut_pos - seg.start
                    if nonzero_end(seg.handle(), rel, seg.capacity) > rel:
                        zero_tail(seg.handle(), rel, seg.capacity)
                        self._tracker.written(seg)
                break
        for seg in segs[keep_n:]:
            seg.unlink()
            self._tracker.dir_created(self.directory)
        for seg in segs[:keep_n]:
            self._segments.append(seg)
            self._starts.append(seg.start)
        self.max_offset = self.min_offset = cut
        # written entries have their blocks; reserve the rest as the queue grows
        self._reserved_end = cut_pos - cut_pos % RESERVE_STEP

    # -- writing (owner thread, store lock held) ---------------------------------------------

    def prepare(self, index: int) -> None:
        """Make sure the entry for offset ``index`` (the next one, or one of the next few) can
        be written: its segment exists and its disk blocks are reserved.

        The store calls this before it writes the commit log, so a full disk fails the append
        cleanly instead of after the message is stored (or as SIGBUS in the mapped write).

        Raises:
            OSError: the segment cannot be created or its blocks cannot be reserved.
        """
        pos = index * CQ_ENTRY_SIZE
        seg = self._segments[-1] if self._segments else None
        if seg is None or pos >= seg.end:
            seg = self._new_segment(pos)
        if pos + CQ_ENTRY_SIZE > self._reserved_end:
            self._reserve(seg, pos + CQ_ENTRY_SIZE - seg.start)

    def _reserve(self, seg: QueueFile, upto: int) -> None:
        """Reserve blocks of ``seg`` from the reserved end to ``upto`` (relative), rounded up
        to ``RESERVE_STEP`` so that this costs one system call per few thousand entries."""
        begin = max(self._reserved_end - seg.start, 0)
        end = min(seg.capacity, -(-upto // RESERVE_STEP) * RESERVE_STEP)
        if end > begin:
            reserve_blocks(seg.handle(), begin, end - begin)
        self._reserved_end = seg.start + end

    def _segment_to_write(self, pos: int) -> QueueFile:
        """The segment holding byte ``pos`` (that of offset ``max_offset``), prepared."""
        seg = self._segments[-1] if self._segments else None
        if seg is None or pos >= seg.end or pos + CQ_ENTRY_SIZE > self._reserved_end:
            self.prepare(self.max_offset)
            seg = self._segments[-1]
        if pos < seg.start:  # a batch prepared later offsets into a newer segment
            seg = self._segments[bisect.bisect_right(self._starts, pos) - 1]
        return seg

    def append(self, commit_log_offset: int, size: int, tags_code: int) -> None:
        """Write the entry for offset ``max_offset`` and advance it."""
        pos = self.max_offset * CQ_ENTRY_SIZE
        seg = self._segment_to_write(pos)
        seg.pwrite(CQ_ENTRY.pack(commit_log_offset, size, tags_code), pos - seg.start)
        self.max_offset += 1
        self._tracker.written(seg)

    def prepare_range(self, first: int, count: int) -> None:
        """:meth:`prepare` for the ``count`` offsets from ``first`` on, a call per segment
        rather than per entry.

        Raises:
            OSError: a segment cannot be created or its blocks cannot be reserved.
        """
        idx, end = first, first + count
        while idx < end:
            self.prepare(idx)
            last = min(end, self._segments[-1].end // CQ_ENTRY_SIZE) - 1
            if last > idx:
                self.prepare(last)
            idx = max(last, idx) + 1

    def append_many(self, entries: bytes) -> None:
        """Write packed entries (``CQ_ENTRY`` each) from offset ``max_offset`` on and advance
        it: :meth:`append` for each of them, a write per segment."""
        n = len(entries) // CQ_ENTRY_SIZE
        data = memoryview(entries)
        done = 0
        while done < n:
            pos = self.max_offset * CQ_ENTRY_SIZE
            seg = self._segment_to_write(pos)
            k = min(n - done, (seg.end - pos) // CQ_ENTRY_SIZE)
            stop = pos + k * CQ_ENTRY_SIZE
            if seg is self._segments[-1] and stop > self._reserved_end:
                self._reserve(seg, stop - seg.start)
            seg.pwrite(data[done * CQ_ENTRY_SIZE : (done + k) * CQ_ENTRY_SIZE], pos - seg.start)
            self.max_offset += k
            done += k
            self._tracker.written(seg)

    def _new_segment(self, pos: int) -> QueueFile:
        if self._segments:
            start = self._segments[-1].end
        else:
            start = pos - pos % self.segment_size
        if not os.path.isdir(self.directory):
            topic_dir = os.path.dirname(self.directory)
            if not os.path.isdir(topic_dir):
                os.makedirs(topic_dir, exist_ok=True)
                self._tracker.dir_created(self._root)
            os.makedirs(self.directory, exist_ok=True)
            self._tracker.dir_created(topic_dir)
        seg = QueueFile.create(
            self.directory, segment_name(start), start, self.segment_size, self._tracker.files
        )
        self._segments.append(seg)
        self._starts.append(seg.start)
        self._tracker.created(seg)
        self._reserved_end = start
        if pos > start:
            self._reserve(seg, pos - start)
            seg.pwrite(FILLER_ENTRY * ((pos - start) // CQ_ENTRY_SIZE), 0)
        return seg

    def repair(self, index: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """Make the existing entry at ``index`` say what the commit log says (a rebuild scan
        found the message of offset ``index`` there); True if it had to be rewritten."""
        loc = self._locate(index) if index < self.max_offset else None
        if loc is None:
            return False
        seg, rel = loc
        raw = seg.pread(CQ_ENTRY_SIZE, rel)
        if len(raw) == CQ_ENTRY_SIZE and CQ_ENTRY.unpack(raw) == (
            commit_log_offset,
            size,
            tags_code,
        ):
            return False
        seg.pwrite(CQ_ENTRY.pack(commit_log_offset, size, tags_code), rel)
        self._tracker.written(seg)
        return True

    def fill_holes(self, upto: int, commit_log_offset: int) -> None:
        """Append hole entries until ``max_offset`` is ``upto``: those offsets' messages are
        lost, the later ones are not."""
        while self.max_offset < upto:
            self.append(commit_log_offset, HOLE_SIZE, 0)

    def reset_to(self, offset: int) -> None:
        """Forget every entry and make ``offset`` the queue's next (and minimum) offset; the
        offsets before it are gone with their messages."""
        self._drop_segments_from(0, reason="queue_reset")
        self.min_offset = self.max_offset = offset
        if offset > 0:
            self._new_segment(offset * CQ_ENTRY_SIZE)

    def _drop_segments_from(self, keep: int, reason: str) -> None:
        for seg in self._segments[keep:]:
            seg.unlink()
            self._tracker.deleted(seg)
            log.info("segment_deleted", path=seg.path, reason=reason)
        del self._segments[keep:]
        del self._starts[keep:]

    # -- reading ------------------------------------------------------------------------------

    @property
    def base_offset(self) -> int:
        """The first offset the queue's files cover."""
        return self._segments[0].start // CQ_ENTRY_SIZE if self._segments else self.max_offset

    def _locate(self, index: int) -> tuple[QueueFile, int] | None:
        pos = index * CQ_ENTRY_SIZE
        segs = self._segments
        if not segs:
            return None
        last = segs[-1]
        if pos >= last.start:
            seg = last
        else:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i < 0:
                return None
            seg = segs[i]
        rel = pos - seg.start
        if rel >= seg.capacity:
            return None
        return seg, rel

    def entry(self, index: int) -> tuple[int, int, int] | None:
        """``(commit_log_offset, size, tags_code)`` at ``index``, or None outside the files."""
        if index >= self.max_offset:
            return None
        loc = self._locate(index)
        if loc is None:
            return None
        seg, rel = loc
        raw = seg.pread(CQ_ENTRY_SIZE, rel)
        if len(raw) < CQ_ENTRY_SIZE:
            return None
        phy, size, tags = CQ_ENTRY.unpack(raw)
        return phy, size, tags

    def read(self, index: int, count: int) -> bytes:
        """Raw entries ``[index, index + k)``, ``1 <= k <= count``, all from one segment
        (empty when ``index`` is outside the files)."""
        loc = self._locate(index)
        if loc is None:
            return b""
        seg, rel = loc
        n = min(count, self.max_offset - index, (seg.capacity - rel) // CQ_ENTRY_SIZE)
        if n <= 0:
            return b""
        raw = seg.pread(n * CQ_ENTRY_SIZE, rel)
        return raw[: len(raw) - len(raw) % CQ_ENTRY_SIZE]

    def last_entry(self) -> tuple[int, int, int] | None:
        return self.entry(self.max_offset - 1) if self.max_offset > self.base_offset else None

    def _is_filler_or_below(self, index: int, phy_limit: int) -> bool:
        e = self.entry(index)
        # a negative offset is a damaged entry, not a deleted message (repaired when read)
        return e is not None and (e[1] == FILLER_SIZE or 0 <= e[0] < phy_limit)

    # -- retention --------------------------------------------------------------------------

    def correct_min_offset(self, commit_log_min: int) -> None:
        """Move ``min_offset`` to the first entry whose message is at or above
        ``commit_log_min`` (entries are in commit-log order, so a binary search does)."""
        self.min_offset = first_false(
            self.base_offset, self.max_offset, lambda i: self._is_filler_or_below(i, commit_log_min)
        )

    def delete_expired(self, commit_log_min: int) -> int:
        """Delete leading segment files whose entries all point below ``commit_log_min`` (never
        the last file, which keeps the queue's position), then correct ``min_offset``."""
        deleted = 0
        while len(self._segments) > 1:
            seg = self._segments[0]
            last = self.entry(seg.end // CQ_ENTRY_SIZE - 1)
            if last is None or not (last[1] == FILLER_SIZE or last[0] < commit_log_min):
                break
            self._segments.pop(0)
            self._starts.pop(0)
            seg.unlink()
            self._tracker.deleted(seg)
            log.info("segment_deleted", path=seg.path, reason="commit_log_deleted")
            deleted += 1
        self.correct_min_offset(commit_log_min)
        return deleted

    def destroy(self) -> None:
        """Delete every segment file of the queue and its folder (the topic is being deleted).
        The descriptors are closed by the next flush, as for any deleted segment."""
        self._drop_segments_from(0, reason="topic_deleted")
        self.min_offset = self.max_offset = 0
        try:
            os.rmdir(self.directory)
        except OSError:
            log.warning("queue_folder_not_removed", path=self.directory)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        for seg in self._segments:
            seg.close()
        self._segments.clear()
        self._starts.clear()
