"""ACL 2.0 in a broker group over real etcd: users and policies created on the leader reach its
followers with the other state files, a follower authenticates clients with them, and after
the leader is killed the new leader enforces the same policies (its replicas replicate as the
initial super user)."""

from __future__ import annotations

import json
from typing import Any

from tests.support.cluster import BrokerCluster
from tests.support.raw import connected
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode

ROOT = Credentials("root-user", "root-secret-123")
ALICE = Credentials("alice", "alice-secret-1")


async def _send(addr: str, who: Credentials, topic: str) -> int:
    async with connected(addr, credentials=who) as c:
        return (await c.send(topic, b"x")).code


async def _route(addr: str, who: Credentials) -> int:
    async with connected(addr, credentials=who) as c:
        return (await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})).code


async def test_users_and_policies_replicate_and_survive_a_failover(make_cluster: Any) -> None:
    init = json.dumps({"username": ROOT.access_key, "password": ROOT.secret_key})
    bc: BrokerCluster = make_cluster(
        settings={
            "authenticationEnabled": "true",
            "authorizationEnabled": "true",
            "initAuthenticationUser": init,
        }
    )
    bc.signer = ROOT.sign
    leader = await bc.start_group("g1")
    async with AsyncAdminClient(
        leader.addr, access_key=ROOT.access_key, secret_key=ROOT.secret_key
    ) as a:
        await a.create_topic("orders")
        await a.create_topic("payroll")
        await a.create_user(ALICE.access_key, ALICE.secret_key)
        entries = [{"resource": "Topic:orders", "actions": ["Pub", "Sub"], "decision": "Allow"}]
        await a.create_acl("User:alice", [{"policyType": "Custom", "entries": entries}])
    assert await _send(leader.addr, ALICE, "orders") == ResponseCode.SUCCESS
    assert await _send(leader.addr, ALICE, "payroll") == ResponseCode.NO_PERMISSION

    followers = [r for r in bc.replicas.values() if r.replica != leader.replica]

    async def replicated() -> bool:
        for r in followers:
            try:
                doc = json.loads((r.store / "config" / "auth.json").read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                return False
            if "alice" not in {u["username"] for u in doc["state"]["users"]}:
                return False
        return True

    await bc.wait(replicated, 30, "alice reaches every follower's store")
    # a follower authenticates route requests with the replicated users
    for r in followers:
        assert await _route(r.addr, ALICE) == ResponseCode.SUCCESS
        assert await _route(r.addr, Credentials("mallory", "mallory-1")) == (
            ResponseCode.NO_PERMISSION
        )

    bc.kill("g1", leader.replica)
    new = await bc.wait_leader("g1", not_replica=leader.replica)

    async def serves_alice() -> bool:
        return await _send(new.addr, ALICE, "orders") == ResponseCode.SUCCESS

    await bc.wait(serves_alice, 30, "the new leader accepts alice's send to orders")
    assert await _send(new.addr, ALICE, "payroll") == ResponseCode.NO_PERMISSION
    assert await _send(new.addr, Credentials("mallory", "mallory-1"), "orders") == (
        ResponseCode.NO_PERMISSION
    )
