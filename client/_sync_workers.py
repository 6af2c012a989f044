"""Running a push consumer's sync callbacks on its own threads (:class:`_SyncWorkers`), so a
slow callback never blocks the event loop."""

from __future__ import annotations

import asyncio
import collections
import inspect
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txmq.protocol.message import MessageExt

from . import telemetry

if TYPE_CHECKING:
    from ._queues import ProcessQueue
    from .consumer import MessageCallback


def _is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 -- objects with an async __call__
    )


_SKIPPED = object()
_STOP = object()


class _SyncWorkers:
    """``consume_thread_max`` threads running sync callbacks from one FIFO work queue.

    Results go back to the event loop in bulk: a worker appends to a deque and schedules one
    drain on the loop only if none is pending, so a busy pool costs one loop wake-up per burst,
    not per message.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        n: int,
        name: str,
        on_result: Callable[[ProcessQueue, MessageExt, object], None],
        group: str = "",
    ) -> None:
        self._loop = loop
        self._group = group
        self._on_result = on_result
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: collections.deque[tuple[ProcessQueue, MessageExt, object]] = (
            collections.deque()
        )
        self._lock = threading.Lock()
        self._drain_scheduled = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, pq: ProcessQueue, msg: MessageExt, callback: MessageCallback) -> None:
        self._work.put((pq, msg, callback))

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is _STOP:
                return
            pq, msg, callback = item
            outcome: object
            if pq.dropped:
                outcome = _SKIPPED
            else:
                try:
                    if telemetry.AVAILABLE:
                        with telemetry.process_span(msg, self._group):
                            callback(msg)
                    else:
                        callback(msg)
                    outcome = None
                except Exception as exc:  # the callback asked for a retry
                    outcome = exc
            self._results.append((pq, msg, outcome))
            with self._lock:
                if self._drain_scheduled:
                    continue
                self._drain_scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: the consumer is gone
                return

    def _drain(self) -> None:
        with self._lock:
            self._drain_scheduled = False
        while self._results:
            pq, msg, outcome = self._results.popleft()
            self._on_result(pq, msg, outcome)

    def stop(self, timeout: float) -> None:
        for _ in self._threads:
            self._work.put(_STOP)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0))
