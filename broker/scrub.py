"""The commit-log scrub: every record below the flushed offset checked again, at a bounded rate.

Recovery checks the records from the checkpoint on; a record below it is checked only when
something reads it.  So damage to old data (a bad sector, a flipped bit on a disk that did not
notice) stays hidden until a consumer hits it.  The scrub reads the whole log again, pass after
pass, and checks each record as recovery does (:func:`~.store.scrub.check_chunk`).  Each damaged
record is logged (``commit_log_record_damaged``, ERROR) with the segment file and its commit-log
offset, and counted; each pass ends with a line saying what it checked
(``commit_log_scrub_pass``).

The chunks are read on the broker's background thread, never on the event loop, with pauses
between them that keep a pass at ``commitLogScrubBytesPerSecond``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from .store.scrub import MAX_CHUNK, MIN_CHUNK, Chunk, check_chunk

if TYPE_CHECKING:
    from .store import MessageStore

log = structlog.get_logger(__name__)

Background = Callable[[Callable[[], Any]], Awaitable[Any]]


@dataclass(eq=False)
class CommitLogScrub:
    """Passes over the commit log at ``rate`` bytes a second, at most one started every
    ``interval`` seconds.

    Args:
        store: the store (read on the event loop: its segment list and flushed offset).
        in_background: runs a blocking call on the broker's background thread.
        rate: bytes a second (> 0).
        interval: seconds from the start of one pass to the start of the next (at least).
        on_damaged: called with the number of damaged records known: found by the last
            complete pass, or so far by this one when it found more; at the end of a pass,
            what it found.
        on_checked: called with the bytes each chunk checked.
    """

    store: MessageStore
    in_background: Background
    rate: int
    interval: float
    on_damaged: Callable[[int], None] = lambda n: None
    on_checked: Callable[[int], None] = lambda n: None
    passes: int = field(default=0, init=False)
    #: ``(segment path, commit-log offset, bytes)`` of the damaged records the last
    #: complete pass found.
    last_damaged: list[tuple[str, int, int]] = field(default_factory=list, init=False)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.scrub_pass()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a read error: logged, the next pass tries again
                log.error("commit_log_scrub_failed", error=repr(exc))
            await asyncio.sleep(max(1.0, started + self.interval - time.monotonic()))

    async def scrub_pass(self) -> None:
        """One pass from the oldest record to the flushed offset at the pass's start."""
        store = self.store
        started = time.monotonic()
        start = pos = store.min_phy_offset
        end = store.flushed_offset
        chunk = max(MIN_CHUNK, min(MAX_CHUNK, self.rate // 10))
        checked = records = 0
        damaged: list[tuple[str, int, int]] = []
        while pos < end:
            seg = next((s for s in store.commit_log_segments() if s.start + s.capacity > pos), None)
            if seg is None:
                break
            if pos < seg.start:  # retention deleted what came before
                pos = seg.start
                continue
            got: Chunk = await self.in_background(
                functools.partial(check_chunk, seg.path, seg.start, seg.capacity, pos, end, chunk)
            )
            for offset, nbytes in got.damaged:
                if offset < store.min_phy_offset:
                    continue  # deleted by retention while it was read
                damaged.append((seg.path, offset, nbytes))
                log.error(
                    "commit_log_record_damaged",
                    file=seg.path,
                    offset=offset,
                    bytes=nbytes,
                    hint="the record cannot be read; the records around it are served",
                )
            if got.damaged:
                self.on_damaged(max(len(damaged), len(self.last_damaged)))
            checked += got.checked
            records += got.records
            self.on_checked(got.checked)
            pos = got.next_pos
            # the pause that keeps the pass at the rate
            ahead = started + checked / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        self.passes += 1
        self.last_damaged = damaged
        self.on_damaged(len(damaged))
        log.info(
            "commit_log_scrub_pass",
            number=self.passes,
            start_offset=start,
            end_offset=end,
            bytes_checked=checked,
            records=records,
            damaged_records=len(damaged),
            seconds=round(time.monotonic() - started, 3),
        )


__all__ = ["CommitLogScrub"]
