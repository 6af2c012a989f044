"""The transaction table's own files, next to the store: the check-state index and the
snapshot.  Both are written from the event loop's copy of the table, on the broker's metadata
thread, with an atomic replace; both are only ever an optimisation of what the half and op
queues in the commit log say, so an unreadable file is logged and ignored.

Files, under ``<store>/transaction/``:

* ``checkState.json``: ``{"version": 1, "checks": {txid: [checkTimes, lastCheckMs], ...},
  "txmqCrc32": n}``, the check counts of pending and parked transactions (halves are never
  rewritten to count checks, as RocketMQ does); ``txmqCrc32`` is the CRC-32 of the rest
  (canonical JSON, :func:`~..store.fileio.checked_json`; absent in files written before);
* ``snapshot.msgpack``: the whole table and the queue positions it covers (:mod:`.snapshot`),
  behind a CRC-32 of its own.

A damaged one (unreadable, or a checksum that does not match) is renamed, never read again,
with a WARNING naming it: the table is then rebuilt from the half and op queues in full (the
snapshot), or its transactions' check counts start again from zero (the check-state index).

The persistence gets only what it uses: the state machine, the store (to know what a snapshot
covers), a flush of the commit log, the metadata thread and the clock.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import TYPE_CHECKING

import structlog

from txmq.protocol.errors import MALFORMED_DOCUMENT, QueryNotFoundError
from txmq.protocol.message import POS_PHYSICAL_OFFSET, POS_STORE_TIMESTAMP
from txmq.protocol.topics import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC

from ..store import GetMessageStatus, atomic_write
from ..store.fileio import checked_json, dumps_with_checksum, set_aside_quietly
from . import snapshot
from .machine import TransactionStateMachine

if TYPE_CHECKING:
    from ..context import Background
    from ..store import MessageStore

log = structlog.get_logger(__name__)

CHECK_STATE_VERSION = 1
_I64 = struct.Struct(">q")


class CheckStateError(ValueError):
    """A check-state index that cannot be read (it is then ignored)."""


def parse_check_state(data: bytes) -> list[tuple[str, int, int]]:
    """``(txid, checkTimes, lastCheckMs)`` of each entry of a check-state index.

    Raises:
        CheckStateError: the bytes are not such an index.
    """
    try:
        doc, _ = checked_json(data, "the check-state index")
        checks = doc.get("checks") or {}
        return [(str(txid), int(times), int(last)) for txid, (times, last) in checks.items()]
    except MALFORMED_DOCUMENT as exc:
        raise CheckStateError(f"unreadable check-state index: {exc!r}") from None


@dataclass(eq=False)
class TransactionPersistence:
    """Writes and reads the check-state index and the snapshot of one broker's table."""

    machine: TransactionStateMachine
    _: KW_ONLY
    store_root: InitVar[str]
    store: MessageStore
    flush_now: Callable[[], Awaitable[int]]
    in_background: Background
    now_ms: Callable[[], int]
    #: the check counts changed since the index was last written
    check_state_dirty: bool = field(default=False, init=False)
    #: broker time of the last snapshot taken (0: none yet)
    last_snapshot_ms: int = field(default=0, init=False)

    def __post_init__(self, store_root: str) -> None:
        self.check_state_path = os.path.join(store_root, "transaction", "checkState.json")
        self.snapshot_path = snapshot_path_of(store_root)

    def mark_check_state_dirty(self) -> None:
        self.check_state_dirty = True

    # -- check state --------------------------------------------------------------------------

    async def persist_check_state(self) -> None:
        """Write the check-state index if it changed: the snapshot is taken here, the write runs
        on the broker's metadata thread."""
        if not self.check_state_dirty:
            return
        self.check_state_dirty = False
        doc = {"version": CHECK_STATE_VERSION, "checks": self.machine.check_counts()}
        path, data = self.check_state_path, dumps_with_checksum(doc)

        def write() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, data)

        try:
            await self.in_background(write)
        except BaseException:
            self.check_state_dirty = True
            raise

    def load_check_state(self) -> None:
        """Give the machine's transactions the check counts the index holds (at start)."""
        try:
            with open(self.check_state_path, "rb") as fh:
                rows = parse_check_state(fh.read())
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("check_state_unreadable", path=self.check_state_path, error=repr(exc))
            return
        except CheckStateError as exc:
            log.warning(
                "check_state_damaged",
                file=self.check_state_path,
                set_aside=set_aside_quietly(self.check_state_path),
                error=str(exc),
                action="the check counts of pending transactions start again from zero",
            )
            return
        for txid, times, last in rows:
            self.machine.restore_check(txid, times, last)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot_due(self, interval_ms: int) -> bool:
        return self.now_ms() - self.last_snapshot_ms >= interval_ms

    async def write_snapshot(self) -> None:
        """Snapshot the table (see :mod:`.snapshot`): taken here, written on the metadata
        thread once the commit log is flushed past what it covers."""
        store = self.store
        clog = store.max_phy_offset
        half_from = store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)
        op_from = store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0)
        tip = self._tip(half_from, op_from)
        snap = snapshot.take(self.machine, clog, half_from, op_from, tip)
        self.last_snapshot_ms = self.now_ms()
        if await self.flush_now() < clog:
            log.warning("transaction_snapshot_skipped", reason="commit log not flushed")
            return
        path = self.snapshot_path

        def write() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, snapshot.encode(snap))

        await self.in_background(write)
        log.debug("transaction_snapshot_written", records=len(snap.records), clog_offset=clog)

    def _tip(self, half_from: int, op_from: int) -> tuple[int, int, int, int] | None:
        """The newest half or op record before queue offsets ``half_from`` / ``op_from``, as
        :attr:`.snapshot.Snapshot.tip` (None: neither queue holds one)."""
        tips = []
        for topic, end in (
            (RMQ_SYS_TRANS_HALF_TOPIC, half_from),
            (RMQ_SYS_TRANS_OP_HALF_TOPIC, op_from),
        ):
            if end <= 0:
                continue
            r = self.store.get_messages(topic, 0, end - 1, 1)
            if r.status is GetMessageStatus.FOUND and r.messages:
                tips.append(record_tip(r.messages[0]))
        return max(tips, default=None)

    def _holds(self, tip: tuple[int, int, int, int]) -> str | None:
        """Why the commit log does not hold the record ``tip`` names; None when it does."""
        try:
            payload = self.store.read_message_bytes(tip[0])
        except QueryNotFoundError:
            return f"no record starts at commit-log offset {tip[0]} any more"
        found = record_tip(payload)
        if found != tip:
            return f"the record at commit-log offset {tip[0]} is another one now"
        return None

    def load_snapshot(self) -> tuple[int | None, int | None]:
        """Restore the last snapshot into the (empty) machine if it is usable; the half and op
        queue offsets to replay from, (None, None) without one."""
        try:
            with open(self.snapshot_path, "rb") as fh:
                snap = snapshot.decode(fh.read())
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            log.warning("transaction_snapshot_ignored", path=self.snapshot_path, error=str(exc))
            return None, None
        except snapshot.SnapshotError as exc:
            self._set_aside(exc)
            return None, None
        if snap.clog_offset > self.store.max_phy_offset:
            # Set aside, not just ignored: once the log grows past it again (with other
            # records) a snapshot without a tip could not tell.
            self._set_aside_stale(
                "it covers more than the recovered commit log",
                snapshot_offset=snap.clog_offset,
                commit_log_offset=self.store.max_phy_offset,
            )
            return None, None
        if snap.tip is not None:
            why = self._holds(snap.tip)
            if why is not None:
                self._set_aside_stale(
                    f"it was taken from another commit log: {why}",
                    snapshot_offset=snap.clog_offset,
                    tip_offset=snap.tip[0],
                )
                return None, None
        try:
            snapshot.restore(self.machine, snap)
        except snapshot.SnapshotError as exc:
            self._set_aside(exc)
            return None, None
        return snap.half_from, snap.op_from

    def _set_aside_stale(self, reason: str, **where: int) -> None:
        """A snapshot of another commit log (cut back since) is renamed, never read again, and
        the table rebuilt from the half and op queues in full."""
        log.warning(
            "transaction_snapshot_stale",
            path=self.snapshot_path,
            set_aside_as=set_aside(self.snapshot_path),
            reason=reason,
            action="rebuilding the transaction table from the half and op queues",
            **where,
        )

    def _set_aside(self, exc: Exception) -> None:
        """A damaged snapshot is renamed (kept for an operator, never read again) and the
        table rebuilt from the half and op queues in full."""
        log.warning(
            "transaction_snapshot_damaged",
            path=self.snapshot_path,
            set_aside_as=set_aside(self.snapshot_path, ".damaged"),
            error=str(exc),
            action="rebuilding the transaction table from the half and op queues",
        )


def record_tip(payload: bytes) -> tuple[int, int, int, int]:
    """``(commit-log offset, size, CRC, store timestamp)`` of a stored message's payload: what
    identifies its record (the CRC is the one its record header holds)."""
    return (
        _I64.unpack_from(payload, POS_PHYSICAL_OFFSET)[0],
        len(payload),
        zlib.crc32(payload),
        _I64.unpack_from(payload, POS_STORE_TIMESTAMP)[0],
    )


def set_aside(snapshot_path: str, suffix: str = ".stale") -> str:
    """Rename a snapshot so it is never read again; the new name (or why it could not be)."""
    aside = f"{snapshot_path}{suffix}"
    try:
        os.replace(snapshot_path, aside)
    except FileNotFoundError:
        return "(no snapshot)"
    except OSError as err:
        return f"(could not be renamed: {err})"
    return aside


def snapshot_path_of(store_root: str) -> str:
    return os.path.join(store_root, "transaction", "snapshot.msgpack")


def set_aside_snapshot_past(store_root: str, offset: int) -> bool:
    """After the commit log of the store at ``store_root`` was cut back to ``offset``: set its
    transaction snapshot aside if the snapshot covers records past the cut (they are gone, and
    the log will grow again with others).  Reads only the head of the file.  True if it did."""
    path = snapshot_path_of(store_root)
    try:
        clog = snapshot.peek_clog(path)
    except FileNotFoundError:
        return False
    except (OSError, snapshot.SnapshotError) as exc:
        clog, why = None, str(exc)
    else:
        why = f"it covers the commit log up to {clog}, the log was cut back to {offset}"
    if clog is not None and clog <= offset:
        return False
    log.warning(
        "transaction_snapshot_stale",
        path=path,
        set_aside_as=set_aside(path),
        reason=why,
        action="the next start rebuilds the transaction table from the half and op queues",
    )
    return True
