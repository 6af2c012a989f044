"""The commit-log scrub's check of one chunk of a segment (the pass, its rate and its log lines:
:mod:`txmq.broker.scrub`).

Recovery checks the records from the checkpoint on; a record below it is checked only when
something reads it.  So damage to old data (a bad sector, a flipped bit on a disk that did not
notice) stays hidden until a consumer hits it.  The scrub reads the whole log again, pass after
pass, and checks each record as recovery does: the header's magic and length, the CRC-32 of the
payload, and the payload's own TOTALSIZE, MAGICCODE and PHYSICALOFFSET and the fields a consume
queue needs.  Each damaged record is logged (``commit_log_record_damaged``, ERROR) with the
segment file and its commit-log offset, and counted; each pass ends with a line saying what it
checked (``commit_log_scrub_pass``).

The store is synchronous and its segments are written and deleted on the broker's event loop:
:func:`check_chunk` reads them through file descriptors of its own (``pread``, no mapping, so a
segment deleted meanwhile is still readable and never unmapped under it), a chunk at a time on
the broker's background thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import structlog

from .commit_log import (
    _MAGIC_BYTES,
    BLANK_MAGIC,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    intact_record_size,
)

log = structlog.get_logger(__name__)

#: Most bytes one chunk reads (one job on the background thread).
MAX_CHUNK = 1 << 20
#: Fewest bytes one chunk reads (below that, the pauses set the rate).
MIN_CHUNK = 64 << 10


@dataclass
class Chunk:
    """What :func:`check_chunk` found in one part of a segment."""

    #: Where the next chunk starts (a record boundary, or the segment's end).
    next_pos: int
    #: Bytes read and checked.
    checked: int = 0
    #: Intact message records.
    records: int = 0
    #: ``(commit-log offset, bytes skipped)`` of each damaged record (or run of damaged bytes).
    damaged: list[tuple[int, int]] = field(default_factory=list)


def _record_at(fd: int, seg_start: int, capacity: int, offset: int) -> int | None:
    """:func:`~.commit_log.intact_record_size` read straight from the file."""
    rel = offset - seg_start
    head = os.pread(fd, RECORD_HEADER_SIZE, rel)
    if len(head) < RECORD_HEADER_SIZE:
        return None
    _magic, length, _crc = RECORD_HEADER.unpack(head)
    if length > capacity - rel:
        return None
    data = os.pread(fd, RECORD_HEADER_SIZE + length, rel)
    try:
        return intact_record_size(data, 0, capacity - rel, offset)
    except IndexError:
        return None


def _resume_after(fd: int, seg_start: int, capacity: int, offset: int, end: int) -> int:
    """The first intact record of the segment after the damaged bytes at ``offset`` and before
    ``end`` (each record names its own offset, so a match is no accident), or ``end``."""
    pos = offset + 1
    while pos < end:
        want = min(MAX_CHUNK, end - pos)
        window = os.pread(fd, want + len(_MAGIC_BYTES) - 1, pos - seg_start)
        at = 0
        while True:
            at = window.find(_MAGIC_BYTES, at)
            if at < 0 or at >= want:
                break
            if _record_at(fd, seg_start, capacity, pos + at) is not None:
                return pos + at
            at += 1
        if len(window) < want:
            break
        pos += want
    return end


def check_chunk(path: str, seg_start: int, capacity: int, pos: int, end: int, budget: int) -> Chunk:
    """Check the records of the segment file ``path`` (store offsets ``[seg_start, seg_start +
    capacity)``) from the record boundary ``pos``, up to ``end`` (at most the segment's end)
    and about ``budget`` bytes.  Blocking: runs on a background thread."""
    end = min(end, seg_start + capacity)
    out = Chunk(pos)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:  # deleted by retention meanwhile
        out.next_pos = seg_start + capacity
        return out
    try:
        data = os.pread(fd, max(0, min(budget, end - pos)), pos - seg_start)
        rel = 0
        while pos < end:
            left = seg_start + capacity - pos
            if left < RECORD_HEADER_SIZE:
                out.checked += left
                pos = seg_start + capacity  # too short for a header: the segment's end
                break
            aligned = True
            try:
                if rel + RECORD_HEADER_SIZE <= len(data):
                    magic, length, crc = RECORD_HEADER.unpack_from(data, rel)
                    if magic == BLANK_MAGIC and length == left and crc == 0:
                        out.checked += left
                        pos = seg_start + capacity  # the rest of the segment is blank
                        break
                size = intact_record_size(data, rel, left, pos)
            except IndexError:  # the record goes on past what was read
                if rel > 0:
                    break  # the rest is for the next chunk
                size = _record_at(fd, seg_start, capacity, pos)  # larger than a chunk
                aligned = False
            if size is None:
                resume = _resume_after(fd, seg_start, capacity, pos, end)
                out.damaged.append((pos, resume - pos))
                out.checked += resume - pos
                pos = resume
                break  # what was read no longer lines up with pos
            out.checked += size
            out.records += 1
            rel += size
            pos += size
            if not aligned:
                break
    finally:
        os.close(fd)
    out.next_pos = pos
    return out


__all__ = ["Chunk", "check_chunk"]
