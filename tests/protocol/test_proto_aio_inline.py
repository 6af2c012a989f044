"""Handlers run in the read that brought their request: one that answers without waiting needs
no task and its answer leaves with the others of that read; one that waits goes on in a task
that is counted, cancellable and reports errors as before.  Real sockets on loopback."""

from __future__ import annotations

import asyncio
import contextvars

from tests.protocol.test_proto_aio import WAIT, RawClient, frame, serve
from tests.support.waiting import wait_until
from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import TopicNotExistError

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def requests(n: int, code: int = 10) -> list[RemotingCommand]:
    out = []
    for i in range(1, n + 1):
        cmd = RemotingCommand.request(code, ext_fields={"x": str(i)})
        cmd.opaque = i
        out.append(cmd)
    return out


async def test_a_handler_that_does_not_wait_runs_without_a_task_and_answers_in_order() -> None:
    tasks: list[asyncio.Task[object] | None] = []
    inflight: list[int] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        tasks.append(asyncio.current_task())
        inflight.append(conn.inflight)
        return cmd.response(ext_fields={"echo": cmd.ext_fields["x"]})

    async with serve(handler) as srv:
        raw = await RawClient.connect(srv.port)
        try:
            await raw.send(b"".join(frame(c) for c in requests(5)))  # one write, five requests
            answers = [await raw.read_command() for _ in range(5)]
        finally:
            await raw.close()
    assert [a.opaque for a in answers] == [1, 2, 3, 4, 5]
    assert [a.ext_fields["echo"] for a in answers] == ["1", "2", "3", "4", "5"]
    assert tasks == [None] * 5, "a handler that does not wait ran in a task"
    assert inflight == [0] * 5


async def test_a_handler_that_waits_goes_on_in_a_counted_task() -> None:
    gate = asyncio.Event()
    in_task: list[bool] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.ext_fields["x"] == "1":
            await asyncio.sleep(0)  # a bare yield first, then a future
            in_task.append(asyncio.current_task() is not None)
            await gate.wait()
        return cmd.response(ext_fields={"echo": cmd.ext_fields["x"]})

    async with serve(handler) as srv:
        raw = await RawClient.connect(srv.port)
        try:
            await raw.send(b"".join(frame(c) for c in requests(2)))
            first = await raw.read_command()  # the one that did not wait answers at once
            assert first.opaque == 2
            conn = srv.connections[0]
            await wait_until(lambda: in_task == [True], WAIT, "the waiting handler to resume")
            assert conn.inflight == 1
            gate.set()
            second = await raw.read_command()
            assert (second.opaque, second.ext_fields["echo"]) == (1, "1")
            await asyncio.wait_for(conn.wait_handlers(), WAIT)
            assert conn.inflight == 0
        finally:
            gate.set()
            await raw.close()


async def test_cancelling_a_waiting_handler_reaches_it_and_the_connection_goes_on() -> None:
    gate = asyncio.Event()
    cancelled: list[str] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.ext_fields["x"] == "1":
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled.append(cmd.ext_fields["x"])
                raise
        return cmd.response(ext_fields={"echo": cmd.ext_fields["x"]})

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            waiting = asyncio.create_task(
                client.request(RemotingCommand.request(10, ext_fields={"x": "1"}), timeout=30)
            )
            await wait_until(
                lambda: srv.connections and srv.connections[0].inflight == 1,
                WAIT,
                "the handler to wait",
            )
            conn = srv.connections[0]
            (task,) = list(conn._tasks)
            task.cancel()
            await asyncio.wait_for(conn.wait_handlers(), WAIT)
            assert task.cancelled()
            assert cancelled == ["1"]
            assert conn.inflight == 0
            answer = await client.request(
                RemotingCommand.request(10, ext_fields={"x": "2"}), timeout=WAIT
            )
            assert answer.ext_fields["echo"] == "2"
            assert not waiting.done()  # a cancelled handler answers nothing
            waiting.cancel()
        finally:
            gate.set()
            client.close()


async def test_errors_before_and_after_waiting_become_answers() -> None:
    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        kind = cmd.ext_fields["x"]
        if kind.startswith("wait"):
            await asyncio.sleep(0.001)
        if kind.endswith("topic"):
            raise TopicNotExistError("no such topic")
        raise ValueError("boom")

    async with serve(handler) as srv:
        client = await open_connection("127.0.0.1", srv.port)
        try:
            for kind in ("topic", "crash", "wait-topic", "wait-crash"):
                ans = await client.request(
                    RemotingCommand.request(10, ext_fields={"x": kind}), timeout=WAIT
                )
                if kind.endswith("topic"):
                    assert ans.code == ResponseCode.TOPIC_NOT_EXIST, kind
                    assert ans.remark == "no such topic"
                else:
                    assert ans.code == ResponseCode.SYSTEM_ERROR, kind
                    assert ans.remark == "ValueError: boom"
            await asyncio.wait_for(srv.connections[0].wait_handlers(), WAIT)
        finally:
            client.close()


async def test_each_handler_runs_in_a_context_of_its_own() -> None:
    seen: list[str] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(_seen.get())
        _seen.set(cmd.ext_fields["x"])
        if cmd.ext_fields["x"] == "2":
            await asyncio.sleep(0.001)
            seen.append(_seen.get())
        return cmd.response()

    async with serve(handler) as srv:
        raw = await RawClient.connect(srv.port)
        try:
            await raw.send(b"".join(frame(c) for c in requests(3)))
            opaques = sorted([(await raw.read_command()).opaque for _ in range(3)])
        finally:
            await raw.close()
    assert opaques == [1, 2, 3]
    assert sorted(seen) == ["2", "unset", "unset", "unset"]
    assert _seen.get() == "unset"
