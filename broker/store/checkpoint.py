"""The store checkpoint (RocketMQ's ``StoreCheckpoint``): how far the consume queues are known
to be on disk.

File: ``<root>/checkpoint``, a JSON document replaced atomically (temp file, fsync, rename,
fsync of the directory), so it is either the old or the new one, never torn::

    {
      "formatVersion": 1,          # FORMAT_VERSION of the store files
      "logicOffset": 123456,       # commit-log offset L: every message record below L has its
                                   # consume-queue entry fsynced, and the commit log itself is
                                   # fsynced up to at least L
      "physicOffset": 123456,      # commit-log flushed offset when the checkpoint was written
      "timestamp": 1700000000000,  # ms, when it was written
      "queues": {"TopicA": {"0": 17, "1": 4}},  # each queue's max offset at L
      "txmqCrc32": 305419896       # CRC-32 of the rest, canonical (fileio.checked_json)
    }

A checkpoint that does not read, or whose checksum does not match, is set aside
(``checkpoint.damaged-<time>``) with a WARNING naming it, and the store rebuilds the consume
queues from the whole commit log, as without a checkpoint.  One without ``txmqCrc32`` was written
before checksums: it is read as before (the next one written has it).

Write order (``MessageStore.flush_consume_queues``): copy L and the queue table under the store
lock, fsync the consume-queue files and directories, fsync the commit log, *then* write this
file.  So after a crash: the recovery scan starts at L, and a queue holding fewer entries than
its ``queues`` value lost files (someone deleted or truncated them) and is rebuilt from further
back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import structlog

from txmq.protocol.errors import MALFORMED_DOCUMENT

from .commit_log import FORMAT_VERSION
from .errors import StoreCorruptError
from .fileio import (
    atomic_write,
    checked_json,
    dumps_with_checksum,
    read_after_interrupted_writes,
    set_aside_quietly,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StoreCheckpoint:
    """One checkpoint.

    Attributes:
        logic_offset: commit-log offset below which all consume-queue entries are durable.
        physic_offset: commit-log flushed offset at the time of writing.
        timestamp_ms: wall-clock time of writing.
        queues: max offset of every queue at ``logic_offset``.
    """

    logic_offset: int
    physic_offset: int
    timestamp_ms: int
    queues: dict[tuple[str, int], int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        table: dict[str, dict[str, int]] = {}
        for (topic, qid), max_offset in sorted(self.queues.items()):
            table.setdefault(topic, {})[str(qid)] = max_offset
        doc = {
            "formatVersion": FORMAT_VERSION,
            "logicOffset": self.logic_offset,
            "physicOffset": self.physic_offset,
            "timestamp": self.timestamp_ms,
            "queues": table,
        }
        return dumps_with_checksum(doc, separators=(",", ":"))

    def write(self, path: str) -> None:
        atomic_write(path, self.to_bytes())

    @classmethod
    def read(cls, path: str) -> StoreCheckpoint | None:
        """The checkpoint at ``path``; None when it is missing or damaged (unreadable, or its
        checksum does not match: it is then set aside), so the store re-dispatches the whole
        commit log.

        Raises:
            StoreCorruptError: the file is from a different store format version.
        """
        raw = read_after_interrupted_writes(path)
        if raw is None:
            return None
        try:
            doc: Any
            doc, _ = checked_json(raw, path)
            version = int(doc["formatVersion"])
            queues: dict[tuple[str, int], int] = {}
            for topic, qs in doc.get("queues", {}).items():
                for qid, max_offset in qs.items():
                    queues[(str(topic), int(qid))] = int(max_offset)
            cp = cls(
                int(doc["logicOffset"]), int(doc["physicOffset"]), int(doc["timestamp"]), queues
            )
        except MALFORMED_DOCUMENT as exc:
            log.warning(
                "checkpoint_damaged",
                file=path,
                set_aside=set_aside_quietly(path),
                error=str(exc),
                action="rebuilding the consume queues from the whole commit log",
            )
            return None
        if version != FORMAT_VERSION:
            raise StoreCorruptError(
                f"{os.path.abspath(path)} was written by store format version {version}; "
                f"this broker reads version {FORMAT_VERSION}"
            )
        return cp
