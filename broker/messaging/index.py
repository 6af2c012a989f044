"""Builds the message index off the send path and answers queries by key
(RocketMQ's ``CommitLogDispatcherBuildIndex`` + ``IndexService.queryOffset``).

:class:`MessageIndexService` follows the commit log from the index's own position: a task woken
by the write path's append hook (or, for appends that do not go through it such as a replica's, a
short timer) reads records already stored, a bounded chunk at a time between requests, and adds
their keys to the index files (:mod:`txmq.broker.store.index`).  A send pays for setting an event;
the indexing itself runs when the loop is otherwise free of it.  A worker thread syncs the files
about once a second and at shutdown.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import structlog

from txmq.protocol.errors import ProtocolError, QueryNotFoundError, SystemBusyError
from txmq.protocol.message import MessageConst, decode_message

from ..store import MessageStore
from ..store.index import MAX_QUERY_NUM, IndexFiles, IndexQueryResult, index_records, key_hash

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: Commit-log bytes read per indexing step (then the loop serves requests again).
CHUNK_BYTES = 256 * 1024
#: How often the index is looked at without a wake-up, and how often it is synced (s).
POLL_INTERVAL = 0.2
#: How long after an append the index looks (s): the appends of that time are indexed in one
#: go, so a send pays for a flag, not for a wake-up of the task.
WAKE_DELAY = 0.005
SYNC_INTERVAL = 1.0
RETENTION_INTERVAL = 10.0
#: How long a query waits for the index to be rebuilt after a start before it is answered
#: "busy" instead of with what the index holds so far (s; under a client's request timeout).
REBUILD_WAIT = 3.0


def _default_background(fn: Callable[[], T]) -> Awaitable[T]:
    return asyncio.get_running_loop().run_in_executor(None, fn)


class MessageIndexService:
    """The index of one broker's store.

    Args:
        store: the open message store (read through its public read API only).
        directory: where the index files live (``<store root>/index``).
        slot_num: hash slots per file (``maxHashSlotNum``).
        max_entries: entries per file (``maxIndexNum``).
        in_background: runs a blocking call off the event loop.
        share: the most of the event loop's time indexing takes while sends arrive.
    """

    def __init__(
        self,
        store: MessageStore,
        directory: str,
        *,
        slot_num: int,
        max_entries: int,
        in_background: Callable[[Callable[[], Any]], Awaitable[Any]] = _default_background,
        share: float = 0.15,
    ) -> None:
        self.store = store
        self.files = IndexFiles(directory, slot_num, max_entries)
        self._in_background = in_background
        self._wake: asyncio.Event | None = None
        self._wake_due = False
        self._timers: list[asyncio.TimerHandle] = []
        #: Appends seen (the write path's hook counts them).
        self._appends = 0
        #: At most this share of the event loop's time goes to indexing while sends arrive.
        self.share = share
        self._task: asyncio.Task[None] | None = None
        self._sync_lock: asyncio.Lock | None = None
        self.records_indexed = 0
        self.entries_added = 0
        #: The commit log's end when the index was loaded: until indexing reaches it, the
        #: index is being rebuilt (after an unclean stop) and a lookup that finds nothing is
        #: not an answer (:meth:`query_when_ready`).
        self._rebuild_target = 0
        self._rebuilt: asyncio.Event | None = None
        self._loaded_at = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self) -> int:
        """Open the index files (blocking); returns the commit-log offset indexing resumes at."""
        self.files.load(self.store.min_phy_offset)
        pos = self.files.position
        if pos > self.store.max_phy_offset:
            # The commit log was cut back below what was indexed: new records take those
            # offsets (stale entries are filtered out by the check every query makes).
            log.warning(
                "index_ahead_of_commit_log", position=pos, max_phy_offset=self.store.max_phy_offset
            )
            pos = self.store.max_phy_offset
        if pos < self.store.min_phy_offset:
            pos = self.store.min_phy_offset
        self.files.advance(pos)
        self._rebuild_target = self.store.max_phy_offset
        self._loaded_at = time.monotonic()
        log.info(
            "index_loaded",
            files=len(self.files.files),
            entries=self.files.entry_count,
            position=pos,
            behind_bytes=self.store.max_phy_offset - pos,
        )
        return pos

    def start(self) -> asyncio.Task[None]:
        self._wake = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._rebuilt = asyncio.Event()
        self._check_rebuilt()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self.run(), name="txmq-index")
        self._timers = [loop.call_later(POLL_INTERVAL, self._poll)]
        return self._task

    def _poll(self) -> None:
        """The timer: appends that do not go through the write path (a replica's) are indexed
        too, and the index is synced when due."""
        assert self._wake is not None
        self._wake.set()
        self._timers = [asyncio.get_running_loop().call_later(POLL_INTERVAL, self._poll)]

    @property
    def rebuilding(self) -> bool:
        """The index has not yet reached the end the commit log had when the index was loaded
        (it is re-reading what an unclean stop left unindexed)."""
        return self._rebuilt is None or not self._rebuilt.is_set()

    def _check_rebuilt(self) -> None:
        if self._rebuilt is None or self._rebuilt.is_set():
            return
        if self.files.position >= self._rebuild_target:
            self._rebuilt.set()
            log.info(
                "index_caught_up",
                position=self.files.position,
                elapsed_ms=round((time.monotonic() - self._loaded_at) * 1000, 1),
            )

    def _wake_up(self) -> None:
        self._wake_due = False
        if self._wake is not None:
            self._wake.set()

    async def close(self) -> None:
        """Stop building, sync everything with clean headers and unmap."""
        for t in self._timers:
            t.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=10.0)
            self._task = None
        await self._in_background(self.files.close)

    # -- the append hook ------------------------------------------------------------------------

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        self._appends += 1
        if not self._wake_due and self._wake is not None:
            self._wake_due = True
            asyncio.get_running_loop().call_later(WAKE_DELAY, self._wake_up)

    # -- building -------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Commit-log offset below which every record is indexed."""
        return self.files.position

    @property
    def behind(self) -> int:
        """Commit-log bytes not indexed yet."""
        return max(0, self.store.max_phy_offset - self.files.position)

    def build_step(self, max_bytes: int = CHUNK_BYTES) -> int:
        """Index the next records (blocking, on the store's thread); returns the commit-log bytes
        passed (0: caught up)."""
        pos = self.files.position
        store = self.store
        if pos > store.max_phy_offset:
            # The log was cut back under the index (a replica's truncation) and may have grown
            # again since: where the cut was is not known here.
            return self._start_over(f"the commit log ends at {store.max_phy_offset}")
        if pos < store.min_phy_offset:
            log.warning("index_skipped_deleted", position=pos, min_phy_offset=store.min_phy_offset)
            self.files.advance(store.min_phy_offset)
            return store.min_phy_offset - pos
        try:
            data, nxt = store.read_replica_chunk(pos, max_bytes)
        except ValueError as exc:  # not a record boundary: the log was rewritten under it
            return self._start_over(str(exc))
        if nxt == pos:
            return 0
        records, entries = index_records(self.files, data, pos)
        self.records_indexed += records
        self.entries_added += entries
        self.files.advance(nxt)
        return nxt - pos

    def _start_over(self, why: str) -> int:
        """The index position is no longer a place in the commit log: index it all again.
        Blocking (it deletes the files; it happens only when a replica's log is cut back)."""
        log.error("index_out_of_step", position=self.files.position, error=why)
        self.files.delete(self.files.detach_all())
        self.files.advance(self.store.min_phy_offset)
        return 1

    def catch_up(self) -> None:
        """Index everything stored (blocking; for tests and tools)."""
        while self.build_step():
            pass

    async def run(self) -> None:
        assert self._wake is not None
        last_sync = last_retention = time.monotonic()
        busy = False
        while True:
            if not busy:
                await self._wake.wait()
            self._wake.clear()
            busy = False
            try:
                until = time.monotonic() + SYNC_INTERVAL
                while True:
                    appends = self._appends
                    t0 = time.monotonic()
                    moved = self.build_step()
                    self._check_rebuilt()
                    if not moved:
                        break
                    took = time.monotonic() - t0
                    if self._appends != appends:
                        # Sends go on: the index takes at most its share of the loop (it falls
                        # behind under a load that needs more, and catches up once it eases).
                        await asyncio.sleep(took * (1.0 - self.share) / self.share)
                    else:
                        await asyncio.sleep(0)  # one chunk at a time between requests
                    if time.monotonic() >= until:  # under steady load: sync now and then
                        busy = True
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("index_build_failed", position=self.files.position, error=repr(exc))
                await asyncio.sleep(1.0)
            now = time.monotonic()
            if now - last_retention >= RETENTION_INTERVAL:
                self.files.drop_below(self.store.min_phy_offset)
                last_retention = now
            if now - last_sync >= SYNC_INTERVAL:
                await self.sync()
                last_sync = now

    async def sync(self) -> None:
        """Make what is indexed durable (on a worker thread)."""
        assert self._sync_lock is not None
        async with self._sync_lock:
            snaps = self.files.sync_snapshots()
            try:
                await self._in_background(lambda: self.files.sync(snaps))
            except OSError as exc:
                log.error("index_sync_failed", error=str(exc))

    # -- queries --------------------------------------------------------------------------------

    async def query_when_ready(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin: int,
        end: int,
        *,
        unique: bool = False,
        before: int | None = None,
        max_bytes: int = 0,
    ) -> IndexQueryResult:
        """:meth:`query`, once the index has been rebuilt after the start (waiting up to
        :data:`REBUILD_WAIT`): what it found so far may be answered, but not a "not found"
        that only means "not indexed yet".

        Raises:
            SystemBusyError: still rebuilding, and nothing found yet (the caller asks again).
        """
        if self.rebuilding and self._rebuilt is not None:
            try:
                await asyncio.wait_for(self._rebuilt.wait(), REBUILD_WAIT)
            except TimeoutError:
                pass
        result = self.query(
            topic, key, max_num, begin, end, unique=unique, before=before, max_bytes=max_bytes
        )
        if not result.messages and self.rebuilding:
            raise SystemBusyError(
                "the message index is being rebuilt after the broker's start "
                f"({self._rebuild_target - self.files.position} bytes of the commit log to go); "
                "ask again"
            )
        return result

    def query(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin: int,
        end: int,
        *,
        unique: bool = False,
        before: int | None = None,
        max_bytes: int = 0,
    ) -> IndexQueryResult:
        """The stored messages of ``topic`` with ``key`` among their KEYS or as their UNIQ_KEY
        (only UNIQ_KEY when ``unique``), stored in ``[begin, end]`` (ms), newest first, at
        most ``max_num`` (capped at 64).  Each candidate is read and checked.

        A page (``before`` given: only messages at commit-log offsets below it) stops at
        ``max_bytes`` too (0: no bound; one message at least) and says where the next page
        starts (:attr:`IndexQueryResult.next_before`) when more match."""
        limit = max(1, min(max_num, MAX_QUERY_NUM))
        found: list[bytes] = []
        seen: set[int] = set()
        size = 0
        last = -1
        h = key_hash(topic.encode("utf-8"), key.encode("utf-8"))
        for phy in self.files.lookup(h, begin, end):
            if phy in seen or (before is not None and phy >= before):
                continue
            seen.add(phy)
            try:
                payload = self.store.read_message_bytes(phy)
                msg = decode_message(payload)
            except (QueryNotFoundError, ProtocolError):
                continue  # deleted by retention, or an entry past a cut log
            if msg.topic != topic or not (begin <= msg.store_timestamp <= end):
                continue
            props = msg.properties
            if props.get(MessageConst.UNIQ_KEY) != key and (
                unique or key not in (props.get(MessageConst.KEYS) or "").split(" ")
            ):
                continue
            if before is not None and (len(found) >= limit or (found and size >= max_bytes > 0)):
                # one more matches: the page ends at the message before it
                return IndexQueryResult(
                    found, self.files.last_timestamp, self.files.position, next_before=last
                )
            found.append(bytes(payload))
            size += len(payload)
            last = phy
            if before is None and len(found) >= limit:
                break
        return IndexQueryResult(found, self.files.last_timestamp, self.files.position)


def index_directory(store_root: str) -> str:
    return os.path.join(store_root, "index")


async def open_message_index(
    config: Any, store: MessageStore, in_background: Callable[[Callable[[], Any]], Awaitable[Any]]
) -> MessageIndexService | None:
    """The index of a broker's store, loaded (None when ``messageIndexEnable`` is off)."""
    if not config.message_index_enable:
        return None
    index = MessageIndexService(
        store,
        index_directory(config.store_path_root_dir),
        slot_num=config.max_hash_slot_num,
        max_entries=config.max_index_num,
        in_background=in_background,
    )
    await in_background(index.load)
    return index
