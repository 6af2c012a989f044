"""Where a broadcasting consumer keeps its offsets: a file of its own (RocketMQ's
``LocalFileOffsetStore``), since every member reads every queue and the broker keeps one
offset per group and queue.

The file is JSON, ``{"group": ..., "offsets": {"<topic>@<broker group>@<queue id>": offset}}``,
written whole to a temporary file, fsynced and renamed over the old one, then written the same
way to ``<path>.bak``: the file is never missing, and when it is damaged the backup is used (a
file that cannot be read is reported with its path).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from txmq.protocol.errors import TxmqError

from .logs import get_logger
from .route import MessageQueue

log = get_logger(__name__)


class OffsetStoreError(TxmqError):
    """The local offset file cannot be read or written; the message names it."""


def default_offset_path(group: str) -> Path:
    """``~/.txmq/offsets/<group>@<host>.json``: one file per group and host.  Several members
    of one broadcasting group on the same host need a path each (``offset_store_path``)."""
    return Path.home() / ".txmq" / "offsets" / f"{group}@{socket.gethostname()}.json"


def _key(mq: MessageQueue) -> str:
    return f"{mq.topic}@{mq.broker}@{mq.queue_id}"


class LocalOffsetStore:
    """The offsets of one broadcasting consumer, in memory and in its file."""

    def __init__(self, path: str | os.PathLike[str], group: str) -> None:
        self.path = Path(path)
        self.group = group
        self._offsets: dict[str, int] = {}
        self._written: dict[str, int] = {}

    def load(self) -> None:
        """Read the file (or its backup when the file is damaged); no file: start empty.

        Raises:
            OffsetStoreError: neither the file nor its backup can be read.
        """
        errors = []
        for candidate in (self.path, self.path.with_name(self.path.name + ".bak")):
            try:
                doc = json.loads(candidate.read_text(encoding="utf-8"))
                offsets = {str(k): int(v) for k, v in dict(doc["offsets"]).items()}
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as exc:
                errors.append(f"{candidate}: {exc}")
                log.warning("offset_file_unreadable", path=str(candidate), error=str(exc))
                continue
            self._offsets = dict(offsets)
            self._written = dict(offsets)
            if errors:
                log.warning("offset_file_backup_used", path=str(candidate))
            return
        if errors:
            raise OffsetStoreError(
                "the broadcasting consumer's offset file cannot be read: " + "; ".join(errors)
            )

    def read(self, mq: MessageQueue) -> int | None:
        return self._offsets.get(_key(mq))

    def update(self, mq: MessageQueue, offset: int) -> None:
        self._offsets[_key(mq)] = offset

    def persist(self) -> None:
        """Write the offsets if they changed since the last write (atomically, durably).

        Raises:
            OffsetStoreError: the file cannot be written (the offsets stay in memory and are
                written by a later call).
        """
        if self._offsets == self._written:
            return
        snapshot = dict(self._offsets)
        doc = json.dumps({"group": self.group, "offsets": snapshot}, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for target in (self.path, self.path.with_name(self.path.name + ".bak")):
                _write_atomically(target, doc)
        except OSError as exc:
            raise OffsetStoreError(f"cannot write the offset file {self.path}: {exc}") from exc
        self._written = snapshot


def _write_atomically(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file, fsynced, renamed over it, the folder
    fsynced: ``path`` holds the old or the new text, whole, whenever it is read."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
