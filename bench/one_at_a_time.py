"""CPU per request of the one-at-a-time figures (the peers harness's ``pub.one`` and ``txn.1``,
the same user code), on both sides: the SDK's process CPU and the broker's (/proc).

    python bench/one_at_a_time.py                         # the SDK compiled
    TXMQ_PURE_PYTHON=1 python bench/one_at_a_time.py      # the SDK as plain Python

Each round runs two brokers of this checkout one after the other, one compiled and one with
``TXMQ_PURE_PYTHON=1`` (ASYNC_FLUSH, a fresh store each); each figure runs ``--count`` requests
after a warm-up and prints µs of CPU per request for the SDK process and the broker process
(user time, and user + system).  Medians of ``--rounds``.  Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

from _scratch import scratch_dir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TICKS = os.sysconf("SC_CLK_TCK")
BODY = b"x" * 1024


def broker_cpu(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


@contextlib.contextmanager
def broker(pure: str) -> Iterator[tuple[str, int]]:
    from _broker import free_port, running  # the SDK is imported once the switch is set

    port = free_port()
    env = dict(os.environ)
    env.pop("TXMQ_PURE_PYTHON", None)
    if pure:
        env["TXMQ_PURE_PYTHON"] = pure
    with scratch_dir("txmq-one-") as scratch:
        store = str(scratch)
        cmd = [sys.executable, "-m", "txmq", "broker", "--port", str(port), "--store-dir", store]
        with running(cmd, port, env=env) as proc:
            yield f"127.0.0.1:{port}", proc.pid


async def figures(address: str, pid: int, count: int) -> dict[str, tuple[float, float, float]]:
    from _broker import CommitAll

    from txmq.client import (
        AsyncProducer,
        AsyncTransactionProducer,
        LocalTransactionState,
        Message,
        SendStatus,
    )
    from txmq.client.admin import AsyncAdminClient

    topic = "one-at-a-time"
    async with AsyncAdminClient(address, timeout=30.0) as admin:
        await admin.create_topic(topic, queues=4)
    producer = AsyncProducer("one-producer", address, request_timeout=30.0)
    # The listener is only consulted by check-back (which should not happen).
    txp = AsyncTransactionProducer("one-tx", CommitAll(), address, request_timeout=30.0)
    await producer.start()
    await txp.start()

    async def pub_one() -> None:
        r = await producer.send(Message(topic, BODY))
        if r.status is not SendStatus.SEND_OK:
            raise RuntimeError(f"send answered {r.status}")

    async def txn_one() -> None:
        async with txp.transaction() as t:
            await t.send(Message(topic, BODY))
        if t.state is not LocalTransactionState.COMMIT_MESSAGE:
            raise RuntimeError(f"transaction ended {t.state}")

    async def timed(op: Callable[[], Awaitable[None]], n: int) -> tuple[float, float, float]:
        for _ in range(min(200, n)):
            await op()
        c0, (u0, s0) = time.process_time(), broker_cpu(pid)
        for _ in range(n):
            await op()
        c1, (u1, s1) = time.process_time(), broker_cpu(pid)
        return (c1 - c0) / n * 1e6, (u1 - u0) / n * 1e6, (u1 + s1 - u0 - s0) / n * 1e6

    try:
        return {"pub.one": await timed(pub_one, count), "txn.1": await timed(txn_one, count)}
    finally:
        await producer.shutdown()
        await txp.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=3000, help="requests per figure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--broker",
        action="append",
        metavar="NAME=SWITCH",
        help="a broker to measure: TXMQ_PURE_PYTHON's value for it (empty: all compiled; "
        "default: compiled= and pure=1)",
    )
    args = ap.parse_args()
    kinds = dict(b.partition("=")[::2] for b in args.broker or ["compiled=", "pure=1"])
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from txmq import _compiled

    print(f"SDK: {_compiled.STATUS.describe()}")
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for kind, switch in kinds.items():
            with broker(switch) as (address, pid):
                for name, value in asyncio.run(figures(address, pid, args.count)).items():
                    runs.setdefault((name, kind), []).append(value)
                    print(
                        f"  {name} broker {kind}: SDK {value[0]:.1f} µs, broker user "
                        f"{value[1]:.1f} µs, user+sys {value[2]:.1f} µs",
                        flush=True,
                    )
    for (name, kind), values in runs.items():
        sdk, user, both = (statistics.median(v[i] for v in values) for i in range(3))
        print(
            f"{name} broker {kind}: median SDK {sdk:.1f} µs/request, broker user {user:.1f}, "
            f"user+sys {both:.1f} µs/request"
        )


if __name__ == "__main__":
    main()
