"""A long run of the partition test: a broker group of three replicas and three etcd members,
each in its own network namespace, under load while a nemesis partitions, heals, kills and
pauses, for ``--minutes``; every ``--every`` seconds each replica's RSS and open files are
recorded and printed; at the end the whole history is checked (tests/support/history.py).

Needs root (network namespaces, iptables) and etcd (``make etcd``).  Run from the repository
root::

    .venv/bin/python bench/soak.py --minutes 60

Exits 1 when the checker finds an anomaly other than the known dirty read (a message handed to
a consumer, then lost with its leader: docs/cluster.md, "Tested faults"), which it counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

# The bench helpers beside this script, as the other benches import them, and tests.support from
# the repository root.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from _broker import quiet_logs  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

from tests.support import netns  # noqa: E402
from tests.support.history import READ_LOST, History, check  # noqa: E402
from tests.support.partitions import (  # noqa: E402
    GROUP,
    Nemesis,
    NsBrokerCluster,
    Workload,
    build,
    commit_log_bytes,
    drain,
    group_in_namespaces,
    no_pending_transactions,
)


def table(samples: list[dict[str, Any]]) -> str:
    """Per replica: RSS (MiB) and open files at the first and last sample, and the peaks."""
    lines = ["replica  rss first  rss last  rss max  files first  files last  files max"]
    replicas = sorted({r for s in samples for r in s["replicas"]})
    for r in replicas:
        seen = [s["replicas"][r] for s in samples if r in s["replicas"]]
        rss = [v[0] / 1024 for v in seen]
        fds = [v[1] for v in seen]
        lines.append(
            f"{r:>7}  {rss[0]:8.1f}  {rss[-1]:8.1f}  {max(rss):7.1f}  "
            f"{fds[0]:11d}  {fds[-1]:10d}  {max(fds):9d}"
        )
    return "\n".join(lines)


async def sample_loop(
    bc: NsBrokerCluster, every: float, samples: list[dict[str, Any]], t0: float
) -> None:
    while True:
        figures = bc.resource_figures()
        sample = {"t": round(time.monotonic() - t0), "replicas": figures}
        samples.append(sample)
        shown = "  ".join(
            f"{r}: {rss / 1024:.0f} MiB {fds} files" for r, (rss, fds) in sorted(figures.items())
        )
        print(f"[{sample['t']:>5}s] {shown}", flush=True)
        await asyncio.sleep(every)


async def soak(args: argparse.Namespace, base: Path) -> int:
    history = History()
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    steps = 0
    with netns.network("s") as net:
        build(net)
        async with group_in_namespaces(net, base) as (_etcd, bc):
            work = Workload(history, bc.seeds(GROUP), seed=args.seed)
            await work.start()
            nemesis = Nemesis(net, bc, history, work, hold=args.hold, log=lambda s: None)
            sampler = asyncio.ensure_future(sample_loop(bc, args.every, samples, t0))
            rnd = random.Random(args.seed)
            try:
                await nemesis.recovered("start")
                while time.monotonic() < end:
                    schedule = nemesis.schedule()
                    rnd.shuffle(schedule)
                    for name, fault in schedule:
                        if time.monotonic() >= end:
                            break
                        t = time.monotonic()
                        await nemesis.step(name, fault)
                        steps += 1
                        print(
                            f"[{t - t0:>5.0f}s] {name}: whole again after "
                            f"{time.monotonic() - t:.1f}s",
                            flush=True,
                        )
            finally:
                await work.stop_writers()
            leader = await nemesis.leader()
            await bc.wait_in_sync(GROUP, [0, 1, 2], timeout=120)

            async def resolved() -> bool:
                return await no_pending_transactions(leader.addr)

            await bc.wait(resolved, 180, "every pending transaction resolved")
            await drain(history, leader.addr, 4)
            await work.shutdown()

            async def same_logs() -> bool:
                return len({commit_log_bytes(r) for r in bc.replicas.values()}) == 1

            await bc.wait(same_logs, 120, "every replica holds the same commit log")
            sampler.cancel()
            samples.append({"t": round(time.monotonic() - t0), "replicas": bc.resource_figures()})
            leader_events = bc.leader_events()
    history.dump(base / "history.jsonl")
    (base / "resources.json").write_text(json.dumps(samples))
    result = check(history, leader_events)
    dirty = [a for a in result.anomalies if a.kind == READ_LOST]
    other = [a for a in result.anomalies if a.kind != READ_LOST]
    minutes = (time.monotonic() - t0) / 60
    print(f"\n{minutes:.1f} min, {steps} faults, {len({e['epoch'] for e in leader_events})} epochs")
    print(f"history: {result.stats}")
    print(f"known dirty reads (read, then lost with their leader): {len(dirty)}")
    for a in dirty[:3]:
        print(a)
    print(f"other anomalies: {len(other)}")
    for a in other[:20]:
        print(a)
    print("\n" + table(samples))
    if args.dir or other:  # else a temp folder, removed (or named on stderr if kept)
        print(f"\nhistory, logs and samples in {base}")
    return 1 if other else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between resource samples")
    ap.add_argument("--hold", type=float, default=8.0, help="seconds each fault lasts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--dir",
        help="where the history and logs go, never removed (default: a new temp folder, removed "
        "at the end unless the check finds anomalies or TXMQ_BENCH_KEEP=1)",
    )
    args = ap.parse_args()
    why = netns.unavailable()
    if why is not None:
        print(f"soak needs network namespaces: {why}", file=sys.stderr)
        return 2
    quiet_logs()
    with scratch_dir("txmq-soak-", keep=args.dir) as base:
        base.mkdir(parents=True, exist_ok=True)
        if asyncio.run(soak(args, base)):
            raise SystemExit(1)  # anomalies: the history stays for a look (a temp folder too)
    return 0


if __name__ == "__main__":
    sys.exit(main())
