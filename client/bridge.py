"""Running the async core from blocking code: an event loop in a background thread.

The sync facade (:mod:`txmq.client.sync`), the Spark connector and the ``txmq`` command line
all call coroutines from plain synchronous Python.  They do it through one bridge,
:class:`LoopThread`: a daemon thread that runs an event loop (uvloop where installed), to which
a caller submits a coroutine and waits for its outcome.

- The facade's clients share one process-wide loop (:meth:`LoopThread.shared`), made on first
  use and again in a child process after a fork.
- :func:`run_coroutine` runs one coroutine on a loop thread of its own and stops it afterwards,
  like :func:`asyncio.run`, but from any thread, including one whose own loop is running.

Every wait is bounded or can be: :meth:`LoopThread.run` takes a ``timeout``; a caller whose wait
ends early (the timeout, or ``KeyboardInterrupt`` in the waiting thread) cancels the coroutine
and waits at most ``cancel_timeout`` for it to unwind, so its ``finally`` blocks run;
:meth:`LoopThread.stop` cancels what is left on the loop and closes it within its ``timeout``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from .errors import ClientStateError
from .logs import get_logger

log = get_logger(__name__)

R = TypeVar("R")

#: Seconds a new loop thread may take to start.
START_TIMEOUT = 10.0
#: Seconds a cancelled coroutine may take to unwind (a consumer's shutdown included).
CANCEL_TIMEOUT = 30.0
#: Seconds :meth:`LoopThread.stop` may take in all.
STOP_TIMEOUT = 10.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running in a daemon thread, for callers in other threads.

    Args:
        name: the thread's name.

    Use :meth:`run` to run a coroutine on it and :meth:`stop` (or ``with LoopThread() as t:``)
    to end it.
    """

    _shared: ClassVar[LoopThread | None] = None
    _shared_guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "txmq-client-loop") -> None:
        self.loop = new_event_loop()
        self.pid = os.getpid()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        if not self._ready.wait(START_TIMEOUT):  # pragma: no cover - a stalled machine
            raise RuntimeError(f"the event loop thread {name!r} did not start")

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def alive(self) -> bool:
        """The loop runs and belongs to this process (a fork does not copy the thread)."""
        return self.pid == os.getpid() and self.thread.is_alive() and not self.loop.is_closed()

    @classmethod
    def shared(cls) -> LoopThread:
        """The process-wide loop thread of the sync facade, started on first use."""
        with cls._shared_guard:
            if cls._shared is None or not cls._shared.alive:
                cls._shared = cls()
            return cls._shared

    @classmethod
    def _forget_shared(cls) -> None:
        # In a forked child: the parent's thread does not exist there, and the guard may have
        # been held by one of the parent's other threads at the fork.
        cls._shared = None
        cls._shared_guard = threading.Lock()

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        coro: Coroutine[Any, Any, R],
        timeout: float | None = None,
        *,
        cancel_timeout: float = CANCEL_TIMEOUT,
    ) -> R:
        """Run ``coro`` on the loop and return its result (or raise its exception).

        Args:
            timeout: seconds to wait for the outcome (None: as long as it takes).
            cancel_timeout: when the wait ends early, seconds to wait for the cancelled
                coroutine to unwind.

        Raises:
            TimeoutError: ``timeout`` passed; the coroutine was cancelled.
            ClientStateError: called from the loop's own thread (it would wait for itself).
        """
        if threading.current_thread() is self.thread:
            coro.close()
            raise ClientStateError(
                "a sync txmq client was called from its own event loop (e.g. inside an async "
                "callback); use the Async* classes there"
            )
        outcome: concurrent.futures.Future[R] = concurrent.futures.Future()
        finished = threading.Event()
        tasks: list[asyncio.Task[R]] = []

        def settle(task: asyncio.Task[R]) -> None:
            if task.cancelled():
                outcome.cancel()
            elif (exc := task.exception()) is not None:
                outcome.set_exception(exc)
            else:
                outcome.set_result(task.result())
            finished.set()

        def begin() -> None:
            task = self.loop.create_task(coro)
            tasks.append(task)
            task.add_done_callback(settle)

        def cancel() -> None:
            for task in tasks:
                task.cancel()

        try:
            self.loop.call_soon_threadsafe(begin)
        except RuntimeError:
            coro.close()
            raise ClientStateError("the client's event loop is closed") from None
        try:
            return outcome.result(timeout)
        except TimeoutError:
            if outcome.done():
                raise  # the coroutine's own TimeoutError
            self._abandon(cancel, finished, cancel_timeout)
            raise TimeoutError(
                f"no result within {timeout} s; the coroutine was cancelled"
            ) from None
        except BaseException:
            # An interrupt (KeyboardInterrupt) while waiting: do not leave the coroutine behind.
            if not outcome.done():
                self._abandon(cancel, finished, cancel_timeout)
            raise

    def _abandon(
        self, cancel: Callable[[], None], finished: threading.Event, cancel_timeout: float
    ) -> None:
        try:
            self.loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            return
        if not finished.wait(cancel_timeout):
            log.warning("cancelled_coroutine_still_running", seconds=cancel_timeout)

    # -- stopping --------------------------------------------------------------------------------

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Cancel the tasks left on the loop, let them unwind, stop the loop and close it, all
        within ``timeout`` seconds.  Idempotent.

        Returns:
            True when the thread ended in time.
        """
        if not self.alive:
            return not self.thread.is_alive()
        deadline = time.monotonic() + timeout

        async def wind_down() -> None:
            current = asyncio.current_task()
            left = [t for t in asyncio.all_tasks() if t is not current]
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left, timeout=max(0.0, deadline - time.monotonic()))
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        if threading.current_thread() is not self.thread:
            waiter = asyncio.run_coroutine_threadsafe(wind_down(), self.loop)
            try:
                waiter.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                waiter.cancel()
                log.warning("event_loop_stop_timed_out", thread=self.thread.name, seconds=timeout)
            except Exception as exc:  # noqa: BLE001 - stopping goes on whatever a task did
                log.warning("event_loop_wind_down_failed", error=repr(exc))
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is self.thread:
            return False  # it ends once the current callback returns
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def run_coroutine(coro: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
    """Run ``coro`` on a loop thread of its own and stop that loop afterwards (as
    :func:`asyncio.run` does, but callable from a thread whose own loop is running).

    Raises:
        TimeoutError: ``timeout`` passed; the coroutine was cancelled.
    """
    with LoopThread(name="txmq-run") as runner:
        return runner.run(coro, timeout)


os.register_at_fork(after_in_child=LoopThread._forget_shared)

__all__ = ["LoopThread", "new_event_loop", "run_coroutine"]
