"""Committed consumer offsets (RocketMQ's ``ConsumerOffsetManager``), persisted as JSON.

File: ``<root>/config/consumerOffset.json``, RocketMQ's shape (``topic@group`` keys; RocketMQ
writes queue ids as bare numbers, JSON needs strings)::

    {"offsetTable": {"TopicA@billing": {"0": 17, "1": 4}},
     "dataVersion": {"timestamp": 1700000000000, "counter": 12}}

Commits only change memory; :meth:`ConsumerOffsetManager.persist` writes the file (atomically)
when something changed.  The broker calls it every ``flushConsumerOffsetInterval`` and on
shutdown, so a crash can lose the last few seconds of commits: consumers then see those
messages again, which at-least-once delivery allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .versioned_table import VersionedJsonTable

TOPIC_GROUP_SEPARATOR = "@"
#: The entry recording how far the committed transactional offsets records (queue 0 of the
#: topic named by the key) have been applied to this table; kept in the same file, so it is
#: written together with the offsets it accounts for.
TXN_APPLIED_GROUP = "TXMQ_SYS_TXN_OFFSETS_APPLIED"


class ConsumerOffsetManager(VersionedJsonTable[dict[int, int]]):
    """Offsets per (group, topic, queue).  Thread-safe: the loop thread commits and queries,
    :meth:`persist` may run on a worker thread.

    Args:
        path: ``<root>/config/consumerOffset.json`` (its folder is created on first write).
    """

    what = "consumer offsets"
    table_key = "offsetTable"

    @staticmethod
    def _key(group: str, topic: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    @staticmethod
    def _from_json(doc: Any) -> dict[str, dict[int, int]]:
        return {
            str(key): {int(qid): int(off) for qid, off in queues.items()}
            for key, queues in doc.items()
        }

    def _snapshot(self) -> tuple[Any, int]:
        self._counter += 1  # every write is a new version
        snapshot = {
            key: {str(q): o for q, o in sorted(queues.items())}
            for key, queues in sorted(self._table.items())
        }
        return snapshot, self._counter

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``offset`` as the next offset ``group`` will consume from the queue."""
        with self._lock:
            queues = self._table.setdefault(self._key(group, topic), {})
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for the queue."""
        with self._lock:
            return self._table.get(self._key(group, topic), {}).get(queue_id, -1)

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets of ``group`` on ``topic`` by queue id (a copy)."""
        with self._lock:
            return dict(self._table.get(self._key(group, topic), {}))

    def groups(self) -> list[str]:
        """Groups that committed anything, sorted."""
        with self._lock:
            keys = list(self._table)
        return sorted(
            {k.split(TOPIC_GROUP_SEPARATOR, 1)[1] for k in keys if TOPIC_GROUP_SEPARATOR in k}
            - {TXN_APPLIED_GROUP}
        )

    def highest(self) -> dict[tuple[str, int], int]:
        """Per (topic, queue id), the highest offset any group committed (the transactional
        offsets' own bookkeeping left out)."""
        out: dict[tuple[str, int], int] = {}
        with self._lock:
            for key, queues in self._table.items():
                topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
                if group == TXN_APPLIED_GROUP:
                    continue
                for qid, off in queues.items():
                    if off > out.get((topic, qid), -1):
                        out[(topic, qid)] = off
        return out

    def topics_of(self, group: str) -> list[str]:
        """Topics ``group`` committed offsets for, sorted."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            return sorted(k[: -len(suffix)] for k in self._table if k.endswith(suffix))

    def remove_group(self, group: str) -> bool:
        """Forget all offsets of ``group``; True if it had any."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        return bool(self._remove(lambda k: k.endswith(suffix)))

    def remove_topic(self, topic: str) -> list[str]:
        """Forget every group's offsets on ``topic``; the groups that had some, sorted."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return sorted(k[len(prefix) :] for k in self._remove(lambda k: k.startswith(prefix)))

    def _remove(self, which: Callable[[str], bool]) -> list[str]:
        """Drop the ``topic@group`` entries ``which`` selects; their keys."""
        with self._lock:
            keys = [k for k in self._table if which(k)]
            for k in keys:
                del self._table[k]
            if keys:
                self._dirty = True
        return keys

    def txn_applied(self, topic: str) -> int:
        """The queue offset (queue 0 of ``topic``) up to which committed transactional offsets
        records were applied; 0 when none was."""
        return max(self.query(TXN_APPLIED_GROUP, topic, 0), 0)

    def apply_txn(
        self, group: str, offsets: list[tuple[str, int, int]], topic: str, upto: int
    ) -> None:
        """Apply the offsets of one committed transaction (``(topic, queue id, offset)``) and
        record that the records of ``topic`` before queue offset ``upto`` are applied, in one
        step: a concurrent :meth:`persist` writes both or neither."""
        with self._lock:
            for t, qid, off in offsets:
                queues = self._table.setdefault(self._key(group, t), {})
                queues[qid] = off
            self._table.setdefault(self._key(TXN_APPLIED_GROUP, topic), {})[0] = upto
            self._dirty = True
