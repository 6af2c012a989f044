"""Cluster mode against a single node, in one run (real etcd members, real broker processes).

1. Plain sends (each awaited: the broker answers once the write is acknowledged) and
   transactions: one broker process, then one group of three replicas (acknowledged once the
   in-sync replicas have it).
2. Failover: a group of three under a light send load; the leader is SIGKILLed; the time from the
   kill to the first write acknowledged by the new leader (``--kills`` times).
3. Sharding: two groups of one replica each, each driven by its own producers, against one
   process -- does spreading the work over two broker processes raise the ceiling of one event
   loop?  (On a small machine the load generator competes for the same cores: compare the CPU.)

Needs etcd (``make etcd``).  Run from the repository root::

    .venv/bin/python bench/cluster.py --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The bench helpers beside this script, as the other benches import them, and tests.support from
# the repository root.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from _broker import CommitAll, quiet_logs, run_for, spawn_broker  # noqa: E402

from tests.support.cluster import BrokerCluster  # noqa: E402
from tests.support.etcd import EtcdCluster  # noqa: E402
from txmq.client import AsyncProducer, AsyncTransactionProducer, Message  # noqa: E402


async def sends(address: str, args: argparse.Namespace, tag: str) -> float:
    body = b"x" * args.size
    producers = [
        AsyncProducer(f"bench-{tag}-{i}", address, request_timeout=15.0)
        for i in range(args.producers)
    ]
    for p in producers:
        await p.start()
    n = iter(range(1 << 62))

    async def one() -> None:
        await producers[next(n) % len(producers)].send(Message("bench-plain", body))

    try:
        await one()
        done, took = await run_for(args.seconds, args.producers * args.inflight, one)
    finally:
        for p in producers:
            await p.shutdown()
    return done / took


async def transactions(address: str, args: argparse.Namespace, tag: str) -> float:
    body = b"x" * args.size
    txps = [
        AsyncTransactionProducer(f"bench-tx-{tag}", CommitAll(), address, request_timeout=15.0)
        for _ in range(args.producers)
    ]
    for t in txps:
        await t.start()
    n = iter(range(1 << 62))

    async def one() -> None:
        await txps[next(n) % len(txps)].send_message_in_transaction(Message("bench-tx", body))

    try:
        await one()
        done, took = await run_for(args.seconds, args.producers * args.inflight, one)
    finally:
        for t in txps:
            await t.shutdown()
    return done / took


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def failover(bc: BrokerCluster, kills: int) -> list[float]:
    times: list[float] = []
    p = AsyncProducer("bench-failover", bc.seeds("g1"), request_timeout=15.0)
    await p.start()
    try:
        for _ in range(kills):
            leader = await bc.wait_leader("g1")
            await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
            for i in range(20):
                await p.send(Message("bench-failover", f"before-{i}".encode()))
            t0 = time.monotonic()
            bc.kill("g1", leader.replica)
            while True:
                try:
                    await p.send(Message("bench-failover", b"after"), timeout=15.0)
                    break
                except Exception:
                    await asyncio.sleep(0.01)
            times.append(time.monotonic() - t0)
            bc.start("g1", leader.replica)
    finally:
        await p.shutdown()
    return times


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"config": vars(args)}
    base = Path(tempfile.mkdtemp(prefix="txmq-bench-cluster-"))
    settings: dict[str, object] = {"flushIntervalCommitLog": 200}
    print("single node ...", file=sys.stderr)
    with spawn_broker(str(base / "single"), settings, flush=args.flush) as (address, pid):
        c0 = cpu_seconds(pid)
        single_send = await sends(address, args, "single")
        single_tx = await transactions(address, args, "single")
        out["single"] = {
            "send_msgs_per_s": round(single_send, 1),
            "tx_per_s": round(single_tx, 1),
            "broker_cpu_s": round(cpu_seconds(pid) - c0, 1),
        }
    etcd = EtcdCluster(base / "etcd", 3).start()
    try:
        print("one group of three replicas ...", file=sys.stderr)
        bc = BrokerCluster(
            base / "group3",
            etcd.endpoints,
            name="bench3",
            groups={"g1": 3},
            flush=args.flush,
            settings={"etcdLeaseTtl": args.lease_ttl, "transactionTimeOut": 6000},
        )
        bc.start_all()
        try:
            await bc.wait_leader("g1", timeout=60)
            await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
            g_send = await sends(bc.seeds("g1"), args, "group3")
            g_tx = await transactions(bc.seeds("g1"), args, "group3")
            out["group3"] = {
                "send_msgs_per_s": round(g_send, 1),
                "tx_per_s": round(g_tx, 1),
                "send_vs_single": round(g_send / single_send, 3),
                "tx_vs_single": round(g_tx / single_tx, 3),
            }
            print(f"failover x{args.kills} ...", file=sys.stderr)
            times = await failover(bc, args.kills)
            out["failover_s"] = {
                "lease_ttl_s": args.lease_ttl,
                "each": [round(t, 2) for t in times],
                "median": round(statistics.median(times), 2),
                "max": round(max(times), 2),
            }
        finally:
            bc.stop_all()
        print("two groups of one replica (sharding) ...", file=sys.stderr)
        bc2 = BrokerCluster(
            base / "shards",
            etcd.endpoints,
            name="bench2x1",
            groups={"g1": 1, "g2": 1},
            flush=args.flush,
            settings={"minInSyncReplicas": 1},
        )
        bc2.start_all()
        try:
            await bc2.wait_leader("g1", timeout=60)
            await bc2.wait_leader("g2", timeout=60)
            r1, r2 = await asyncio.gather(
                sends(bc2.seeds("g1"), args, "shard1"), sends(bc2.seeds("g2"), args, "shard2")
            )
            out["two_groups"] = {
                "send_msgs_per_s": round(r1 + r2, 1),
                "per_group": [round(r1, 1), round(r2, 1)],
                "vs_single": round((r1 + r2) / single_send, 3),
            }
        finally:
            bc2.stop_all()
    finally:
        etcd.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="each measurement")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=8, help="concurrent requests per producer")
    ap.add_argument("--size", type=int, default=1024, help="message body bytes")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument("--kills", type=int, default=3, help="leader kills for the failover time")
    ap.add_argument("--lease-ttl", type=int, default=5, help="etcdLeaseTtl of the group (s)")
    args = ap.parse_args()
    quiet_logs()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
