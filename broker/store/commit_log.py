"""The commit log: every message of every topic, appended to one log of fixed-size segments.

Files: ``<root>/commitlog/<20-digit start offset>``, each ``mapped_file_size_commit_log`` bytes,
preallocated.  Store offsets are global: segment ``N`` covers ``[start, start + size)`` and the
next segment starts where it ends.

Record layout (``FORMAT_VERSION`` 1, big-endian)::

    off  size  field
    0    4     MAGIC     RECORD_MAGIC 0x54584D51 ("TXMQ") or BLANK_MAGIC 0x54584D42 ("TXMB")
    4    4     LENGTH    message record: payload bytes
                         blank record: bytes from the blank's first byte to the segment end
    8    4     CRC32     zlib.crc32 of the payload (blank record: 0)
    12   n     PAYLOAD   the stored message in RocketMQ's layout (txmq.protocol.message), with
                         QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and STOREHOST filled in

* A message's commit-log offset (its offsetMsgId, its consume-queue entry, the PHYSICALOFFSET
  inside the payload) is the offset of the record's first byte (the MAGIC).
* A record never spans two segments.  When the next record does not fit, a blank record fills
  the rest of the segment (just its 12-byte header is written) and the record goes to the start
  of a new segment.  If fewer than 12 bytes remain, nothing is written: a reader that has fewer
  than 12 bytes left in a segment moves on to the next one.
* Zeros mean "end of data": segments are preallocated, so the unwritten part reads as zeros.

Why ``pwrite`` for appends and ``mmap`` for reads: a write through a mapping of a sparse file
that hits a full disk kills the process with SIGBUS, while ``pwrite`` raises ENOSPC, which the
broker can answer.  Reads through the mapping cost no system call per message (a pull reads up
to 32 of them), and the page cache is shared, so they see every ``pwrite`` at once.  The store
never shrinks a mapped file (tails are zeroed with the file unmapped), so reads cannot fault.

Recovery rule (:meth:`CommitLog.recover`): scan forward from a known record boundary (the
checkpoint), validating framing, CRC and the payload's own TOTALSIZE/MAGIC/PHYSICALOFFSET.  The
first record that fails ends the log: the rest of its segment is zeroed and later segments are
deleted.  Data below the checkpoint was fsynced, so the cut never goes below it: if a scan that
started earlier (to rebuild a lost consume queue) meets a bad record there, the record is
skipped, not cut.
"""

from __future__ import annotations

import bisect
import enum
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import structlog

from txmq.protocol.message import (
    FIXED_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MessageConst,
    string_to_properties,
)

from .errors import StoreIOError
from .fileio import fsync_dir, nonzero_end, zero_tail
from .mapped_file import MappedFile, segment_files, segment_name
from .tags import tags_code_of

log = structlog.get_logger(__name__)

#: Version of the on-disk formats (commit-log record, consume-queue entry, checkpoint).
FORMAT_VERSION = 1

RECORD_MAGIC = 0x54584D51  # "TXMQ"
#: How a record header starts on disk (what a scan past damage looks for).
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "big")
BLANK_MAGIC = 0x54584D42  # "TXMB"
RECORD_HEADER = struct.Struct(">III")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 12

# Positions inside the payload (the stored message), see txmq.protocol.message.
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: A stored message's TOTALSIZE and MAGICCODE, its first two fields.
_TOTAL_AND_MAGIC = struct.Struct(">ii")
_I16 = struct.Struct(">h")
_POS_TOTALSIZE = 0
_POS_MAGIC = 4
_POS_QUEUE_ID = 12
_POS_QUEUE_OFFSET = 20
_POS_PHYSICAL_OFFSET = 28
_POS_SYS_FLAG = 36
_POS_STORE_TIMESTAMP = 56
_POS_BODY_LEN = 84
#: Most buffers one pwritev takes (POSIX IOV_MAX; Linux: 1024).
_IOV_MAX = 1024


def encode_record(payload: bytes | bytearray | memoryview) -> bytes:
    """One message record: header + payload."""
    return RECORD_HEADER.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + bytes(payload)


class DispatchInfo(NamedTuple):
    """What a consume queue needs from a stored message."""

    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    store_timestamp: int


def parse_dispatch_info(payload: bytes | memoryview) -> DispatchInfo:
    """Read the dispatch fields of a stored message without decoding the body.

    Raises:
        ValueError: the payload is not a well-formed stored message.
    """
    try:
        magic = _I32.unpack_from(payload, _POS_MAGIC)[0]
        body_len = _I32.unpack_from(payload, _POS_BODY_LEN)[0]
        if body_len < 0:
            raise ValueError("negative body length")
        p = FIXED_SIZE + body_len
        if magic == MESSAGE_MAGIC_CODE:
            tlen = payload[p]
            p += 1
        elif magic == MESSAGE_MAGIC_CODE_V2:
            tlen = _I16.unpack_from(payload, p)[0]
            p += 2
        else:
            raise ValueError(f"bad message magic {magic}")
        if tlen <= 0:
            raise ValueError("empty topic")
        topic = bytes(payload[p : p + tlen]).decode("utf-8")
        p += tlen
        plen = _I16.unpack_from(payload, p)[0]
        p += 2
        if plen < 0 or p + plen != len(payload):
            raise ValueError("properties do not end the record")
        tags = None
        if plen:
            props = bytes(payload[p : p + plen]).decode("utf-8")
            if MessageConst.TAGS in props:
                tags = string_to_properties(props).get(MessageConst.TAGS)
        return DispatchInfo(
            topic,
            _I32.unpack_from(payload, _POS_QUEUE_ID)[0],
            _I64.unpack_from(payload, _POS_QUEUE_OFFSET)[0],
            _I32.unpack_from(payload, _POS_SYS_FLAG)[0],
            tags_code_of(tags),
            _I64.unpack_from(payload, _POS_STORE_TIMESTAMP)[0],
        )
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed stored message: {exc}") from None


def _payload_matches(payload: bytes | memoryview, length: int, offset: int) -> bool:
    """The payload's own fields agree with where and how it was framed."""
    return (
        _I32.unpack_from(payload, _POS_TOTALSIZE)[0] == length
        and _I32.unpack_from(payload, _POS_MAGIC)[0] in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
        and _I64.unpack_from(payload, _POS_PHYSICAL_OFFSET)[0] == offset
    )


def intact_record_size(
    data: bytes | memoryview | mmap.mmap, rel: int, cap_left: int, offset: int
) -> int | None:
    """The record size (header included) of the intact message record at ``rel`` of ``data``
    (``cap_left``: bytes from there to the segment's end; ``offset``: its commit-log offset),
    or None.  Raises IndexError when ``data`` ends inside it."""
    if len(data) - rel < RECORD_HEADER_SIZE:
        raise IndexError
    magic, length, crc = RECORD_HEADER.unpack_from(data, rel)
    if magic != RECORD_MAGIC or not FIXED_SIZE <= length <= cap_left - RECORD_HEADER_SIZE:
        return None
    stop = rel + RECORD_HEADER_SIZE + length
    if stop > len(data):
        raise IndexError
    with memoryview(data) as mv:
        payload = mv[rel + RECORD_HEADER_SIZE : stop]
        try:
            if zlib.crc32(payload) != crc or not _payload_matches(payload, length, offset):
                return None
            parse_dispatch_info(payload)
        except ValueError:
            return None
        finally:
            payload.release()
    return int(RECORD_HEADER_SIZE + length)


class _Stop(enum.Enum):
    """Why a segment walk stopped."""

    INVALID = "invalid"  # no valid record at the position (zeros, garbage, torn record)
    BLANK = "blank"  # a blank record: continue in the next segment
    SHORT_TAIL = "short_tail"  # fewer than 12 bytes left: continue in the next segment


class _Found(Exception):
    """Ends :meth:`CommitLog.find_record`'s walk at the record wanted."""


@dataclass(frozen=True)
class CommitLogRecovery:
    """What :meth:`CommitLog.recover` found and did."""

    end: int
    truncated_bytes: int
    deleted_segments: int
    damaged_records: int


class CommitLog:
    """The segments of the commit log and the append position.

    Threads: :meth:`reserve`, :meth:`write`, reads and retention run on one thread (the store's
    owner) with ``lock`` held around anything that changes the segment list; :meth:`flush` may
    run concurrently on a worker thread and takes ``lock`` only to copy what it needs.

    Args:
        directory: ``<root>/commitlog``.
        segment_size: size of new segment files.
        lock: the store's short lock (shared so the store can snapshot the commit-log position
            and its consume queues atomically).
    """

    def __init__(self, directory: str, segment_size: int, lock: threading.Lock) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self._lock = lock
        self._flush_lock = threading.Lock()
        self._segments: list[MappedFile] = []
        self._starts: list[int] = []
        #: Next append position (also the end of valid data).
        self.write_pos = 0
        #: Everything below this offset is fsynced.
        self.flushed = 0
        self._retired: list[MappedFile] = []
        self._dir_dirty = False

    # -- opening ----------------------------------------------------------------------------

    def load(self) -> None:
        """Open the segment files (no validation of their content; see :meth:`recover`).

        Segments must be contiguous; files after a gap cannot be reached and are set aside
        (renamed ``<name>.orphaned``).
        """
        os.makedirs(self.directory, exist_ok=True)
        found = segment_files(self.directory)
        expected: int | None = None
        for start, path in found:
            if expected is not None and start != expected:
                # A segment in the middle is missing: offsets after it cannot be reached by a
                # scan.  The file is kept for an operator, under a name the store ignores.
                os.replace(path, path + ".orphaned")
                log.error(
                    "segment_orphaned",
                    path=path + ".orphaned",
                    reason="gap_in_commit_log",
                    expected_start=expected,
                )
                self._dir_dirty = True
                continue
            # A segment's capacity is its file size (segments written under an older
            # mappedFileSizeCommitLog keep theirs).  An empty file was created but never sized
            # (a crash right after open): it gets the configured size.
            size = os.path.getsize(path)
            seg = MappedFile.open_existing(
                path, start, min_capacity=size or self.segment_size, writable=False
            )
            self._append_segment(seg)
            expected = seg.end
        if self._segments:
            self.write_pos = self._segments[-1].end
        self.flushed = self.write_pos

    @property
    def min_offset(self) -> int:
        """Offset of the oldest byte still stored (0 for an empty log)."""
        return self._segments[0].start if self._segments else 0

    @property
    def segments(self) -> list[MappedFile]:
        return list(self._segments)

    def recover(
        self, start: int, durable_end: int, on_record: Callable[[int, int, DispatchInfo], None]
    ) -> CommitLogRecovery:
        """Validate from ``start`` (a record boundary) to the end of data, calling
        ``on_record(offset, size, info)`` for every valid message record, then cut the log
        after the last valid record.

        ``durable_end`` (the checkpoint, also a record boundary) separates data that was
        fsynced from a tail a crash may have torn.  Only the tail is ever cut: a bad record
        below ``durable_end`` (a damaged disk) is logged and skipped (the scan resumes at the
        next segment, or at ``durable_end`` if that comes first); reads of it fail their CRC
        check instead.

        ``size`` is the payload (stored-message) size.  Returns the new end and what was cut.
        """
        start = max(start, self.min_offset)
        end, damaged = self._scan(start, max(durable_end, start), on_record)
        truncated, deleted = self._truncate(end)
        self.write_pos = end
        self.flushed = min(self.flushed, start)
        return CommitLogRecovery(end, truncated, deleted, damaged)

    def _scan(
        self, start: int, durable_end: int, on_record: Callable[[int, int, DispatchInfo], None]
    ) -> tuple[int, int]:
        """Returns the end of valid data and how many bad records were skipped below
        ``durable_end``."""
        pos = start
        damaged = 0
        while True:
            idx = self._index_of(pos)
            if idx is None:
                return pos, damaged
            seg = self._segments[idx]
            stop, pos = self._scan_segment(seg, pos, on_record)
            if stop is _Stop.INVALID:
                # A damaged record, or the torn tail a crash left?  Damage has intact records
                # after it (each names its own offset, so a match is no accident): those are
                # kept, with their offsets, whether or not a checkpoint vouches for them.
                resume = self._next_record(seg, pos)
                if resume is None and idx + 1 < len(self._segments):
                    following = self._segments[idx + 1]
                    if self._record_at(following, following.start) is not None:
                        resume = following.start  # records never span two segments
                if resume is None:
                    if pos >= durable_end:
                        return pos, damaged  # the torn tail starts here
                    # Below the checkpoint with nothing readable after it in this segment.
                    resume = min(durable_end, seg.end)
                log.error(
                    "commit_log_damaged",
                    offset=pos,
                    skipped_to=resume,
                    bytes=resume - pos,
                    path=seg.path,
                )
                damaged += 1
                pos = resume
            elif idx + 1 < len(self._segments):
                pos = self._segments[idx + 1].start
            else:
                # The data ends with this segment: after a blank record the log ends at the
                # segment end (as it did when the blank was written); in a tail too short
                # for a header it ends where the last record ended.
                return (seg.end if stop is _Stop.BLANK else pos), damaged

    def find_record(
        self, start: int, end: int, wanted: Callable[[DispatchInfo], bool]
    ) -> tuple[int, int, DispatchInfo] | None:
        """The first intact record in ``[start, end)`` whose dispatch fields ``wanted``
        accepts, as ``(offset, size, info)``; damaged bytes are stepped over."""
        found: list[tuple[int, int, DispatchInfo]] = []

        def on_record(offset: int, size: int, info: DispatchInfo) -> None:
            if offset >= end:
                raise _Found
            if wanted(info):
                found.append((offset, size, info))
                raise _Found

        pos = max(start, self.min_offset)
        while pos < min(end, self.write_pos):
            idx = self._index_of(pos)
            if idx is None:
                return None
            seg = self._segments[idx]
            try:
                stop, pos = self._scan_segment(seg, pos, on_record)
            except _Found:
                return found[0] if found else None
            if stop is _Stop.INVALID:
                resume = self._next_record(seg, pos)
                pos = resume if resume is not None else seg.end
            else:
                pos = seg.end
        return None

    def _record_at(self, seg: MappedFile, pos: int) -> int | None:
        """The payload length of the intact message record at ``pos`` of ``seg``, or None."""
        assert seg.mm is not None
        rel = pos - seg.start
        if rel < 0:
            return None
        try:
            size = intact_record_size(seg.mm, rel, seg.capacity - rel, pos)
        except IndexError:  # the segment ends inside a record header
            return None
        return None if size is None else size - RECORD_HEADER_SIZE

    def _next_record(self, seg: MappedFile, pos: int) -> int | None:
        """The offset of the first intact record of ``seg`` after ``pos``, or None.  Only the
        bytes up to the segment's last non-zero one are searched: the zeros a preallocated
        segment ends with (what follows the end of the log at every start) cost no read."""
        assert seg.mm is not None and seg.fd is not None
        mm = seg.mm
        rel = pos - seg.start + 1
        end = nonzero_end(seg.fd, rel, seg.capacity)
        while rel < end:
            rel = mm.find(_MAGIC_BYTES, rel, end)
            if rel < 0:
                return None
            if self._record_at(seg, seg.start + rel) is not None:
                return seg.start + rel
            rel += 1
        return None

    def _scan_segment(
        self, seg: MappedFile, pos: int, on_record: Callable[[int, int, DispatchInfo], None]
    ) -> tuple[_Stop, int]:
        """Walk the records of one segment from ``pos``; why and where the walk stopped."""
        assert seg.mm is not None
        header = RECORD_HEADER
        hsize = RECORD_HEADER_SIZE
        cap = seg.capacity
        with memoryview(seg.mm) as mv:
            while True:
                rel = pos - seg.start
                if cap - rel < hsize:
                    return _Stop.SHORT_TAIL, pos
                magic, length, crc = header.unpack_from(mv, rel)
                if magic == BLANK_MAGIC and length == cap - rel and crc == 0:
                    return _Stop.BLANK, pos
                if magic != RECORD_MAGIC or not FIXED_SIZE <= length <= cap - rel - hsize:
                    return _Stop.INVALID, pos
                payload = mv[rel + hsize : rel + hsize + length]
                try:
                    if zlib.crc32(payload) != crc or not _payload_matches(payload, length, pos):
                        return _Stop.INVALID, pos
                    info = parse_dispatch_info(payload)
                except ValueError:
                    return _Stop.INVALID, pos
                finally:
                    payload.release()
                on_record(pos, length, info)
                pos += hsize + length

    def _truncate(self, end: int) -> tuple[int, int]:
        """Zero everything after ``end`` in its segment and delete later segments."""
        truncated = 0
        idx = self._index_of(end)
        keep = len(self._segments) if idx is None else idx + 1
        if idx is not None:
            seg = self._segments[idx]
            assert seg.fd is not None
            rel = end - seg.start
            tail = nonzero_end(seg.fd, rel, seg.capacity)
            if tail > rel:
                truncated += tail - rel
                seg.unmap()
                zero_tail(seg.fd, rel, seg.capacity)
                seg.map()
                seg.sync()
                log.warning("commit_log_truncated", path=seg.path, offset=end, bytes=tail - rel)
        later = self._segments[keep:]
        for seg in later:
            assert seg.fd is not None
            truncated += nonzero_end(seg.fd, 0, seg.capacity)
            seg.unlink()
            seg.close_fd()
            log.warning("segment_deleted", path=seg.path, reason="after_recovered_end")
        if later:
            del self._segments[keep:]
            del self._starts[keep:]
            fsync_dir(self.directory)
        return truncated, len(later)

    # -- appending (owner thread, store lock held) -------------------------------------------

    def reserve(self, n: int) -> int:
        """The offset where ``n`` contiguous bytes will be written by :meth:`write`.

        Rolls to a new segment (writing a blank record over the rest of the current one) when
        they do not fit.  The caller guarantees ``n <= segment_size``.
        """
        pos = self.write_pos
        seg = self._segments[-1] if self._segments else None
        if seg is not None and pos + n <= seg.end:
            return pos
        if seg is not None and pos < seg.end:
            remaining = seg.end - pos
            if remaining >= RECORD_HEADER_SIZE:
                self._pwrite(seg, pos, [RECORD_HEADER.pack(BLANK_MAGIC, remaining, 0)])
            pos = self.write_pos = seg.end
        try:
            new = MappedFile.create(self.directory, pos, self.segment_size, writable=False)
        except OSError as exc:
            log.error("segment_create_failed", path=self.segment_path(pos), error=str(exc))
            raise StoreIOError.wrapping(
                f"cannot create commit-log segment at offset {pos}: {exc}", exc
            ) from exc
        self._append_segment(new)
        self._dir_dirty = True
        log.debug("segment_created", path=new.path)
        return pos

    def write(self, pos: int, parts: Sequence[bytes | bytearray]) -> None:
        """Write ``parts`` back to back at ``pos`` (from :meth:`reserve`) in one system call
        where possible, then advance the write position."""
        seg = self._segments[-1]
        self.write_pos = pos + self._pwrite(seg, pos, parts)

    def _pwrite(self, seg: MappedFile, pos: int, parts: Sequence[bytes | bytearray]) -> int:
        """Write ``parts`` back to back at ``pos``: a ``pwritev`` per ``_IOV_MAX`` of them (the
        parts are not joined first), a short write finished with plain ``pwrite``.  Returns
        the bytes written."""
        assert seg.fd is not None
        fd = seg.fd
        rel = pos - seg.start
        written = 0
        try:
            for i in range(0, len(parts), _IOV_MAX):
                chunk = parts[i : i + _IOV_MAX] if len(parts) > _IOV_MAX else parts
                want = sum(map(len, chunk))
                done = os.pwritev(fd, chunk, rel + written)
                if done < want:
                    data = memoryview(b"".join(chunk))
                    while done < want:
                        n = os.pwrite(fd, data[done:], rel + written + done)
                        if n <= 0:
                            raise OSError(f"pwrite wrote {n} bytes")
                        done += n
                written += want
        except OSError as exc:
            total = sum(map(len, parts))
            # Leave zeros, not half a record, where the next append will go.
            try:
                os.pwrite(fd, bytes(total), rel)
            except OSError:
                pass
            log.error(
                "commit_log_write_failed", path=seg.path, offset=pos, size=total, error=str(exc)
            )
            raise StoreIOError.wrapping(
                f"writing {total} bytes to the commit log at offset {pos} failed: {exc}", exc
            ) from exc
        return written

    # -- replication (owner thread) ------------------------------------------------------------

    def read_raw(self, pos: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole records from ``pos`` (a record boundary), as stored: ``(data, next)``.

        ``data`` stays inside one segment and holds at most ``max_bytes`` (but always at least
        one record when there is one).  ``next`` is where the following read starts: the end of
        ``data``, or the next segment's start once this segment's data ends (after a blank
        record or a tail too short for a header).  ``(b"", pos)`` means nothing new.

        Raises:
            ValueError: ``pos`` is below the oldest stored segment or not a record boundary.
        """
        if pos >= self.write_pos:
            return b"", pos
        idx = self._index_of(pos)
        if idx is None:
            raise ValueError(
                f"commit-log offset {pos} is not stored here (oldest offset {self.min_offset})"
            )
        seg = self._segments[idx]
        assert seg.mm is not None
        limit = min(self.write_pos, seg.end)
        rolled = self.write_pos >= seg.end  # the log goes on in a later segment
        cur = pos
        ended = False
        while cur < limit:
            rel = cur - seg.start
            if seg.capacity - rel < RECORD_HEADER_SIZE:
                ended = True
                break
            magic, length, _crc = RECORD_HEADER.unpack_from(seg.mm, rel)
            if magic == BLANK_MAGIC and length == seg.capacity - rel:
                cur += RECORD_HEADER_SIZE
                ended = True
                break
            if magic != RECORD_MAGIC or cur + RECORD_HEADER_SIZE + length > limit:
                raise ValueError(f"commit-log offset {cur} is not a record boundary")
            if cur > pos and cur + RECORD_HEADER_SIZE + length - pos > max_bytes:
                break
            cur += RECORD_HEADER_SIZE + length
        else:
            ended = rolled
        data = bytes(seg.mm[pos - seg.start : cur - seg.start])
        return data, (seg.end if ended and rolled else cur)

    def write_replicated(self, pos: int, data: bytes, next_pos: int) -> None:
        """Write ``data`` (whole records read by a leader's :meth:`read_raw`) at ``pos``, the
        same offset it has on the leader, and move the write position to ``next_pos``.  The
        caller holds the store lock and has validated the records."""
        if pos != self.write_pos and not (self.write_pos == 0 and not self._segments):
            raise ValueError(
                f"replicated data at {pos} does not continue this log at {self.write_pos}"
            )
        if data:
            seg = self._segments[-1] if self._segments else None
            if seg is None or pos >= seg.end:
                try:
                    seg = MappedFile.create(self.directory, pos, self.segment_size, writable=False)
                except OSError as exc:
                    raise StoreIOError.wrapping(
                        f"cannot create commit-log segment at offset {pos}: {exc}", exc
                    ) from exc
                self._append_segment(seg)
                self._dir_dirty = True
            if pos + len(data) > seg.end:
                raise ValueError(
                    f"replicated data [{pos}, {pos + len(data)}) crosses the segment end {seg.end}"
                    " (the leader's mappedFileSizeCommitLog differs from this broker's)"
                )
            self._pwrite(seg, pos, [data])
        if not data and not self._segments:
            self.flushed = next_pos
        self.write_pos = max(pos + len(data), next_pos)

    # -- reading ------------------------------------------------------------------------------

    def read_payload(self, offset: int, size: int | None = None) -> bytes | None:
        """The stored-message bytes of the record at ``offset``, or None if there is no intact
        message record there (deleted, never written, not a record boundary, or corrupt)."""
        found = self._locate(offset, size)
        if found is None:
            return None
        seg, start, stop, crc, length = found
        assert seg.mm is not None
        payload = seg.mm[start:stop]
        if zlib.crc32(payload) != crc or not _payload_matches(payload, length, offset):
            return None
        return payload

    def read_payloads(self, entries: list[tuple[int, int]]) -> bytes | None:
        """The stored-message bytes of the records at ``entries`` (commit-log offset, size),
        back to back in one buffer, or None when one of them is not an intact record (as
        :meth:`read_payload` judges it).

        The records are checked through views of the mappings and copied once, into the result.
        """
        parts: list[memoryview] = []
        views: dict[int, memoryview] = {}  # one view of each segment touched
        append = parts.append
        crc32 = zlib.crc32
        unpack_header = RECORD_HEADER.unpack_from
        unpack_head = _TOTAL_AND_MAGIC.unpack_from
        unpack_i64 = _I64.unpack_from
        magics = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
        hsize = RECORD_HEADER_SIZE
        write_pos = self.write_pos
        # The segment of the record before: records read together are mostly in one, so each
        # is checked inline (what _locate and _payload_matches check, without their calls).
        view: memoryview | None = None
        lo = hi = 0  # store offsets [lo, hi) the segment's view covers
        try:
            for offset, size in entries:
                end = offset + hsize + size
                if offset < lo or end > hi or size < FIXED_SIZE:  # (a damaged entry's size)
                    found = self._locate(offset, size)
                    if found is None:
                        return None
                    seg = found[0]
                    view = views.get(seg.start)
                    if view is None:
                        assert seg.mm is not None
                        view = views[seg.start] = memoryview(seg.mm)
                    lo, hi = seg.start, min(seg.start + seg.capacity, write_pos)
                assert view is not None
                rel = offset - lo
                magic, length, crc = unpack_header(view, rel)
                if magic != RECORD_MAGIC or length != size or length < FIXED_SIZE:
                    return None
                payload = view[rel + hsize : rel + hsize + length]
                append(payload)
                if crc32(payload) != crc:
                    return None
                total, pmagic = unpack_head(payload)
                if (
                    total != length
                    or pmagic not in magics
                    or unpack_i64(payload, _POS_PHYSICAL_OFFSET)[0] != offset
                ):
                    return None
            return b"".join(parts)
        finally:  # no view of a mapping outlives the call (a segment is unmapped when deleted)
            for part in parts:
                part.release()
            for view in views.values():
                view.release()

    def _locate(
        self, offset: int, size: int | None
    ) -> tuple[MappedFile, int, int, int, int] | None:
        """``(segment, payload start, payload stop, CRC, length)`` of the record framed at
        ``offset`` (of ``size`` bytes when given), or None when no record is framed there."""
        seg = self._segment_for(offset)
        if seg is None or seg.mm is None:
            return None
        rel = offset - seg.start
        if rel + RECORD_HEADER_SIZE > seg.capacity:
            return None
        magic, length, crc = RECORD_HEADER.unpack_from(seg.mm, rel)
        if magic != RECORD_MAGIC or length < FIXED_SIZE or (size is not None and length != size):
            return None
        stop = rel + RECORD_HEADER_SIZE + length
        if stop > seg.capacity or seg.start + stop > self.write_pos:
            return None
        return seg, rel + RECORD_HEADER_SIZE, stop, crc, length

    def read_store_timestamp(self, offset: int) -> int | None:
        """STORETIMESTAMP of the message at ``offset`` (framing checked, CRC not)."""
        seg = self._segment_for(offset)
        if seg is None or seg.mm is None:
            return None
        rel = offset - seg.start
        if rel + RECORD_HEADER_SIZE + FIXED_SIZE > seg.capacity:
            return None
        magic, length, _crc = RECORD_HEADER.unpack_from(seg.mm, rel)
        if magic != RECORD_MAGIC or length < FIXED_SIZE:
            return None
        ts: int = _I64.unpack_from(seg.mm, rel + RECORD_HEADER_SIZE + _POS_STORE_TIMESTAMP)[0]
        return ts

    def _segment_for(self, offset: int) -> MappedFile | None:
        if offset >= self.write_pos or not self._segments:
            return None
        last = self._segments[-1]
        if offset >= last.start:
            return last
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._segments[i] if i >= 0 else None

    def _index_of(self, offset: int) -> int | None:
        """Index of the segment holding ``offset`` (None past the last one)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset >= self._segments[i].end:
            return None
        return i

    def _append_segment(self, seg: MappedFile) -> None:
        self._segments.append(seg)
        self._starts.append(seg.start)

    # -- flushing (any thread) ----------------------------------------------------------------

    def flush(self) -> int:
        """fsync everything written before this call started; returns the flushed offset.

        Safe to run on a worker thread while the owner appends: the segment list is copied
        under the store lock, the fsyncs run without it.  Concurrent calls are serialised, so
        a caller that arrives during an fsync waits and then shares the next one (group
        commit)."""
        with self._flush_lock:
            with self._lock:
                target = self.write_pos
                flushed = self.flushed
                segs = []
                for seg in reversed(self._segments):
                    if seg.end <= flushed:
                        break
                    if seg.start < target:
                        segs.append(seg)
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                retired, self._retired = self._retired, []
            for seg in segs:
                seg.sync()
            if dir_dirty:
                fsync_dir(self.directory)
            for seg in retired:
                seg.close_fd()
            if target > self.flushed:
                self.flushed = target
            return self.flushed

    def probe_write(self) -> None:
        """Write one zero byte where the next append goes (there are zeros there already, and
        the append overwrites it): whether the filesystem takes writes to the active segment.

        Raises:
            OSError: it does not (EROFS on a filesystem gone read-only).
        """
        with self._lock:
            seg = self._segments[-1] if self._segments else None
            pos = self.write_pos
            if seg is None or seg.fd is None or pos >= seg.end:
                return
            os.pwrite(seg.fd, b"\0", pos - seg.start)

    # -- retention (owner thread) ---------------------------------------------------------------

    def delete_first_segment(self, reason: str) -> MappedFile:
        """Remove the oldest segment (never the last one); the caller holds the store lock."""
        if len(self._segments) < 2:
            raise ValueError("the active segment is never deleted")
        seg = self._segments.pop(0)
        self._starts.pop(0)
        seg.unlink()
        self._retired.append(seg)  # the flush thread closes the descriptor
        self._dir_dirty = True
        log.info("segment_deleted", path=seg.path, reason=reason)
        return seg

    def close_retired(self) -> None:
        """Close the descriptors of deleted segments now: their space is freed only once they
        are closed (waits for a flush in progress, which may still be using one)."""
        with self._flush_lock:
            with self._lock:
                retired, self._retired = self._retired, []
            for seg in retired:
                seg.close_fd()

    def close(self) -> None:
        with self._flush_lock, self._lock:
            for seg in self._segments + self._retired:
                seg.close()
            self._segments.clear()
            self._starts.clear()
            self._retired.clear()

    def segment_path(self, start: int) -> str:
        return os.path.join(self.directory, segment_name(start))
