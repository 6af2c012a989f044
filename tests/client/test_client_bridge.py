"""The sync-over-async bridge: a coroutine run from blocking code gives its result or its
exception, a bounded wait cancels it and lets it unwind, and stopping the loop is bounded even
when a task refuses to end."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from txmq.client import ClientStateError
from txmq.client.bridge import LoopThread, run_coroutine


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def _fail() -> None:
    await asyncio.sleep(0)
    raise ValueError("from the coroutine")


def test_result_and_exception_reach_the_caller() -> None:
    with LoopThread(name="t-bridge") as runner:
        assert runner.run(_add(2, 3)) == 5
        with pytest.raises(ValueError, match="from the coroutine"):
            runner.run(_fail())
        assert runner.alive
    assert not runner.alive and not runner.thread.is_alive()


def test_a_coroutines_own_timeout_error_is_not_taken_for_the_wait_ending() -> None:
    async def times_out() -> None:
        await asyncio.wait_for(asyncio.sleep(10), 0.01)

    with LoopThread(name="t-bridge") as runner, pytest.raises(TimeoutError) as info:
        runner.run(times_out(), timeout=5.0)
    assert "cancelled" not in str(info.value)


def test_a_wait_that_times_out_cancels_the_coroutine_and_lets_it_unwind() -> None:
    unwound = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # cleanup that itself awaits
            unwound.set()

    with LoopThread(name="t-bridge") as runner:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="cancelled"):
            runner.run(slow(), timeout=0.1)
        assert unwound.is_set(), "the coroutine's finally block did not run before run() returned"
        assert time.monotonic() - started < 5
        assert runner.run(_add(1, 1)) == 2  # the loop goes on serving


def test_stop_is_bounded_when_a_task_ignores_cancellation() -> None:
    release = threading.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    runner = LoopThread(name="t-bridge")
    runner.loop.call_soon_threadsafe(lambda: runner.loop.create_task(stubborn()))
    started = time.monotonic()
    runner.stop(timeout=0.3)
    assert time.monotonic() - started < 5
    release.set()
    runner.thread.join(5)
    assert not runner.thread.is_alive()


def test_calling_from_the_loop_thread_is_refused() -> None:
    with LoopThread(name="t-bridge") as runner:

        async def reenter() -> None:
            runner.run(_add(1, 2))

        with pytest.raises(ClientStateError, match="own event loop"):
            runner.run(reenter())


def test_run_coroutine_works_where_a_loop_is_running() -> None:
    async def inside_a_running_loop() -> int:
        # Blocking code called from a coroutine (as Spark may call the connector).
        return run_coroutine(_add(20, 22))

    assert asyncio.run(inside_a_running_loop()) == 42
    assert not [t for t in threading.enumerate() if t.name == "txmq-run"]


def test_the_shared_loop_is_one_per_process() -> None:
    assert LoopThread.shared() is LoopThread.shared()
    assert LoopThread.shared().alive
