"""The message index: the ``KEYS`` and ``UNIQ_KEY`` of stored messages, per topic, to their
commit-log offsets (RocketMQ's ``IndexFile`` / ``IndexService``, in our own layout).

Files: ``<root>/index/<20-digit commit-log offset>``, named by the commit-log offset of the first
record the file indexes.  Each file is one memory mapping of fixed size (sparse until written)::

    HEADER   64 bytes, little-endian
             magic "TXIX" u32, version u16, flags u16 (1 = CLEAN: the slots agree with ``count``),
             base_ts i64 (ms; entry times are deltas from it), min_ts i64, max_ts i64 (the store
             timestamps covered), begin_phy i64 (= the name), end_phy i64 (where indexing goes on:
             the commit-log offset after the last record read), slot_num u32, max_entries u32,
             count u32 (entries in use), crc32 u32 of the bytes before it
    SLOTS    slot_num x u32: 1 + the newest entry whose hash falls in the slot, 0 = empty
    ENTRIES  max_entries x 20 bytes: key hash u32, commit-log offset i64, store time - base_ts
             i32 (ms), 1 + the previous entry of the same slot u32 (0 = none)

A key is hashed as ``crc32(topic + "#" + key)``.  An entry's previous pointer always names an
older entry, so a chain walk ends; hashes collide, so every candidate is checked against the
stored message before it is returned.  A file is full at ``max_entries`` entries, or when a store
time no longer fits its delta; the next entry starts a new file.

Building: :class:`MessageIndex` follows the commit log from its own position (``end_phy`` of the
newest file), reading records already stored through the store's read API, off the send path
(a task woken by the write path's append hook or a short timer).  A message in a ROLLBACK record
is not indexed (RocketMQ's rule); every other record is.

Durability: the file being written keeps its slots in memory; entries go straight to the
mapping.  The flusher (a worker thread, about once a second) copies a snapshot of the slots into
the mapping, syncs it, then writes the header with the ``count`` and ``end_phy`` of the moment the
snapshot was taken, so the header never promises more than is on disk.  On load, the newest file
gets its slots checked so that no chain starts past ``count`` (entries written after the last
header are dropped) and indexing resumes at its ``end_phy``, re-reading the rest from the commit
log.  A file whose header is unreadable (bad magic, version, checksum, size or counts) is renamed
``<name>.damaged`` and logged; it and every newer file are rebuilt from the commit log, starting at
its name's offset.
"""

from __future__ import annotations

import array
import mmap
import os
import re
import struct
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import structlog

from txmq.protocol.message import (
    FIXED_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MessageConst,
    MessageSysFlag,
)

from .commit_log import BLANK_MAGIC, RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC
from .fileio import fsync_dir

log = structlog.get_logger(__name__)

INDEX_MAGIC = 0x58495854  # "TXIX" little-endian
INDEX_VERSION = 1
FLAG_CLEAN = 1

_HEADER = struct.Struct("<IHHqqqqqIII")
_CRC = struct.Struct("<I")
HEADER_SIZE = 64
_SLOT = struct.Struct("<I")
_ENTRY = struct.Struct("<IqiI")
ENTRY_SIZE = _ENTRY.size  # 20
_I16 = struct.Struct(">h")
_TX_TYPE = 0xC
_ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
_NAME = re.compile(r"^\d{20}$")
_KEYS = (MessageConst.KEYS + "\x01").encode()
_UNIQ = (MessageConst.UNIQ_KEY + "\x01").encode()
#: Chain steps one file walk takes at most (a bound on one query's work).
MAX_CHAIN_STEPS = 200_000
#: Most messages one query returns (RocketMQ's ``maxMsgsNumBatch``).
MAX_QUERY_NUM = 64
#: How far ahead of the entries in use a file's disk space is allocated.
ALLOCATE_STEP = 1 << 20


class IndexFileDamaged(Exception):
    """An index file whose header cannot be trusted."""


def key_hash(topic: bytes, key: bytes) -> int:
    """The hash of ``topic#key`` an entry carries."""
    return zlib.crc32(key, zlib.crc32(topic + b"#"))


def index_keys(props: bytes) -> list[bytes]:
    """The keys a message is indexed under: each of its space-separated ``KEYS`` and its
    ``UNIQ_KEY``, each once (what :func:`index_records` adds for one message)."""
    out: list[bytes] = []
    keys = _find_prop(props, _KEYS, 0, len(props))
    uniq = _find_prop(props, _UNIQ, 0, len(props))
    if keys:
        for k in keys.split(b" "):
            if k and k != uniq and k not in out:
                out.append(k)
    if uniq:
        out.append(uniq)
    return out


def file_name(begin_phy: int) -> str:
    return f"{begin_phy:020d}"


def file_size(slot_num: int, max_entries: int) -> int:
    return HEADER_SIZE + slot_num * 4 + max_entries * ENTRY_SIZE


class IndexFile:
    """One index file, mapped.  Appends and lookups run on the owner thread; :meth:`sync`
    (with a header snapshot) may run on a worker thread."""

    def __init__(self, path: str, mm: mmap.mmap, fd: int, slot_num: int, max_entries: int) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self.mm = mm
        self._fd = fd
        self.slot_num = slot_num
        self.max_entries = max_entries
        self._entries_at = HEADER_SIZE + slot_num * 4
        self.flags = 0
        self.base_ts = 0
        self.min_ts = 0
        self.max_ts = 0
        self.begin_phy = 0
        self.end_phy = 0
        self.count = 0
        #: Written to since the last :meth:`sync`.
        self.dirty = False
        #: While the file is written: its slots, kept in memory and copied to the mapping by
        #: :meth:`sync` (the mapping's slots always agree with the header synced last).  None
        #: once the file is sealed and synced: lookups read the mapping.
        self.slots: array.array[int] | None = None
        #: Bytes from the start known to be allocated on disk.
        self._allocated = 0

    def allocate(self, entries: int) -> None:
        """Make sure the header, the slots and the first ``entries`` entries are allocated on
        disk, a step ahead.  The file is sparse: a write through the mapping into a hole of a
        full disk would kill the broker with SIGBUS; this raises ENOSPC instead."""
        need = self._entries_at + entries * ENTRY_SIZE
        if need <= self._allocated and self._allocated:
            return
        end = min(len(self.mm), need + ALLOCATE_STEP)
        os.posix_fallocate(self._fd, 0, end)
        self._allocated = end

    def _load_slots(self) -> None:
        slots = array.array("I")
        slots.frombytes(self.mm[HEADER_SIZE : self._entries_at])
        if sys.byteorder != "little":
            slots.byteswap()
        self.slots = slots

    def slots_snapshot(self) -> bytes | None:
        """The in-memory slots as the mapping stores them (owner thread)."""
        if self.slots is None:
            return None
        if sys.byteorder == "little":
            return self.slots.tobytes()
        copy = array.array("I", self.slots)
        copy.byteswap()
        return copy.tobytes()

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, begin_phy: int, slot_num: int, max_entries: int) -> IndexFile:
        path = os.path.join(directory, file_name(begin_phy))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        size = file_size(slot_num, max_entries)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        f = cls(path, mm, fd, slot_num, max_entries)
        try:
            f.allocate(0)
        except BaseException:
            f.close()
            os.unlink(path)
            raise
        f.begin_phy = f.end_phy = begin_phy
        f.slots = array.array("I", bytes(4 * slot_num))
        f.dirty = True
        f.write_header(f.header_snapshot())
        return f

    @classmethod
    def open(cls, path: str) -> IndexFile:
        """Open an existing file.

        Raises:
            IndexFileDamaged: its header is unreadable or does not fit the file.
        """
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise IndexFileDamaged(f"{size} bytes, shorter than a header")
            head = os.pread(fd, HEADER_SIZE, 0)
            fields = _HEADER.unpack_from(head, 0)
            (magic, version, flags, base, lo, hi, begin, end, slots, max_entries, count) = fields
            (crc,) = _CRC.unpack_from(head, _HEADER.size)
            if magic != INDEX_MAGIC:
                raise IndexFileDamaged(f"bad magic {magic:#x}")
            if crc != zlib.crc32(head[: _HEADER.size]):
                raise IndexFileDamaged("header checksum mismatch")
            if version != INDEX_VERSION:
                raise IndexFileDamaged(f"unknown version {version}")
            name = os.path.basename(path)
            if not slots or not max_entries or count > max_entries or end < begin:
                raise IndexFileDamaged("header counts out of range")
            if file_name(begin) != name:
                raise IndexFileDamaged(f"header says it starts at {begin}")
            if size != file_size(slots, max_entries):
                raise IndexFileDamaged(f"size {size} does not match its header")
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        f = cls(path, mm, fd, slots, max_entries)
        f.flags, f.base_ts, f.min_ts, f.max_ts = flags, base, lo, hi
        f.begin_phy, f.end_phy, f.count = begin, end, count
        return f

    # -- header -------------------------------------------------------------------------------

    def header_snapshot(self, clean: bool = False) -> bytes:
        head = _HEADER.pack(
            INDEX_MAGIC,
            INDEX_VERSION,
            FLAG_CLEAN if clean else 0,
            self.base_ts,
            self.min_ts,
            self.max_ts,
            self.begin_phy,
            self.end_phy,
            self.slot_num,
            self.max_entries,
            self.count,
        )
        return head + _CRC.pack(zlib.crc32(head))

    def write_header(self, header: bytes) -> None:
        self.mm[: len(header)] = header

    def sync(self, header: bytes, slots: bytes | None, seal: bool = False) -> None:
        """Make the entries and ``slots`` durable, then ``header`` (both taken together before:
        the header never names more than what the first sync covered).  ``seal``: the file is
        written no more, its in-memory slots are dropped."""
        if slots is not None:
            self.mm[HEADER_SIZE : self._entries_at] = slots
        if seal:
            self.slots = None
        self.mm.flush()
        self.write_header(header)
        self.mm.flush(0, min(mmap.PAGESIZE, len(self.mm)))

    # -- appending (owner thread) --------------------------------------------------------------

    def full(self) -> bool:
        return self.count >= self.max_entries

    def fits_time(self, ts: int) -> bool:
        return self.count == 0 or -(2**31) <= ts - self.base_ts < 2**31

    def put_many(self, items: list[tuple[int, int, int]], i: int) -> int:
        """Add ``items[i:]`` (hash, commit-log offset, store time) while they fit; returns the
        index of the first one not added."""
        slots = self.slots
        assert slots is not None, "a sealed index file is not written"
        n = len(items)
        count = self.count
        if count == 0 and i < n:
            self.base_ts = self.min_ts = self.max_ts = items[i][2]
        base, lo, hi = self.base_ts, self.min_ts, self.max_ts
        cap, sn, at, mm = self.max_entries, self.slot_num, self._entries_at, self.mm
        self.allocate(min(cap, count + n - i))
        pack = _ENTRY.pack_into
        while i < n and count < cap:
            h, phy, ts = items[i]
            d = ts - base
            if not -0x80000000 <= d < 0x80000000:
                break
            if ts < lo:
                lo = ts
            elif ts > hi:
                hi = ts
            s = h % sn
            pack(mm, at + count * ENTRY_SIZE, h, phy, d, slots[s])
            count += 1
            slots[s] = count
            i += 1
        self.count, self.min_ts, self.max_ts = count, lo, hi
        self.dirty = True
        return i

    # -- lookup -------------------------------------------------------------------------------

    def overlaps(self, begin: int, end: int) -> bool:
        return self.count > 0 and self.min_ts <= end and self.max_ts >= begin

    def lookup(self, h: int, begin: int, end: int) -> Iterator[int]:
        """Commit-log offsets of the entries with hash ``h`` stored in ``[begin, end]`` (ms),
        newest first."""
        mm = self.mm
        slots = self.slots
        if slots is not None:
            cur = slots[h % self.slot_num]
        else:
            (cur,) = _SLOT.unpack_from(mm, HEADER_SIZE + (h % self.slot_num) * 4)
        steps = 0
        count = self.count
        while 0 < cur <= count and steps < MAX_CHAIN_STEPS:
            eh, phy, delta, prev = _ENTRY.unpack_from(mm, self._entries_at + (cur - 1) * ENTRY_SIZE)
            if eh == h and begin <= self.base_ts + delta <= end:
                yield phy
            if prev >= cur:  # damaged: a chain only goes back
                return
            cur = prev
            steps += 1

    # -- repair -------------------------------------------------------------------------------

    def repair_slots(self) -> str:
        """After an unclean stop: make every chain start below ``count``.  Returns how (the
        quick way follows chains that start past ``count`` back through the entries written
        after the header; when those are not intact the slots are rebuilt from the entries)."""
        count = self.count
        slots = array.array("I")
        slots.frombytes(self.mm[HEADER_SIZE : self._entries_at])
        if sys.byteorder != "little":
            slots.byteswap()
        fixed: dict[int, int] = {}
        for i, head in enumerate(slots):
            if head <= count:
                continue
            cur = head
            while cur > count:
                if cur > self.max_entries:
                    return self._rebuild_slots()
                eh, _phy, _d, prev = _ENTRY.unpack_from(
                    self.mm, self._entries_at + (cur - 1) * ENTRY_SIZE
                )
                if prev >= cur or eh % self.slot_num != i:
                    return self._rebuild_slots()
                cur = prev
            fixed[i] = cur
        for i, head in fixed.items():
            _SLOT.pack_into(self.mm, HEADER_SIZE + i * 4, head)
        self._load_slots()
        return "chains" if fixed else "clean"

    def _rebuild_slots(self) -> str:
        mm = self.mm
        mm[HEADER_SIZE : self._entries_at] = bytes(self._entries_at - HEADER_SIZE)
        at = self._entries_at
        for n in range(self.count):
            pos = at + n * ENTRY_SIZE
            eh, phy, delta, _prev = _ENTRY.unpack_from(mm, pos)
            slot_at = HEADER_SIZE + (eh % self.slot_num) * 4
            (prev,) = _SLOT.unpack_from(mm, slot_at)
            _ENTRY.pack_into(mm, pos, eh, phy, delta, prev)
            _SLOT.pack_into(mm, slot_at, n + 1)
        self._load_slots()
        return "rebuilt"

    def close(self) -> None:
        try:
            self.mm.close()
        finally:
            os.close(self._fd)


@dataclass(frozen=True)
class IndexQueryResult:
    """What a query found: the stored messages (their stored bytes, newest first) and how far
    the index had got (RocketMQ's ``indexLastUpdateTimestamp`` / ``indexLastUpdatePhyoffset``)."""

    messages: list[bytes]
    last_update_timestamp: int
    last_update_phy_offset: int
    #: A paged query (``before`` given): the commit-log offset of the last message found,
    #: where the next page starts, when more may match (None: none more).
    next_before: int | None = None


#: A file to sync: its header, its slots (None: the mapping has them) and whether it is sealed.
Snapshot = tuple[IndexFile, bytes, bytes | None, bool]


class IndexFiles:
    """The index files of one folder, and appending to them: the part of the index that knows
    nothing of the commit log (what the unit tests and the bench drive directly).

    Threads: :meth:`add`, :meth:`lookup` and :meth:`sync_snapshots` on the owner thread;
    :meth:`sync` of what the snapshot returned on any one worker thread at a time."""

    def __init__(self, directory: str, slot_num: int, max_entries: int) -> None:
        self.directory = directory
        self.slot_num = slot_num
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        #: Commit-log offset indexing goes on from.
        self.position = 0
        #: Store timestamp of the newest message indexed.
        self.last_timestamp = 0
        #: Files left full (or out of time range) and not yet synced with their final header.
        self._sealed: list[IndexFile] = []
        self._retired: list[IndexFile] = []
        self._dir_dirty = False
        #: Held while a worker syncs (so a file is not closed under it).
        self.sync_lock = threading.Lock()

    # -- loading --------------------------------------------------------------------------------

    def load(self, start_if_empty: int) -> None:
        """Open the files; set damaged ones aside (see the module docstring) and set
        :attr:`position`."""
        os.makedirs(self.directory, exist_ok=True)
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        resume: int | None = None
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            try:
                f = IndexFile.open(path)
            except (IndexFileDamaged, OSError, ValueError) as exc:
                aside = path + ".damaged"
                os.replace(path, aside)
                log.error(
                    "index_file_damaged",
                    file=path,
                    set_aside=aside,
                    error=str(exc),
                    rebuild_from=int(name),
                )
                for later in names[i + 1 :]:
                    os.remove(os.path.join(self.directory, later))
                    log.warning(
                        "index_file_dropped", file=later, reason="rebuilt after a damaged one"
                    )
                resume = int(name)
                self._dir_dirty = True
                break
            self.files.append(f)
        # A file left before its final header was synced (the stop came just after the next
        # file began) is where indexing goes on: the newer files are rebuilt.
        for i, f in enumerate(self.files[:-1]):
            if not f.flags & FLAG_CLEAN:
                for newer in self.files[i + 1 :]:
                    newer.close()
                    os.remove(newer.path)
                    log.warning(
                        "index_file_dropped", file=newer.path, reason="an older file was not sealed"
                    )
                del self.files[i + 1 :]
                self._dir_dirty = True
                break
        if self.files:
            # The newest file may have been written after its header (nothing says how far
            # when the broker stopped without closing it): no chain may start past its count.
            last = self.files[-1]
            how = last.repair_slots()
            if how != "clean":
                log.info("index_file_repaired", file=last.path, entries=last.count, how=how)
            self.last_timestamp = last.max_ts
            # After a damaged file, indexing goes on at its name only if the file before it
            # says it covers that far: a kill while the damaged one was being created (sized,
            # no header yet) leaves the older one unsealed, its header behind its entries.
            resume = last.end_phy if resume is None else min(resume, last.end_phy)
        self.position = start_if_empty if resume is None else resume

    # -- appending ------------------------------------------------------------------------------

    def _active(self, ts: int, phy: int) -> IndexFile:
        f = self.files[-1] if self.files else None
        if f is not None and not f.full() and f.fits_time(ts) and f.slots is not None:
            return f
        # The new file starts at the message, where a rebuild of it would start.
        begin = self.position if f is None else max(phy, f.begin_phy + 1)
        new = IndexFile.create(self.directory, begin, self.slot_num, self.max_entries)
        if f is not None:
            # Sealed: its entries point below ``phy + 1`` (a message's keys may straddle two
            # files).
            f.end_phy = max(f.end_phy, phy + 1)
            self._sealed.append(f)
        self.files.append(new)
        self._dir_dirty = True
        return new

    def add(self, h: int, phy: int, ts: int) -> None:
        """Index hash ``h`` of the message at commit-log offset ``phy`` stored at ``ts``."""
        self.add_many([(h, phy, ts)])

    def add_many(self, items: list[tuple[int, int, int]]) -> None:
        """:meth:`add` each ``(hash, commit-log offset, store time)``, in commit-log order."""
        i = 0
        n = len(items)
        while i < n:
            _h, phy, ts = items[i]
            i = self._active(ts, phy).put_many(items, i)
            if ts > self.last_timestamp:
                self.last_timestamp = ts
        if n and items[-1][2] > self.last_timestamp:
            self.last_timestamp = items[-1][2]

    def advance(self, position: int) -> None:
        """Everything below ``position`` is indexed."""
        self.position = position
        if self.files:
            f = self.files[-1]
            if f.end_phy != position:
                f.end_phy = position
                f.dirty = True

    def drop_below(self, min_phy: int) -> None:
        """Retire the files whose every entry points below ``min_phy`` (never the newest);
        :meth:`sync` deletes them."""
        while len(self.files) > 1 and self.files[0].end_phy <= min_phy:
            f = self.files.pop(0)
            if f in self._sealed:
                self._sealed.remove(f)
            self._retired.append(f)

    # -- lookup ---------------------------------------------------------------------------------

    def lookup(self, h: int, begin: int, end: int) -> Iterator[int]:
        """Candidate commit-log offsets for hash ``h`` in ``[begin, end]``, newest file first."""
        for f in reversed(self.files):
            if f.overlaps(begin, end):
                yield from f.lookup(h, begin, end)

    # -- durability -----------------------------------------------------------------------------

    def sync_snapshots(self, clean: bool = False) -> list[Snapshot]:
        """What :meth:`sync` makes durable, taken on the owner thread: each file written since
        the last sync with its header and slots as of now (sealed files' final headers are
        clean)."""
        out: list[Snapshot] = []
        for f in self._sealed:
            out.append((f, f.header_snapshot(clean=True), f.slots_snapshot(), True))
            f.dirty = False
        self._sealed = []
        if self.files:
            f = self.files[-1]
            if f.dirty or clean:
                out.append((f, f.header_snapshot(clean=clean), f.slots_snapshot(), False))
                f.dirty = False
        return out

    def sync(self, snapshots: list[Snapshot]) -> None:
        """Blocking: sync the snapshots' files, delete retired files."""
        with self.sync_lock:
            for f, header, slots, seal in snapshots:
                f.sync(header, slots, seal)
            retired, self._retired = self._retired, []
            for f in retired:
                f.close()
                os.remove(f.path)
                log.info("index_file_deleted", file=f.path, end_phy=f.end_phy)
            if retired or self._dir_dirty:
                self._dir_dirty = False
                fsync_dir(self.directory)

    def close(self) -> None:
        """Sync everything with clean headers and unmap (blocking)."""
        self.sync(self.sync_snapshots(clean=True))
        with self.sync_lock:
            for f in self.files:
                f.close()
            self.files = []

    def detach_all(self) -> list[IndexFile]:
        """Forget every file (owner thread): indexing starts over; :meth:`delete` them."""
        doomed = self.files + self._retired
        self.files, self._sealed, self._retired = [], [], []
        return doomed

    def delete(self, doomed: list[IndexFile]) -> None:
        """Blocking: close and delete files :meth:`detach_all` returned."""
        with self.sync_lock:
            for f in doomed:
                f.close()
                os.remove(f.path)
            fsync_dir(self.directory)

    @property
    def entry_count(self) -> int:
        return sum(f.count for f in self.files)


#: The fields of a stored message's fixed part the index reads: MAGICCODE, SYSFLAG,
#: STORETIMESTAMP, BODYLENGTH (offsets 4, 36, 56, 84).
_FIXED_FIELDS = struct.Struct(">4xi28xi16xq20xi")


def _find_prop(data: bytes, name: bytes, start: int, end: int) -> bytes | None:
    """The value of property ``name`` (with its ``\x01``) in ``data[start:end]``."""
    i = data.find(name, start, end)
    while i > start and data[i - 1] != 2:
        i = data.find(name, i + 1, end)
    if i < 0:
        return None
    v = i + len(name)
    j = data.find(b"\x02", v, end)
    return data[v : j if j >= 0 else end]


def index_records(files: IndexFiles, data: bytes, pos: int) -> tuple[int, int]:
    """Index the whole commit-log records in ``data`` (read at ``pos``).  Returns ``(records
    read, entries added)``; stops at a blank record."""
    cur = 0
    n = len(data)
    records = 0
    items: list[tuple[int, int, int]] = []
    add = items.append
    unpack_header = RECORD_HEADER.unpack_from
    unpack_fixed = _FIXED_FIELDS.unpack_from
    unpack_i16 = _I16.unpack_from
    crc = zlib.crc32
    find = data.find
    seeds: dict[bytes, int] = {}
    while cur + RECORD_HEADER_SIZE <= n:
        magic, length, _crc = unpack_header(data, cur)
        if magic != RECORD_MAGIC:
            if magic == BLANK_MAGIC:
                break
            raise ValueError(f"no commit-log record at offset {pos + cur}")
        start = cur + RECORD_HEADER_SIZE
        end = start + length
        records += 1
        cur = end
        try:
            msg_magic, sys_flag, ts, body_len = unpack_fixed(data, start)
            p = start + FIXED_SIZE + body_len
            if msg_magic == MESSAGE_MAGIC_CODE:
                tlen = data[p]
                p += 1
            elif msg_magic == MESSAGE_MAGIC_CODE_V2:
                tlen = unpack_i16(data, p)[0]
                p += 2
            else:
                continue
            topic = data[p : p + tlen]
            p += tlen
            props_end = p + 2 + unpack_i16(data, p)[0]
            p += 2
        except (struct.error, IndexError):
            continue
        if sys_flag & _TX_TYPE == _ROLLBACK or props_end > end:
            continue
        seed = seeds.get(topic)
        if seed is None:
            seed = seeds[topic] = crc(topic + b"#")
        phy = pos + cur - RECORD_HEADER_SIZE - length
        # _find_prop inlined for the usual case (a name at the start or after a separator).
        i = find(_UNIQ, p, props_end)
        if i < 0:
            uniq = None
        elif i == p or data[i - 1] == 2:
            j = find(b"\x02", i + 9, props_end)
            uniq = data[i + 9 : j if j >= 0 else props_end]
        else:
            uniq = _find_prop(data, _UNIQ, p, props_end)
        i = find(_KEYS, p, props_end)
        if i < 0:
            keys = None
        elif i == p or data[i - 1] == 2:
            j = find(b"\x02", i + 5, props_end)
            keys = data[i + 5 : j if j >= 0 else props_end]
        else:
            keys = _find_prop(data, _KEYS, p, props_end)
        if keys:
            if b" " not in keys:
                if keys != uniq:
                    add((crc(keys, seed), phy, ts))
            else:
                # a set, not a list: a trace message's KEYS name up to a hundred messages
                done: set[bytes] = {b"", uniq or b""}
                for k in keys.split(b" "):
                    if k not in done:
                        done.add(k)
                        add((crc(k, seed), phy, ts))
        if uniq:
            add((crc(uniq, seed), phy, ts))
    files.add_many(items)
    return records, len(items)
