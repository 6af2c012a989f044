"""Many pending transactions: memory, idle check scheduling, restart, and checks once due.

Starts a broker (a child process on a temporary store), stores ``--count`` one-half
transactions (SEND_MESSAGE_V2, many in flight: a batch holds the halves of one transaction,
and these are separate transactions, as producers send them) with a ``transactionTimeOut`` so large
that none is due, and prints:

* the broker's RSS per pending half (RSS after minus RSS before, over the count);
* the broker's CPU per second while idle for ``--idle`` seconds, nothing due, check rounds every
  ``--interval`` ms (first with no pending transaction, then with all of them);
* the restart time: SIGTERM, then a new broker on the store until it answers a request;
* the restarted broker (``transactionTimeOut`` 0: all of them due, checks every
  ``--drain-interval`` ms) with a producer (the SDK) that answers every check with COMMIT:
  checks sent and answered per second, from the first check until none is pending.

    python bench/pending_halves.py                 # 1,000,000 pending halves
    python bench/pending_halves.py --count 20000   # a quick try
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import CommitAll, emit, quiet_logs, send_raw, spawn_broker  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

from txmq.client import AsyncTransactionProducer  # noqa: E402
from txmq.client.admin import AsyncAdminClient  # noqa: E402
from txmq.protocol.message import (  # noqa: E402
    MessageConst,
    MessageSysFlag,
)

TOPIC = "bench-pending"
GROUP = "bench-pending-tx"
QUEUES = 4
NEVER_MS = 10**12  # transactionTimeOut while filling: nothing is due


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def metrics(address: str) -> dict[str, Any]:
    async with AsyncAdminClient(address) as admin:
        return dict(await admin.metrics())


def pending_of(m: dict[str, Any]) -> int:
    return int(sum(v for k, v in m.items() if k.startswith("txmq_transaction_pending{")))


async def fill(address: str, count: int, body_size: int, in_flight: int, conns: int) -> float:
    """Store ``count`` one-half transactions (one SEND_MESSAGE_V2 each, ``in_flight`` at a time
    on each of ``conns`` connections); returns the seconds it took."""
    half = {MessageConst.TRAN_MSG: "true", MessageConst.PGROUP: GROUP}
    return await send_raw(
        address,
        group=GROUP,
        topic=TOPIC,
        queues=QUEUES,
        sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
        body=b"p" * body_size,
        properties=(half for _ in range(count)),
        in_flight=in_flight,
        conns=conns,
    )


def idle_cpu(pid: int, seconds: float) -> float:
    """The broker's CPU seconds per second over ``seconds`` of idling."""
    c0, t0 = proc_cpu(pid), time.monotonic()
    time.sleep(seconds)
    return (proc_cpu(pid) - c0) / (time.monotonic() - t0)


async def drain_with_producer(
    address: str, pid: int, timeout: float, check_threads: int, check_queue: int
) -> dict[str, Any]:
    """Connect a producer answering every check with COMMIT; wait until none is pending."""
    producer = AsyncTransactionProducer(
        GROUP,
        CommitAll(),
        address,
        request_timeout=30.0,
        check_threads=check_threads,
        check_queue_size=check_queue,
    )
    t0 = time.monotonic()
    c0 = proc_cpu(pid)
    await producer.start()
    try:
        m = await metrics(address)
        while not m.get("txmq_transaction_checks_sent_total") and time.monotonic() - t0 < timeout:
            await asyncio.sleep(0.05)  # the first round after the producer registered
            m = await metrics(address)
        t0 = time.monotonic()
        c0 = proc_cpu(pid)
        while pending_of(m) and time.monotonic() - t0 < timeout:
            await asyncio.sleep(0.5)
            m = await metrics(address)
        elapsed = time.monotonic() - t0
    finally:
        await producer.shutdown()
    sent = int(m.get("txmq_transaction_checks_sent_total", 0))
    answered = int(m.get("txmq_transaction_checks_answered_total", 0))
    return {
        "left_pending": pending_of(m),
        "checks_sent": sent,
        "checks_answered": answered,
        "commits": int(m.get("txmq_transaction_commits_total", 0)),
        "drain_s": round(elapsed, 1),
        "checks_sent_per_s": round(sent / elapsed),
        "checks_answered_per_s": round(answered / elapsed),
        "broker_cpu_while_draining": round((proc_cpu(pid) - c0) / elapsed, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="pending one-half transactions")
    ap.add_argument("--body", type=int, default=128, help="body bytes of a half")
    ap.add_argument("--in-flight", type=int, default=128, help="sends in flight a connection")
    ap.add_argument("--connections", type=int, default=2, help="sending connections")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    ap.add_argument("--interval", type=int, default=1000, help="transactionCheckInterval, ms")
    ap.add_argument(
        "--drain-interval",
        type=int,
        default=10_000,
        help="transactionCheckInterval after the restart, ms (a check unanswered this long is "
        "sent again)",
    )
    ap.add_argument("--check-threads", type=int, default=8, help="the producer's check_threads")
    ap.add_argument(
        "--check-queue", type=int, default=100_000, help="the producer's check_queue_size"
    )
    ap.add_argument("--drain-timeout", type=float, default=1800.0, help="seconds to wait")
    ap.add_argument("--store", help="store folder (default: a temporary one)")
    args = ap.parse_args()
    quiet_logs()
    with scratch_dir("txmq-pending-", keep=args.store) as root:
        run(args, str(root))


def run(args: argparse.Namespace, root: str) -> None:
    settings: dict[str, object] = {
        "transactionTimeOut": NEVER_MS,
        "transactionCheckInterval": args.interval,
    }
    out: dict[str, object] = {"count": args.count, "check_interval_ms": args.interval}
    with spawn_broker(root, settings) as (address, pid):
        rss0 = proc_rss_mib(pid)
        out["idle_cpu_per_s_0_pending"] = round(idle_cpu(pid, args.idle), 4)
        fill_s = asyncio.run(fill(address, args.count, args.body, args.in_flight, args.connections))
        out["fill_s"] = round(fill_s, 1)
        out["fill_halves_per_s"] = round(args.count / fill_s)
        pending = pending_of(asyncio.run(metrics(address)))
        assert pending == args.count, f"{pending} pending, {args.count} stored"
        time.sleep(args.interval / 1000 * 2)  # a round or two: the table settles
        rss1 = proc_rss_mib(pid)
        out["rss_mib_before"] = round(rss0)
        out["rss_mib_after"] = round(rss1)
        out["rss_bytes_per_pending_half"] = round((rss1 - rss0) * 1048576 / args.count)
        out[f"idle_cpu_per_s_{args.count}_pending"] = round(idle_cpu(pid, args.idle), 4)
        t_stop = time.monotonic()
    out["shutdown_s"] = round(time.monotonic() - t_stop, 2)  # SIGTERM: snapshot written
    t_start = time.monotonic()
    restarted = {
        "transactionTimeOut": 0,  # all of them due
        "transactionCheckInterval": args.drain_interval,
    }
    with spawn_broker(root, restarted) as (address, pid):
        m = asyncio.run(metrics(address))
        out["restart_s"] = round(time.monotonic() - t_start, 2)
        out["rss_mib_after_restart"] = round(proc_rss_mib(pid))
        out["pending_after_restart"] = pending_of(m)
        out.update(
            asyncio.run(
                drain_with_producer(
                    address, pid, args.drain_timeout, args.check_threads, args.check_queue
                )
            )
        )
    emit(out)


if __name__ == "__main__":
    main()
