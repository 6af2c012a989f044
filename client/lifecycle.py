"""The start and stop of the async clients (producer, push and pull consumer, transaction
producer): start once, shut down once, ``async with``; and the connection of those that hold
one."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from .callbacks import ConnectionState, ConnectionStateCallback, call_hook
from .config import DEFAULT_BROKER, ClientConfig
from .errors import ClientStateError

if TYPE_CHECKING:
    from .remoting import BrokerConnection


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


class ConnectedClient(AsyncClient):
    """An async client with a broker connection of its own, made by :meth:`_start` and
    dropped by :meth:`_shutdown`.

    Args:
        group: the client's group (producer or consumer group).
        broker: ``"host:port"`` of the broker.
        config: client settings; ``settings`` override single fields of it.
        on_connection_state: ``callback(address, state)`` when the client's connection to a
            broker is made (:attr:`ConnectionState.CONNECTED`), lost (``LOST``) or made again
            (``RECONNECTED``); see :mod:`txmq.client.callbacks`.
    """

    _conn: BrokerConnection | None = None

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        config: ClientConfig | None = None,
        on_connection_state: ConnectionStateCallback | None = None,
        **settings: Any,
    ) -> None:
        if not group or not isinstance(group, str):
            raise ValueError(f"a {self._kind} needs a non-empty group name")
        super().__init__()
        self.group = group
        self.broker = broker
        self.config = (config or ClientConfig()).replace(**settings)
        self._conn = None
        self._on_connection_state = on_connection_state
        self._setup()

    async def start(self) -> None:
        """Connect to the broker; see the subclass's :meth:`_start`.

        Raises:
            ClientStateError: the client was shut down already.
        """
        was_started = self._started
        await super().start()
        hook = self._on_connection_state
        if hook is not None and not was_started and self._conn is not None:
            self._conn.on_connection_state(hook)
            call_hook(hook, self._conn.address, ConnectionState.CONNECTED)

    def _setup(self) -> None:
        """Make the state a subclass keeps besides the connection (the last step of
        ``__init__``, so that a subclass with the same arguments needs no ``__init__``)."""

    @property
    def connection(self) -> BrokerConnection:
        """The broker connection (for extensions, e.g. transactional check processors).

        Raises:
            ClientStateError: the client is not started.
        """
        if self._conn is None:
            raise ClientStateError(
                f"{self._kind} {self.group!r} is not started; call start() or use 'async with'"
            )
        return self._conn


__all__ = ["AsyncClient", "ConnectedClient"]
