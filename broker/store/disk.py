"""Whether the disk under the store takes writes: a read-only filesystem (mounted so, or gone
read-only under the store after an error), no space left, or fuller than
``diskRefuseWritesRatio``.  While it does not, every write is refused with the same retriable
SERVICE_NOT_AVAILABLE naming the cause, until a probe says writes fit again."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from typing import Any

import structlog

from txmq.protocol.errors import ServiceNotAvailableError

from .config import StoreConfig

log = structlog.get_logger(__name__)


def read_only_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is EROFS."""
    return disk_errno(exc) == errno.EROFS


#: The errors of a disk that takes no writes: read-only, no space, over quota.
_REFUSING_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def disk_errno(exc: BaseException) -> int | None:
    """The errno of ``exc`` (or of what caused it) when it says the disk takes no writes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _REFUSING_ERRNOS:
            return seen.errno
        seen = seen.__cause__
    return None


def used_percent(used: int, total: int) -> float:
    return used * 100.0 / total if total else 0.0


def allocated(seg: Any) -> int:
    """Bytes a segment's file takes on disk (what deleting it frees)."""
    try:
        return int(os.stat(seg.path).st_blocks) * 512
    except OSError:
        return 0


class DiskGuard:
    """The store's view of its disk (owner thread).

    Args:
        root: the store folder.
        config: the ratios and the policy (``diskRefuseWritesRatio``, ...).
        probe_write: writes a zero byte where the next commit-log append goes (raises OSError
            when the filesystem takes no writes).
    """

    def __init__(self, root: str, config: StoreConfig, probe_write: Callable[[], None]) -> None:
        self.root = root
        self.config = config
        self._probe_write = probe_write
        #: Why writes are refused now (the disk is full, the filesystem is read-only), None
        #: while they are accepted; :attr:`writes_refused_cause` names the reason
        #: (``disk_full``, ``read_only``).
        self.writes_refused: str | None = None
        self.writes_refused_cause: str | None = None
        #: A write or fsync failed with EROFS: the filesystem went read-only under the store
        #: (ext4's errors=remount-ro does that without statvfs saying so); cleared once a write
        #: probe succeeds again.
        self._read_only_seen = False
        #: a write failed with ENOSPC/EDQUOT: writes stay refused until a probe fits
        self._no_space_seen = False
        #: How the filesystem's flags are read (``os.statvfs``; a seam for tests).
        self.statvfs: Callable[[str], os.statvfs_result] = os.statvfs
        self._short_of_space_warned = False

    def warn_short_of_space(self, used: int, total: int) -> None:
        if not self._short_of_space_warned:
            self._short_of_space_warned = True
            log.warning(
                "disk_short_of_space",
                used_percent=round(used_percent(used, total), 1),
                disk_max_used_space_ratio=self.config.disk_max_used_space_ratio,
                policy=self.config.disk_full_policy,
                refuse_writes_at=self.config.disk_refuse_writes_ratio,
                hint="unread messages are kept: free space, add disk, or set "
                "diskFullPolicy=delete_oldest to let retention delete the oldest",
            )

    def note_read_only(self, exc: BaseException) -> None:
        """A write failed with EROFS: refuse writes now, saying why."""
        self._read_only_seen = True
        if self.writes_refused_cause != "read_only":
            self._refuse_read_only(str(exc))

    def refusal(self, exc: BaseException) -> ServiceNotAvailableError | None:
        """The answer to a write of any store file (the commit log, the consume queues, the
        topic table, offsets, subscription groups) that failed because the disk takes no
        writes: a read-only filesystem, or no space left (ENOSPC, EDQUOT) even before the
        sampled usage reached ``diskRefuseWritesRatio``.  Writes are turned off, saying why, and
        the same retriable SERVICE_NOT_AVAILABLE is returned for every such failure; None for
        any other error."""
        code = disk_errno(exc)
        if code is None:
            return None
        if code == errno.EROFS:
            self.note_read_only(exc)
        elif self.writes_refused_cause != "read_only":
            self._no_space_seen = True
            if self.writes_refused_cause != "disk_full":
                self.writes_refused = (
                    f"the disk holding the store ({self.root}) has no space left "
                    f"({errno.errorcode.get(code, code)}): writes are refused until space is freed"
                )
                self.writes_refused_cause = "disk_full"
                log.error("writes_refused", cause="no_space", store=self.root, error=str(exc))
        return ServiceNotAvailableError(self.writes_refused or str(exc))

    def _space_back(self) -> bool:
        """After a write failed for want of space: whether 1 MiB can be had again (a probe
        file, allocated, synced and removed)."""
        probe = os.path.join(self.root, ".space-probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, 1024 * 1024)
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError:
            return False
        self._no_space_seen = False
        return True

    def _refuse_read_only(self, detail: str) -> None:
        self.writes_refused = (
            f"the filesystem holding the store ({self.root}) is read-only: writes are refused "
            "until it is writable again"
        )
        self.writes_refused_cause = "read_only"
        log.error("writes_refused", cause="read_only", store=self.root, error=detail)

    def _read_only_now(self) -> str | None:
        """Why the store's filesystem takes no writes (mounted read-only, or a write probe
        fails with EROFS after a write did), None when it takes them."""
        try:
            if self.statvfs(self.root).f_flag & os.ST_RDONLY:
                return "mounted read-only"
        except OSError as exc:
            return str(exc)
        if not self._read_only_seen:
            return None
        # Probe: a file in the store folder, and a zero byte where the next append goes (it is
        # zeros there already, and the append overwrites it).
        probe = os.path.join(self.root, ".write-probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"\0")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe)
            self._probe_write()
        except OSError as exc:
            return str(exc)
        self._read_only_seen = False
        return None

    def check(self, freed: int = 0) -> str | None:
        """Look at the disk: a read-only filesystem, or past ``disk_refuse_writes_ratio``
        percent used, refuses writes (:attr:`writes_refused` says why,
        :attr:`writes_refused_cause` names the reason) until that is over.  Cheap enough to call
        every second; ``freed``: bytes just deleted whose files may still be open."""
        read_only = self._read_only_now()
        if read_only is not None:
            if self.writes_refused_cause != "read_only":
                self._refuse_read_only(read_only)
            return self.writes_refused
        if self.writes_refused_cause == "read_only":
            log.info("writes_accepted_again", cause="read_only", store=self.root)
            self.writes_refused = self.writes_refused_cause = None
        usage = shutil.disk_usage(self.root)
        used = used_percent(usage.used - freed, usage.total)
        limit = self.config.disk_refuse_writes_ratio
        was = self.writes_refused
        if self._no_space_seen and not self._space_back():
            return self.writes_refused  # a write found no byte left: refused until one fits
        if used >= limit:
            self.writes_refused = (
                f"the disk holding the store is {used:.0f}% full (diskRefuseWritesRatio {limit}%): "
                "writes are refused until space is freed"
            )
            self.writes_refused_cause = "disk_full"
            if was is None:
                log.warning("writes_refused", used_percent=round(used, 1), limit=limit)
        else:
            self.writes_refused = self.writes_refused_cause = None
            if was is not None:
                log.info("writes_accepted_again", used_percent=round(used, 1), limit=limit)
            if used <= self.config.disk_max_used_space_ratio:
                self._short_of_space_warned = False
        return self.writes_refused

    def used_ratio(self) -> float:
        # RocketMQ's measure: space in use over total (blocks reserved for root count as free).
        usage = shutil.disk_usage(self.root)
        return used_percent(usage.used, usage.total)
