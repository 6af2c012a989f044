"""Getting bytes onto the disk: the flush services.

* ``ASYNC_FLUSH`` (default): the commit log is fsynced every ``flushIntervalCommitLog`` ms; a
  send is answered once its record is written to the file (so it survives the death of the broker
  process, not yet a power cut).
* ``SYNC_FLUSH``: a send is answered only after an fsync covering its record.  Sends that arrive
  while an fsync runs wait for the next one, so concurrent senders share one fsync (group commit).

fsync runs on a single worker thread, never on the event loop; appends keep happening on the loop
meanwhile (the store's flush() is safe for that).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field

import structlog

from txmq.protocol.aio import wait_event
from txmq.protocol.errors import FlushDiskTimeoutError

from .metrics import BrokerMetrics
from .ports import ReplicationPort
from .store import MessageStore

log = structlog.get_logger(__name__)


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

    def __post_init__(self) -> None:
        self.interval = self.interval_ms / 1000.0
        self.sync_timeout = self.sync_timeout_ms / 1000.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txmq-flush")
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: True while the flusher sleeps without a timer because nothing is unflushed;
        #: :meth:`on_append` ends that.
        self._idle = False
        #: The commit-log end when the consume queues were last flushed (``flush_queues``).
        self._queues_flushed_at = -1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txmq-flush")

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
            self._executor, self.store.flush_consume_queues
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
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.sync_timeout)
        except TimeoutError:
            raise FlushDiskTimeoutError(
                f"the message was stored but not flushed to disk within {self.sync_timeout:.1f}s"
            ) from None

    async def _run(self) -> None:
        while not self._stopping:
            if self.sync:
                await wait_event(self._wakeup, self.interval)
                self._wakeup.clear()
            else:
                await asyncio.sleep(self.interval)
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
        for end, fut in self._waiters:
            if end <= flushed:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((end, fut))
        self._waiters = still
        if still:
            self._wakeup.set()

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
