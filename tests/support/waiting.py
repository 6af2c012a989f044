"""Waiting on a condition with a bounded timeout and a clear failure message (never
sleep-then-assert): the suite must hold on a loaded machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0, what: str = ""
) -> None:
    """Poll ``predicate`` (sync or async) until it is true; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.02)


def wait_until_sync(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Blocking :func:`wait_until` for tests of the sync facade."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


async def rounds_pass(rounds: Callable[[], int], n: int, what: str = "check rounds") -> None:
    """Wait until a counter (e.g. the broker's completed check rounds) has advanced by ``n``:
    "nothing happened during n rounds" without guessing how long n rounds take."""
    start = rounds()
    await wait_until(lambda: rounds() >= start + n, what=f"{n} more {what}")
