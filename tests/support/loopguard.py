"""A guard that records blocking durability calls made on a thread while it runs an event loop.

It catches, wherever they come from (the broker's own code or a library):

* ``os.fsync`` / ``os.fdatasync`` (wrapped while the guard is active; txmq looks both up at
  call time);
* the audit events of an atomic file replacement: ``tempfile.mkstemp`` and ``os.rename``
  (``os.replace`` raises the same event), and ``os.remove`` (retention).

A call counts when the calling thread has a running event loop; the broker's worker threads
(commit-log flush, metadata writes) have none.  Deterministic, so it holds on a loaded machine
where a timing-based slow-callback check would not.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_WATCHED_EVENTS = frozenset({"tempfile.mkstemp", "os.rename", "os.remove"})


class _State:
    active: BlockingCallGuard | None = None
    hooked = False


class BlockingCallGuard:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def _record(self, what: str) -> None:
        if asyncio._get_running_loop() is None:
            return
        stack = "".join(traceback.format_stack(limit=12)[:-2])
        with self._lock:
            self.calls.append(f"{what} on thread {threading.current_thread().name}\n{stack}")

    def report(self) -> str:
        return "\n".join(self.calls[:5])


def _audit(event: str, args: tuple[Any, ...]) -> None:
    guard = _State.active
    if guard is not None and event in _WATCHED_EVENTS:
        guard._record(f"{event}{args!r}")


def _wrap(name: str, original: Callable[[int], None]) -> Callable[[int], None]:
    def wrapper(fd: int) -> None:
        guard = _State.active
        if guard is not None:
            guard._record(f"os.{name}({fd})")
        original(fd)

    return wrapper


@contextmanager
def blocking_call_guard() -> Iterator[BlockingCallGuard]:
    """Record blocking durability calls made on event-loop threads inside the block."""
    if not _State.hooked:
        sys.addaudithook(_audit)  # audit hooks cannot be removed: installed once, idle outside
        _State.hooked = True
    guard = BlockingCallGuard()
    originals = {n: getattr(os, n) for n in ("fsync", "fdatasync") if hasattr(os, n)}
    for n, fn in originals.items():
        setattr(os, n, _wrap(n, fn))
    _State.active = guard
    try:
        yield guard
    finally:
        _State.active = None
        for n, fn in originals.items():
            setattr(os, n, fn)
