"""Start a throwaway broker in a child process for a benchmark (or use --broker)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from txmq.client import LocalTransactionState, Message, TransactionListener


def quiet_logs() -> None:
    """Benchmarks print numbers, not the SDK's debug events."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def spawn_broker(
    store: str,
    settings: dict[str, object] | None = None,
    flush: str = "ASYNC_FLUSH",
) -> Iterator[tuple[str, int]]:
    """A broker in a child process on ``store``: yields its address and pid, and stops it
    (SIGTERM, then SIGKILL after 30 s) at the end."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "txmq",
        "broker",
        "--store-dir",
        store,
        "--port",
        str(port),
        "--flush",
        flush,
        "--log-level",
        "WARNING",
    ]
    for k, v in (settings or {}).items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the broker did not start")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def broker_process(
    settings: dict[str, object] | None = None,
    flush: str = "ASYNC_FLUSH",
    address: str | None = None,
) -> Iterator[str]:
    """Yield a broker address: ``address`` if given, else a fresh broker in a temp folder."""
    if address:
        yield address
        return
    with (
        tempfile.TemporaryDirectory(prefix="txmq-bench-") as tmp,
        spawn_broker(tmp, settings, flush) as (started, _pid),
    ):
        yield started


async def drain_topic(address: str, topic: str, group: str = "bench-reader") -> list[bytes]:
    """Every message body stored in ``topic``, queue by queue, in offset order."""
    from txmq.client import AsyncPullConsumer

    bodies: list[bytes] = []
    consumer = AsyncPullConsumer(group, broker=address)
    await consumer.start()
    try:
        for qid in await consumer.fetch_queues(topic):
            offset = 0
            while True:
                r = await consumer.pull(topic, qid, offset, max_nums=256)
                if not r.messages:
                    break
                bodies.extend(m.body for m in r.messages)
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()
    return bodies


def percentiles(
    values: list[float], ps: tuple[float, ...] = (50, 90, 99, 99.9)
) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    out = {f"p{p:g}": s[min(len(s) - 1, int(len(s) * p / 100))] for p in ps}
    out["max"] = s[-1]
    return out


def emit(doc: dict[str, object]) -> None:
    """Print a human summary line per key and one JSON line for machines."""
    for k, v in doc.items():
        print(f"{k:32} {v}")
    print("JSON " + json.dumps(doc, default=str))
    sys.stdout.flush()


async def run_for(seconds: float, workers: int, one: Any) -> tuple[int, float]:
    """Run ``one()`` in ``workers`` concurrent loops for ``seconds``: (calls completed, elapsed
    seconds)."""
    done = 0
    stop_at = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            await one()
            done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(workers)))
    return done, time.monotonic() - t0


class CommitAll(TransactionListener):
    """Commits every local transaction (and says so when asked back)."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE
