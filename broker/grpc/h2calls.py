"""The calls of the native gRPC transport (:mod:`.h2`): what a method is, the state of one
HTTP/2 stream carrying a call, the request stream of a bidirectional call, and the context its
handler gets (what :class:`~.service.MessagingService` uses of grpc's ``ServicerContext``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

# gRPC status codes (grpc.StatusCode values)
OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED = 0, 1, 2, 4
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14


class AbortError(Exception):
    """Raised by :meth:`CallContext.abort`: the call ends with the status set on its context."""


class StreamClosed(Exception):
    """The stream of a call is gone (reset by the peer, or its connection closed)."""


UNARY, SERVER_STREAMING, BIDI = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: how to parse its request, the handler, and its kind."""

    kind: int
    deserialize: Callable[[bytes], Any]
    handler: Callable[..., Any]


# -- calls --------------------------------------------------------------------------------------


class RequestStream:
    """The request messages of a bidirectional call, as an async iterator."""

    __slots__ = ("_items", "_waiter", "_ended", "_deserialize")

    def __init__(self, deserialize: Callable[[bytes], Any]) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._deserialize = deserialize

    def __len__(self) -> int:
        return len(self._items)

    def put(self, payload: bytes) -> None:
        self._items.append(self._deserialize(payload))
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class Stream:
    """One HTTP/2 stream carrying one call."""

    __slots__ = (
        "id",
        "method",
        "context",
        "buf",
        "remote_ended",
        "ended",
        "headers_sent",
        "window",
        "pending",
        "pending_trailers",
        "drained",
        "task",
        "requests",
        "unacked",
        "deadline",
        "timer",
        "encoding",
        "messages",
    )

    def __init__(self, sid: int, window: int) -> None:
        self.id = sid
        self.method: Method | None = None
        self.context: CallContext | None = None
        #: Bytes of the request message(s) not complete yet.
        self.buf = bytearray()
        self.remote_ended = False
        #: The response is over (trailers written or queued) or the stream was reset.
        self.ended = False
        self.headers_sent = False
        #: The peer's flow-control window of this stream (what may still be sent).
        self.window = window
        #: DATA waiting for window: the payloads (gRPC-framed) not sent yet.
        self.pending: deque[bytes] = deque()
        self.pending_trailers: bytes | None = None
        self.drained: asyncio.Future[None] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.requests: RequestStream | None = None
        #: Request bytes received and not given back to the peer's window yet.
        self.unacked = 0
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        #: The request's ``grpc-encoding`` (None: identity).
        self.encoding: bytes | None = None
        #: Request messages of a unary / server-streaming call (one expected).
        self.messages: list[bytes] = []


class Connection(Protocol):
    """What a call's context uses of its connection (:class:`.h2.H2Connection`)."""

    peer_name: str

    async def send_message(self, s: Stream, body: bytes) -> None: ...


class CallContext:
    """What :class:`~.service.MessagingService` uses of grpc's ``ServicerContext``."""

    __slots__ = ("_conn", "_stream", "_metadata", "code", "details")

    def __init__(
        self, conn: Connection, stream: Stream, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        self._conn = conn
        self._stream = stream
        self._metadata = metadata
        self.code = OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._conn.peer_name

    def time_remaining(self) -> float | None:
        d = self._stream.deadline
        if d is None:
            return None
        return max(0.0, d - asyncio.get_running_loop().time())

    async def abort(self, code: Any, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        """End the call with ``code`` (a ``grpc.StatusCode`` or its number) and ``details``."""
        self.code = code.value[0] if hasattr(code, "value") else int(code)
        self.details = details
        raise AbortError(details)

    def set_code(self, code: Any) -> None:
        self.code = code.value[0] if hasattr(code, "value") else int(code)

    def set_details(self, details: str) -> None:
        self.details = details

    async def write(self, message: Any) -> None:
        """Send one response message of a streaming call (waits for the peer's window)."""
        await self._conn.send_message(self._stream, message.SerializeToString())
