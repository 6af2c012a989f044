"""Floods and fairness: one broker, an unaffected client's send latency unloaded and then under
each flood in turn, and the broker's RSS before, during and after each.

    python bench/floods.py                     # every flood
    python bench/floods.py --floods idle,loris --probe-seconds 5

Floods (each set up, held while the probe runs, then taken down):

* ``idle``: 5,000 connections that send nothing;
* ``parked``: 1,000 long-polled pulls parked on an empty queue (100 connections, 10 each);
* ``noread``: 50 clients that pipeline pulls of about 128 KiB answers and never read
  (maxConnectionWriteBuffer drops them; reading their requests pauses before);
* ``loris``: 200 connections that send a frame's first bytes and then one byte a second
  (frameReadTimeout drops them: the script waits for it, up to ``--loris-wait`` s);
* ``topics``: 10,000 topics (``--topics``) created by their first send, one message pulled from
  each (consume-queue files are kept within ``maxOpenConsumeQueueFiles``, half the open-files
  limit by default; ``--max-open-cq-files`` sets it).

The probe is a separate process (so the flood's own client work is not in its figures): one
connection, sequential 256-byte SEND_MESSAGE_V2 for ``--probe-seconds``; it reports p50 and
p99.  The ratio is the flood's p99 over the unloaded p99.  RLIMIT_NOFILE is raised to its hard
limit here, and the broker (a child) inherits it.  Each row also gives the broker's open
descriptors (``/proc/PID/fd``) before, at the peak of and after the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _broker import emit, percentiles, quiet_logs, spawn_broker  # noqa: E402

from txmq.protocol.aio import Connection, open_connection  # noqa: E402
from txmq.protocol.codes import RequestCode  # noqa: E402
from txmq.protocol.command import RemotingCommand  # noqa: E402
from txmq.protocol.frame import encode_frame  # noqa: E402
from txmq.protocol.headers import (  # noqa: E402
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.message import MessageConst, UniqIdGenerator, properties_to_string  # noqa: E402

_ids = UniqIdGenerator()
FLOODS = ("idle", "parked", "noread", "loris", "topics")


def raise_nofile(want: int = 262_144) -> int:
    """Open files: ``want`` where allowed (root may raise the hard limit), else the hard
    limit.  Every connection is a file; consume-queue files are bounded by the broker."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))
        return want
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def send_cmd(topic: str, body: bytes, queue_id: int = 0) -> RemotingCommand:
    h = SendMessageRequestHeader(
        producer_group="flood-bench",
        topic=topic,
        queue_id=queue_id,
        born_timestamp=int(time.time() * 1000),
        properties=properties_to_string({MessageConst.UNIQ_KEY: _ids.next_id()}),
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext_fields(), body)


def pull_cmd(topic: str, queue_id: int, offset: int, suspend_ms: int = 0) -> RemotingCommand:
    h = PullMessageRequestHeader(
        consumer_group="flood-bench",
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=0x4 | (0x2 if suspend_ms else 0),
        suspend_timeout_millis=suspend_ms,
        subscription="*",
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, h.to_ext_fields())


async def connect(address: str) -> Connection:
    host, port = _split(address)
    return await open_connection(host, port, timeout=30.0)


# -- the probe (its own process) -----------------------------------------------------------------


async def probe(address: str, seconds: float) -> dict[str, float]:
    conn = await connect(address)
    try:
        await conn.request(send_cmd("flood-probe", b"w" * 256), 10.0)  # creates the topic
        lat: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = await conn.request(send_cmd("flood-probe", b"p" * 256), 10.0)
            lat.append((time.perf_counter() - t0) * 1000)
            if r.code != 0:
                raise RuntimeError(f"probe send failed: {r.code} {r.remark}")
        pct = percentiles(lat, (50, 99))
        return {"sends": len(lat), "p50_ms": round(pct["p50"], 3), "p99_ms": round(pct["p99"], 3)}
    finally:
        conn.close()


def run_probe(address: str, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--probe", address, "--probe-seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# -- the floods ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def idle(address: str) -> AsyncIterator[str]:
    host, port = _split(address)
    writers = []
    try:
        for _ in range(5000):
            _, w = await asyncio.open_connection(host, port)
            writers.append(w)
        yield f"{len(writers)} idle connections"
    finally:
        for w in writers:
            w.close()


@contextlib.asynccontextmanager
async def parked(address: str) -> AsyncIterator[str]:
    conns = [await connect(address) for _ in range(100)]
    r = await conns[0].request(send_cmd("flood-parked", b"x"), 10.0)  # the topic exists
    assert r.code == 0, r.remark
    tasks = []
    for i, c in enumerate(conns):
        for j in range(10):
            q = (i * 10 + j) % 4
            offset = 1 if q == 0 else 0  # each queue's end: nothing to answer
            tasks.append(
                asyncio.create_task(c.request(pull_cmd("flood-parked", q, offset, 60_000), 90))
            )
    await asyncio.sleep(2.0)  # they reach the broker and park
    answered = sum(t.done() for t in tasks)
    try:
        yield f"{len(tasks) - answered} pulls parked ({answered} answered early)"
    finally:
        for t in tasks:
            t.cancel()
        for c in conns:
            c.close()


@contextlib.asynccontextmanager
async def noread(address: str) -> AsyncIterator[str]:
    conn = await connect(address)
    for i in range(64):  # 64 messages of 4 KiB: a pull of 32 answers about 128 KiB
        r = await conn.request(send_cmd("flood-noread", bytes(4096) + b"%d" % i), 10.0)
        assert r.code == 0, r.remark
    conn.close()
    frames = b"".join(encode_frame(pull_cmd("flood-noread", 0, 0)) for _ in range(200))
    host, port = _split(address)
    socks = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, port))
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.send(frames)
            socks.append(s)
        await asyncio.sleep(2.0)
        yield f"{len(socks)} clients that stopped reading, 200 pulls each"
    finally:
        for s in socks:
            s.close()


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1 << 16, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@contextlib.asynccontextmanager
async def loris(address: str, wait: float) -> AsyncIterator[str]:
    host, port = _split(address)
    frame = encode_frame(send_cmd("flood-loris", b"z" * 100))
    socks = []
    for _ in range(200):
        s = socket.socket()
        s.connect((host, port))
        s.setblocking(False)
        s.send(frame[:6])
        socks.append(s)
    sent = [6] * len(socks)
    stop = asyncio.Event()

    async def dribble() -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            for i, s in enumerate(socks):
                if sent[i] < len(frame) - 1:
                    with contextlib.suppress(OSError):
                        s.send(frame[sent[i] : sent[i] + 1])
                        sent[i] += 1

    task = asyncio.create_task(dribble())
    started = time.monotonic()
    note: list[str] = []
    try:
        yield f"{len(socks)} slow-loris connections (one byte a second)"
        deadline = started + wait
        while time.monotonic() < deadline and not all(_closed(s) for s in socks):
            await asyncio.sleep(0.5)
        dropped = sum(_closed(s) for s in socks)
        note.append(
            f"{dropped}/{len(socks)} dropped by the broker {time.monotonic() - started:.0f}s after connecting"
        )
    finally:
        stop.set()
        task.cancel()
        for s in socks:
            s.close()
        if note:
            print("  loris:", note[0])
            LORIS_NOTE.extend(note)


LORIS_NOTE: list[str] = []


@contextlib.asynccontextmanager
async def topics(address: str, n: int) -> AsyncIterator[str]:
    conns = [await connect(address) for _ in range(4)]
    t0 = time.monotonic()

    async def make(k: int) -> None:
        for i in range(k, n, 16):
            r = await conns[i % 4].request(send_cmd(f"flood-topic-{i}", b"t"), 30.0)
            assert r.code == 0, r.remark
            r = await conns[i % 4].request(pull_cmd(f"flood-topic-{i}", 0, 0), 30.0)
            assert r.code in (0, 19, 20), (r.code, r.remark)

    await asyncio.gather(*(make(k) for k in range(16)))
    took = time.monotonic() - t0
    try:
        yield f"{n} topics created by a send and read by a pull in {took:.1f}s"
    finally:
        for c in conns:
            c.close()


async def main(args: argparse.Namespace) -> None:
    nofile = raise_nofile()
    quiet_logs()
    chosen = [f for f in args.floods.split(",") if f]
    settings: dict[str, object] = {}
    if args.max_open_cq_files:
        settings["maxOpenConsumeQueueFiles"] = args.max_open_cq_files
    with (
        tempfile.TemporaryDirectory(prefix="txmq-floods-") as tmp,
        spawn_broker(tmp, settings) as (address, pid),
    ):
        await asyncio.sleep(1.0)
        run_probe(address, 1.0)  # warm-up
        base = run_probe(address, args.probe_seconds)
        print(f"unloaded: {json.dumps(base)} rss_mib {rss_mib(pid)}")
        rows: dict[str, object] = {
            "nofile": nofile,
            "unloaded": base,
            "rss_start_mib": rss_mib(pid),
            "fds_start": open_fds(pid),
        }
        makers: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[str]]] = {
            "idle": lambda: idle(address),
            "parked": lambda: parked(address),
            "noread": lambda: noread(address),
            "loris": lambda: loris(address, args.loris_wait),
            "topics": lambda: topics(address, args.topics),
        }
        for name in chosen:
            before, fds_before = rss_mib(pid), open_fds(pid)
            async with makers[name]() as what:
                during, fds_during = rss_mib(pid), open_fds(pid)
                loop = asyncio.get_running_loop()
                p = await loop.run_in_executor(None, run_probe, address, args.probe_seconds)
                peak = max(during, rss_mib(pid))
                fds_peak = max(fds_during, open_fds(pid))
            await asyncio.sleep(2.0)
            after = rss_mib(pid)
            row = {
                "what": what,
                "probe": p,
                "p99_ratio": round(p["p99_ms"] / base["p99_ms"], 2),
                "rss_mib": {"before": before, "during": peak, "after": after},
                "fds": {"before": fds_before, "during": fds_peak, "after": open_fds(pid)},
            }
            if name == "loris" and LORIS_NOTE:
                row["dropped"] = LORIS_NOTE[-1]
            print(f"{name}: {json.dumps(row)}")
            rows[name] = row
        rows["rss_end_mib"] = rss_mib(pid)
        emit(rows)


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--floods", default=",".join(FLOODS), help="comma list of " + ", ".join(FLOODS))
    ap.add_argument("--probe-seconds", type=float, default=5.0)
    ap.add_argument("--topics", type=int, default=10_000, help="topics of the topics flood")
    ap.add_argument(
        "--max-open-cq-files",
        type=int,
        default=0,
        help="the broker's maxOpenConsumeQueueFiles (0: its default, half the open-files limit)",
    )
    ap.add_argument("--loris-wait", type=float, default=45.0, help="seconds to wait for the drops")
    ap.add_argument("--probe", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        quiet_logs()
        print(json.dumps(asyncio.run(probe(args.probe, args.probe_seconds))))
        return
    from txmq.broker.server import new_event_loop

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main(args))


if __name__ == "__main__":
    cli()
