"""The start and stop of the async clients (producer, push and pull consumer, transaction
producer): start once, shut down once, ``async with``."""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar, Self

from .errors import ClientStateError


class AsyncClient:
    """The lifecycle the async clients share.

    :meth:`start` connects once (a second call does nothing) and refuses a client that was shut
    down; :meth:`shutdown` is idempotent and does nothing for a client that never started;
    ``async with client:`` starts it and shuts it down.  A subclass does its own work in
    :meth:`_start` and :meth:`_shutdown`, sets :attr:`_kind` (how errors name it) and has a
    ``group``.
    """

    #: How error messages name the client ("producer", "consumer", ...).
    _kind: ClassVar[str] = "client"
    group: str

    def __init__(self) -> None:
        #: :meth:`_start` completed and :meth:`shutdown` has not run since.
        self._started = False
        #: :meth:`shutdown` was called: the client cannot start again.
        self._closed = False

    async def start(self) -> None:
        """Connect to the broker; see the subclass's :meth:`_start`.

        Raises:
            ClientStateError: the client was shut down already.
        """
        if self._closed:
            raise ClientStateError(f"{self._kind} {self.group!r} was shut down; make a new one")
        if self._started:
            return
        await self._start()
        self._started = True

    async def shutdown(self) -> None:
        """Close cleanly; see the subclass's :meth:`_shutdown`.  Idempotent."""
        self._closed = True
        if not self._started:
            return
        self._started = False
        await self._shutdown()

    def _not_started(self) -> ClientStateError:
        """The error of a call that needs a started client."""
        return ClientStateError(
            f"{self._kind} {self.group!r} is not started; call start() or use 'async with'"
        )

    async def _start(self) -> None:
        raise NotImplementedError

    async def _shutdown(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()


__all__ = ["AsyncClient"]
