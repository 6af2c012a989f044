"""Queue locks of orderly consumers (RocketMQ's ``RebalanceLockManager``).

An orderly consumer locks each queue it is assigned before consuming it, and renews its locks
periodically: one lock per (consumer group, topic, broker, queue id), held by one client id.
A lock not renewed for :data:`LOCK_MAX_LIVE_S` has expired and goes to whoever asks next; a
lock held by another client and not expired is refused.  Unlocking frees only the caller's
locks.  A lock also ends with the connection it was last taken or renewed on (the client went
away or was scanned out for missing heartbeats), so its queues move to the rest of the group at
once instead of after the expiry.

Time comes from the broker's clock seam, so expiry is tested without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from txmq.protocol.locks import QueueRef

log = structlog.get_logger(__name__)

#: How long a lock lives without a renewal (``rocketmq.broker.rebalance.lockMaxLiveTime``).
LOCK_MAX_LIVE_S = 60.0


@dataclass(slots=True)
class LockEntry:
    client_id: str
    #: Clock time of the last grant or renewal.
    renewed: float
    #: The connection the lock was last granted or renewed on (None: not tied to one).
    conn: Any = None


class QueueLockTable:
    """Who holds which queue of which group.

    Args:
        clock: wall clock in seconds (the broker's clock seam).
        max_live_s: how long a lock lives without a renewal.
    """

    def __init__(self, clock: Callable[[], float], max_live_s: float = LOCK_MAX_LIVE_S) -> None:
        self._clock = clock
        self.max_live_s = max_live_s
        self._table: dict[str, dict[QueueRef, LockEntry]] = {}

    def _expired(self, entry: LockEntry, now: float) -> bool:
        return now - entry.renewed > self.max_live_s

    def try_lock_batch(
        self, group: str, mqs: Iterable[QueueRef], client_id: str, conn: Any = None
    ) -> set[QueueRef]:
        """Lock (or renew) ``mqs`` for ``client_id``; returns those it holds now."""
        now = self._clock()
        locks = self._table.setdefault(group, {})
        granted: set[QueueRef] = set()
        for mq in mqs:
            entry = locks.get(mq)
            if entry is None:
                locks[mq] = LockEntry(client_id, now, conn)
                log.info("queue_locked", group=group, queue=mq, client_id=client_id)
            elif entry.client_id == client_id:
                entry.renewed = now
                entry.conn = conn
            elif self._expired(entry, now):
                log.warning(
                    "queue_lock_taken_over",
                    group=group,
                    queue=mq,
                    old_client_id=entry.client_id,
                    client_id=client_id,
                )
                locks[mq] = LockEntry(client_id, now, conn)
            else:
                continue
            granted.add(mq)
        return granted

    def unlock_batch(self, group: str, mqs: Iterable[QueueRef], client_id: str) -> set[QueueRef]:
        """Free those of ``mqs`` that ``client_id`` holds; returns them."""
        locks = self._table.get(group)
        freed: set[QueueRef] = set()
        if not locks:
            return freed
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
                freed.add(mq)
        if freed:
            log.info("queues_unlocked", group=group, queues=sorted(freed), client_id=client_id)
        if not locks:
            del self._table[group]
        return freed

    def connection_closed(self, conn: Any) -> int:
        """Free every lock last taken or renewed on ``conn``; returns how many."""
        freed = 0
        for group in list(self._table):
            locks = self._table[group]
            gone = [mq for mq, e in locks.items() if e.conn is conn]
            for mq in gone:
                log.info(
                    "queue_lock_released_with_connection",
                    group=group,
                    queue=mq,
                    client_id=locks[mq].client_id,
                )
                del locks[mq]
            freed += len(gone)
            if not locks:
                del self._table[group]
        return freed

    def holder(self, group: str, mq: QueueRef) -> str | None:
        """The client id holding a live lock on ``mq`` for ``group``, or None."""
        entry = self._table.get(group, {}).get(mq)
        if entry is None or self._expired(entry, self._clock()):
            return None
        return entry.client_id

    def held(self) -> int:
        """How many lock entries the table keeps (expired ones included)."""
        return sum(len(v) for v in self._table.values())
