"""Every replica serves its operations port whatever its role: /readyz says ready for the
leader and for followers in the in-sync set, and a killed leader's successor turns ready."""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker.test_ops_port import get
from tests.support.cluster import BrokerCluster, Replica
from tests.support.etcd import EtcdCluster

pytestmark = pytest.mark.slow


def _ready(r: Replica) -> bool:
    try:
        return get(r.ops_port, "/readyz")[0] == 200
    except OSError:
        return False


async def test_every_role_answers_readyz_and_a_new_leader_turns_ready(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")

    async def all_ready() -> bool:
        return all(_ready(r) for r in bc.replicas.values() if r.running)

    await bc.wait(all_ready, 30, "every replica (leader and in-sync followers) ready")
    status, text = get(leader.ops_port, "/readyz")
    assert status == 200 and "leader of g1" in text, text
    follower = next(r for r in bc.replicas.values() if r is not leader)
    status, text = get(follower.ops_port, "/readyz")
    assert status == 200 and "in-sync follower of g1" in text, text
    assert get(follower.ops_port, "/healthz")[0] == 200
    assert get(follower.ops_port, "/metrics")[0] == 200

    bc.kill("g1", leader.replica)
    new = await bc.wait_leader("g1", not_replica=leader.replica)

    async def new_ready() -> bool:
        ok = _ready(new)
        return ok and "leader of g1" in get(new.ops_port, "/readyz")[1]

    await bc.wait(new_ready, 30, "the new leader ready")
    status, text = get(new.ops_port, "/metrics")
    assert status == 200 and "txmq_connections" in text  # the leader's own metrics


async def test_a_replica_started_before_etcd_waits_for_it(make_cluster: Any, tmp_path: Any) -> None:
    """Brokers are often started with, or before, their etcd members: a replica keeps trying
    to reach etcd (a log line per attempt, bounded waits) and leads once etcd is there."""
    late = EtcdCluster(tmp_path / "late-etcd", 1)  # ports chosen, not started yet
    bc: BrokerCluster = make_cluster(groups={"g1": 1}, etcd_endpoints=late.endpoints)
    r = bc.start("g1", 0)
    try:
        await bc.wait(
            lambda: _async(len(bc.events("g1", 0, "etcd_unreachable")) >= 2),
            30,
            "two attempts to reach etcd logged",
        )
        assert r.running, "the replica exited instead of waiting for etcd"
        late.start()
        await bc.wait_leader("g1", timeout=60)
        assert bc.events("g1", 0, "etcd_reached")
    finally:
        bc.stop_all()
        late.stop()


async def _async(value: bool) -> bool:
    return value
