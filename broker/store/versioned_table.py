"""A table kept whole in one JSON file of RocketMQ's config shape (``{table_key: {...},
"dataVersion": {...}, "txmqCrc32": n}``): read once at start, written atomically when it changed,
the previous version kept as ``<file>.bak``.  ``txmqCrc32`` is the CRC-32 of the rest of the
document in canonical form (:func:`.fileio.checked_json`); a file without it (written before
checksums) is read as before and written with one at the next write.  A damaged file (not JSON,
not such a table, or a checksum that does not match) never stops a start: it is set aside
(``<file>.damaged-<time>``) and the table read from the backup, or started empty when that is
damaged too (both logged, naming the files)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import structlog

from .errors import StoreCorruptError
from .fileio import read_versioned_json, set_aside, write_versioned_json

log = structlog.get_logger(__name__)

V = TypeVar("V")


class JsonEntry(Protocol):
    """An entry of a :class:`ConfigJsonTable`: written as its JSON object."""

    def to_json(self) -> dict[str, Any]: ...


E = TypeVar("E", bound=JsonEntry)


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
        #: :meth:`load` found the file damaged (the table came from the backup, or is empty).
        self.damaged = False

    def _from_json(self, doc: Any) -> dict[str, V]:
        """The table read from the file's JSON."""
        raise NotImplementedError

    def _snapshot(self) -> tuple[Any, int]:
        """The table as JSON and the version to write; called under ``_lock``."""
        raise NotImplementedError

    def load(self) -> None:
        """Read the file if there is one; a damaged one is set aside and the table read from
        its backup (or started empty), then written again."""
        try:
            loaded = read_versioned_json(self.path, self.what, self.table_key, self._from_json)
        except StoreCorruptError as exc:
            loaded = self._from_backup(exc)
        if loaded is None:
            return
        with self._lock:
            self._table, self._counter, checked = loaded
            # a file without a checksum is written again with one
            self._dirty = self.damaged or not checked

    def _from_backup(self, exc: StoreCorruptError) -> tuple[dict[str, V], int, bool] | None:
        self.damaged = True
        aside = set_aside(self.path)
        backup = self.path + ".bak"
        try:
            loaded = read_versioned_json(backup, self.what, self.table_key, self._from_json)
        except StoreCorruptError as bak_exc:
            loaded, why = None, f"its backup is damaged too: {bak_exc}"
            os.replace(backup, aside + ".bak")
        else:
            why = "no backup" if loaded is None else ""
        if loaded is not None:
            log.warning(
                "table_read_from_backup",
                what=self.what,
                file=self.path,
                set_aside=aside,
                backup=backup,
                error=str(exc),
                hint="changes after the backup was written are lost",
            )
        else:
            log.error(
                "table_lost",
                what=self.what,
                file=self.path,
                set_aside=aside,
                error=str(exc),
                why=why,
                hint="starting with an empty table",
            )
            with self._lock:
                self._dirty = True
        return loaded

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


class ConfigJsonTable(VersionedJsonTable[E]):
    """A table of configs by name: each read from its JSON object with ``entry`` and written
    with its own ``to_json``; the version counts changes, not writes.

    Args:
        path: the file (its folder is created on first write).
        entry: a config from its JSON object.
    """

    def __init__(self, path: str, entry: Callable[[Any], E]) -> None:
        super().__init__(path)
        self._entry = entry

    def _from_json(self, doc: Any) -> dict[str, E]:
        return {name: self._entry(c) for name, c in doc.items()}

    def _snapshot(self) -> tuple[Any, int]:
        return {name: c.to_json() for name, c in sorted(self._table.items())}, self._counter

    def _put(self, name: str, config: E) -> None:
        """Add or replace the config of ``name`` (a change)."""
        with self._lock:
            self._table[name] = config
            self._changed()

    def _remove(self, name: str) -> bool:
        """Remove the config of ``name`` (a change); True if there was one."""
        with self._lock:
            if self._table.pop(name, None) is None:
                return False
            self._changed()
        return True

    def _changed(self) -> None:
        """Called under ``_lock`` on each change: a new version, not written yet."""
        self._counter += 1
        self._dirty = True


__all__ = ["ConfigJsonTable", "VersionedJsonTable"]
