"""Connections that hold the broker without using it: a client whose answers stay unread
(the broker's write buffer for it full) for clientWriteStallTimeout is dropped, counted from
when writing to it paused, while a client that reads slowly but steadily is kept; a connection
that sends no whole frame within clientFirstFrameTimeout of being accepted is closed, while
one that sent a frame and waits on a long poll is kept; the gRPC port closes a connection that
sends not even its HTTP/2 preface within the same time.  Each drop is logged
(``connection_dropped``, with the peer) and counted in
``txmq_connections_dropped_total{reason}``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.brokers import closed_by_peer, dropped, raw_broker, started
from tests.support.logs import fresh_loggers
from tests.support.ports import free_port
from tests.support.raw import long_poll, unread_pulls
from tests.support.scrape import scrape, value
from tests.support.waiting import parked_pulls, wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame

STALL_MS = 2000


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """The broker's log lines of the test (a fresh logger: one cached earlier in the session
    keeps processors ``capture_logs`` cannot see into)."""
    fresh_loggers(monkeypatch)
    with capture_logs() as captured:
        yield captured


def _server_side(b: BrokerController, sock: socket.socket) -> Connection | None:
    """The broker's end of ``sock``."""
    port = sock.getsockname()[1]
    return next((c for c in b._connections if c.peer[1] == port), None)


def _paused(b: BrokerController, sock: socket.socket) -> bool:
    conn = _server_side(b, sock)
    return conn is not None and conn._write_paused


def _reader_of_nothing(address: str, frames: bytes) -> socket.socket:
    """A client that sends ``frames`` (requests with large answers) and never reads."""
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(frames)
    return s


def _heartbeat() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, b"{}")


def _drop_lines(
    logs: list[MutableMapping[str, Any]], reason: str
) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "connection_dropped" and e["reason"] == reason]


async def test_a_client_that_stops_reading_is_dropped_after_the_stall_timeout(
    make_broker_config: Callable[..., BrokerConfig], logs: list[MutableMapping[str, Any]]
) -> None:
    metrics_port = free_port()
    cfg = make_broker_config(client_write_stall_timeout=STALL_MS, metrics_port=metrics_port)
    async with raw_broker(cfg) as (b, c):
        # 200 pulls of about 128 KiB each: more than the socket buffers take (a few MiB), so
        # writing to the client pauses.
        frames = await unread_pulls(c, "stall")
        host, _, bport = b.address.rpartition(":")
        with contextlib.closing(socket.create_connection((host, int(bport)))) as greedy:
            greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            greedy.setblocking(False)
            port = greedy.getsockname()[1]
            loop = asyncio.get_running_loop()
            # It reads its first answer, and is older than the stall timeout when it stops reading:
            # the stall counts from the pause, not from the connection's start.
            await loop.sock_sendall(greedy, encode_frame(_heartbeat()))
            first = asyncio.ensure_future(loop.sock_recv(greedy, 4096))
            assert (await asyncio.wait({first}, timeout=10))[0], "no answer to the heartbeat"
            answered = time.monotonic()
            await wait_until(
                lambda: time.monotonic() - answered >= STALL_MS / 1000,
                30,
                "the connection older than the stall timeout",
            )
            await loop.sock_sendall(greedy, frames)
            await wait_until(
                lambda: _paused(b, greedy), 30, "writing to the reader-of-nothing paused"
            )
            paused_at = time.monotonic()
            # Every other client is served while the stalled one is held.
            assert (await c.send("stall", b"meanwhile", queue_id=1)).code == ResponseCode.SUCCESS
            assert dropped(b, "slow_reader") == 0, "dropped before its stall timeout"

            await wait_until(
                lambda: dropped(b, "slow_reader") >= 1, 30, "the stalled client dropped"
            )
            held = time.monotonic() - paused_at  # at most the test's lag in seeing the pause short
            assert held >= STALL_MS / 1000 - 0.5, f"dropped {held:.2f}s after writing paused"
            # the reset reaches the client a moment after the drop is counted
            await wait_until(lambda: closed_by_peer(greedy), 10, "the broker's reset at the client")
            await wait_until(lambda: len(b._connections) == 1, 10, "the dropped connection gone")

            (line,) = _drop_lines(logs, "slow_reader")
            assert line["log_level"] == "warning"
            assert line["peer"] == f"127.0.0.1:{port}"
            assert line["stalled_s"] >= STALL_MS / 1000
            assert line["pending_bytes"] > 0
            assert "answers not read" in line["detail"]
            samples = await asyncio.get_running_loop().run_in_executor(None, scrape, metrics_port)
            assert value(samples, "txmq_connections_dropped_total", reason="slow_reader") == 1.0
            assert value(samples, "txmq_connections_dropped_total", reason="idle") == 0.0

            # ... and served after.
            assert (await c.send("stall", b"after", queue_id=1)).code == ResponseCode.SUCCESS
            _resp, got = await c.pull("stall", 1, 0)
            assert [m.body for m in got] == [b"meanwhile", b"after"]


async def test_a_client_whose_unread_answers_fit_in_its_socket_is_dropped(
    make_broker_config: Callable[..., BrokerConfig], logs: list[MutableMapping[str, Any]]
) -> None:
    """Four pulls (about 512 KiB of answers) fit in the kernel's socket buffer: writing never
    pauses, and the answers sit there unread."""
    async with raw_broker(make_broker_config(client_write_stall_timeout=STALL_MS)) as (b, c):
        frames = await unread_pulls(c, "fits", count=4)
        with contextlib.closing(_reader_of_nothing(b.address, frames)) as greedy:
            port = greedy.getsockname()[1]
            sent = time.monotonic()
            paused: list[bool] = []

            def slow_reader_dropped() -> bool:
                paused.append(_paused(b, greedy))
                return dropped(b, "slow_reader") >= 1

            await wait_until(slow_reader_dropped, 30, "the client with unread answers dropped")
            assert time.monotonic() - sent >= STALL_MS / 1000
            assert not any(paused), "writing paused: the answers did not fit in the socket"
            # the reset reaches the client a moment after the drop is counted
            await wait_until(lambda: closed_by_peer(greedy), 10, "the broker's reset at the client")
            (line,) = _drop_lines(logs, "slow_reader")
            assert line["peer"] == f"127.0.0.1:{port}"
            assert line["stalled_s"] >= STALL_MS / 1000
            assert line["pending_bytes"] > 0
            # The client that reads its answers is kept.
            assert (await c.send("fits", b"after")).code == ResponseCode.SUCCESS
            await wait_until(lambda: len(b._connections) == 1, 10, "the dropped connection gone")


async def test_a_client_that_keeps_sending_and_never_reads_is_dropped(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """Its reader is wedged, its heartbeats go on: each heartbeat's answer goes into the socket,
    which takes it, but the client acknowledges nothing, so it is dropped all the same."""
    async with raw_broker(make_broker_config(client_write_stall_timeout=STALL_MS)) as (b, c):
        frames = await unread_pulls(c, "wedged", count=4)
        with contextlib.closing(_reader_of_nothing(b.address, frames)) as wedged:
            wedged.setblocking(False)
            loop = asyncio.get_running_loop()
            beat = encode_frame(_heartbeat())
            started = time.monotonic()
            deadline = started + 30
            beats = 0
            while dropped(b, "slow_reader") < 1 and time.monotonic() < deadline:
                try:
                    await loop.sock_sendall(wedged, beat)
                except OSError:
                    break  # the broker reset the connection
                beats += 1
                await asyncio.sleep(0.1)  # pacing the heartbeats, not waiting for a result
            # Dropped while its heartbeats went on (a drop counts before the reset is sent).
            assert dropped(b, "slow_reader") == 1, "not dropped in 30 s of heartbeats"
            assert time.monotonic() - started >= STALL_MS / 1000
            assert beats > 1


async def test_a_client_that_reads_slowly_but_steadily_is_not_dropped(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    stall_s = 2.0
    cfg = make_broker_config(client_write_stall_timeout=int(stall_s * 1000))
    async with raw_broker(cfg) as (b, c):
        frames = await unread_pulls(c, "steady")
        with contextlib.closing(_reader_of_nothing(b.address, frames)) as slow:
            slow.setblocking(False)
            loop = asyncio.get_running_loop()
            await wait_until(lambda: _paused(b, slow), 30, "writing to the slow reader paused")
            # Read 4 KiB every 50 ms (about 80 KiB/s, far below what the broker has for it) for
            # two stall timeouts: writing to it stays paused all along, but it takes bytes.
            read = 0
            samples: list[bool] = []
            started = time.monotonic()
            while time.monotonic() - started < 2 * stall_s:
                read += len(await loop.sock_recv(slow, 4096))
                samples.append(_paused(b, slow))
                await asyncio.sleep(0.05)  # pacing the reads, not waiting for a result
            assert all(samples), "writing resumed: the reader was not slow enough to test anything"
            assert read > 0
            assert _server_side(b, slow) is not None, "the steady reader was dropped"
            assert dropped(b, "slow_reader") == 0


async def test_a_connection_that_sends_nothing_is_closed_and_a_long_poll_is_kept(
    make_broker_config: Callable[..., BrokerConfig], logs: list[MutableMapping[str, Any]]
) -> None:
    first_frame_s = 1.0
    cfg = make_broker_config(client_first_frame_timeout=int(first_frame_s * 1000))
    async with raw_broker(cfg) as (b, c):
        host, _, port = b.address.rpartition(":")
        silent: list[socket.socket] = []
        poller: Connection | None = None
        try:
            await c.create_topic("idle", 1)
            # The poller connects first: its deadline passes before the silent ones'.
            poller = await open_connection(host, int(port))
            poll = asyncio.ensure_future(poller.request(long_poll("pollers", "idle"), timeout=90))
            await wait_until(lambda: parked_pulls(b, "idle", 0) == 1, 30, "the long poll parked")
            connected = time.monotonic()
            silent = [socket.create_connection((host, int(port))) for _ in range(3)]
            await wait_until(lambda: dropped(b, "idle") >= 3, 30, "the silent connections closed")
            assert time.monotonic() - connected >= first_frame_s - 0.1
            # Counted when the broker closes them; the close reaches the socket a moment later.
            await wait_until(
                lambda: all(closed_by_peer(s) for s in silent), 10, "the silent sockets closed"
            )
            assert dropped(b, "idle") == 3, "a connection that had sent a frame was closed"
            lines = _drop_lines(logs, "idle")
            assert sorted(e["peer"] for e in lines) == sorted(
                f"127.0.0.1:{s.getsockname()[1]}" for s in silent
            )
            assert all(e["stalled_s"] == first_frame_s for e in lines)

            # The long poll is still held, and answered when its message comes.
            assert not poll.done()
            assert (await c.send("idle", b"woken", queue_id=0)).code == ResponseCode.SUCCESS
            done, _ = await asyncio.wait({poll}, timeout=30)
            assert done, "the parked pull was never answered"
            assert poll.result().code == ResponseCode.SUCCESS
            # The client that sent its first frame at once is still served.
            assert (await c.send("idle", b"still")).code == ResponseCode.SUCCESS
        finally:
            for s in silent:
                s.close()
            if poller is not None:
                poller.close()


async def test_the_first_frame_must_arrive_whole_in_time(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """The deadline is on the first *whole* frame: one begun and not finished in time is
    closed as idle; one finished in time is kept past the deadline."""
    async with started(make_broker_config(client_first_frame_timeout=1000)) as b:
        host, _, port = b.address.rpartition(":")
        frame = encode_frame(_heartbeat())
        whole = socket.create_connection((host, int(port)))
        half = socket.create_connection((host, int(port)))
        try:
            whole.sendall(frame)
            half.sendall(frame[:6])
            whole.setblocking(False)
            answer = asyncio.ensure_future(asyncio.get_running_loop().sock_recv(whole, 4096))
            done, _ = await asyncio.wait({answer}, timeout=10)
            answer.cancel()
            assert done and len(answer.result()) > 0, "the heartbeat got no answer"
            await wait_until(lambda: closed_by_peer(half), 30, "the half-frame connection closed")
            assert dropped(b, "idle") == 1
            assert _server_side(b, whole) is not None, "the connection that sent a frame was closed"
        finally:
            whole.close()
            half.close()


async def test_the_grpc_port_closes_a_connection_that_sends_no_preface(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    grpc = pytest.importorskip("grpc", reason="the grpc extra is not installed")
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    b = BrokerController(
        make_broker_config(
            grpc_server_enable=True, grpc_server_port=0, client_first_frame_timeout=1000
        )
    )
    await b.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}")
    silent = socket.create_connection(("127.0.0.1", b.grpc_port))
    connected = time.monotonic()
    try:
        stub = sgrpc.MessagingServiceStub(channel)
        md = (("x-mq-client-id", "stall-client-1"), ("x-mq-language", "PYTHON"))

        async def route() -> Any:
            req = spb.QueryRouteRequest(topic=pb.Resource(name="grpc-idle"))
            return await stub.QueryRoute(req, metadata=md, timeout=10)

        first = await route()
        await wait_until(lambda: closed_by_peer(silent), 30, "the silent gRPC connection closed")
        assert time.monotonic() - connected >= 0.9
        # The channel that spoke HTTP/2 at once is kept past the deadline.
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        assert (await route()).status.code == first.status.code
    finally:
        silent.close()
        await channel.close()
        await b.shutdown()
