"""The one asyncio adapter shared by broker and client.

A :class:`Connection` reads frames with :class:`~txmq.protocol.frame.FrameDecoder`, resolves
responses to the futures of their requests (by ``opaque``), and runs incoming requests through a
handler.  A handler runs at once, in the read that brought its request; one that has to wait
(a long-polling pull, a flush) goes on in a task of its own from there, so it never delays a
send on the same connection.  The answers of one read leave in one write at its end.  It serves
both directions: the broker also sends requests to clients (CHECK_TRANSACTION_STATE).
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import itertools
import socket
import ssl as _ssl
import struct
import termios
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

from .codes import ResponseCode, SerializeType
from .command import RemotingCommand
from .errors import (
    ConnectionClosedError,
    FrameTooLargeError,
    MalformedFrameError,
    ProtocolError,
    RequestTimeoutError,
    TxmqError,
)
from .frame import (
    DEFAULT_MAX_FRAME_SIZE,
    LARGE_BODY,
    FrameDecoder,
    encode_frame,
    encode_frame_head,
)

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]

_opaques = itertools.count(1)


def next_opaque() -> int:
    return next(_opaques) & 0x7FFFFFFF


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; True if it was set.

    Unlike ``asyncio.wait_for(event.wait(), timeout)`` on Python 3.11, a cancellation that
    arrives while the event is being set is never swallowed, so a ``while`` loop around it always
    stops when its task is cancelled.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()


#: ioctl asking a socket for the bytes in its send queue not yet acknowledged by the peer.
_OUTQ = getattr(termios, "TIOCOUTQ", None)


def socket_unacked(transport: asyncio.BaseTransport | None) -> int:
    """Bytes the kernel holds for the peer of ``transport``: written to the socket and not
    acknowledged yet (0 where the system cannot tell)."""
    if transport is None or _OUTQ is None:
        return 0
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        out = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", out)[0])


def _reset_on_close(transport: asyncio.BaseTransport) -> None:
    """Have closing the socket discard what the kernel still holds for the peer and reset the
    connection, rather than keep it until the peer reads it all."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (OSError, ValueError, AttributeError):
        pass


def _expire(fut: asyncio.Future[Any], code: int, peer: tuple[str, int], timeout: float) -> None:
    if not fut.done():
        fut.set_exception(
            RequestTimeoutError(
                f"no answer to request code {code} from {peer[0]}:{peer[1]} within {timeout:.3f}s"
            )
        )


class _Resumed:
    """Awaitable that goes on with a coroutine already started outside any task: it yields the
    future the coroutine is waiting on (so the task running it waits on that future) and then
    keeps driving the coroutine, passing a cancellation (or any exception thrown into the task)
    on to it; its result is the coroutine's."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, None, Any]:
        coro = self._coro
        waiting = self._waiting
        self._waiting = None
        while True:
            try:
                yield waiting
            except BaseException as exc:  # the task was cancelled (or something thrown in)
                try:
                    waiting = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                waiting = coro.send(None)
            except StopIteration as stop:
                return stop.value


async def _resume(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    await _Resumed(coro, waiting)


async def _reraise(exc: BaseException) -> None:
    raise exc


class AnswerTooLargeError(ProtocolError):
    """Reported (``on_protocol_error``), never raised: an answer would pass the frame limit
    the peer accepts and was replaced by an error answer naming the limit."""


#: The largest answer body a connection sends (RocketMQ's clients and txmq's refuse frames
#: above 16 MiB by default; a megabyte is left for the header).  A larger answer is replaced by
#: an error naming the limit.
ANSWER_BODY_LIMIT = DEFAULT_MAX_FRAME_SIZE - 1024 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A server's bounds on one connection.

    Attributes:
        max_write_buffer: bytes of answers the peer has not read yet past which it is dropped
            (0: no bound).  Reading its requests pauses long before, at the transport's high
            water mark, so a peer that stops reading stops being served.
        frame_timeout: seconds a frame may take from its first byte to its last (0: no bound).
        answer_window: bytes of answers not taken by the peer yet past which its next request
            waits for it to read them (0: no wait).  Requests already read are otherwise all
            answered at once, however many a peer that stopped reading pipelined.
        write_stall_timeout: seconds the peer may leave its answers untaken before it is
            dropped (0: never): while writing to it is paused (the transport's buffer above its
            high water mark), counted from the pause or from the last byte it acknowledged
            since; while not, from when :meth:`Connection.check_unread` first saw the kernel
            holding bytes for it that it then acknowledged none of.
        first_frame_timeout: seconds after the connection is made within which the peer must
            have sent a whole frame; it is dropped otherwise (0: never).
        on_dropped: told of every connection dropped: the connection and the :class:`Drop`.
    """

    max_write_buffer: int = 0
    frame_timeout: float = 0.0
    answer_window: int = 0
    write_stall_timeout: float = 0.0
    first_frame_timeout: float = 0.0
    on_dropped: Callable[[Connection, Drop], None] | None = None


#: Why a connection was dropped (the ``reason`` of :class:`Drop`).
SLOW_READER = "slow_reader"  # its answers stayed unread for write_stall_timeout
IDLE = "idle"  # no whole frame within first_frame_timeout of being accepted
WRITE_BUFFER = "write_buffer"  # more answers unread than max_write_buffer
PARTIAL_FRAME = "partial_frame"  # a frame not whole within frame_timeout (a slow-loris)


@dataclass(frozen=True, slots=True)
class Drop:
    """Why a server dropped a connection.

    Attributes:
        reason: one of :data:`SLOW_READER`, :data:`IDLE`, :data:`WRITE_BUFFER`,
            :data:`PARTIAL_FRAME` (a metric label).
        detail: the same in words, for the log.
        stalled_s: seconds the peer took nothing of its answers (slow readers), or had sent no
            whole frame (idle connections); None otherwise.
        pending_bytes: bytes of answers written and not taken by the peer when it was dropped
            (held by the broker, and by the kernel unacknowledged where it can tell).
    """

    reason: str
    detail: str
    stalled_s: float | None = None
    pending_bytes: int = 0


class Connection(asyncio.Protocol):
    """One TCP connection speaking remoting frames.

    Args:
        handler: coroutine run for every incoming *request*; its return value is the response
            (ignored for oneway requests).  A :class:`TxmqError` it raises becomes a response with
            the error's code and message; anything else becomes SYSTEM_ERROR.
        max_frame_size: frames announcing more are refused and the connection closed.
        on_close: called once with this connection when it closes.
        limits: a server's bounds on one connection (None: unbounded, as a client's are).
    """

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        on_close: Callable[[Connection], None] | None = None,
        on_protocol_error: Callable[[Connection, ProtocolError], None] | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self._frame_timer: asyncio.TimerHandle | None = None
        #: Server side: drops the peer that sends no whole frame in time (first_frame_timeout).
        self._idle_timer: asyncio.TimerHandle | None = None
        #: Server side, while writing is paused: checks that the peer still takes bytes.
        self._stall_timer: asyncio.TimerHandle | None = None
        #: Loop time since which the peer has taken nothing while writing is paused.
        self._stalled_since = 0.0
        #: :attr:`acked` when last looked at by a stall check.
        self._stall_acked = 0
        #: While writing is not paused: loop time since which the kernel has held answers for
        #: the peer that it takes none of (:meth:`check_unread`); None while it takes them.
        self._unread_since: float | None = None
        #: Bytes handed to the transport since the start (what the peer took: this minus the
        #: transport's buffer).
        self._handed = 0
        #: Applied to every request this side sends, just before it is written (a client's
        #: ACL credentials, :meth:`txmq.protocol.acl.Credentials.sign`).
        self.signer: Callable[[RemotingCommand], None] | None = None
        self.on_close = on_close
        self.on_protocol_error = on_protocol_error
        self._decoder = FrameDecoder(max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Frames written in this turn of the event loop, handed to the transport together at
        #: its end: one send() for all the answers (or requests) of a turn instead of one each.
        self._wbuf: list[bytes] = []
        self._wbuf_bytes = 0
        #: True while a read is being handled: frames written meanwhile go out at its end.
        self._reading = False
        self._closed = asyncio.get_running_loop().create_future()
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.peer: tuple[str, int] = ("", 0)
        self.local: tuple[str, int] = ("", 0)
        #: Free slot for the owner (e.g. the broker keeps the client id here).
        self.context: dict[str, Any] = {}
        #: The header encoding of the last request the peer sent: requests sent *to* the peer
        #: use it, since a stock client decodes only the encoding it speaks (JSON or ROCKETMQ).
        self.peer_serialize_type: SerializeType = SerializeType.MSGPACK

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have the same API.
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
        if isinstance(local, tuple):
            self.local = (str(local[0]), int(local[1]))
        limits = self.limits
        if limits is not None and limits.first_frame_timeout > 0:
            self._idle_timer = asyncio.get_running_loop().call_later(
                limits.first_frame_timeout, self._no_first_frame, limits.first_frame_timeout
            )

    def _no_first_frame(self, timeout: float) -> None:
        self._idle_timer = None
        self.drop(
            IDLE,
            f"no whole frame within {timeout:g}s of being accepted",
            stalled_s=timeout,
        )

    def data_received(self, data: bytes) -> None:
        self._decoder.feed(data)
        decoded = 0
        self._reading = True
        try:
            while True:
                try:
                    cmd = self._decoder.next_command()
                except FrameTooLargeError as exc:
                    self._report(exc)
                    self._write_error(0, str(exc), SerializeType.MSGPACK)
                    self.close()
                    return
                except MalformedFrameError as exc:
                    self._report(exc)
                    self._write_error(0, f"malformed frame: {exc}", SerializeType.MSGPACK)
                    continue
                if cmd is None:
                    break
                decoded += 1
                self._dispatch(cmd)
        finally:
            self._reading = False
            if self._wbuf:  # the answers of this read, in one write
                self._flush_writes()
        if decoded and self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        limits = self.limits
        if limits is not None and limits.frame_timeout > 0:
            self._watch_partial_frame(limits.frame_timeout, decoded)

    def _watch_partial_frame(self, timeout: float, decoded: int) -> None:
        """A frame must arrive whole within ``timeout`` of its first byte: a peer that holds a
        partial frame longer (a slow-loris) is dropped."""
        timer = self._frame_timer
        if not self._decoder.buffered:
            if timer is not None:
                timer.cancel()
                self._frame_timer = None
        elif timer is None or decoded:  # a new frame began
            if timer is not None:
                timer.cancel()
            self._frame_timer = asyncio.get_running_loop().call_later(
                timeout,
                self.drop,
                PARTIAL_FRAME,
                f"no whole frame within {timeout:g}s of its first byte",
            )

    def drop(self, reason: str, detail: str, *, stalled_s: float | None = None) -> None:
        """Close at once, discarding what is not written yet (a server protecting itself);
        ``reason`` and ``detail`` as in :class:`Drop`."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        limits = self.limits
        if limits is not None and limits.on_dropped is not None:
            pending = self.backlog + socket_unacked(transport)
            limits.on_dropped(self, Drop(reason, detail, stalled_s, pending))
        self._wbuf.clear()
        self._wbuf_bytes = 0
        _reset_on_close(transport)
        transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for timer in (self._frame_timer, self._idle_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self._frame_timer = self._idle_timer = self._stall_timer = None
        self._wbuf.clear()
        self._wbuf_bytes = 0
        err = ConnectionClosedError(f"connection to {self.peer[0]}:{self.peer[1]} closed")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()
        if not self._closed.done():
            self._closed.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        limits = self.limits
        if limits is not None and self._transport is not None:
            # A peer that does not read its answers gets no more of its requests read: what
            # the server holds for it stays bounded.
            self._transport.pause_reading()
            if limits.write_stall_timeout > 0 and self._stall_timer is None:
                loop = asyncio.get_running_loop()
                self._stalled_since = loop.time()
                self._stall_acked = self.acked
                self._stall_timer = loop.call_later(
                    self._stall_interval(limits.write_stall_timeout), self._check_stall
                )

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self.limits is not None and self._transport is not None:
            self._transport.resume_reading()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _stall_interval(timeout: float) -> float:
        """How often a paused connection is looked at: a stall is seen within this of its
        timeout (a quarter of it, at most a second)."""
        return min(timeout / 4, 1.0)

    def check_unread(self) -> None:
        """Server side, called by the owner about every second: a peer for which the kernel
        holds answers it takes none of is dropped after ``write_stall_timeout``, also while
        writing to it is not paused (its unread answers all fit in the socket's buffer, so
        :meth:`pause_writing` never comes).  Costs one ioctl on a connection that was ever
        written to."""
        limits = self.limits
        if (
            limits is None
            or limits.write_stall_timeout <= 0
            or self._write_paused  # :meth:`_check_stall` watches it
            or not self._handed
            or self.closed
        ):
            return
        unacked = socket_unacked(self._transport)
        if not unacked:
            self._unread_since = None
            return
        now = asyncio.get_running_loop().time()
        acked = self.taken - unacked
        since = self._unread_since
        if since is None or acked > self._stall_acked:
            since = self._unread_since = now
        self._stall_acked = acked
        stalled = now - since
        if stalled >= limits.write_stall_timeout:
            self.drop(
                SLOW_READER,
                f"answers not read for {stalled:.1f}s",
                stalled_s=round(stalled, 3),
            )

    def _check_stall(self) -> None:
        """While writing is paused: drop the peer once it has taken nothing of its answers for
        ``write_stall_timeout``; a peer that takes some, however little, starts the count
        again.  What it took is what it acknowledged (:attr:`acked`): the kernel may hold
        megabytes for it, and wakes the transport only once a good part of them went."""
        self._stall_timer = None
        limits = self.limits
        if limits is None or not self._write_paused or self.closed:
            return
        timeout = limits.write_stall_timeout
        loop = asyncio.get_running_loop()
        now = loop.time()
        acked = self.acked
        if acked > self._stall_acked:
            self._stalled_since = now
        self._stall_acked = acked
        stalled = now - self._stalled_since
        if stalled >= timeout:
            self.drop(
                SLOW_READER,
                f"answers not read for {stalled:.1f}s",
                stalled_s=round(stalled, 3),
            )
            return
        self._stall_timer = loop.call_later(
            min(self._stall_interval(timeout), timeout - stalled), self._check_stall
        )

    def _report(self, exc: ProtocolError) -> None:
        if self.on_protocol_error is not None:
            self.on_protocol_error(self, exc)

    def _write_error(self, opaque: int, remark: str, st: SerializeType) -> None:
        cmd = RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR, opaque=opaque, flag=1, remark=remark, serialize_type=st
        )
        self.write(cmd)

    def _dispatch(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            return
        self.peer_serialize_type = cmd.serialize_type
        if self.handler is None:
            if not cmd.is_oneway:
                self.write(
                    cmd.response(
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        f"request code {cmd.code} not supported here",
                    )
                )
            return
        # The handler runs now, not in a task of its own: most answer without waiting, and
        # then no task is made and no turn of the loop passes.  One that waits goes on in a
        # task from where it stopped (counted in ``_tasks`` as before).
        coro = self._handle(cmd)
        context = contextvars.copy_context()
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # as a task would have ended (and reported) it
            task = asyncio.get_running_loop().create_task(_reraise(exc), context=context)
        else:
            task = asyncio.get_running_loop().create_task(_resume(coro, waiting), context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, cmd: RemotingCommand) -> None:
        assert self.handler is not None
        limits = self.limits
        if (
            limits is not None
            and limits.answer_window
            and self.backlog > limits.answer_window
            and not await self._room_for_answers(limits)
        ):
            return
        try:
            resp = await self.handler(self, cmd)
        except TxmqError as exc:
            resp = cmd.response(exc.code, str(exc) or type(exc).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the peer gets an answer, the connection survives
            resp = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if resp is not None and not cmd.is_oneway:
            if len(resp.body) > ANSWER_BODY_LIMIT:
                resp = self._answer_too_large(cmd, len(resp.body))
            resp.opaque = cmd.opaque
            resp.serialize_type = cmd.serialize_type
            if self.closed:
                return  # the peer left before its answer was ready; nobody to tell
            self.write(resp)

    def _answer_too_large(self, cmd: RemotingCommand, size: int) -> RemotingCommand:
        """The error sent instead of an answer the peer would refuse (it closes a connection
        that announces a larger frame, and the request would end without a word)."""
        remark = (
            f"the answer to request code {cmd.code} has a body of {size} bytes, more than the "
            f"{ANSWER_BODY_LIMIT} bytes one answer may carry (a client refuses frames above "
            f"{DEFAULT_MAX_FRAME_SIZE} bytes): ask for less (a lower limit, or the next page)"
        )
        self._report(AnswerTooLargeError(remark))
        return cmd.response(ResponseCode.SYSTEM_ERROR, remark)

    async def _room_for_answers(self, limits: ConnectionLimits) -> bool:
        """Wait until the peer has read its answers down to ``answer_window`` (False: the
        connection is gone).  Writing is paused meanwhile, so a peer that reads nothing for
        ``write_stall_timeout`` is dropped (:meth:`_check_stall`), which ends the wait."""
        while not self.closed and self.backlog > limits.answer_window:
            self._flush_writes()
            if not self._write_paused:
                break  # the transport took them
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut
        return not self.closed

    @property
    def taken(self) -> int:
        """Bytes the transport has passed on to the peer's socket since the start."""
        transport = self._transport
        pending = transport.get_write_buffer_size() if transport is not None else 0
        return self._handed - pending

    @property
    def acked(self) -> int:
        """Bytes the peer has acknowledged since the start: :attr:`taken` less what the kernel
        holds unacknowledged (where the system cannot tell, :attr:`taken`; under TLS the
        kernel counts the records' few bytes of framing too, so this errs low)."""
        return self.taken - socket_unacked(self._transport)

    @property
    def backlog(self) -> int:
        """Bytes of answers (or requests) written and not taken by the peer yet."""
        transport = self._transport
        pending = transport.get_write_buffer_size() if transport is not None else 0
        return self._wbuf_bytes + pending

    # -- public API -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    @property
    def inflight(self) -> int:
        """Requests from the peer being handled now."""
        return len(self._tasks)

    def write(self, cmd: RemotingCommand) -> None:
        """Queue one frame; it goes to the transport at the end of the read being handled, or
        else at the end of this turn of the event loop (in order, with the other frames of the
        read or turn)."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.peer[0]}:{self.peer[1]} is closed")
        buf = self._wbuf
        now = False
        if not buf and not self._reading:
            # A client's only request in flight has nothing to be gathered with: it goes out
            # now (the peer starts on it while this side gets ready for the answer).
            now = self.limits is None and len(self._pending) <= 1
            if not now:
                asyncio.get_running_loop().call_soon(self._flush_writes)
        if len(cmd.body) < LARGE_BODY:
            frame = encode_frame(cmd)
            buf.append(frame)
            self._wbuf_bytes += len(frame)
        else:  # a large body (a pull answer, a batch) goes out as it is, not copied after its head
            head = encode_frame_head(cmd)
            buf += (head, cmd.body)
            self._wbuf_bytes += len(head) + len(cmd.body)
        if now:
            self._flush_writes()

    def _flush_writes(self) -> None:
        buf = self._wbuf
        if not buf:
            return
        self._wbuf = []
        handed = self._wbuf_bytes
        self._wbuf_bytes = 0
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the peer left; nobody to tell
        self._handed += handed
        if len(buf) == 1:
            transport.write(buf[0])
        else:
            transport.writelines(buf)
        limits = self.limits
        if limits is not None and limits.max_write_buffer:
            pending = transport.get_write_buffer_size()
            if pending > limits.max_write_buffer:
                self.drop(
                    WRITE_BUFFER,
                    f"{pending} bytes of answers not read by the peer "
                    f"(the limit is {limits.max_write_buffer})",
                )

    async def drain(self) -> None:
        """Wait until the transport takes writes again (returns at once when it does, or when
        the connection closes)."""
        if self._write_paused and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut

    async def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """Send a request and wait for its response."""
        cmd.opaque = next_opaque()
        if self.signer is not None:
            self.signer(cmd)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[cmd.opaque] = fut
        # A timer that fails the future, rather than asyncio.wait_for: no extra task per
        # request, and a cancellation of the caller is never lost when the answer arrives at
        # the same moment (Python 3.11's wait_for swallows it then).
        timer = loop.call_later(timeout, _expire, fut, cmd.code, self.peer, timeout)
        try:
            self.write(cmd)
            if self._write_paused:
                await self.drain()
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(cmd.opaque, None)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next_opaque()
        cmd.flag |= 0x2
        if self.signer is not None:
            self.signer(cmd)
        self.write(cmd)

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._flush_writes()  # what was written before close() still goes out
            self._transport.close()

    async def wait_closed(self, timeout: float = 5.0) -> bool:
        """Wait (up to ``timeout``) until the connection is closed; True if it is."""
        await asyncio.wait({self._closed}, timeout=timeout)
        return self._closed.done()

    async def wait_handlers(self) -> None:
        """Wait until the requests being handled now have been answered."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def open_connection(
    host: str,
    port: int,
    handler: Handler | None = None,
    *,
    timeout: float = 3.0,
    signer: Callable[[RemotingCommand], None] | None = None,
    ssl: _ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    **kwargs: Any,
) -> Connection:
    """Connect to ``host:port`` and return the :class:`Connection`; ``signer`` signs every
    request it sends (see :attr:`Connection.signer`).  With ``ssl`` the connection is TLS, the
    broker's certificate checked as the context says, for ``server_hostname`` (default:
    ``host``)."""
    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {}
    if ssl is not None:
        tls = {"ssl": ssl, "server_hostname": server_hostname or host}
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(handler, **kwargs), host, port, **tls),
            timeout,
        )
    except TimeoutError:
        raise RequestTimeoutError(f"connecting to {host}:{port} timed out") from None
    except _ssl.SSLError as exc:
        raise ConnectionClosedError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
    except OSError as exc:
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {exc}") from exc
    proto.signer = signer
    return proto
