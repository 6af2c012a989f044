"""gRPC over HTTP/2 on the broker's own event loop: the ``native`` transport of the RocketMQ 5
front end (``grpcTransport = native``), serving the same :class:`~.service.MessagingService`
methods as the ``grpc.aio`` server, without grpcio's completion-queue thread and its hand-offs.

What it speaks.  HTTP/2 (RFC 9113) as a server, the subset gRPC uses: plain text with prior
knowledge (h2c, the connection preface first) or TLS with ALPN ``h2``.  The connection and its
streams are kept here; the frame layout, the constant response header blocks and the request
header decoder are in :mod:`.h2frames`, the per-call state and the handler's context in
:mod:`.h2calls`.  Both flow-control windows are honoured when sending (a large ReceiveMessage batch
waits for the peer's WINDOW_UPDATEs) and replenished when receiving.  PING is answered, PRIORITY
ignored, RST_STREAM cancels the call, a protocol error is answered with GOAWAY and the
connection closed; other connections are not affected.

gRPC on top (the ``application/grpc`` wire format): length-prefixed messages, ``grpc-timeout``
(:meth:`CallContext.time_remaining`; a call still running at its deadline is cancelled and
answered DEADLINE_EXCEEDED), status in the ``grpc-status`` / ``grpc-message`` trailers, request
messages compressed with ``gzip`` or ``deflate`` inflated (up to the size bound), responses
never compressed.  A request message larger than the bound is answered RESOURCE_EXHAUSTED before
its body is read.

Cost.  A unary call whose request arrives whole in one read runs its handler at once, outside
any task (:meth:`H2Connection._start`, as the remoting port does), and its answer - HEADERS,
DATA and trailers - goes out with everything else answered in that read, in one write.
"""

from __future__ import annotations

import asyncio
import contextvars
import struct
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from txmq.protocol.aio import _reraise, _reset_on_close, _resume

from .h2calls import (
    BIDI,
    CANCELLED,
    DEADLINE_EXCEEDED,
    INTERNAL,
    OK,
    RESOURCE_EXHAUSTED,
    UNARY,
    UNIMPLEMENTED,
    UNKNOWN,
    AbortError,
    CallContext,
    Method,
    RequestStream,
    Stream,
    StreamClosed,
)
from .h2frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_HEADER_BLOCK,
    MAX_WINDOW,
    MESSAGE_PREFIX,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RESPONSE_HEADERS,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    TRAILERS_OK,
    WINDOW_UPDATE,
    ConnectionError_,
    HpackDecoder,
    frame,
    parse_timeout,
    trailers,
)

log = structlog.get_logger(__name__)

#: A unary answer's HEADERS frame, its DATA frame's head and the message prefix; then (after
#: the message) its trailers frame: each packed at once.
_UNARY_HEAD = struct.Struct(f">HBBBL{len(RESPONSE_HEADERS)}sHBBBLBL")
_UNARY_TAIL = struct.Struct(f">HBBBL{len(TRAILERS_OK)}s")

#: Streams one connection may have open at once (more are refused with REFUSED_STREAM).
MAX_CONCURRENT_STREAMS = 1024
#: What a client may send on one stream before the broker's WINDOW_UPDATE (also sent as soon as
#: half of it arrived), and on the whole connection.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
#: Request messages of a bidirectional call (Telemetry) received and not read by it yet, at
#: most (a call that reads none of them is ended RESOURCE_EXHAUSTED).
MAX_UNREAD_MESSAGES = 1024


# -- the connection -----------------------------------------------------------------------------


class H2Server:
    """What every connection of the port shares: the methods, the bounds, the open
    connections."""

    def __init__(
        self,
        methods: dict[bytes, Method],
        *,
        max_receive: int,
        first_frame_timeout: float,
        write_stall_timeout: float,
        on_protocol_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self.methods = methods
        self.max_receive = max_receive
        self.first_frame_timeout = first_frame_timeout
        self.write_stall_timeout = write_stall_timeout
        self.on_protocol_error = on_protocol_error
        self.connections: set[H2Connection] = set()
        self.stopping = False
        settings = [
            (S_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (S_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            (S_ENABLE_PUSH, 0),
        ]
        payload = b"".join(struct.pack(">HL", k, v) for k, v in settings)
        self.greeting = frame(SETTINGS, 0, 0, payload) + frame(
            WINDOW_UPDATE, 0, 0, struct.pack(">L", CONNECTION_WINDOW - DEFAULT_WINDOW)
        )

    def protocol(self) -> H2Connection:
        return H2Connection(self)

    def goaway_all(self) -> None:
        self.stopping = True
        for c in list(self.connections):
            c.goaway(NO_ERROR, "")

    @property
    def busy(self) -> bool:
        return any(c.streams for c in self.connections)

    def close_all(self) -> None:
        for c in list(self.connections):
            c.abort()


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection serving gRPC calls."""

    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.methods = server.methods
        self.max_receive = server.max_receive
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer_name = "ipv4:0.0.0.0:0"
        self._buf = b""
        self._preface = False
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        #: The peer's connection window (what may still be sent) and its settings.
        self.window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW
        self.max_frame = DEFAULT_FRAME
        #: Request bytes received and not given back to the peer's connection window yet.
        self._unacked = 0
        #: The header block being received across CONTINUATION frames: (stream, flags, parts).
        self._continued: tuple[int, int, list[bytes]] | None = None
        self._decoder = HpackDecoder()
        #: Header blocks decoded without changing the dynamic table, by their bytes, valid
        #: while the table stays as it is (cleared when it changes).
        self._memo: dict[bytes, tuple[bytes, tuple[tuple[str, str], ...], float | None, bytes]]
        self._memo = {}
        self._memo_state = 0
        self._wbuf: list[bytes] = []
        self._reading = False
        self._flush_scheduled = False
        self._blocked: list[Stream] = []
        self._goaway_sent = False
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._idle_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have the same API.
        transport: asyncio.Transport = base  # type: ignore[assignment]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = str(peer[0])
            self.peer_name = f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"
        self.server.connections.add(self)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
            transport.abort()
            return
        transport.write(self.server.greeting)
        timeout = self.server.first_frame_timeout
        if timeout > 0:
            self._idle_timer = self.loop.call_later(timeout, self._no_preface)
        if self.server.stopping:
            self.goaway(NO_ERROR, "")

    def _no_preface(self) -> None:
        self._idle_timer = None
        log.info("grpc_connection_idle", peer=self.peer_name)
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        for timer in (self._idle_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        for s in list(self.streams.values()):
            self._discard(s, cancel=True)
        self.streams.clear()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._wbuf.clear()

    def pause_writing(self) -> None:
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()
        timeout = self.server.write_stall_timeout
        if timeout > 0 and self._stall_timer is None:
            self._stall_timer = self.loop.call_later(timeout, self._stalled)

    def resume_writing(self) -> None:
        self._paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self.transport is not None:
            self.transport.resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _stalled(self) -> None:
        self._stall_timer = None
        if self._paused and self.transport is not None:
            log.info("grpc_connection_stalled", peer=self.peer_name)
            _reset_on_close(self.transport)
            self.abort()

    def abort(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.abort()

    # -- reading --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        self._reading = True
        try:
            if not self._preface:
                if len(data) < 24:
                    if not PREFACE.startswith(data):
                        raise ConnectionError_(PROTOCOL_ERROR, "bad connection preface")
                    self._buf = data
                    return
                if data[:24] != PREFACE:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad connection preface")
                self._preface = True
                if self._idle_timer is not None:
                    self._idle_timer.cancel()
                    self._idle_timer = None
                data = data[24:]
            self._frames(data)
        except ConnectionError_ as exc:
            self._connection_error(exc.code, str(exc))
        finally:
            self._reading = False
            if self._wbuf:
                self._flush()

    def _frames(self, data: bytes) -> None:
        pos = 0
        end = len(data)
        unpack = FRAME_HEAD.unpack_from
        while end - pos >= 9:
            hi, lo, kind, flags, sid = unpack(data, pos)
            length = (hi << 8) | lo
            if length > DEFAULT_FRAME:
                raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            payload = data[pos + 9 : stop]
            pos = stop
            sid &= 0x7FFFFFFF
            if self._continued is not None and kind != CONTINUATION:
                raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
            if kind == DATA:
                self._data(sid, flags, payload)
            elif kind == HEADERS:
                self._headers(sid, flags, payload)
            elif kind == WINDOW_UPDATE:
                # grpc-core sends two a call (one on the stream, one on the connection): the
                # common ones, nothing waiting for window, are added here
                if length == 4:
                    inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
                    if sid:
                        s = self.streams.get(sid)
                        if s is None:
                            if sid <= self.last_stream:
                                continue  # a stream already answered
                        elif inc and s.window + inc <= MAX_WINDOW and not s.pending:
                            if s.pending_trailers is None:
                                s.window += inc
                                continue
                    elif inc and self.window + inc <= MAX_WINDOW and not self._blocked:
                        self.window += inc
                        continue
                self._window_update(sid, payload)
            elif kind == SETTINGS:
                self._settings(sid, flags, payload)
            elif kind == PING:
                if sid != 0:
                    raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
                if len(payload) != 8:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "PING of a wrong size")
                if not flags & ACK:
                    self._write(frame(PING, ACK, 0, payload))
            elif kind == RST_STREAM:
                if sid == 0:
                    raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
                if len(payload) != 4:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM of a wrong size")
                s = self.streams.get(sid)
                if s is not None:
                    self._discard(s, cancel=True)
                elif sid > self.last_stream:
                    raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            elif kind == CONTINUATION:
                self._continuation(sid, flags, payload)
            elif kind == GOAWAY:
                if not self.streams:
                    self.goaway(NO_ERROR, "")
            elif kind == PRIORITY:
                if sid == 0:
                    raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
                if len(payload) != 5:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "PRIORITY of a wrong size")
            elif kind == PUSH_PROMISE:
                raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            # unknown frame types are ignored (RFC 9113 section 4.1)
        if pos < end:
            self._buf = data[pos:]

    def _settings(self, sid: int, flags: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS of a wrong size")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.initial_window
                self.initial_window = value
                for s in self.streams.values():
                    s.window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 16_777_215:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._write(frame(SETTINGS, ACK, 0))
        self._unblock()

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong size")
        inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.window += inc
            if self.window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
            self._unblock()
            return
        s = self.streams.get(sid)
        if s is None:
            return
        if inc == 0:
            self._reset(s, PROTOCOL_ERROR)
            return
        s.window += inc
        if s.window > MAX_WINDOW:
            self._reset(s, FLOW_CONTROL_ERROR)
            return
        if s.pending or s.pending_trailers is not None:
            self._send_pending(s)

    def _headers(self, sid: int, flags: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & (PADDED | PRIORITY_FLAG):
            payload = self._unpad(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, payload)
        else:
            self._continued = (sid, flags, [payload])

    def _continuation(self, sid: int, flags: int, payload: bytes) -> None:
        c = self._continued
        if c is None or c[0] != sid:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        c[2].append(payload)
        if sum(len(p) for p in c[2]) > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._continued = None
            self._header_block(sid, c[1], b"".join(c[2]))

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload:
            raise ConnectionError_(PROTOCOL_ERROR, "padded frame without its pad length")
        pad = payload[0]
        if pad >= len(payload):
            raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - pad]

    def _decode(
        self, block: bytes
    ) -> tuple[bytes, tuple[tuple[str, str], ...], float | None, bytes]:
        """(path, metadata, timeout, encoding) of a request header block."""
        decoder = self._decoder
        state = decoder.changes
        if state != self._memo_state:
            self._memo.clear()
            self._memo_state = state
        else:
            hit = self._memo.get(block)
            if hit is not None:
                return hit
        fields = decoder.decode(block)
        path = b""
        method = b""
        content_type = b""
        timeout: float | None = None
        encoding = b""
        md: list[tuple[str, str]] = []
        for n, v in fields:
            if n[:1] == b":":
                if n == b":path":
                    path = v
                elif n == b":method":
                    method = v
            elif n == b"content-type":
                content_type = v
            elif n == b"grpc-timeout":
                timeout = parse_timeout(v)
            elif n == b"grpc-encoding":
                encoding = v
            elif n != b"te":
                md.append((n.decode("latin-1"), v.decode("utf-8", "replace")))
        if method != b"POST" or not content_type.startswith(b"application/grpc"):
            path = b""  # answered UNIMPLEMENTED / refused below
        out = (path, tuple(md), timeout, encoding)
        if decoder.changes == state and len(self._memo) < 256:
            self._memo[block] = out
        return out

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        s = self.streams.get(sid)
        if s is not None:  # trailers of a client stream
            self._decoder.decode(block)
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
            self._remote_end(s)
            return
        if sid <= self.last_stream or not sid & 1:
            if sid <= self.last_stream and sid & 1:
                # a closed stream: decode to keep the table in step, then refuse
                self._decode(block)
                raise ConnectionError_(STREAM_CLOSED, f"HEADERS on closed stream {sid}")
            raise ConnectionError_(PROTOCOL_ERROR, f"bad stream id {sid}")
        self.last_stream = sid
        path, md, timeout, encoding = self._decode(block)
        if self._goaway_sent:
            self._write(frame(RST_STREAM, 0, sid, b"\0\0\0\x07"))
            return
        if len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self._write(frame(RST_STREAM, 0, sid, b"\0\0\0\x07"))
            return
        s = Stream(sid, self.initial_window)
        self.streams[sid] = s
        s.remote_ended = bool(flags & END_STREAM)
        m = self.methods.get(path)
        if m is None:
            self._end_early(s, UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
            return
        if encoding and encoding != b"identity":
            if encoding not in (b"gzip", b"deflate"):
                self._end_early(
                    s, UNIMPLEMENTED, f"grpc-encoding {encoding.decode('latin-1')} not supported"
                )
                return
            s.encoding = encoding
        s.method = m
        if timeout is not None:
            s.deadline = self.loop.time() + timeout
        s.context = CallContext(self, s, md)
        if m.kind == BIDI:
            s.requests = RequestStream(m.deserialize)
            if s.remote_ended:
                s.requests.end()
            self._start(s, self._run_bidi(s, m))
        elif s.remote_ended:
            self._dispatch(s)

    def _data(self, sid: int, flags: int, payload: bytes) -> None:
        n = len(payload)
        if n:
            self._unacked += n
            if self._unacked >= CONNECTION_WINDOW // 2:
                self._write(frame(WINDOW_UPDATE, 0, 0, self._unacked.to_bytes(4, "big")))
                self._unacked = 0
        if flags & PADDED:
            payload = self._unpad(flags, payload)
        s = self.streams.get(sid)
        if (
            flags == END_STREAM
            and s is not None
            and s.requests is None
            and not s.buf
            and not s.messages
            and not s.remote_ended
            and not s.ended
            and n > 5
            and payload[0] == 0
            and int.from_bytes(payload[1:5], "big") == n - 5
            and n - 5 <= self.max_receive
        ):
            # the common case: the whole request of a unary call in one frame that ends it
            s.remote_ended = True
            m = s.method
            assert m is not None
            request = m.deserialize(payload[5:])
            if m.kind == UNARY:
                self._start(s, self._run_unary(s, m, request))
            else:
                self._start(s, self._run_server_streaming(s, m, request))
            return
        if s is None or s.remote_ended:
            if sid == 0 or sid > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            if s is not None:
                self._reset(s, STREAM_CLOSED)
            return  # a stream answered (or reset) already
        end = bool(flags & END_STREAM)
        if not s.ended and payload:
            buf = s.buf
            if not buf and len(payload) >= 5:
                # the common case: whole messages in this frame
                pos = 0
                size = len(payload)
                while size - pos >= 5:
                    compressed, length = MESSAGE_PREFIX.unpack_from(payload, pos)
                    if pos + 5 + length > size:
                        break
                    if not self._message(s, compressed, payload[pos + 5 : pos + 5 + length]):
                        return
                    pos += 5 + length
                if pos < size:
                    buf += payload[pos:] if pos else payload
            else:
                buf += payload
            if buf and not self._messages(s):
                return
            if not end:
                s.unacked += n
                if s.unacked >= STREAM_WINDOW // 2:
                    self._write(frame(WINDOW_UPDATE, 0, sid, s.unacked.to_bytes(4, "big")))
                    s.unacked = 0
        if end:
            self._remote_end(s)

    def _messages(self, s: Stream) -> bool:
        """Take the complete messages out of ``s.buf``; False when the stream was ended."""
        buf = s.buf
        while len(buf) >= 5:
            compressed, length = MESSAGE_PREFIX.unpack_from(buf, 0)
            if length > self.max_receive:
                return self._too_large(s, length)
            if len(buf) < 5 + length:
                break
            message = bytes(buf[5 : 5 + length])
            del buf[: 5 + length]
            if not self._message(s, compressed, message):
                return False
        if len(buf) >= 5:
            _, length = MESSAGE_PREFIX.unpack_from(buf, 0)
            if length > self.max_receive:
                return self._too_large(s, length)
        return True

    def _too_large(self, s: Stream, length: int) -> bool:
        self._end_early(
            s,
            RESOURCE_EXHAUSTED,
            f"Received message larger than max ({length} vs. {self.max_receive})",
        )
        return False

    def _message(self, s: Stream, compressed: int, message: bytes) -> bool:
        """One whole request message; False when the stream was ended."""
        if len(message) > self.max_receive:
            return self._too_large(s, len(message))
        if compressed:
            if s.encoding is None:
                self._end_early(s, INTERNAL, "compressed message without grpc-encoding")
                return False
            wbits = 31 if s.encoding == b"gzip" else 15
            try:
                d = zlib.decompressobj(wbits)
                message = d.decompress(message, self.max_receive + 1)
            except zlib.error as exc:
                self._end_early(s, INTERNAL, f"cannot decompress the message: {exc}")
                return False
            if len(message) > self.max_receive or d.unconsumed_tail:
                return self._too_large(s, self.max_receive + 1)
        if s.requests is not None:
            if len(s.requests) >= MAX_UNREAD_MESSAGES:
                # the call takes none of what the client sends: end it rather than hold more
                self._end_early(s, RESOURCE_EXHAUSTED, "too many request messages not read")
                if s.task is not None:
                    s.task.cancel()
                return False
            s.requests.put(message)
        elif s.messages:
            self._end_early(s, UNIMPLEMENTED, "more than one request message")
            return False
        else:
            s.messages.append(message)
        return True

    def _remote_end(self, s: Stream) -> None:
        s.remote_ended = True
        if s.buf and not s.ended:
            self._end_early(s, INTERNAL, "incomplete request message")
            return
        if s.requests is not None:
            s.requests.end()
        elif s.ended:
            self._close(s)
        elif s.task is None and s.method is not None:
            self._dispatch(s)

    # -- calls ----------------------------------------------------------------------------------

    def _dispatch(self, s: Stream) -> None:
        m = s.method
        assert m is not None
        if len(s.messages) != 1:
            self._end_early(s, INTERNAL, "no request message")
            return
        request = m.deserialize(s.messages.pop())
        if m.kind == UNARY:
            self._start(s, self._run_unary(s, m, request))
        else:
            self._start(s, self._run_server_streaming(s, m, request))

    def _start(self, s: Stream, coro: Coroutine[Any, Any, None]) -> None:
        """Run a call's coroutine now, outside any task, until it first waits; it goes on in
        a task from there (as the remoting port runs its handlers)."""
        context = contextvars.copy_context()
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            task = self.loop.create_task(_reraise(exc), context=context)
        else:
            task = self.loop.create_task(_resume(coro, waiting), context=context)
        if not s.ended:
            s.task = task
            if s.deadline is not None:
                s.timer = self.loop.call_at(s.deadline, self._deadline, s)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _deadline(self, s: Stream) -> None:
        s.timer = None
        if s.ended:
            return
        self._end_early(s, DEADLINE_EXCEEDED, "Deadline Exceeded")
        if s.task is not None:
            s.task.cancel()

    async def _run_unary(self, s: Stream, m: Method, request: Any) -> None:
        ctx = s.context
        assert ctx is not None
        try:
            response = await m.handler(request, ctx)
            body = response.SerializeToString()
        except AbortError:
            self._finish(s, ctx.code, ctx.details)
            return
        except asyncio.CancelledError:
            self._finish(s, CANCELLED, "Cancelled")
            raise
        except Exception as exc:
            log.exception("grpc_call_failed", method=m.handler.__name__)
            self._finish(s, UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
            return
        if s.ended:
            return
        n = len(body) + 5
        if s.window >= n and self.window >= n and n <= self.max_frame and not s.headers_sent:
            sid = s.id
            s.window -= n
            self.window -= n
            s.headers_sent = True
            self._write(
                _UNARY_HEAD.pack(
                    0,
                    len(RESPONSE_HEADERS),
                    HEADERS,
                    END_HEADERS,
                    sid,
                    RESPONSE_HEADERS,
                    n >> 8,
                    n & 0xFF,
                    DATA,
                    0,
                    sid,
                    0,
                    n - 5,
                )
                + body
                + _UNARY_TAIL.pack(
                    0, len(TRAILERS_OK), HEADERS, END_HEADERS | END_STREAM, sid, TRAILERS_OK
                )
            )
            if s.remote_ended and s.timer is None and not self._goaway_sent:
                # the call is over both ways: forget it (what _close does, in short)
                s.ended = True
                if self.streams.get(sid) is s:
                    del self.streams[sid]
            else:
                s.ended = True
                self._close(s)
            return
        self._queue_message(s, body)
        self._finish(s, OK, "")

    async def _run_server_streaming(self, s: Stream, m: Method, request: Any) -> None:
        async def stream(ctx: CallContext) -> None:
            async for item in m.handler(request, ctx):
                await self.send_message(s, item.SerializeToString())

        await self._run_call(s, m, stream)

    async def _run_bidi(self, s: Stream, m: Method) -> None:
        requests = s.requests
        assert requests is not None
        await self._run_call(s, m, lambda ctx: m.handler(requests, ctx))

    async def _run_call(
        self, s: Stream, m: Method, call: Callable[[CallContext], Awaitable[Any]]
    ) -> None:
        """A streaming call to its end: its status in the trailers, whatever ended it."""
        ctx = s.context
        assert ctx is not None
        try:
            await call(ctx)
        except AbortError:
            self._finish(s, ctx.code, ctx.details)
            return
        except StreamClosed:
            return
        except asyncio.CancelledError:
            self._finish(s, CANCELLED, "Cancelled")
            raise
        except Exception as exc:
            log.exception("grpc_call_failed", method=m.handler.__name__)
            self._finish(s, UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
            return
        self._finish(s, ctx.code, ctx.details)

    # -- writing --------------------------------------------------------------------------------

    async def send_message(self, s: Stream, body: bytes) -> None:
        """One response message of a streaming call; waits while the peer's windows (or the
        socket) hold what was sent before."""
        if s.ended or self.transport is None:
            raise StreamClosed(f"stream {s.id} is closed")
        self._queue_message(s, body)
        while s.pending and not s.ended:
            fut = s.drained = self.loop.create_future()
            try:
                await fut
            finally:
                s.drained = None
        if s.ended and s.pending_trailers is None:
            raise StreamClosed(f"stream {s.id} is closed")
        if self._paused and self.transport is not None:
            w = self.loop.create_future()
            self._drain_waiters.append(w)
            await w

    def _queue_message(self, s: Stream, body: bytes) -> None:
        if not s.headers_sent:
            s.headers_sent = True
            self._write(frame(HEADERS, END_HEADERS, s.id, RESPONSE_HEADERS))
        s.pending.append(MESSAGE_PREFIX.pack(0, len(body)) + body)
        self._send_pending(s)

    def _send_pending(self, s: Stream) -> None:
        """Send what the windows let through of ``s``'s queued DATA (then its trailers)."""
        pending = s.pending
        while pending:
            room = min(s.window, self.window, self.max_frame)
            if room <= 0:
                if s not in self._blocked:
                    self._blocked.append(s)
                return
            chunk = pending[0]
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
            n = len(chunk)
            s.window -= n
            self.window -= n
            self._write(FRAME_HEAD.pack(n >> 8, n & 0xFF, DATA, 0, s.id) + chunk)
        if s.drained is not None and not s.drained.done():
            s.drained.set_result(None)
        if s.pending_trailers is not None:
            block, s.pending_trailers = s.pending_trailers, None
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, s.id, block))
            self._close(s)

    def _unblock(self) -> None:
        blocked, self._blocked = self._blocked, []
        for s in blocked:
            if self.streams.get(s.id) is s:
                self._send_pending(s)

    def _finish(self, s: Stream, code: int, message: str) -> None:
        """End the response with its status (after its queued DATA)."""
        if s.ended:
            return
        s.ended = True
        block = TRAILERS_OK if code == OK and not message else trailers(code, message)
        if not s.headers_sent:  # trailers-only
            s.headers_sent = True
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, s.id, RESPONSE_HEADERS + block))
            self._close(s)
        elif s.pending:
            s.pending_trailers = block
        else:
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, s.id, block))
            self._close(s)

    def _end_early(self, s: Stream, code: int, message: str) -> None:
        """Answer a call before (or without) running it, or end it now."""
        s.pending.clear()
        s.pending_trailers = None
        self._finish(s, code, message)

    def _close(self, s: Stream) -> None:
        """The response is complete: forget the stream once the request is too."""
        if not s.remote_ended:
            # the peer may still be sending: tell it to stop (RFC 9113 section 8.1)
            self._write(frame(RST_STREAM, 0, s.id, b"\0\0\0\0"))
            s.remote_ended = True
        self._discard(s, cancel=False)

    def _reset(self, s: Stream, code: int) -> None:
        self._write(frame(RST_STREAM, 0, s.id, code.to_bytes(4, "big")))
        self._discard(s, cancel=True)

    def _discard(self, s: Stream, cancel: bool) -> None:
        if self.streams.get(s.id) is s:
            del self.streams[s.id]
        s.ended = True
        s.pending.clear()
        s.pending_trailers = None
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        if s.drained is not None and not s.drained.done():
            s.drained.set_result(None)
        if s.requests is not None:
            s.requests.end()
        if cancel and s.task is not None and not s.task.done():
            s.task.cancel()
        if self._goaway_sent and not self.streams and self.transport is not None:
            self._flush()
            self.transport.close()

    def goaway(self, code: int, detail: str) -> None:
        if self.transport is None:
            return
        if not self._goaway_sent:
            self._goaway_sent = True
            self._write(
                frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code) + detail.encode())
            )
        self._flush()
        if not self.streams or code != NO_ERROR:
            self.transport.close()

    def _connection_error(self, code: int, detail: str) -> None:
        log.info("grpc_protocol_error", peer=self.peer_name, code=code, error=detail)
        if self.server.on_protocol_error is not None:
            self.server.on_protocol_error(self.peer_name, detail)
        self._buf = b""
        self.goaway(code, detail)
        for s in list(self.streams.values()):
            self._discard(s, cancel=True)

    def _write(self, data: bytes) -> None:
        self._wbuf.append(data)
        if not self._reading and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        buf = self._wbuf
        if not buf:
            return
        t = self.transport
        if t is None or t.is_closing():
            buf.clear()
            return
        t.write(buf[0] if len(buf) == 1 else b"".join(buf))
        buf.clear()
