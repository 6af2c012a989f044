"""Many more consume queues than open files: a broker with ``maxOpenConsumeQueueFiles = 64``
serves 500 topics x 4 queues (2,000 consume-queue files), across a SIGKILL and a restart, with
every message readable and its open descriptors (counted in /proc/PID/fd) within the bound plus
a fixed margin the whole time."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import threading

import pytest

from tests.support.process import BrokerProcess, running
from tests.support.raw import RawClient
from tests.support.waiting import wait_until_sync
from txmq.protocol.codes import ResponseCode

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/fd")

BOUND = 64
TOPICS = 500
QUEUES = 4
#: Descriptors the broker may open beyond its idle count and the consume-queue bound: new
#: commit-log segments, table rewrites, the test's own connections.
MARGIN = 24
CLIENTS = 8
SEGMENT = re.compile(r"^\d{20}$")


def fds(pid: int) -> tuple[int, int]:
    """(all open descriptors, those on consume-queue segment files) of process ``pid``."""
    total = cq = 0
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            target = os.readlink(os.path.join(base, name))
        except FileNotFoundError:
            continue  # closed while listed
        total += 1
        # a segment file (the flush also opens queue folders for a moment, to fsync them)
        if f"{os.sep}consumequeue{os.sep}" in target and SEGMENT.match(os.path.basename(target)):
            cq += 1
    return total, cq


def _all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (state T in /proc/PID/task/*/stat)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            continue  # the thread ended
        if state not in ("T", "t"):
            return False
    return True


def frozen_fds(pid: int) -> tuple[int, int]:
    """:func:`fds` of ``pid`` read while the process is stopped (SIGSTOP, then SIGCONT), so
    that no descriptor closes or opens while the listing is read. Listing a running process can
    count a descriptor closed after it was read and another opened after that, which is not a
    state the process was ever in. The wait for every thread to stop is polled finely: the
    broker stands still for as long as it lasts (a thread in an uninterruptible wait, such as
    a long fsync, stops only when it returns)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until_sync(
            lambda: _all_stopped(pid), 30, "every thread of the broker stopped", interval=0.0002
        )
        return fds(pid)
    finally:
        os.kill(pid, signal.SIGCONT)


class FdWatch:
    """Samples the broker's descriptors every few milliseconds while it runs (each sample read
    with the broker stopped for a moment) and keeps the peaks; reads its log meanwhile (a full
    pipe would block it)."""

    def __init__(self, bp: BrokerProcess) -> None:
        assert bp.proc is not None
        self.bp = bp
        self.pid = bp.proc.pid
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self.peak_total = 0
        self.peak_cq = 0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            total, cq = frozen_fds(self.pid)
            self.peak_total = max(self.peak_total, total)
            self.peak_cq = max(self.peak_cq, cq)
            self.samples += 1
            await asyncio.sleep(0.005)  # the sampling period: the broker runs between samples

    def _read_log(self) -> None:
        while not self._stop.is_set():
            self.bp.drain_logs(0.1)

    async def __aenter__(self) -> FdWatch:
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None and self._reader is not None
        self._task.cancel()
        (ended,) = await asyncio.gather(self._task, return_exceptions=True)
        self._stop.set()
        await asyncio.to_thread(self._reader.join, 10)
        assert not self._reader.is_alive(), "log reader did not stop"
        if isinstance(ended, BaseException) and not isinstance(ended, asyncio.CancelledError):
            raise ended  # the sampler failed (a broker that did not stop): the test fails


def body(topic: int, queue: int, round_: int) -> bytes:
    return f"t{topic}-q{queue}-r{round_}".encode()


async def send_all(address: str, round_: int) -> None:
    clients = [await RawClient.connect(address) for _ in range(CLIENTS)]
    try:

        async def worker(k: int) -> None:
            c = clients[k]
            for t in range(k, TOPICS, CLIENTS):
                for q in range(QUEUES):
                    resp = await c.send(f"fdb-{t}", body(t, q, round_), queue_id=q)
                    assert resp.code == ResponseCode.SUCCESS, (t, q, resp.code, resp.remark)

        await asyncio.gather(*(worker(k) for k in range(CLIENTS)))
    finally:
        for c in clients:
            await c.close()


async def read_all(address: str) -> dict[tuple[int, int], list[bytes]]:
    clients = [await RawClient.connect(address) for _ in range(CLIENTS)]
    got: dict[tuple[int, int], list[bytes]] = {}
    try:

        async def worker(k: int) -> None:
            c = clients[k]
            for t in range(k, TOPICS, CLIENTS):
                for q in range(QUEUES):
                    resp, msgs = await c.pull(f"fdb-{t}", q, 0)
                    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (
                        t,
                        q,
                        resp.code,
                        resp.remark,
                    )
                    got[(t, q)] = [m.body for m in msgs]

        await asyncio.gather(*(worker(k) for k in range(CLIENTS)))
    finally:
        for c in clients:
            await c.close()
    return got


def expect(rounds: int) -> dict[tuple[int, int], list[bytes]]:
    return {
        (t, q): [body(t, q, r) for r in range(rounds)] for t in range(TOPICS) for q in range(QUEUES)
    }


def check_bound(watch: FdWatch, idle: int, what: str) -> None:
    assert watch.samples > 0
    assert watch.peak_cq <= BOUND, (
        f"{what}: {watch.peak_cq} consume-queue files open, bound {BOUND}"
    )
    assert watch.peak_total <= idle + BOUND + MARGIN, (
        f"{what}: {watch.peak_total} descriptors open, idle {idle} + bound {BOUND} + {MARGIN}"
    )


@pytest.mark.external
async def test_2000_consume_queues_within_64_open_files(tmp_path) -> None:
    with running(
        str(tmp_path / "store"),
        flush="ASYNC_FLUSH",
        settings={"maxOpenConsumeQueueFiles": BOUND},
    ) as bp:
        address = bp.address
        assert bp.proc is not None
        idle, _ = fds(bp.proc.pid)
        async with FdWatch(bp) as watch:
            await send_all(address, 0)
            assert await read_all(address) == expect(1)
        check_bound(watch, idle, "first life")

        bp.kill()
        address = bp.start()
        assert bp.proc is not None
        async with FdWatch(bp) as watch:
            assert await read_all(address) == expect(1), "lost across SIGKILL"
            await send_all(address, 1)  # appends to files closed and opened again
            assert await read_all(address) == expect(2)
        check_bound(watch, idle, "after SIGKILL")

        assert bp.terminate() == 0
        address = bp.start()
        assert bp.proc is not None
        async with FdWatch(bp) as watch:
            assert await read_all(address) == expect(2), "lost across a clean restart"
        check_bound(watch, idle, "after restart")
