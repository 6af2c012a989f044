"""CPU and Python calls per transaction, broker and SDK, for the peer harness's ``txn.k``
figures: ``producer.transaction()`` with ``k`` messages of 1 KiB sent concurrently, committed,
one transaction at a time (the code of ``bench/peers/bench_txmq.py``).

    python bench/txn_cpu.py --messages 1 --count 2000
    python bench/txn_cpu.py --messages 100 --count 100 --profile

A fresh broker (this interpreter, this ``PYTHONPATH``) on a fresh store serves each run; its
CPU (utime + stime from /proc) and the SDK's (``time.process_time``) are read around the
timed transactions, after a warm-up of ``--warmup`` transactions.  With ``--profile`` the broker
runs under cProfile (``python -m cProfile -m txmq broker``, stopped with SIGINT) and a second
broker runs the warm-up alone, so that what the start and the warm-up cost is taken off; the
SDK's timed part is profiled too.  Calls per transaction are printed with the hottest
functions (``--dump F``: every function's calls and µs per transaction in F.sdk / F.broker).
Machine load moves the CPU figures little and the call counts not at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import signal
import sys
import time
from collections.abc import Iterator

from _scratch import scratch_dir

TICKS = os.sysconf("SC_CLK_TCK")
BODY = b"x" * 1024


@contextlib.contextmanager
def broker(profile_to: str | None) -> Iterator[tuple[str, int]]:
    from _broker import free_port, running

    port = free_port()
    cmd = [sys.executable]
    if profile_to:
        cmd += ["-m", "cProfile", "-o", profile_to]
    cmd += ["-m", "txmq", "broker", "--bind", "127.0.0.1", "--port", str(port)]
    with scratch_dir("txmq-txncpu-") as store:
        cmd += ["--store-dir", str(store), "--log-level", "WARNING"]
        with running(cmd, port, timeout=60, stop=signal.SIGINT) as proc:
            yield f"127.0.0.1:{port}", proc.pid


async def drive(address: str, pid: int, k: int, warmup: int, count: int, profile: bool):
    import logging

    import structlog
    from _broker import cpu_ticks

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from txmq.client import (
        AsyncTransactionProducer,
        LocalTransactionState,
        Message,
        TransactionListener,
    )
    from txmq.client.admin import AsyncAdminClient

    class Listener(TransactionListener):
        async def execute_local_transaction(self, message, arg):  # type: ignore[override]
            return LocalTransactionState.COMMIT_MESSAGE

        async def check_local_transaction(self, message):  # type: ignore[override]
            return LocalTransactionState.COMMIT_MESSAGE

    topic = f"txncpu-{k}"
    async with AsyncAdminClient(address, timeout=30.0) as admin:
        await admin.create_topic(topic, queues=4)
    txp = AsyncTransactionProducer("txn-cpu", Listener(), address, request_timeout=30.0)
    await txp.start()
    await txp.producer._route_for(topic)

    async def one() -> None:
        async with txp.transaction() as t:
            if k == 1:
                await t.send(Message(topic, BODY))
            else:
                await asyncio.gather(*(t.send(Message(topic, BODY)) for _ in range(k)))
        if t.state is not LocalTransactionState.COMMIT_MESSAGE:
            raise RuntimeError(f"transaction ended {t.state}")

    for _ in range(warmup):
        await one()
    prof = cProfile.Profile() if profile else None
    b0, c0, w0 = cpu_ticks(pid), time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(count):
        await one()
    if prof:
        prof.disable()
    b1, c1, w1 = cpu_ticks(pid), time.process_time(), time.perf_counter()
    await txp.shutdown()
    return (b1 - b0) / TICKS, c1 - c0, w1 - w0, prof


def calls(stats: pstats.Stats) -> int:
    return sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]


def table(
    stats: pstats.Stats, minus: pstats.Stats | None = None
) -> dict[tuple[str, int, str], tuple[int, float, float]]:
    """Function -> (calls, tottime, cumtime), less ``minus``'s."""
    out = {}
    base = minus.stats if minus is not None else {}  # type: ignore[attr-defined]
    for key, (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        b = base.get(key)
        if b is not None:
            nc, tt, ct = nc - b[1], tt - b[2], ct - b[3]
        if nc > 0:
            out[key] = (nc, tt, ct)
    return out


def top(
    rows_of: dict[tuple[str, int, str], tuple[int, float, float]],
    per: int,
    n: int,
    dump: str | None = None,
) -> str:
    out = io.StringIO()
    if dump:
        with open(dump, "w") as f:
            for (file, line, fn), (nc, tt, ct) in sorted(rows_of.items(), key=lambda kv: -kv[1][1]):
                where = f"{os.path.relpath(file) if file != '~' else '~'}:{line}({fn})"
                f.write(f"{nc / per:8.2f} {tt / per * 1e6:8.2f} {ct / per * 1e6:9.2f}  {where}\n")
    rows = sorted(rows_of.items(), key=lambda kv: -kv[1][1])[:n]
    for (file, line, fn), (nc, tt, _ct) in rows:
        where = f"{os.path.basename(file)}:{line}({fn})"
        out.write(f"    {nc / per:7.2f} calls {tt / per * 1e6:8.2f} µs  {where}\n")
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1, help="messages per transaction")
    ap.add_argument("--count", type=int, default=2000, help="timed transactions")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--dump", help="write every function's calls/µs per transaction to DUMP.sdk/.broker"
    )
    args = ap.parse_args()
    k = args.messages
    doc: dict[str, object] = {"messages": k, "count": args.count}
    with scratch_dir("txmq-txncpu-prof-") as tmp:
        runs = [(args.warmup + args.count, "full")]
        if args.profile:
            runs.append((args.warmup, "warm"))
        broker_calls: dict[str, int] = {}
        stats: dict[str, pstats.Stats] = {}
        for total, name in runs:
            out = os.path.join(tmp, f"{name}.prof") if args.profile else None
            with broker(out) as (address, pid):
                timed = args.count if name == "full" else 0
                b, c, w, prof = asyncio.run(
                    drive(address, pid, k, total - timed, timed, args.profile and name == "full")
                )
            if name == "full":
                doc["txn_per_s"] = round(args.count / w, 1)
                doc["broker_us_per_txn"] = round(b / args.count * 1e6, 1)
                doc["sdk_us_per_txn"] = round(c / args.count * 1e6, 1)
                doc["broker_us_per_msg"] = round(b / args.count / k * 1e6, 2)
                doc["sdk_us_per_msg"] = round(c / args.count / k * 1e6, 2)
                if prof is not None:
                    st = pstats.Stats(prof)
                    doc["sdk_calls_per_txn"] = round(calls(st) / args.count, 1)
                    print("SDK, per transaction (tottime):")
                    dump = args.dump and args.dump + ".sdk"
                    print(top(table(st), args.count, args.top, dump))
            if out:
                st = pstats.Stats(out)
                if args.dump:
                    shutil.copy(out, f"{args.dump}.{name}.prof")
                broker_calls[name] = calls(st)
                stats[name] = st
        if args.profile:
            per = (broker_calls["full"] - broker_calls["warm"]) / args.count
            doc["broker_calls_per_txn"] = round(per, 1)
            print("broker, per transaction (tottime, less a run of the warm-up alone):")
            dump = args.dump and args.dump + ".broker"
            print(top(table(stats["full"], stats["warm"]), args.count, args.top, dump))
    for key, v in doc.items():
        print(f"{key:24} {v}")
    print("JSON " + json.dumps(doc))


if __name__ == "__main__":
    main()
