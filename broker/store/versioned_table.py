"""A table kept whole in one JSON file of RocketMQ's config shape (``{table_key: {...},
"dataVersion": {...}}``): read once at start, written atomically when it changed."""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Generic, TypeVar

from .fileio import read_versioned_json, write_versioned_json

V = TypeVar("V")


class VersionedJsonTable(Generic[V]):
    """The table, its version counter and whether a change is not written yet.

    Thread-safe: ``_lock`` guards the table; :meth:`persist` may run on another thread than the
    one changing it.  A subclass names the file's table (:attr:`what`, :attr:`table_key`) and
    converts it (:meth:`_from_json`, :meth:`_snapshot`).

    Args:
        path: the file (its folder is created on first write).
    """

    #: What the table holds, for error messages.
    what: ClassVar[str]
    #: The key of the table in the file.
    table_key: ClassVar[str]

    def __init__(self, path: str) -> None:
        self.path = path
        self._table: dict[str, V] = {}
        self._counter = 0
        self._dirty = False
        self._lock = threading.Lock()
        self._persist_lock = threading.Lock()

    @staticmethod
    def _from_json(doc: Any) -> dict[str, V]:
        """The table read from the file's JSON."""
        raise NotImplementedError

    def _snapshot(self) -> tuple[Any, int]:
        """The table as JSON and the version to write; called under ``_lock``."""
        raise NotImplementedError

    def load(self) -> None:
        """Read the file if there is one.

        Raises:
            StoreCorruptError: the file exists but cannot be read as such a table.
        """
        loaded = read_versioned_json(self.path, self.what, self.table_key, self._from_json)
        if loaded is None:
            return
        with self._lock:
            self._table, self._counter = loaded
            self._dirty = False

    def persist(self) -> bool:
        """Write the table if it changed since the last write; True if it wrote.

        Raises:
            OSError: the write failed; the file keeps its previous content and the table stays
                dirty, so the next call tries again.
        """
        with self._persist_lock:
            with self._lock:
                if not self._dirty:
                    return False
                self._dirty = False
                table, counter = self._snapshot()
            try:
                write_versioned_json(self.path, self.table_key, table, counter)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise
            return True


__all__ = ["VersionedJsonTable"]
