"""Retention of the commit log (RocketMQ's ``CleanCommitLogService``): old segments deleted by
age, or for space under ``diskFullPolicy=delete_oldest``, then the consume-queue files that
only point into them.  Called by :meth:`~.message_store.MessageStore.delete_expired_files` on
the store's owner thread."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterable

import structlog

from .commit_log import CommitLog
from .consume_queue import ConsumeQueue
from .disk import DiskGuard, allocated, used_percent

log = structlog.get_logger(__name__)

#: Segments retention deletes per call at most (RocketMQ's deleteCommitLogFilesBatchMax).
DELETE_FILES_BATCH_MAX = 10


def delete_expired_files(
    cl: CommitLog,
    queues: Iterable[ConsumeQueue],
    disk: DiskGuard,
    lock: threading.Lock,
    now: float | None = None,
) -> int:
    """Delete old commit-log segments of ``cl``, then the files of ``queues`` that only point
    into them, holding the store's append ``lock``.

    A segment is deleted (oldest first, never the active last one, at most
    ``DELETE_FILES_BATCH_MAX`` per call) when its file was last modified more than
    ``file_reserved_time`` hours before ``now``.  While the disk holding the store is fuller
    than ``disk_max_used_space_ratio`` percent, ``disk_full_policy`` decides:
    ``refuse_writes`` deletes nothing before its time (writes are refused past
    ``disk_refuse_writes_ratio``, see :meth:`MessageStore.check_space`); ``delete_oldest`` deletes the
    oldest segments, read or not, until the disk would be below the ratio -- counting the
    space each deletion frees, so it deletes no more than needed -- with a warning.  Each
    consume queue's minimum offset then moves to its first message still stored.

    Args:
        now: seconds since the epoch to age files against (default: the wall clock, which
            file modification times use).

    Returns:
        How many commit-log segments were deleted.
    """
    now = time.time() if now is None else now
    config = disk.config
    reserved = config.file_reserved_time * 3600.0
    ratio = config.disk_max_used_space_ratio
    deleted = for_space = 0
    freed = 0
    lost_from = cl.min_offset
    with lock:
        usage = shutil.disk_usage(disk.root)
        while deleted < DELETE_FILES_BATCH_MAX and len(cl.segments) > 1:
            first = cl.segments[0]
            if first.mtime() + reserved < now:
                reason = "expired"
            elif used_percent(usage.used - freed, usage.total) > ratio:
                if config.disk_full_policy != "delete_oldest":
                    disk.warn_short_of_space(usage.used - freed, usage.total)
                    break
                reason = "disk_full"
                for_space += 1
            else:
                break
            size = allocated(first)
            cl.delete_first_segment(reason)
            freed += size
            deleted += 1
        if deleted:
            cl_min = cl.min_offset
            cq_deleted = sum(cq.delete_expired(cl_min) for cq in queues)
            fields = {
                "segments_deleted": deleted,
                "consume_queue_segments_deleted": cq_deleted,
                "min_phy_offset": cl_min,
                "bytes_freed": freed,
            }
            if for_space:
                # Messages go that consumers may not have read: say so loudly.
                log.warning(
                    "retention_deleted_for_space",
                    policy="delete_oldest",
                    deleted_segments_for_space=for_space,
                    deleted_offsets=f"{lost_from}..{cl_min}",
                    **fields,
                )
            else:
                log.info("retention_applied", **fields)
    if deleted:
        cl.close_retired()  # so the space is free now, not at the next flush
    return deleted
