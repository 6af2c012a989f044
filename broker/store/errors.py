"""Errors the store raises besides the protocol's response-code errors.

Everything derives from :class:`~txmq.protocol.errors.TxmqError`, so the broker turns whatever
escapes the store into a response (SYSTEM_ERROR unless the class says otherwise).
"""

from __future__ import annotations

from txmq.protocol.errors import BrokerSystemError, TxmqError

# The "unused-ignore" codes below: ``mypy broker/store`` run from the repository root cannot
# resolve ``txmq.protocol`` (it is installed through an editable-install import hook), sees
# ``Any`` and refuses to subclass it; where the import resolves the ignores are unused.


class StoreLockedError(TxmqError):  # type: ignore[misc, unused-ignore]
    """Another process (or another MessageStore in this process) has the store directory
    open."""


class StoreCorruptError(TxmqError):  # type: ignore[misc, unused-ignore]
    """A file the store cannot do without (a config table, the checkpoint's format) is
    unreadable; the message names the file."""


class StoreIOError(BrokerSystemError, OSError):  # type: ignore[misc, unused-ignore]
    """Writing to the commit log failed (disk full, I/O error).  Nothing of the failed append
    is visible; the store stays usable once the cause is gone."""

    @classmethod
    def wrapping(cls, message: str, cause: BaseException) -> StoreIOError:
        """The error for a write that failed with ``cause``: its errno (what the disk-full
        refusal reads) and its ``__cause__`` set here, not left to ``raise ... from``, which
        code compiled by mypyc does not always honour."""
        err = cls(message)
        if isinstance(cause, OSError):
            err.errno = cause.errno
        err.__cause__ = cause
        return err
