"""Cluster mode against a single node, in one run (real etcd members, real broker processes).

1. Plain sends (each awaited: the broker answers once the write is acknowledged) and
   transactions: one broker process, then one group of three replicas (acknowledged once the
   in-sync replicas have it).
2. Failover: a group of three under a light send load; the leader is SIGKILLed; the time from the
   kill to the first write acknowledged by the new leader (``--kills`` times).
3. Sharding: two groups of one replica each, each driven by its own producers, against one
   process -- does spreading the work over two broker processes raise the ceiling of one event
   loop?  (On a small machine the load generator competes for the same cores: compare the CPU.)

Besides the rates, each phase reports the CPU each broker process spent per acknowledged send or
transaction (``/proc/PID/stat`` utime + stime around the phase: it survives a busy machine where
the rates do not) and, for the group, the transfers each follower took per send (pushes of a
streaming follower, fetches otherwise) and the chunks the leader read for them.

Needs etcd (``make etcd``).  Run from the repository root::

    .venv/bin/python bench/cluster.py --seconds 10
    .venv/bin/python bench/cluster.py --parts single,group3 --kills 0   # the ratios only
    .venv/bin/python bench/cluster.py --parts group3 --profile /tmp/prof  # cProfile each replica
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

# The bench helpers beside this script, as the other benches import them, and tests.support from
# the repository root.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from _broker import CommitAll, quiet_logs, run_clients, send_until_stored, spawn_broker  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

from tests.support.cluster import BrokerCluster, Replica  # noqa: E402
from tests.support.etcd import EtcdCluster  # noqa: E402
from txmq.client import AsyncProducer, AsyncTransactionProducer, Message  # noqa: E402
from txmq.client.lifecycle import AsyncClient  # noqa: E402

C = TypeVar("C", bound=AsyncClient)


async def rate(
    args: argparse.Namespace, clients: list[C], call: Callable[[C], Awaitable[object]]
) -> float:
    """Calls a second: ``call`` on ``clients`` in turn, ``args.inflight`` in flight per client."""
    n = iter(range(1 << 62))

    async def one() -> None:
        await call(clients[next(n) % len(clients)])

    done, took = await run_clients(clients, args.seconds, args.producers * args.inflight, one)
    return done / took


async def sends(address: str, args: argparse.Namespace, tag: str) -> float:
    body = b"x" * args.size
    producers = [
        AsyncProducer(f"bench-{tag}-{i}", address, request_timeout=15.0)
        for i in range(args.producers)
    ]
    return await rate(args, producers, lambda p: p.send(Message("bench-plain", body)))


async def transactions(address: str, args: argparse.Namespace, tag: str) -> float:
    body = b"x" * args.size
    txps = [
        AsyncTransactionProducer(f"bench-tx-{tag}", CommitAll(), address, request_timeout=15.0)
        for _ in range(args.producers)
    ]
    return await rate(
        args, txps, lambda t: t.send_message_in_transaction(Message("bench-tx", body))
    )


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Runs ``txmq`` under cProfile timed by the process's CPU clock (wall time would count the
#: moments a busy machine gave the core to another process); argv[1] is the output file.
PROFILE_RUN = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    runpy.run_module("txmq", run_name="__main__")
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""


class ProfiledCluster(BrokerCluster):
    """Each replica under cProfile (CPU time), its profile written to
    ``<dir>/<group>-<replica>.prof`` when it stops (SIGTERM)."""

    def __init__(self, *args: Any, profile_dir: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.profile_dir = profile_dir

    def command(self, r: Replica) -> list[str]:
        cmd = super().command(r)
        out = self.profile_dir / f"{r.group}-{r.replica}.prof"
        assert cmd[1:3] == ["-m", "txmq"]
        return [cmd[0], "-c", PROFILE_RUN, str(out), *cmd[3:]]


async def fetch_counts(bc: BrokerCluster, group: str) -> dict[int | str, int]:
    """Transfers (pushes taken, or fetches) each following replica of ``group`` has had from its
    current leader, and under ``"reads"`` the chunks the leader read for them (a chunk pushed
    to both followers is read once)."""
    out: dict[int | str, int] = {}
    for r in bc.replicas.values():
        if r.group == group and r.running:
            st = await bc.status(r.addr)
            if st is not None and st["self"]["role"] == "follower":
                out[r.replica] = int(st["self"].get("fetches", 0))
            elif st is not None and st["self"]["role"] == "leader":
                me = st["self"]
                out["reads"] = int(me.get("fetchesServed", 0)) - int(me.get("chunksShared", 0))
    return out


async def measured(
    bc: BrokerCluster, leader: int, work: Callable[[], Awaitable[float]], seconds: float
) -> tuple[float, dict[str, Any]]:
    """Run ``work`` (which returns a rate) and report the CPU of each replica and the follower
    fetches per acknowledged operation."""
    procs = {rid: r.proc for (g, rid), r in bc.replicas.items() if g == "g1" and r.proc}
    f0 = await fetch_counts(bc, "g1")
    c0 = {rid: cpu_seconds(p.pid) for rid, p in procs.items()}
    rate = await work()
    c1 = {rid: cpu_seconds(p.pid) for rid, p in procs.items()}
    f1 = await fetch_counts(bc, "g1")
    ops = max(rate * seconds, 1.0)
    cpu = {
        ("leader" if rid == leader else f"follower{rid}"): round((c1[rid] - c0[rid]) * 1e6 / ops)
        for rid in sorted(procs)
    }
    fetches = {
        (f"follower{rid}" if rid != "reads" else "leader_reads"): round(
            (f1[rid] - f0[rid]) / ops, 3
        )
        for rid in f1
        if rid in f0
    }
    return rate, {"cpu_us_per_op": cpu, "fetches_per_op": fetches}


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
            await send_until_stored(p, Message("bench-failover", b"after"), 15.0)
            times.append(time.monotonic() - t0)
            bc.start("g1", leader.replica)
    finally:
        await p.shutdown()
    return times


async def main_async(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"config": vars(args)}
    parts = set(args.parts.split(","))
    settings: dict[str, object] = {"flushIntervalCommitLog": 200}
    single_send = single_tx = 0.0
    if "single" in parts:
        print("single node ...", file=sys.stderr)
        with spawn_broker(str(base / "single"), settings, flush=args.flush) as (address, pid):
            c0 = cpu_seconds(pid)
            single_send = await sends(address, args, "single")
            c1 = cpu_seconds(pid)
            single_tx = await transactions(address, args, "single")
            c2 = cpu_seconds(pid)
            out["single"] = {
                "send_msgs_per_s": round(single_send, 1),
                "tx_per_s": round(single_tx, 1),
                "broker_cpu_s": round(c2 - c0, 1),
                "send_cpu_us_per_op": round((c1 - c0) * 1e6 / (single_send * args.seconds)),
                "tx_cpu_us_per_op": round((c2 - c1) * 1e6 / (single_tx * args.seconds)),
            }
    if not parts & {"group3", "failover", "shards"}:
        return out
    # The replicas log at the single node's level (spawn_broker: WARNING); at the harness's
    # default (INFO) every transaction decision writes a log line the single node does not.
    os.environ["TXMQ_LOG_LEVEL"] = args.log_level
    etcd = EtcdCluster(base / "etcd", 3).start()
    try:
        if parts & {"group3", "failover"}:
            print("one group of three replicas ...", file=sys.stderr)
            kw: dict[str, Any] = {}
            cls: type[BrokerCluster] = BrokerCluster
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                cls, kw = ProfiledCluster, {"profile_dir": Path(args.profile)}
            bc = cls(
                base / "group3",
                etcd.endpoints,
                name="bench3",
                groups={"g1": 3},
                flush=args.flush,
                settings={"etcdLeaseTtl": args.lease_ttl, "transactionTimeOut": 6000},
                **kw,
            )
            bc.start_all()
            try:
                leader = await bc.wait_leader("g1", timeout=60)
                await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
                if "group3" in parts:
                    seeds = bc.seeds("g1")
                    g_send, send_cost = await measured(
                        bc, leader.replica, lambda: sends(seeds, args, "group3"), args.seconds
                    )
                    g_tx, tx_cost = await measured(
                        bc,
                        leader.replica,
                        lambda: transactions(seeds, args, "group3"),
                        args.seconds,
                    )
                    out["group3"] = {
                        "send_msgs_per_s": round(g_send, 1),
                        "tx_per_s": round(g_tx, 1),
                        "send": send_cost,
                        "tx": tx_cost,
                    }
                    if single_send:
                        out["group3"]["send_vs_single"] = round(g_send / single_send, 3)
                        out["group3"]["tx_vs_single"] = round(g_tx / single_tx, 3)
                if "failover" in parts and args.kills:
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
        if "shards" in parts:
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
                }
                if single_send:
                    out["two_groups"]["vs_single"] = round((r1 + r2) / single_send, 3)
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
    ap.add_argument(
        "--parts",
        default="single,group3,failover,shards",
        help="comma-separated: single, group3, failover, shards",
    )
    ap.add_argument("--log-level", default="WARNING", help="the replicas' log level")
    ap.add_argument(
        "--profile", default="", help="cProfile each replica of the group into this folder"
    )
    args = ap.parse_args()
    quiet_logs()
    with scratch_dir("txmq-bench-cluster-") as base:
        out = asyncio.run(main_async(args, base))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
