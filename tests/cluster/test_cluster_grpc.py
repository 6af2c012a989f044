"""The official RocketMQ 5 Python client (gRPC) against a cluster of two broker groups: the
route names each group's queues at its leader's gRPC endpoint, sends spread over both groups,
and a SimpleConsumer receives every message from both; after a leader is SIGKILLed the client,
given every broker's endpoint, goes on with the new leader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cluster_failover import stored_bodies, txmq_cli
from tests.compat.test_grpc_python5 import py5, run  # noqa: F401  (py5: the fixture)
from tests.support.cluster import BrokerCluster

pytestmark = pytest.mark.slow


async def test_py5_client_uses_every_group(make_cluster: Any, py5: Path) -> None:  # noqa: F811
    bc: BrokerCluster = make_cluster(
        groups={"g1": 1, "g2": 2}, settings={"minInSyncReplicas": 1}, grpc=True
    )
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    l2 = await bc.wait_leader("g2")
    await bc.wait_in_sync("g2", [0, 1])
    endpoints = ";".join(f"127.0.0.1:{r.grpc_port}" for r in bc.replicas.values() if r.running)
    for group in ("g1", "g2"):
        txmq_cli(
            "cluster", "place", "spread", "--group", group, "--queues", "2", "--broker", l1.addr
        )

    async def routed() -> bool:
        st = await bc.status(l1.addr)
        return st is not None and all("spread" in st["groups"][g]["topics"] for g in ("g1", "g2"))

    await bc.wait(routed, 30, "topic 'spread' published by both groups")
    bodies = [f"m{i}" for i in range(12)]
    sent = run(
        py5,
        op="send",
        endpoint=f"127.0.0.1:{l1.grpc_port}",
        topic="spread",
        messages=[{"body": b} for b in bodies],
    )
    assert len(sent["ids"]) == 12
    # Spread over both groups: each leader stored some of them.
    on1 = await stored_bodies(l1.addr, "spread", 2)
    on2 = await stored_bodies(l2.addr, "spread", 2)
    assert on1 and on2, (len(on1), len(on2))
    assert sorted(b.decode() for b in on1 + on2) == sorted(bodies)
    got = run(
        py5,
        op="receive",
        endpoint=f"127.0.0.1:{l2.grpc_port}",
        topic="spread",
        group="py5-cluster",
        count=12,
        timeout=30,
    )
    assert sorted(m["body"] for m in got["messages"]) == sorted(bodies)

    # The g2 leader dies; the client, given every endpoint, sends through the new one.
    bc.kill("g2", l2.replica)
    new2 = await bc.wait_leader("g2", not_replica=l2.replica)
    more = [f"n{i}" for i in range(12)]
    run(py5, op="send", endpoint=endpoints, topic="spread", messages=[{"body": b} for b in more])
    on1 = await stored_bodies(l1.addr, "spread", 2)
    on2 = await stored_bodies(new2.addr, "spread", 2)
    assert set(more) <= {b.decode() for b in on1 + on2}
