"""Waiting on a condition with a bounded timeout and a clear failure message (never
sleep-then-assert): the suite must hold on a loaded machine.

A test that needs something to have happened waits on a probe of it: ``wait_until`` polls a
predicate and fails naming what it waited for and the last value the probe returned.  A test
that needs something *not* to happen waits on a positive marker instead of a fixed time (a
message sent after the forbidden one arrives, a number of broker rounds passes, a queue's
committed offset reaches its end), then asserts the forbidden thing is absent."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sized
from typing import Any, NoReturn, TypeVar, overload

import pytest

from txmq.client.admin import AsyncAdminClient

T = TypeVar("T")

#: How often a probe is asked again.
POLL_INTERVAL = 0.02


def _describe(predicate: Callable[..., Any]) -> str:
    """The predicate's source line (a lambda names its condition well enough), or its repr."""
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


def _timed_out(timeout: float, what: str, predicate: Callable[..., Any], last: object) -> NoReturn:
    pytest.fail(
        f"timed out after {timeout}s waiting for {what or _describe(predicate)} "
        f"(last value seen: {last!r})"
    )


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    what: str = ...,
    interval: float = ...,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T], timeout: float = ..., what: str = ..., interval: float = ...
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "",
    interval: float = POLL_INTERVAL,
) -> Any:
    """Poll ``predicate`` (sync or async), every ``interval`` seconds, until it returns
    something true, and return that; fail the test after ``timeout`` naming ``what`` and the
    last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            _timed_out(timeout, what, predicate, value)
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "",
    interval: float = POLL_INTERVAL,
) -> T:
    """Blocking :func:`wait_until` for tests of the sync facade and of subprocesses."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            _timed_out(timeout, what, predicate, value)
        time.sleep(interval)


async def rounds_pass(rounds: Callable[[], int], n: int, what: str = "check rounds") -> None:
    """Wait until a counter (e.g. the broker's completed check rounds) has advanced by ``n``:
    "nothing happened during n rounds" without guessing how long n rounds take."""
    start = rounds()
    await wait_until(lambda: rounds() >= start + n, what=f"{n} more {what} (from {start})")


def parked_pulls(broker: Any, topic: str, queue_id: int) -> int:
    """How many long-poll pulls the broker holds parked on a queue (they found nothing and
    wait for a message or their timeout): the probe for "the pull is parked"."""
    return int(broker.ctx.hold.parked(topic, queue_id))


async def wait_caught_up(admin: Any, group: str, topic: str, what: str) -> None:
    """Wait (30 s at most) until ``group``'s lag on ``topic`` is 0 in the admin's consume
    stats: its committed offsets reach the end."""

    async def caught_up() -> bool:
        stats = await admin.consume_stats(group, topic)
        return bool(stats) and sum(s["lag"] for s in stats) == 0

    await wait_until(caught_up, 30, what)


async def wait_all_consumed(
    address: str, got: Sized, n: int, group: str, topic: str, caught_up: str
) -> None:
    """Wait (30 s at most each) until a consumer has received ``n`` messages into ``got``, then
    until ``group``'s committed offsets on ``topic`` reach the end (``caught_up``: what that
    wait is called when it fails)."""
    await wait_until(lambda: len(got) == n, 30, f"the consumer gets all {n} messages")
    async with AsyncAdminClient(address) as admin:
        await wait_caught_up(admin, group, topic, caught_up)
