"""Consume-queue segment files within a bounded number of open descriptors.

A broker with 10,000 topics has at least 10,000 consume queues, each with one or more segment
files, more than a process may hold open.  So a consume-queue segment (:class:`QueueFile`)
is read and written with ``pread``/``pwrite`` on one descriptor (no memory mapping: Python's
``mmap`` keeps a duplicate descriptor, and every mapping is an area the kernel counts too), and
that descriptor is opened when the file is used and closed by :class:`OpenFiles`, a
least-recently-used bound shared by every queue of a store (``maxOpenConsumeQueueFiles``).

Durability: the flush thread fsyncs the files written since its last round (``sync``).  A file
written and not yet fsynced is fsynced before its descriptor is closed, so no flush loses an
fsync because the file was closed; a file the flush thread is fsyncing right now is skipped by
the eviction (or waited for, if every candidate is busy).  Each file has a small lock that its
fsync and its close take, so an fsync never runs on a closed or reused descriptor.

:func:`raise_open_files_limit` raises the process's soft ``RLIMIT_NOFILE`` to its hard limit
(as servers do at start-up); :func:`default_open_files_bound` derives the bound from it.
"""

from __future__ import annotations

import itertools
import os
import resource
import threading
from collections import OrderedDict

import structlog

from .fileio import extend_to, preallocate, sync_segment

log = structlog.get_logger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Consume-queue files get at most this share of the open-files limit by default; the rest is
#: for connections, commit-log segments, indexes and tables.
DEFAULT_SHARE = 0.5
#: The bound is never below this (a file per queue of a few topics stays open).
MIN_BOUND = 16
#: How many of the least recently used files an eviction looks at for one it can close
#: without an fsync.
_EVICT_SCAN = 8

_limit_lock = threading.Lock()
_limit_raised: tuple[int, int] | None = None


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (once per process; both logged) and
    return the soft limit in force (a large number for "unlimited")."""
    global _limit_raised
    with _limit_lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if _limit_raised is None:
            before = soft
            if hard == resource.RLIM_INFINITY or soft < hard:
                target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                except (ValueError, OSError) as exc:
                    log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=str(exc))
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            _limit_raised = (soft, hard)
            log.info("open_files_limit", soft_before=before, soft=soft, hard=hard)
        return soft if soft != resource.RLIM_INFINITY else 1 << 20


def default_open_files_bound() -> int:
    """``maxOpenConsumeQueueFiles`` when it is 0: half the (raised) soft open-files limit."""
    return max(MIN_BOUND, int(raise_open_files_limit() * DEFAULT_SHARE))


class QueueFile:
    """A consume-queue segment: ``capacity`` bytes holding queue bytes
    ``[start, start + capacity)``, opened on use, closed by :class:`OpenFiles`.

    Owner thread: everything but :meth:`sync` (flush thread) and :meth:`close_fd` (either).
    """

    __slots__ = (
        "path",
        "start",
        "capacity",
        "fd",
        "dirty",
        "deleted",
        "_synced_once",
        "_lock",
        "_files",
        "__weakref__",
    )

    def __init__(self, path: str, start: int, capacity: int, files: OpenFiles, fd: int) -> None:
        self.path = path
        self.start = start
        self.capacity = capacity
        self.fd: int | None = fd
        #: Written since the last fsync began.
        self.dirty = False
        self.deleted = False
        self._synced_once = False
        self._lock = threading.Lock()
        self._files = files
        files.opened(self)

    @property
    def end(self) -> int:
        return self.start + self.capacity

    @classmethod
    def create(
        cls, directory: str, name: str, start: int, capacity: int, files: OpenFiles
    ) -> QueueFile:
        """Create (or reset to zeros) a segment file of ``capacity`` bytes.  The caller makes
        the directory entry durable."""
        path = os.path.join(directory, name)
        fd = files.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC)
        try:
            if os.fstat(fd).st_size:
                os.ftruncate(fd, 0)  # leftovers from an earlier life must not read as data
            preallocate(fd, capacity)
        except BaseException:
            os.close(fd)
            files.unreserve()
            raise
        f = cls(path, start, capacity, files, fd)
        f._synced_once = False
        return f

    @classmethod
    def open_existing(cls, path: str, start: int, min_capacity: int, files: OpenFiles) -> QueueFile:
        """Open an existing segment; one shorter than ``min_capacity`` is extended with zeros."""
        fd = files.open(path, os.O_RDWR | _O_CLOEXEC)
        try:
            size = extend_to(fd, min_capacity)
        except BaseException:
            os.close(fd)
            files.unreserve()
            raise
        return cls(path, start, size, files, fd)

    # -- use (owner thread) -------------------------------------------------------------------

    def handle(self) -> int:
        """The open descriptor, reopening the file if it was closed (which may close the least
        recently used other file)."""
        fd = self.fd
        if fd is None:
            if self.deleted:
                raise FileNotFoundError(f"consume-queue file was deleted: {self.path}")
            fd = self._files.open(self.path, os.O_RDWR | _O_CLOEXEC)
            self.fd = fd
            self._files.opened(self)
        else:
            self._files.touch(self)
        return fd

    def pread(self, length: int, rel: int) -> bytes:
        """Up to ``length`` bytes from file position ``rel``."""
        return os.pread(self.handle(), length, rel)

    def pwrite(self, data: bytes | bytearray | memoryview, rel: int) -> None:
        """Write all of ``data`` at file position ``rel``."""
        fd = self.handle()
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], rel + done)
        self.dirty = True

    # -- durability and closing ----------------------------------------------------------------

    def _sync_locked(self) -> None:
        fd = self.fd
        if fd is None:
            return
        self.dirty = False
        sync_segment(fd, self._synced_once)
        self._synced_once = True

    def sync(self) -> None:
        """Make everything written so far durable (flush thread).  A closed file was fsynced
        when it was closed."""
        with self._lock:
            self._sync_locked()

    def try_evict(self, *, wait: bool, need_clean: bool) -> bool:
        """Close the descriptor to make room (called by :class:`OpenFiles` with its lock
        held): fsync first if written since the last fsync.  False (nothing done) when the file
        is being fsynced and ``wait`` is false, or it is dirty and ``need_clean`` is set."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if self.dirty and need_clean:
                return False
            if self.dirty:
                self._sync_locked()
            fd, self.fd = self.fd, None
            if fd is not None:
                os.close(fd)
            return True
        finally:
            self._lock.release()

    def close_fd(self) -> None:
        """Close the descriptor (the file may be reopened later unless deleted)."""
        with self._lock:
            fd, self.fd = self.fd, None
            if fd is not None:
                os.close(fd)
        self._files.forget(self)

    def close(self) -> None:
        self.close_fd()

    def unlink(self) -> None:
        """Remove the file and close its descriptor."""
        self.deleted = True
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.close_fd()

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime

    def __repr__(self) -> str:
        return f"QueueFile({self.path!r}, start={self.start}, capacity={self.capacity})"


class OpenFiles:
    """At most ``bound`` open consume-queue files; opening one more closes the least recently
    used (one that needs no fsync if any of the few oldest does not).

    Thread-safe; its lock is taken before a file's own lock, never after.
    """

    def __init__(self, bound: int = 0) -> None:
        derived = default_open_files_bound()  # raises the soft limit in any case
        self.bound = bound if bound > 0 else derived
        self._lru: OrderedDict[QueueFile, None] = OrderedDict()
        self._lock = threading.Lock()
        #: Slots taken by :meth:`make_room` for files being opened and not yet
        #: :meth:`opened` (another thread opening meanwhile must not take them too).
        self._reserved = 0
        #: Files closed to make room (a counter for stats and tests).
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def make_room(self) -> None:
        """Close files until one more may be opened, and keep that slot for the file being
        opened: :meth:`opened` takes it, :meth:`unreserve` gives it back if the open failed."""
        with self._lock:
            while self._lru and len(self._lru) + self._reserved >= self.bound:
                self._evict_one(None)
            self._reserved += 1

    def open(self, path: str, flags: int) -> int:
        """:meth:`make_room`, then open ``path``: the descriptor, its slot kept until
        :meth:`opened` (given back here if the open fails)."""
        self.make_room()
        try:
            return os.open(path, flags, 0o644)
        except BaseException:
            self.unreserve()
            raise

    def unreserve(self) -> None:
        """Give back the slot of a :meth:`make_room` whose open failed."""
        with self._lock:
            self._reserved = max(0, self._reserved - 1)

    def opened(self, f: QueueFile) -> None:
        """Count ``f`` as open (most recently used); called after :meth:`make_room`."""
        with self._lock:
            self._reserved = max(0, self._reserved - 1)
            self._lru[f] = None
            self._lru.move_to_end(f)
            while len(self._lru) > self.bound:
                self._evict_one(f)

    def touch(self, f: QueueFile) -> None:
        with self._lock:
            if f in self._lru:
                self._lru.move_to_end(f)

    def forget(self, f: QueueFile) -> None:
        with self._lock:
            self._lru.pop(f, None)

    def _evict_one(self, keep: QueueFile | None) -> None:
        candidates = [c for c in itertools.islice(self._lru, _EVICT_SCAN + 1) if c is not keep]
        for need_clean, wait in ((True, False), (False, False), (False, True)):
            for c in candidates:
                if c.try_evict(wait=wait, need_clean=need_clean):
                    del self._lru[c]
                    self.evictions += 1
                    return
        raise RuntimeError("no consume-queue file can be closed")
