"""Floods the broker must shrug off, in the small (bench/floods.py has the full sizes and
figures): a thousand idle connections and two hundred parked long polls while another client
sends; it keeps its latency, every parked pull is still answered when its message arrives, and
what the floods held is released when they go.  Clients that pipeline pulls and stop reading
hold no more than the answer window each and are dropped."""

from __future__ import annotations

import asyncio
import resource
import socket
import statistics
import time
from collections.abc import Callable

import pytest

from tests.support.raw import RawClient, long_poll, unread_pulls
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import ANSWER_WINDOW, BrokerController
from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand

IDLE = 1000
PARKED = 200


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
def many_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 4 * (IDLE + PARKED) + 512  # both ends of every connection live in this process
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def _latencies(c: RawClient, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await c.send("probe", b"p%d" % i)
        out.append(time.perf_counter() - t0)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return out


async def test_idle_connections_and_parked_polls_leave_other_clients_served(
    many_files: None, make_broker_config: Callable[..., BrokerConfig]
) -> None:
    b = BrokerController(make_broker_config(default_topic_queue_nums=8))
    await b.start()
    probe = await RawClient.connect(b.address)
    host, _, port = b.address.rpartition(":")
    idle: list[asyncio.StreamWriter] = []
    pollers: list[Connection] = []
    pulls: list[asyncio.Task[RemotingCommand]] = []
    try:
        # The topic exists, empty: the pulls below park.
        made = await probe.call(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "parked", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6},
        )
        assert made.code == ResponseCode.SUCCESS, made.remark
        await _latencies(probe, 20)
        before = statistics.median(await _latencies(probe, 100))
        rss_before = _rss_mib()

        for _ in range(IDLE):
            idle.append((await asyncio.open_connection(host, int(port)))[1])
        for _ in range(PARKED // 10):
            pollers.append(await open_connection(host, int(port)))
        for i, conn in enumerate(pollers):
            for j in range(10):
                pulls.append(
                    asyncio.create_task(
                        conn.request(long_poll("parkers", "parked", (i + j) % 8), timeout=90)
                    )
                )
        await wait_until(
            lambda: sum(b.ctx.hold.parked("parked", q) for q in range(8)) == PARKED,
            30,
            f"{PARKED} pulls parked",
        )
        await wait_until(lambda: len(b._connections) >= IDLE + PARKED // 10 + 1, 30)

        during = statistics.median(await _latencies(probe, 100))
        # Generous: the machine is shared, and both ends of 1,200 connections are in this
        # process.
        assert during <= max(5 * before, 0.05), (before, during)
        grew = _rss_mib() - rss_before
        assert grew < 200, f"RSS grew by {grew:.0f} MiB for {IDLE} connections"
        assert not any(t.done() for t in pulls), "a parked pull was answered early"

        # A message to each queue answers every parked pull on it.
        for q in range(8):
            assert (await probe.send("parked", b"q%d" % q, queue_id=q)).code == 0
        done, pending = await asyncio.wait(pulls, timeout=30)
        assert not pending, f"{len(pending)} parked pulls were never answered"
        assert all(t.result().code == ResponseCode.SUCCESS for t in done)
    finally:
        for t in pulls:
            t.cancel()
        for w in idle:
            w.close()
        for conn in pollers:
            conn.close()
        try:
            # What the floods held is released: only the probe's connection is left.
            await wait_until(lambda: len(b._connections) == 1, 30, "the floods' connections closed")
        finally:
            await probe.close()
            await b.shutdown()


async def test_clients_that_stop_reading_hold_a_bounded_backlog_and_are_dropped(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """Each pipelines 200 pulls of about 128 KiB answers (25 MiB, under the default 64 MiB
    maxConnectionWriteBuffer) and reads nothing: the broker answers up to the answer window,
    holds the rest of the requests unanswered, and drops them after clientWriteStallTimeout."""
    b = BrokerController(make_broker_config(client_write_stall_timeout=2000))
    await b.start()
    c = await RawClient.connect(b.address)
    host, _, port = b.address.rpartition(":")
    greedy: list[socket.socket] = []
    try:
        frames = await unread_pulls(c, "wide")
        for _ in range(5):
            s = socket.create_connection((host, int(port)))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(frames)
            greedy.append(s)
        await wait_until(lambda: len(b._connections) == 6, 10)
        # Each holds at most the window and the answer that crossed it, not 25 MiB.
        bound = ANSWER_WINDOW + 256 * 1024
        peaks: list[int] = []

        def all_held() -> bool:
            backlogs = [conn.backlog for conn in b._connections]
            peaks.append(max(backlogs))
            return sum(1 for x in backlogs if x > 0) == len(greedy)

        await wait_until(all_held, 30, "every reader-of-nothing holding unread answers")
        assert 0 < max(peaks) <= bound, (max(peaks), bound)
        # Everyone else is served meanwhile.
        assert (await c.send("wide", b"after", queue_id=1)).code == ResponseCode.SUCCESS
        await wait_until(lambda: len(b._connections) == 1, 30, "the readers-of-nothing dropped")
        key = "txmq_connections_dropped_total{reason=slow_reader}"
        dropped = b.metrics.snapshot().get(key, 0.0)
        assert dropped == len(greedy), dropped
    finally:
        for s in greedy:
            s.close()
        await c.close()
        await b.shutdown()
