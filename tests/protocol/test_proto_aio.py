"""The asyncio adapter: two real Connections over a loopback socket (server on port 0), and raw
sockets where the test needs to see the exact bytes."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.waiting import wait_until
from txmq.protocol.aio import Connection, Handler, open_connection, wait_event
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    ConnectionClosedError,
    FrameTooLargeError,
    MalformedFrameError,
    ProtocolError,
    RequestTimeoutError,
    TopicNotExistError,
)
from txmq.protocol.frame import FrameDecoder, encode_frame

WAIT = 5.0  # upper bound for anything that should happen at once


@dataclass
class Server:
    port: int
    connections: list[Connection] = field(default_factory=list)
    protocol_errors: list[ProtocolError] = field(default_factory=list)
    closed: list[Connection] = field(default_factory=list)
    requests: list[RemotingCommand] = field(default_factory=list)


@asynccontextmanager
async def serve(handler: Handler | None, **kwargs: Any) -> AsyncIterator[Server]:
    loop = asyncio.get_running_loop()
    state = Server(port=0)

    async def recording(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        state.requests.append(cmd)
        assert handler is not None
        return await handler(conn, cmd)

    def factory() -> Connection:
        conn = Connection(
            recording if handler is not None else None,
            on_close=state.closed.append,
            on_protocol_error=lambda c, exc: state.protocol_errors.append(exc),
            **kwargs,
        )
        state.connections.append(conn)
        return conn

    server = await loop.create_server(factory, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for conn in state.connections:
            conn.close()
        await server.wait_closed()


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields={"echo": cmd.ext_fields.get("x")}, body=cmd.body)


class RawClient:
    """A plain socket that writes bytes and reads frames, to see exactly what the peer sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_command(self) -> RemotingCommand:
        async def read() -> RemotingCommand:
            while (cmd := self.decoder.next_command()) is None:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionClosedError("eof")
                self.decoder.feed(data)
            return cmd

        return await asyncio.wait_for(read(), WAIT)

    async def read_until_eof(self) -> bytes:
        async def read() -> bytes:
            chunks = []
            while data := await self.reader.read(65536):
                chunks.append(data)
            return b"".join(chunks)

        return await asyncio.wait_for(read(), WAIT)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


def frame(cmd: RemotingCommand) -> bytes:
    return encode_frame(cmd)


# --- request / response -----------------------------------------------------------------------


@pytest.mark.parametrize("st_type", list(SerializeType), ids=lambda s: s.name)
async def test_request_response_by_opaque(st_type: SerializeType) -> None:
    async with serve(echo) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            for i in range(3):
                req = RemotingCommand.request(
                    RequestCode.SEND_MESSAGE,
                    {"x": f"v{i}"},
                    body=b"b%d" % i,
                    serialize_type=st_type,
                )
                resp = await client.request(req, timeout=WAIT)
                assert resp.is_response
                assert resp.opaque == req.opaque
                assert resp.code == ResponseCode.SUCCESS
                assert resp.serialize_type == st_type  # answered in the request's type
                assert resp.ext_fields == {"echo": f"v{i}"}
                assert resp.body == b"b%d" % i
            opaques = [r.opaque for r in srv.requests]
            assert len(set(opaques)) == 3
        finally:
            client.close()


async def test_concurrent_requests_answered_out_of_order() -> None:
    gate = asyncio.Event()
    answered: list[str] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = cmd.ext_fields["x"]
        if name == "slow":
            await gate.wait()  # held until the fast one has been handled
        else:
            gate.set()
        answered.append(name)
        return await echo(conn, cmd)

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            done_order: list[str] = []

            async def call(name: str) -> RemotingCommand:
                resp = await client.request(
                    RemotingCommand.request(RequestCode.PULL_MESSAGE, {"x": name}), timeout=WAIT
                )
                done_order.append(name)
                return resp

            slow = asyncio.create_task(call("slow"))
            # the slow request reaches the server first
            await wait_until(lambda: len(srv.requests) == 1, WAIT, "the slow request to arrive")
            fast = asyncio.create_task(call("fast"))
            slow_resp, fast_resp = await asyncio.gather(slow, fast)
            assert [c.ext_fields["x"] for c in srv.requests] == ["slow", "fast"]
            assert answered == ["fast", "slow"]
            assert done_order == ["fast", "slow"]
            assert slow_resp.ext_fields == {"echo": "slow"}
            assert fast_resp.ext_fields == {"echo": "fast"}
        finally:
            client.close()


async def test_many_concurrent_requests_each_get_their_own_answer() -> None:
    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        n = int(cmd.ext_fields["x"])
        await asyncio.sleep((97 - n) % 7 * 0.002)  # scramble the answer order
        return await echo(conn, cmd)

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            resps = await asyncio.gather(
                *(
                    client.request(RemotingCommand.request(10, {"x": str(n)}), timeout=WAIT)
                    for n in range(100)
                )
            )
            assert [r.ext_fields["echo"] for r in resps] == [str(n) for n in range(100)]
        finally:
            client.close()


async def test_server_initiated_request_reaches_the_client_handler() -> None:
    # The broker sends CHECK_TRANSACTION_STATE to a producer's connection.
    async def client_handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        assert cmd.code == RequestCode.CHECK_TRANSACTION_STATE
        return cmd.response(ext_fields={"seen": cmd.ext_fields["transactionId"]})

    async with serve(echo) as srv:
        client = await open_connection("127.0.0.1", srv.port, client_handler)
        try:
            await client.request(RemotingCommand.request(10), timeout=WAIT)  # wait for accept
            server_side = srv.connections[0]
            resp = await server_side.request(
                RemotingCommand.request(
                    RequestCode.CHECK_TRANSACTION_STATE, {"transactionId": "T1"}
                ),
                timeout=WAIT,
            )
            assert resp.ext_fields == {"seen": "T1"}
        finally:
            client.close()


async def test_request_to_a_peer_without_handler_is_not_supported() -> None:
    async with serve(echo) as srv:
        client = await open_connection("127.0.0.1", srv.port)  # no handler
        try:
            await client.request(RemotingCommand.request(10), timeout=WAIT)
            resp = await srv.connections[0].request(
                RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE), timeout=WAIT
            )
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        finally:
            client.close()


# --- oneway -----------------------------------------------------------------------------------


async def test_oneway_gets_no_response() -> None:
    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        # Returns an answer even for the oneway request: the Connection must drop it.
        return cmd.response(ext_fields={"for": cmd.opaque})

    async with serve(handler) as srv:
        raw = await RawClient.connect(srv.port)
        try:
            oneway = RemotingCommand(code=RequestCode.END_TRANSACTION, opaque=5, flag=0x2)
            normal = RemotingCommand(code=RequestCode.HEART_BEAT, opaque=6)
            await raw.send(frame(oneway) + frame(normal))
            first = await raw.read_command()
            assert first.opaque == 6 and first.ext_fields == {"for": 6}
            await raw.send(frame(RemotingCommand(code=RequestCode.HEART_BEAT, opaque=7)))
            assert (await raw.read_command()).opaque == 7
            assert [(c.opaque, c.is_oneway) for c in srv.requests] == [
                (5, True),
                (6, False),
                (7, False),
            ]
        finally:
            await raw.close()


async def test_send_oneway_sets_the_flag() -> None:
    seen = asyncio.Event()

    async def handler(conn: Connection, cmd: RemotingCommand) -> None:
        seen.set()

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            client.send_oneway(RemotingCommand.request(RequestCode.END_TRANSACTION))
            await asyncio.wait_for(seen.wait(), WAIT)
            assert srv.requests[0].is_oneway
        finally:
            client.close()


# --- errors from the handler ------------------------------------------------------------------


async def test_handler_exception_becomes_an_error_response() -> None:
    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        what = cmd.ext_fields["x"]
        if what == "txmq":
            raise TopicNotExistError("topic nope does not exist")
        if what == "bug":
            raise ValueError("boom")
        return await echo(conn, cmd)

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            r1 = await client.request(RemotingCommand.request(10, {"x": "txmq"}), timeout=WAIT)
            assert r1.code == ResponseCode.TOPIC_NOT_EXIST
            assert r1.remark == "topic nope does not exist"
            r2 = await client.request(RemotingCommand.request(10, {"x": "bug"}), timeout=WAIT)
            assert r2.code == ResponseCode.SYSTEM_ERROR
            assert r2.remark is not None and "ValueError" in r2.remark and "boom" in r2.remark
            # The connection goes on serving.
            r3 = await client.request(RemotingCommand.request(10, {"x": "ok"}), timeout=WAIT)
            assert r3.code == ResponseCode.SUCCESS and r3.ext_fields == {"echo": "ok"}
        finally:
            client.close()


# --- bad input --------------------------------------------------------------------------------


async def test_malformed_frame_gets_an_error_and_the_connection_keeps_working() -> None:
    async with serve(echo) as srv:
        raw = await RawClient.connect(srv.port)
        try:
            header = b"\xc1\xc1"  # not msgpack
            bad = struct.pack(">II", 4 + len(header), (2 << 24) | len(header)) + header
            await raw.send(bad)
            err = await raw.read_command()
            assert err.is_response
            assert err.code == ResponseCode.SYSTEM_ERROR
            assert err.remark is not None and "malformed" in err.remark
            assert len(srv.protocol_errors) == 1
            assert isinstance(srv.protocol_errors[0], MalformedFrameError)

            good = RemotingCommand(
                code=10, opaque=11, ext_fields={"x": "again"}, serialize_type=SerializeType.JSON
            )
            await raw.send(frame(good))
            resp = await raw.read_command()
            assert (resp.opaque, resp.code, resp.ext_fields) == (11, 0, {"echo": "again"})
            assert not srv.closed
        finally:
            await raw.close()


async def test_oversized_length_prefix_closes_the_connection() -> None:
    async with serve(echo, max_frame_size=1024) as srv:
        raw = await RawClient.connect(srv.port)
        other = await open_connection("127.0.0.1", srv.port)
        try:
            await raw.send(struct.pack(">I", 1025))  # only the prefix
            rest = await raw.read_until_eof()  # the server closes the connection
            dec = FrameDecoder()
            dec.feed(rest)
            err = dec.next_command()
            assert err is not None and err.code == ResponseCode.SYSTEM_ERROR
            assert err.remark is not None and "1025" in err.remark
            assert len(srv.protocol_errors) == 1
            assert isinstance(srv.protocol_errors[0], FrameTooLargeError)
            # Nothing else is affected: another connection is still served.
            resp = await other.request(RemotingCommand.request(10, {"x": "fine"}), timeout=WAIT)
            assert resp.ext_fields == {"echo": "fine"}
        finally:
            other.close()
            await raw.close()


async def test_truncated_frame_then_close_does_not_disturb_the_server() -> None:
    async with serve(echo) as srv:
        raw = await RawClient.connect(srv.port)
        full = frame(RemotingCommand(code=10, opaque=1, body=b"x" * 100))
        await raw.send(full[:50])
        await raw.close()
        client = await open_connection("127.0.0.1", srv.port)
        try:
            resp = await client.request(RemotingCommand.request(10, {"x": "y"}), timeout=WAIT)
            assert resp.ext_fields == {"echo": "y"}
            assert srv.requests[0].ext_fields == {"x": "y"}  # the torn frame never dispatched
        finally:
            client.close()


# --- closing ----------------------------------------------------------------------------------


async def test_pending_requests_fail_when_the_peer_closes() -> None:
    gate = asyncio.Event()
    arrived = asyncio.Event()

    async def handler(conn: Connection, cmd: RemotingCommand) -> None:
        arrived.set()
        await gate.wait()  # never answers

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            pending = [
                asyncio.create_task(client.request(RemotingCommand.request(11), timeout=30))
                for _ in range(3)
            ]
            await asyncio.wait_for(arrived.wait(), WAIT)
            srv.connections[0].close()
            for task in pending:
                with pytest.raises(ConnectionClosedError):
                    await asyncio.wait_for(task, WAIT)
            assert await client.wait_closed(WAIT), "the connection did not close"
            assert client.closed
            # New requests on the closed connection fail at once.
            with pytest.raises(ConnectionClosedError):
                await client.request(RemotingCommand.request(10), timeout=WAIT)
        finally:
            gate.set()
            for conn in srv.connections:
                await asyncio.wait_for(conn.wait_handlers(), WAIT)
            client.close()


async def test_on_close_is_called_once_for_each_side() -> None:
    closed: list[Connection] = []
    async with serve(echo) as srv:
        client = await open_connection("127.0.0.1", srv.port, on_close=closed.append)
        await client.request(RemotingCommand.request(10), timeout=WAIT)
        client.close()
        assert await client.wait_closed(WAIT), "the connection did not close"
        await wait_until(lambda: srv.closed, WAIT, "the server side to see the close")
        assert closed == [client]
        assert srv.closed == srv.connections


async def test_request_timeout() -> None:
    gate = asyncio.Event()

    async def handler(conn: Connection, cmd: RemotingCommand) -> None:
        await gate.wait()

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            with pytest.raises(RequestTimeoutError):
                await client.request(RemotingCommand.request(11), timeout=0.05)
            assert not client._pending  # the future is forgotten
        finally:
            gate.set()
            await asyncio.wait_for(srv.connections[0].wait_handlers(), WAIT)
            client.close()


async def test_connect_refused_is_connection_closed_error() -> None:
    async with serve(echo) as srv:
        port = srv.port
    with pytest.raises(ConnectionClosedError):
        await open_connection("127.0.0.1", port, timeout=WAIT)


async def test_a_cancel_that_meets_the_answer_is_not_swallowed() -> None:
    """A task cancelled in the same loop turn as its answer arrives must still end cancelled:
    loops that send requests (heartbeat, rebalance) are stopped by cancellation, and a lost
    cancel kept them running forever (asyncio.wait_for on Python 3.11 drops it)."""
    async with serve(echo) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            task = asyncio.ensure_future(client.request(RemotingCommand.request(11), WAIT))
            dispatch = client._dispatch

            def answer_then_cancel(cmd: RemotingCommand) -> None:
                dispatch(cmd)  # resolves the request's future ...
                task.cancel()  # ... and the owner cancels before the task runs again

            client._dispatch = answer_then_cancel  # type: ignore[method-assign]
            done, _ = await asyncio.wait({task}, timeout=WAIT)
            assert done, "the request neither finished nor was cancelled"
            assert task.cancelled(), f"the cancel was swallowed: {task.result()!r}"
        finally:
            client.close()


async def test_wait_event_returns_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, WAIT) is True
