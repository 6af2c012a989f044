"""One fixed-size segment file (RocketMQ's ``MappedFile``), shared by commit log and consume
queues.

A segment is named by the 20-digit, zero-padded store offset of its first byte
(``00000000001073741824``), so sorting names sorts offsets and a position is found without
opening anything.  The file is preallocated to its full size when created; the bytes not yet
written read as zeros, and zeros mean "nothing here" to both readers.

Threads: the loop thread writes, reads and maps; a flush thread calls :meth:`sync` only.  The
file descriptor therefore outlives the mapping: a deleted segment is unmapped and unlinked at
once, but its descriptor is closed later by the flush thread (:meth:`close_fd`), so an fsync that
is running on it never sees a closed or reused descriptor.
"""

from __future__ import annotations

import mmap
import os
import re

import structlog

from .fileio import extend_to, preallocate, sync_segment

log = structlog.get_logger(__name__)

SEGMENT_NAME_DIGITS = 20
_NAME = re.compile(r"^\d{20}$")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def segment_name(start: int) -> str:
    """The file name of the segment starting at ``start``."""
    return f"{start:0{SEGMENT_NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The start offset a segment file name stands for, or None for any other file."""
    return int(name) if _NAME.match(name) else None


def segment_files(directory: str) -> list[tuple[int, str]]:
    """The segment files in ``directory`` as ``(start offset, path)``, in offset order; other
    files are logged and left alone."""
    found: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        start = parse_segment_name(name)
        if start is None:
            log.warning("unknown_file_ignored", path=os.path.join(directory, name))
            continue
        found.append((start, os.path.join(directory, name)))
    found.sort()
    return found


class MappedFile:
    """A segment: a file of ``capacity`` bytes holding store offsets
    ``[start, start + capacity)``, with a shared memory mapping.

    Args:
        path: the file.
        start: store offset of the file's first byte.
        capacity: file size in bytes.
        fd: an open read-write descriptor (the MappedFile owns it).
        writable: map read-write (consume queues write through the map) or read-only (the commit
            log writes with ``pwrite`` and reads through the map).
    """

    __slots__ = ("path", "start", "capacity", "fd", "mm", "writable", "_synced_once", "__weakref__")

    def __init__(
        self, path: str, start: int, capacity: int, fd: int, *, writable: bool, map_now: bool = True
    ) -> None:
        self.path = path
        self.start = start
        self.capacity = capacity
        self.fd: int | None = fd
        self.writable = writable
        self.mm: mmap.mmap | None = None
        # The first sync of a segment is a full fsync (its size and block map are new);
        # later ones are fdatasync.
        self._synced_once = False
        if map_now:
            self.map()

    @property
    def end(self) -> int:
        """Store offset just past the segment."""
        return self.start + self.capacity

    @classmethod
    def create(cls, directory: str, start: int, capacity: int, *, writable: bool) -> MappedFile:
        """Create (or reset to zeros) the segment file for ``start`` and map it.

        The caller must make the directory entry durable (fsync the directory) before relying
        on the data.
        """
        path = os.path.join(directory, segment_name(start))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size:
                os.ftruncate(fd, 0)  # leftovers from an earlier life must not read as data
            preallocate(fd, capacity)
            return cls(path, start, capacity, fd, writable=writable)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open_existing(
        cls, path: str, start: int, *, min_capacity: int, writable: bool, map_now: bool = True
    ) -> MappedFile:
        """Open an existing segment file.

        Its capacity is its size.  A file shorter than ``min_capacity`` (a crash between create
        and preallocate, or a damaged file) is extended with zeros first.
        """
        fd = os.open(path, os.O_RDWR | _O_CLOEXEC)
        try:
            size = extend_to(fd, min_capacity)
            return cls(path, start, size, fd, writable=writable, map_now=map_now)
        except BaseException:
            os.close(fd)
            raise

    def map(self) -> None:
        """(Re)create the memory mapping."""
        assert self.fd is not None
        if self.mm is None:
            access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(self.fd, self.capacity, access=access)

    def unmap(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def sync(self) -> None:
        """Make everything written so far durable (flush thread)."""
        fd = self.fd
        if fd is None:
            return
        sync_segment(fd, self._synced_once)
        self._synced_once = True

    def mtime(self) -> float:
        """Last modification time of the file (what retention ages by)."""
        return os.stat(self.path).st_mtime

    def unlink(self) -> None:
        """Unmap and remove the file; the descriptor stays open until :meth:`close_fd`."""
        self.unmap()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close_fd(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.unmap()
        self.close_fd()

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, start={self.start}, capacity={self.capacity})"
