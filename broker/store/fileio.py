"""Small file-system helpers with the durability rules spelled out.

* A new or renamed file is durable only once its *directory* is fsynced too (POSIX: the entry
  lives in the directory).  :func:`atomic_write` and the segment code do that.
* Segment files are preallocated at their full size, so their length never changes while data is
  appended; ``fdatasync`` then only has to push data blocks (and the block map), not the inode
  times.  They are sparse: a segment takes disk space as it fills.
* Cutting a tail is done with ``ftruncate(pos)`` followed by ``ftruncate(size)``: the kernel
  drops the blocks after ``pos`` (reads then return zeros) without writing gigabytes of zeros.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from txmq.protocol.errors import MALFORMED_DOCUMENT

from .errors import StoreCorruptError

log = structlog.get_logger(__name__)


def fdatasync(fd: int) -> None:
    """fdatasync where the platform has it (Linux); plain fsync elsewhere.  Looked up at each
    call, so a test guard that wraps ``os.fdatasync`` sees every call."""
    getattr(os, "fdatasync", os.fsync)(fd)


def sync_segment(fd: int, synced_once: bool) -> None:
    """Make what was written to a preallocated segment file durable: its first sync is a full
    fsync (its size and block map are new), later ones are :func:`fdatasync`."""
    if synced_once:
        fdatasync(fd)
    else:
        os.fsync(fd)


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def fsync_dir(path: str) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, *, fsync: Callable[[int], None] | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Order: write a temporary file in the same directory, fsync it, rename it over ``path``,
    fsync the directory.  On any failure the temporary file is removed and ``path`` keeps its old
    content.

    Args:
        path: the file to replace (its directory must exist).
        data: the complete new content.
        fsync: the function used to fsync the temporary file (a seam for fault-injection tests;
            ``os.fsync`` by default).

    Raises:
        OSError: the write, fsync or rename failed; ``path`` is unchanged.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            (fsync or os.fsync)(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def remove_stale_temp_files(path: str) -> list[str]:
    """Delete temporary files :func:`atomic_write` left next to ``path`` when the process died
    mid-write (``<name>.<random>.tmp``); returns their paths."""
    directory = os.path.dirname(os.path.abspath(path))
    prefix = os.path.basename(path) + "."
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    return removed


def preallocate(fd: int, size: int) -> None:
    """Give a file its full size as a sparse file (``ftruncate``): instant, and the unwritten
    part reads as zeros and takes no disk space."""
    os.ftruncate(fd, size)


def extend_to(fd: int, min_size: int) -> int:
    """The size of an existing file, extended with zeros (:func:`preallocate`) to ``min_size``
    first if it is shorter (a crash between create and preallocate, or a damaged file)."""
    size = os.fstat(fd).st_size
    if size < min_size:
        preallocate(fd, min_size)
        size = min_size
    return size


def reserve_blocks(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks for ``[offset, offset + length)`` of a file (``posix_fallocate``).

    Writing through ``mmap`` into a hole of a sparse file on a full disk kills the process with
    SIGBUS; writing into reserved blocks cannot fail that way, and a full disk shows up here
    instead, as an OSError (ENOSPC).  Filesystems that cannot reserve blocks are left sparse.
    """
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def zero_tail(fd: int, pos: int, size: int) -> None:
    """Make bytes ``[pos, size)`` of a file read as zeros (truncate down, then back up).

    The file must not be memory-mapped while this runs (a mapped page past the temporary end
    would fault with SIGBUS).
    """
    os.ftruncate(fd, pos)
    preallocate(fd, size)


def nonzero_end(fd: int, start: int, end: int) -> int:
    """The position just after the last non-zero byte in ``[start, end)``, or ``start``.

    Only the file's data extents are read (``SEEK_DATA``/``SEEK_HOLE``), so a mostly sparse
    1 GiB segment costs a few reads; filesystems without hole reporting are read in full.
    """
    last = start
    pos = start
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    while pos < end:
        data_start, data_end = pos, end
        if seek_data is not None and seek_hole is not None:
            try:
                data_start = os.lseek(fd, pos, seek_data)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after pos
                    break
                data_start = pos
            if data_start >= end:
                break
            try:
                data_end = min(os.lseek(fd, data_start, seek_hole), end)
            except OSError:
                data_end = end
        p = data_start
        while p < data_end:
            chunk = os.pread(fd, min(1 << 20, data_end - p), p)
            if not chunk:
                break
            stripped = len(chunk.rstrip(b"\0"))
            if stripped:
                last = p + stripped
            p += len(chunk)
        pos = max(data_end, pos + 1)
    return last


def read_after_interrupted_writes(path: str) -> bytes | None:
    """The content of the file at ``path``, or None when there is none, after removing (and
    logging) the temporary files an interrupted :func:`atomic_write` left next to it."""
    for stale in remove_stale_temp_files(path):
        log.info("temp_file_removed", path=stale)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


T = TypeVar("T")


#: The top-level field of a JSON state file that holds its checksum: the CRC-32 (``zlib.crc32``)
#: of the rest of the document in canonical form (:func:`canonical_json`).  An extra field, so
#: RocketMQ's own tools still read ``topics.json`` and the other tables (they ignore unknown
#: fields); a file without it was written before checksums (or by hand) and is read as before.
CHECKSUM_FIELD = "txmqCrc32"


class ChecksumMismatch(ValueError):
    """A state file whose checksum does not match its content."""


def canonical_json(doc: Any) -> bytes:
    """``doc`` as the bytes its checksum covers: keys sorted, no spaces, ASCII.  Parsing a file
    and encoding it this way gives the bytes the writer encoded, however the file is laid out
    (the writers use string keys only)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def with_checksum(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its :data:`CHECKSUM_FIELD` added (last)."""
    rest = {k: v for k, v in doc.items() if k != CHECKSUM_FIELD}
    rest[CHECKSUM_FIELD] = zlib.crc32(canonical_json(rest))
    return rest


def checked_json(raw: bytes | str, path: str) -> tuple[Any, bool]:
    """Parse a JSON state file and verify its checksum; returns the document without the
    checksum field and whether it had one (False: an older file, taken as it is).

    Raises:
        ChecksumMismatch: the checksum does not match (a damaged file).
        ValueError: not JSON.
    """
    doc = json.loads(raw)
    if not isinstance(doc, dict) or CHECKSUM_FIELD not in doc:
        return doc, False
    stored = doc.pop(CHECKSUM_FIELD)
    actual = zlib.crc32(canonical_json(doc))
    if stored != actual:
        raise ChecksumMismatch(
            f"{path}: checksum mismatch (the file says {CHECKSUM_FIELD} {stored!r}, "
            f"its content has {actual})"
        )
    return doc, True


def dumps_with_checksum(doc: dict[str, Any], **dump_args: Any) -> bytes:
    """The file content of ``doc`` with its checksum (``dump_args``: how to lay it out)."""
    return json.dumps(with_checksum(doc), **dump_args).encode()


def read_versioned_json(
    path: str, what: str, table_key: str, convert: Callable[[Any], T]
) -> tuple[T, int, bool] | None:
    """Read a table written by :func:`write_versioned_json` (RocketMQ's config file shape,
    ``{table_key: {...}, "dataVersion": {"timestamp": ..., "counter": ...}}``), after removing
    what an interrupted write left next to it.

    Returns:
        ``(convert(table), counter, checked)``, or None when there is no file; ``checked``:
        the file carried a checksum (False: written before checksums, read as before).

    Raises:
        StoreCorruptError: the file cannot be read as such a table (``what`` names it), its
            checksum does not match, or ``convert`` fails on it.
    """
    raw = read_after_interrupted_writes(path)
    if raw is None:
        return None
    try:
        doc, checked = checked_json(raw, path)
        table = convert(doc.get(table_key, {}))
        counter = int(doc.get("dataVersion", {}).get("counter", 0))
    except MALFORMED_DOCUMENT as exc:
        raise StoreCorruptError(f"cannot read {what} from {path}: {exc}") from None
    return table, counter, checked


def write_versioned_json(path: str, table_key: str, table: Any, counter: int) -> None:
    """Write ``table`` with its version atomically, creating the folder if needed.

    Raises:
        OSError: the write failed; the file keeps its previous content.
    """
    doc = {
        table_key: table,
        "dataVersion": {"timestamp": int(time.time() * 1000), "counter": counter},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    keep_backup(path)
    atomic_write(path, dumps_with_checksum(doc, indent=1))


def keep_backup(path: str) -> None:
    """Keep the current content of ``path`` as ``<path>.bak`` before it is replaced (RocketMQ's
    config files keep one too): what the table is read from when the file is found damaged.
    A hard link, so ``path`` itself never goes missing."""
    tmp = path + ".bak.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(path, tmp)
    except FileNotFoundError:
        return
    os.replace(tmp, path + ".bak")


def set_aside(path: str) -> str:
    """Rename a damaged file to ``<path>.damaged-<time>`` (kept for the operator, never read
    again); returns the new name."""
    aside = f"{path}.damaged-{int(time.time())}"
    os.replace(path, aside)
    return aside


def set_aside_quietly(path: str) -> str:
    """:func:`set_aside` for a log line: the new name, or why the file could not be renamed."""
    try:
        return set_aside(path)
    except OSError as exc:
        return f"(could not be renamed: {exc})"
