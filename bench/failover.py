"""Failover time of one broker group of three replicas, default timers, SIGKILL of the leader
(or, with ``--fault stop``, SIGSTOP: a leader alive but silent, as on a lost host or link).

Two clients, measured separately (each ``--runs`` times; the killed replica is restarted, or
the paused one resumed, and caught up between runs):

* ``sdk``: a txmq SDK producer given the group's addresses sends one message after another;
  the time from the kill to the first send the new leader acknowledges (with
  ``--kill-etcd-leader``, etcd's own leader is SIGKILLed just before the broker's);
* ``cpp``: the stock Apache rocketmq-client-cpp producer (``tests/compat/cpp_client.py``), the
  brokers as its name servers, one synchronous send every ``--interval`` seconds; the time from
  the kill to the first send it reports as acknowledged after the kill.  That client re-reads
  routes every 30 s from its start, so the kill comes at a random moment of that cycle (from
  ``--seed``): after 1 + U(0, 30) s of sending.  With ``routeWriteReplicas`` (the default) it
  retries on a follower's write-only route entry, which forwards to the new leader; with
  ``--set routeWriteReplicas=false`` it waits for its next route refresh.

``cpp-rate`` (not a failover): the same producer's rate of ``--sends`` synchronous sends with
no pause, no fault, over the same group (with ``routeWriteReplicas`` two sends in three go
through a follower); compare with ``--set routeWriteReplicas=false``.

Prints min / median / max of each and one JSON line.  Needs etcd (``make etcd``) and, for
``cpp``, the stock client (installed by the compatibility tests).  From the repository root::

    .venv/bin/python bench/failover.py --runs 5
    .venv/bin/python bench/failover.py --runs 5 --fault stop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from _broker import quiet_logs, send_until_stored  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

from tests.support.cluster import FAST_CLUSTER, BrokerCluster  # noqa: E402
from tests.support.etcd import EtcdCluster  # noqa: E402
from txmq.broker.config import BrokerConfig, key_name  # noqa: E402
from txmq.client import AsyncProducer, Message  # noqa: E402


def default_settings() -> dict[str, Any]:
    """The broker's defaults for every timer the test harness shortens."""
    defaults = BrokerConfig()
    out: dict[str, Any] = {}
    for attr in vars(defaults):
        if key_name(attr) in FAST_CLUSTER:
            out[key_name(attr)] = getattr(defaults, attr)
    out["mappedFileSizeCommitLog"] = 8 * 1024 * 1024  # small files: quick to create
    return out


async def settle(bc: BrokerCluster) -> Any:
    """The group's leader, once every replica is in sync and only the leader etcd names
    says it leads (a leader resumed after a pause says so until it finds it was deposed)."""
    await bc.wait_leader("g1", timeout=60)
    await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
    found: list[Any] = []

    async def one_leader() -> bool:
        st = await bc.group_status("g1")
        if st is None or not st.get("leader"):
            return False
        leading = []
        for r in bc.replicas.values():
            mine = await bc.status(r.addr)
            if mine is None:
                return False
            if mine["self"]["role"] == "leader":
                leading.append(r)
        found[:] = leading
        return [r.replica for r in leading] == [st["leader"]["replicaId"]]

    await bc.wait(one_leader, 60, "one replica leading, the one etcd names")
    return found[0]


def fail(bc: BrokerCluster, replica: int, fault: str) -> None:
    if fault == "stop":
        bc.pause("g1", replica)
    else:
        bc.kill("g1", replica)


def recover(bc: BrokerCluster, replica: int, fault: str) -> None:
    if fault == "stop":
        bc.resume("g1", replica)
    else:
        bc.start("g1", replica)


async def sdk_run(
    bc: BrokerCluster, p: AsyncProducer, etcd: EtcdCluster | None, fault: str
) -> float:
    leader = await settle(bc)
    for i in range(20):
        await p.send(Message("bench-failover", f"before-{i}".encode()))
    dead_etcd = None
    if etcd is not None:
        dead_etcd = await asyncio.to_thread(etcd.leader_index)
        etcd.kill(dead_etcd)
    t0 = time.monotonic()
    fail(bc, leader.replica, fault)
    await send_until_stored(p, Message("bench-failover", b"after"), 30.0)
    took = time.monotonic() - t0
    if etcd is not None and dead_etcd is not None:
        await asyncio.to_thread(etcd.restart, dead_etcd)
    recover(bc, leader.replica, fault)
    return took


async def cpp_run(
    bc: BrokerCluster, home: Path, interval: float, phase: float, fault: str
) -> float:
    from tests.compat.stock import cpp_client

    cpp = cpp_client(home)
    leader = await settle(bc)
    namesrv = ";".join(r.addr for r in bc.replicas.values())
    count = int(120 / interval)
    proc = cpp.start(
        "send", namesrv, "stock", "--count", count, "--interval", interval, "--keep-going"
    )
    assert proc.stdout is not None
    try:
        ok = 0
        deadline = time.monotonic() + 60
        while ok < 5:
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line or time.monotonic() > deadline:
                raise RuntimeError("the C++ client stopped before the kill")
            ok += '"status": 0' in line
        started = time.monotonic()
        while time.monotonic() - started < phase:
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line:
                raise RuntimeError("the C++ client stopped before the kill")
        t0 = time.monotonic()
        fail(bc, leader.replica, fault)
        while True:
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line:
                raise RuntimeError("the C++ client ended without a send after the kill")
            if '"status": 0' in line and time.monotonic() - t0 > interval:
                # (a send answered just after the kill was in flight before it)
                return time.monotonic() - t0
            if time.monotonic() - t0 > 100:
                raise RuntimeError("no acknowledged C++ send within 100 s of the kill")
    finally:
        proc.kill()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        recover(bc, leader.replica, fault)


async def cpp_rate(bc: BrokerCluster, home: Path, sends: int) -> float:
    """Messages per second of ``sends`` synchronous sends by the stock producer (from its
    first acknowledged send: the client's start and first route lookup are left out)."""
    from tests.compat.stock import cpp_client

    cpp = cpp_client(home)
    await settle(bc)
    namesrv = ";".join(r.addr for r in bc.replicas.values())
    proc = cpp.start("send", namesrv, "stock-rate", "--count", sends + 1)
    assert proc.stdout is not None
    try:
        first = await asyncio.to_thread(proc.stdout.readline)
        if '"status": 0' not in first:
            raise RuntimeError(f"the C++ client's first send failed: {first!r}")
        t0 = time.monotonic()
        ok = 0
        while True:
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line:
                break
            ok += '"status": 0' in line
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    if ok != sends:
        raise RuntimeError(f"{sends - ok} of {sends} sends failed")
    return sends / took


def summary(times: list[float]) -> dict[str, float]:
    return {
        "min": round(min(times), 2),
        "median": round(statistics.median(times), 2),
        "max": round(max(times), 2),
    }


async def main_async(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    etcd = EtcdCluster(base / "etcd", 3).start()
    settings = default_settings()
    for kv in args.set or []:
        k, _, v = kv.partition("=")
        settings[k] = v
    out: dict[str, Any] = {"settings": settings, "runs": args.runs, "fault": args.fault}
    bc = BrokerCluster(base / "brokers", etcd.endpoints, name="bench", groups={"g1": 3})
    bc.settings = settings
    try:
        bc.start_all()
        await settle(bc)
        if "sdk" in args.clients.split(","):
            p = AsyncProducer("bench-failover", bc.seeds("g1"), request_timeout=30.0)
            await p.start()
            try:
                times = []
                for i in range(args.runs):
                    times.append(
                        await sdk_run(bc, p, etcd if args.kill_etcd_leader else None, args.fault)
                    )
                    print(
                        f"sdk run {i + 1}: {times[-1]:.2f} s (ended {time.strftime('%H:%M:%S')})",
                        file=sys.stderr,
                    )
            finally:
                await p.shutdown()
            out["sdk_s"] = {**summary(times), "all": [round(t, 2) for t in times]}
        if "cpp" in args.clients.split(","):
            times = []
            rnd = random.Random(args.seed)
            for i in range(args.runs):
                phase = 1.0 + rnd.uniform(0, 30)
                times.append(await cpp_run(bc, base / "cpp-home", args.interval, phase, args.fault))
                print(f"cpp run {i + 1}: {times[-1]:.2f} s", file=sys.stderr)
            out["cpp_s"] = {**summary(times), "all": [round(t, 2) for t in times]}
        if "cpp-rate" in args.clients.split(","):
            rates = []
            for i in range(args.runs):
                rates.append(await cpp_rate(bc, base / "cpp-home", args.sends))
                print(f"cpp-rate run {i + 1}: {rates[-1]:.0f} msg/s", file=sys.stderr)
            out["cpp_rate"] = {**summary(rates), "all": [round(r) for r in rates]}
    finally:
        bc.stop_all()
        etcd.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="leader kills per client")
    ap.add_argument("--clients", default="sdk,cpp", help="sdk, cpp, cpp-rate (comma-separated)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between C++ sends")
    ap.add_argument("--set", action="append", help="a broker setting KEY=VALUE (repeatable)")
    ap.add_argument("--seed", type=int, default=1, help="the C++ kill moments")
    ap.add_argument(
        "--fault",
        choices=("kill", "stop"),
        default="kill",
        help="SIGKILL the leader (restarted after), or SIGSTOP it (resumed after)",
    )
    ap.add_argument("--sends", type=int, default=2000, help="cpp-rate: sends per run")
    ap.add_argument(
        "--kill-etcd-leader",
        action="store_true",
        help="sdk: SIGKILL etcd's own leader just before the broker leader (restarted after)",
    )
    args = ap.parse_args()
    quiet_logs()
    with scratch_dir("txmq-bench-failover-") as base:
        out = asyncio.run(main_async(args, base))
    for client in ("sdk", "cpp"):
        s = out.get(f"{client}_s")
        if s:
            signal = "SIGSTOP" if out["fault"] == "stop" else "SIGKILL"
            print(
                f"{client}: leader {signal} -> first acknowledged send: "
                f"min {s['min']:.2f} s, median {s['median']:.2f} s, max {s['max']:.2f} s "
                f"({len(s['all'])} runs)"
            )
    r = out.get("cpp_rate")
    if r:
        print(
            f"cpp-rate: synchronous sends of the stock producer: min {r['min']:.0f}, "
            f"median {r['median']:.0f}, max {r['max']:.0f} msg/s ({len(r['all'])} runs)"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
