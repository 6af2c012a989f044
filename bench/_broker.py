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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from txmq.client import AsyncProducer, LocalTransactionState, Message, TransactionListener
from txmq.client.lifecycle import AsyncClient


def quiet_logs() -> None:
    """Benchmarks print numbers, not the SDK's debug events."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def running(
    cmd: list[str],
    port: int,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 30.0,
    name: str = "broker",
    stop: int = signal.SIGTERM,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (a broker) until the block ends: yields the process once it listens on
    ``port`` (fails if it exits first or does not listen within ``timeout`` seconds); then
    stops it with ``stop`` (SIGINT lets a broker under cProfile write its profile), SIGKILL
    after ``timeout``."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{name}: the broker exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the broker did not listen in {timeout} s")
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


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
    with running(cmd, port) as proc:
        yield f"127.0.0.1:{port}", proc.pid


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


def emitted(stdout: str) -> dict[str, Any] | None:
    """The document of the last JSON line a benchmark printed (:func:`emit`) in ``stdout``;
    None when it printed none."""
    doc: dict[str, Any] | None = None
    for line in stdout.splitlines():
        if line.startswith("JSON "):
            doc = json.loads(line[5:])
    return doc


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


async def run_clients(
    clients: Sequence[AsyncClient],
    seconds: float,
    workers: int,
    one: Callable[[], Awaitable[object]],
) -> tuple[int, float]:
    """Start ``clients``, call ``one()`` once (the route, the topic: not part of the measure),
    then as :func:`run_for`; the clients are shut down after, whatever happened."""
    for c in clients:
        await c.start()
    try:
        await one()
        return await run_for(seconds, workers, one)
    finally:
        for c in clients:
            await c.shutdown()


async def send_until_stored(producer: AsyncProducer, msg: Message, timeout: float) -> None:
    """Send ``msg`` again and again (each try waiting ``timeout`` at most) until a send goes
    through: how a failover bench sees the cluster serving again."""
    while True:
        try:
            await producer.send(msg, timeout=timeout)
            return
        except Exception:
            await asyncio.sleep(0.01)


class CommitAll(TransactionListener):
    """Commits every local transaction (and says so when asked back)."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def send_request(
    connection: Any,
    *,
    group: str,
    topic: str,
    queues: int,
    queue_id: int,
    sys_flag: int,
    properties: str,
    body: bytes,
    timeout: float,
    batch: bool | None = None,
) -> None:
    """One SEND_MESSAGE_V2 request (``batch``: SEND_BATCH_MESSAGE) as a producer makes it, sent
    on ``connection`` (a :class:`~txmq.client.BrokerConnection`); raises unless it was stored."""
    from txmq.protocol.codes import RequestCode
    from txmq.protocol.command import RemotingCommand
    from txmq.protocol.headers import SendMessageRequestHeader

    header = SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        default_topic_queue_nums=queues,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=properties,
        batch=batch,
    )
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    cmd = RemotingCommand.request(code, header.to_v2_ext_fields(), body)
    resp = await connection.request(cmd, timeout)
    if resp.code != 0:
        raise RuntimeError(f"send failed: {resp.code} {resp.remark}")


async def send_raw(
    address: str,
    *,
    group: str,
    topic: str,
    queues: int,
    sys_flag: int,
    body: bytes,
    properties: Iterable[dict[str, str]],
    in_flight: int,
    conns: int,
) -> float:
    """Store one message per item of ``properties`` (a fresh UNIQ_KEY added to each) as plain
    SEND_MESSAGE_V2 requests, round-robin over ``queues`` queues, ``in_flight`` at a time on
    each of ``conns`` connections (no SDK in between: the broker's cost alone); the seconds it
    took."""
    from txmq.protocol.message import MessageConst, UniqIdGenerator, properties_to_string
    from txmq.spark_connector.session import BrokerSession

    ids = UniqIdGenerator()
    items = enumerate(properties)
    t0 = time.monotonic()

    async def sender() -> None:
        async with BrokerSession(address, 120.0) as session:
            sem = asyncio.Semaphore(in_flight)
            tasks: set[asyncio.Future[None]] = set()

            async def one(qid: int, props: str) -> None:
                try:
                    await send_request(
                        session.connection,
                        group=group,
                        topic=topic,
                        queues=queues,
                        queue_id=qid,
                        sys_flag=sys_flag,
                        properties=props,
                        body=body,
                        timeout=120.0,
                    )
                finally:
                    sem.release()

            for i, extra in items:  # shared by the connections: each item is sent once
                props = properties_to_string({MessageConst.UNIQ_KEY: ids.next_id(), **extra})
                await sem.acquire()
                t = asyncio.ensure_future(one(i % queues, props))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)

    await asyncio.gather(*(sender() for _ in range(conns)))
    return time.monotonic() - t0
