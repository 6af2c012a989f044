"""A stock RocketMQ client (Apache rocketmq-client-cpp) against a broker group: it is given the
brokers as its name servers, sends to the leader the route names, and after the leader is
SIGKILLed finds the new leader through the routes (within its 30 s route refresh).  Here with
``routeWriteReplicas`` off: the routes name only each group's leader, as before that setting
(with it on, see test_route_write_replicas.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.compat.stock import cpp_client
from tests.support.cluster import BrokerCluster
from tests.support.raw import connected

pytestmark = pytest.mark.slow


async def test_cpp_client_follows_a_leader_change(make_cluster: Any, tmp_path: Path) -> None:
    cpp = cpp_client(tmp_path / "home")
    bc: BrokerCluster = make_cluster(settings={"routeWriteReplicas": False})
    bc.start_all()
    leader = await bc.wait_leader("g1")
    await bc.wait_in_sync("g1", [0, 1, 2])
    namesrv = ";".join(r.addr for r in bc.replicas.values())
    proc = cpp.start(
        "send",
        namesrv,
        "stock",
        "--count",
        100,
        "--interval",
        0.5,
        "--keep-going",
        "--prefix",
        "cpp",
    )
    first: list[str] = []
    try:
        # Kill the leader once the client has sent ten messages through it: past its first
        # route refresh (3 s after its start, then every 30 s), so its sends fail until the next.
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while sum('"status": 0' in line for line in first) < 10:
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line and time.monotonic() < deadline, f"the client stopped early: {first}"
            first.append(line)
        killed_at = time.monotonic()
        bc.kill("g1", leader.replica)
        new = await bc.wait_leader("g1", not_replica=leader.replica)
        rest, err = await asyncio.to_thread(proc.communicate, timeout=150)
        out = "".join(first) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    ok = [d["i"] for d in docs if d.get("status") == 0]
    failed = [d["i"] for d in docs if "error" in d]
    assert ok and ok[0] == 0, docs[:3]
    assert failed, "the leader kill did not show at all: was it killed mid-run?"
    assert all(i in ok for i in range(max(failed) + 1, 100)), "sends did not recover"
    print(
        f"stock C++ client: {len(failed)} sends failed over "
        f"{(max(failed) - min(failed) + 1) * 0.5:.1f}s after the kill "
        f"(kill at {time.monotonic() - killed_at:.0f}s ago)"
    )
    async with connected(new.addr) as c:
        stored = {m.body.split(b"-")[1].split(b".")[0] for m in await c.pull_all("stock", 4)}
    missing = [i for i in ok if str(i).encode() not in stored]
    assert not missing, f"acknowledged sends {missing[:5]} are not on the new leader"
