"""A store with far more consume-queue files than its bound on open ones
(``max_open_consume_queue_files``): files are closed least-recently-used and opened again on
use; appends, reads, flushes (on another thread, as the broker runs them), recovery from a
crash image and topic deletion all see closed-and-reopened files correctly, and no file written
since its last fsync is ever closed without one."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_helpers import crash_image, make_msg, read_queue

from txmq.broker.store import MessageStore

BOUND = 16
TOPICS = 15
QUEUES = 4
PER_QUEUE = 25  # 10 entries per file: 3 files per queue, 180 in all
_SEGMENT = re.compile(r"^\d{20}$")


def _path_of(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _is_segment(path: str) -> bool:
    return "/consumequeue/" in path and bool(_SEGMENT.match(os.path.basename(path)))


def open_segments() -> int:
    return sum(_is_segment(_path_of(int(n))) for n in os.listdir("/proc/self/fd"))


class UnsyncedCloseGuard:
    """Wraps ``os.pwrite``, ``os.fsync``, ``os.fdatasync`` and ``os.close`` (the OS seam): a
    consume-queue segment closed while it still exists and holds writes no fsync covered is
    recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.dirty: set[int] = set()
        self.violations: list[str] = []
        self.closes = 0
        real_pwrite, real_fsync = os.pwrite, os.fsync
        real_fdatasync, real_close = os.fdatasync, os.close

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            n = real_pwrite(fd, data, offset)
            with self.lock:
                self.dirty.add(fd)
            return n

        def synced(real: Callable[[int], None]) -> Callable[[int], None]:
            def sync(fd: int) -> None:
                with self.lock:
                    self.dirty.discard(fd)
                real(fd)

            return sync

        def close(fd: int) -> None:
            path = _path_of(fd)
            with self.lock:
                was_dirty = fd in self.dirty
                self.dirty.discard(fd)
                if _is_segment(path):
                    self.closes += 1
                    if was_dirty and os.path.exists(path):
                        self.violations.append(path)
            real_close(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fsync", synced(real_fsync))
        monkeypatch.setattr(os, "fdatasync", synced(real_fdatasync))
        monkeypatch.setattr(os, "close", close)


class FlushThread:
    """Runs ``store.flush_consume_queues`` over and over on its own thread, as the broker's
    flush service does while the loop appends."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.store.flush_consume_queues()
                self.rounds += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> FlushThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "flush thread did not stop"
        assert self.error is None, f"flush failed: {self.error!r}"


def put_round(store: MessageStore, r: int) -> None:
    for t in range(TOPICS):
        for q in range(QUEUES):
            res = store.put_message(make_msg(f"T{t}", f"{t}-{q}-{r}".encode(), queue_id=q))
            assert res.queue_offset == r


def check_all(store: MessageStore, rounds: int) -> None:
    for t in range(TOPICS):
        for q in range(QUEUES):
            bodies = [m.body for m in read_queue(store, f"T{t}", q)]
            assert bodies == [f"{t}-{q}-{r}".encode() for r in range(rounds)], (t, q)


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[UnsyncedCloseGuard]:
    g = UnsyncedCloseGuard(monkeypatch)
    yield g
    assert not g.violations, f"closed with writes not fsynced: {g.violations[:5]}"


def test_many_queues_within_the_bound(
    make_store: Callable[..., MessageStore], tmp_path: Path, guard: UnsyncedCloseGuard
) -> None:
    store = make_store(max_open_consume_queue_files=BOUND)
    files = store._tracker.files
    assert files.bound == BOUND
    with FlushThread(store) as flusher:
        for r in range(PER_QUEUE):
            put_round(store, r)
            assert open_segments() <= BOUND
        check_all(store, PER_QUEUE)
    assert flusher.rounds > 0
    assert open_segments() <= BOUND
    assert files.evictions > TOPICS * QUEUES, "the bound never closed a file"
    assert guard.closes > TOPICS * QUEUES

    # a crash image (the page cache survives a killed process): recovery opens and cuts
    # closed files too
    put_round(store, PER_QUEUE)
    image = crash_image(tmp_path / "store", tmp_path / "image")
    again = make_store(image, max_open_consume_queue_files=BOUND)
    assert open_segments() <= 2 * BOUND  # two stores open, each within its bound
    check_all(again, PER_QUEUE + 1)
    put_round(again, PER_QUEUE + 1)
    check_all(again, PER_QUEUE + 2)

    # deleting topics whose files are closed removes them all
    for t in range(0, TOPICS, 2):
        again.delete_topic(f"T{t}")
        assert not (image / "consumequeue" / f"T{t}").exists()
    again.flush_consume_queues()
    assert open_segments() <= 2 * BOUND


def test_clean_restart_reads_everything(
    make_store: Callable[..., MessageStore], tmp_path: Path, guard: UnsyncedCloseGuard
) -> None:
    store = make_store(max_open_consume_queue_files=BOUND)
    for r in range(PER_QUEUE):
        put_round(store, r)
    store.close()
    assert open_segments() == 0
    again = make_store(max_open_consume_queue_files=BOUND)
    check_all(again, PER_QUEUE)
    assert open_segments() <= BOUND


def test_bound_below_minimum_refused(tmp_path: Path) -> None:
    from txmq.broker.store import StoreConfig

    with pytest.raises(ValueError, match="max_open_consume_queue_files"):
        StoreConfig(str(tmp_path), max_open_consume_queue_files=3)


def test_default_bound_is_half_the_raised_limit() -> None:
    """0 derives the bound from the open-files limit, which is first raised to the hard one."""
    import resource

    from txmq.broker.store.queue_file import OpenFiles

    files = OpenFiles(0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        assert soft == hard
    assert files.bound == max(16, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2)
    assert OpenFiles(40).bound == 40
