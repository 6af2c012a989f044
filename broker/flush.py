"""Getting bytes onto the disk: the flush services.

* ``ASYNC_FLUSH`` (default): the commit log is fsynced every ``flushIntervalCommitLog`` ms; a
  send is answered once its record is written to the file (so it survives the death of the broker
  process, not yet a power cut).
* ``SYNC_FLUSH``: a send is answered only after an fsync covering its record.  Group commit: an
  fsync is handed to the flush thread straight from the send that waits for it (in the same turn
  of the event loop, no task to wake), and the next one the moment the last one's waiters are
  released, so the loop appends the next requests while the disk syncs the previous ones and
  the answers of one fsync leave while the next runs: a window of sends in flight is answered in
  parts and refills while the disk works, instead of draining and refilling in one step per
  fsync.  An fsync starts once the requests waiting are at least 55 % of those in flight at the
  last release (waiting then plus released then; one request alone starts it at once), or
  :data:`GROUP_HOLD_S` after the first of them: a window of sends is synced in about two
  groups, not one per request.

fsync runs on a worker thread, never on the event loop; appends keep happening on the loop
meanwhile (the store's flush() is safe for that).  The consume queues and the checkpoint are
synced on a thread of their own, so the once-a-second checkpoint never holds up an answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field

import structlog

from txmq.protocol.errors import FlushDiskTimeoutError

from .metrics import BrokerMetrics
from .ports import ReplicationPort
from .store import MessageStore

log = structlog.get_logger(__name__)

#: SYNC_FLUSH: the longest a waiting request holds its fsync back for more of the requests in
#: flight to join it (see the module's docstring).
GROUP_HOLD_S = 0.005


@dataclass(eq=False)
class FlushService:
    store: MessageStore
    _: KW_ONLY
    sync: bool
    interval_ms: int
    sync_timeout_ms: int
    metrics: BrokerMetrics
    #: Cluster mode: the leader's replication; a write is durable once the in-sync
    #: replicas have it too.
    replication: ReplicationPort | None = field(default=None, init=False)
    #: A test seam: told ``(end offset, the store's flushed offset)`` of each waiting request
    #: as it is released to be answered.
    on_release: Callable[[int, int], None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        # set here too: a compiled dataclass does not fill in the defaults of init=False fields
        self.replication = None
        self.on_release = None
        self.interval = self.interval_ms / 1000.0
        self.sync_timeout = self.sync_timeout_ms / 1000.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txmq-flush")
        #: The consume queues' fsyncs and the checkpoint (``flush_queues``), apart from the
        #: commit log's: a SYNC_FLUSH answer never waits behind them.
        self._queue_executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="txmq-flush-queues"
        )
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: SYNC_FLUSH: an fsync for the waiters is on the flush thread (at most one at a time).
        self._syncing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Requests in flight at the last release (released + still waiting), and the timer
        #: that starts an fsync held back for more of them.
        self._in_flight = 1
        self._hold: asyncio.TimerHandle | None = None
        #: When the last of those fsyncs ended (``time.monotonic()``).
        self._last_sync = 0.0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: True while the flusher sleeps without a timer because nothing is unflushed;
        #: :meth:`on_append` ends that.
        self._idle = False
        #: The commit-log end when the consume queues were last flushed (``flush_queues``).
        self._queues_flushed_at = -1

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="txmq-flush")

    async def flush_now(self) -> int:
        """fsync the commit log off-loop; returns the flushed offset."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        flushed = await loop.run_in_executor(self._executor, self.store.flush)
        self.metrics.flushes.inc()
        elapsed = time.perf_counter() - t0
        if elapsed > 1.0:
            log.warning("flush_slow", seconds=round(elapsed, 3), flushed_offset=flushed)
        return flushed

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """The write path's subscriber: records were appended, so an idle flusher goes back to
        its interval."""
        if self._idle:
            self._idle = False
            self._wakeup.set()

    async def flush_queues(self, *, force: bool = True) -> None:
        """fsync the consume queues and write the checkpoint; with ``force=False``, only if
        something was appended since the last time (an idle broker wakes no thread for it)."""
        end = self.store.max_phy_offset
        if not force and end == self._queues_flushed_at:
            return
        await asyncio.get_running_loop().run_in_executor(
            self._queue_executor, self.store.flush_consume_queues
        )
        self._queues_flushed_at = end

    async def wait_durable(self, end_offset: int) -> None:
        """Under SYNC_FLUSH, return once the commit log is fsynced past ``end_offset``; raise
        FlushDiskTimeoutError if that takes longer than ``syncFlushTimeout``.  Under
        ASYNC_FLUSH, return at once.  In cluster mode, then wait until the in-sync replicas
        have it (FlushSlaveTimeoutError / SlaveNotAvailableError otherwise)."""
        if self.sync and self.store.flushed_offset < end_offset:
            await self._wait_flushed(end_offset)
        if self.replication is not None:
            await self.replication.wait_replicated(end_offset)

    async def _wait_flushed(self, end_offset: int) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end_offset, fut))
        if not self._syncing:
            self._group()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.sync_timeout)
        except TimeoutError:
            raise FlushDiskTimeoutError(
                f"the message was stored but not flushed to disk within {self.sync_timeout:.1f}s"
            ) from None

    def _group(self) -> None:
        """No fsync runs and requests wait: start one if enough of those in flight wait, else
        hold it back (at most :data:`GROUP_HOLD_S`)."""
        if len(self._waiters) * 20 >= self._in_flight * 11:
            self._sync()
        elif self._hold is None and self._loop is not None:
            self._hold = self._loop.call_later(GROUP_HOLD_S, self._held)

    def _held(self) -> None:
        self._hold = None
        if self._waiters and not self._syncing:
            self._sync()

    def _sync(self) -> None:
        """Start an fsync for the waiters on the flush thread; :meth:`_synced` runs on the loop
        when it ends."""
        loop = self._loop
        if loop is None or self._stopping:
            return  # not started, or stopping: stop() flushes and releases
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        self._syncing = True
        t0 = time.perf_counter()
        done = self._executor.submit(self.store.flush)
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._synced, f, t0))

    def _synced(self, done: Future[int], t0: float) -> None:
        self._syncing = False
        try:
            flushed = done.result()
        except Exception as exc:  # keep serving; waiters time out with a clear error
            log.error("flush_failed", error=repr(exc))
            if self._loop is not None and not self._stopping:
                self._syncing = True
                self._loop.call_later(0.1, self._retry)
            return
        self.metrics.flushes.inc()
        self._last_sync = time.monotonic()
        elapsed = time.perf_counter() - t0
        if elapsed > 1.0:
            log.warning("flush_slow", seconds=round(elapsed, 3), flushed_offset=flushed)
        self._release(flushed)

    def _retry(self) -> None:
        self._syncing = False
        if self._waiters:
            self._sync()

    async def _run(self) -> None:
        """The interval flush (every ``flushIntervalCommitLog`` ms while something is
        unflushed); SYNC_FLUSH's waiters start their own fsyncs (:meth:`_sync`)."""
        while not self._stopping:
            await asyncio.sleep(self.interval)
            if time.monotonic() - self._last_sync < self.interval:
                continue  # SYNC_FLUSH's groups keep the log synced: no fsync of its own
            if self.store.max_phy_offset <= self.store.flushed_offset and not self._waiters:
                # Nothing to flush: sleep without a timer until something is appended.
                self._idle = True
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                flushed = await self.flush_now()
            except Exception as exc:  # keep serving; waiters time out with a clear error
                log.error("flush_failed", error=repr(exc))
                await asyncio.sleep(0.1)
                continue
            self._release(flushed)

    def _release(self, flushed: int) -> None:
        still = []
        seen = self.on_release
        for end, fut in self._waiters:
            if end <= flushed:
                if seen is not None:
                    seen(end, self.store.flushed_offset)
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((end, fut))
        self._in_flight = max(1, len(self._waiters))
        self._waiters = still
        if still and not self._syncing:
            self._group()  # the next group: what was appended while the last fsync ran

    async def stop(self) -> None:
        """Final flush of commit log and queues, then stop."""
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        flushed = await self.flush_now()
        self._release(flushed)
        await self.flush_queues()
        self._executor.shutdown(wait=True)
        self._queue_executor.shutdown(wait=True)
