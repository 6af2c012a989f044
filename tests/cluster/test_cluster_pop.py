"""POP consumption across a failover: the leader's receipt handles, invisible times and
delivery attempts are records in the replicated commit log, so the new leader of the group
rebuilds them (``broker/messaging/pop.py``).  A group of three replicas with real etcd; the
leader SIGKILLed after a SimpleConsumer's receive, ack and change of invisible time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_cluster_failover import txmq_cli
from tests.integration.test_pop_durable import TOPIC, Consumer, receive_until
from tests.support.cluster import BrokerCluster

pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402

pytestmark = pytest.mark.slow


async def test_pop_state_survives_a_leader_kill(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster(groups={"g1": 3}, grpc=True)
    bc.start_all()
    leader = await bc.wait_leader("g1")
    await bc.wait_in_sync("g1", [0, 1, 2])
    txmq_cli("cluster", "place", TOPIC, "--group", "g1", "--queues", "2", "--broker", leader.addr)

    c = Consumer(leader.grpc_port)
    try:
        for i in range(3):
            await c.send(f"m{i}".encode())
        got = await receive_until(c, 3, 60, "the 3 messages received")
        by_body = {g.body: g for g in got}
        assert sorted(by_body) == [b"m0", b"m1", b"m2"], got
        assert await c.ack(by_body[b"m0"]) == pb.OK
        m1 = await c.change_invisible(by_body[b"m1"], 1)
        # acknowledged once the in-sync replicas hold it: so do they hold the POP records
        # appended before it
        await c.send(b"after")
    finally:
        await c.close()

    bc.kill("g1", leader.replica)
    new = await bc.wait_leader("g1", not_replica=leader.replica)
    c = Consumer(new.grpc_port)
    try:
        # m2's handle from the old leader acks it at the new one; m1's old handle is replaced
        assert await c.ack(by_body[b"m2"]) == pb.OK, "a handle issued by the old leader"
        assert await c.ack(by_body[b"m1"]) == pb.INVALID_RECEIPT_HANDLE
        again = await receive_until(c, 2, 60, "m1 again and the message sent last")
        assert sorted((g.body, g.attempt) for g in again) == [(b"after", 1), (b"m1", 2)], again
        assert await c.ack(m1) == pb.INVALID_RECEIPT_HANDLE
        for g in again:
            assert await c.ack(g) == pb.OK
    finally:
        await c.close()
