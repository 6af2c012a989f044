"""The txmq SDK over a cluster of two broker groups, given one group's address only: producers
spread over the queues of both groups, a transaction's halves stay in one group and its decision
(and check-back answer) goes there, push and pull consumers read every group, and a group's
leader change is followed.  Real etcd members and real broker processes."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from tests.cluster.test_cluster_failover import stored_bodies, text, txmq_cli
from tests.support.cluster import BrokerCluster
from tests.support.waiting import wait_until
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    InvalidMessageError,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    TransactionListener,
)

pytestmark = pytest.mark.slow

TOPIC = "spread"


async def two_groups(make_cluster: Any, g2_replicas: int = 1) -> tuple[BrokerCluster, str, str]:
    """g1 (one replica) and g2, with TOPIC placed on both (2 queues each); the leaders'
    addresses."""
    bc: BrokerCluster = make_cluster(
        groups={"g1": 1, "g2": g2_replicas}, settings={"minInSyncReplicas": 1}
    )
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    l2 = await bc.wait_leader("g2")
    if g2_replicas > 1:
        await bc.wait_in_sync("g2", list(range(g2_replicas)))
    for group in ("g1", "g2"):
        await asyncio.to_thread(
            txmq_cli, "cluster", "place", TOPIC, "--group", group, "--queues", "2",
            "--broker", l1.addr,
        )  # fmt: skip

    async def routed() -> bool:
        async with AsyncPullConsumer("route-probe", l1.addr) as c:
            try:
                return {q.broker for q in await c.fetch_message_queues(TOPIC)} == {"g1", "g2"}
            except Exception:
                return False

    await bc.wait(routed, 30, f"the route of {TOPIC!r} names both groups")
    return bc, l1.addr, l2.addr


async def test_producer_and_consumers_use_every_group(make_cluster: Any) -> None:
    bc, g1, g2 = await two_groups(make_cluster)
    bodies = [f"m-{i}".encode() for i in range(40)]
    async with AsyncProducer("spread-producer", g1) as producer:
        results = [await producer.send(Message(TOPIC, b)) for b in bodies]
        # A queue id alone is ambiguous in a topic of two groups; with the group it is not.
        with pytest.raises(InvalidMessageError, match="broker="):
            await producer.send(Message(TOPIC, b"x"), queue_id=1)
        pinned = await producer.send(Message(TOPIC, b"pinned"), queue_id=1, broker="g2")
        assert (pinned.broker_name, pinned.queue_id) == ("g2", 1)
        bodies.append(b"pinned")
        results.append(pinned)
    by_group = collections.Counter(r.broker_name for r in results)
    assert set(by_group) == {"g1", "g2"}, by_group
    # Each message is stored in the group its result names, once.
    stored = {
        "g1": sorted(await stored_bodies(g1, TOPIC, 2)),
        "g2": sorted(await stored_bodies(g2, TOPIC, 2)),
    }
    for group in ("g1", "g2"):
        expected = sorted(b for b, r in zip(bodies, results, strict=True) if r.broker_name == group)
        assert stored[group] == expected

    # Two push consumers of one group, started with g1's address: together they hold all four
    # queues, each once, and receive every message exactly once.
    got: list[bytes] = []

    async def on_message(msg: MessageExt) -> None:
        got.append(msg.body)

    consumers = [
        AsyncPushConsumer("spread-readers", g1, consume_from="first", rebalance_interval=1.0)
        for _ in range(2)
    ]
    for c in consumers:
        c.subscribe(TOPIC, "*", on_message)
        await c.start()
    try:
        all_queues = {MessageQueue(TOPIC, g, q) for g in ("g1", "g2") for q in (0, 1)}

        async def shared() -> bool:
            held = [q for c in consumers for q in c.queues() if q.topic == TOPIC]
            return len(held) == 4 and set(held) == all_queues

        await wait_until(shared, 30, "the two consumers share the four queues of both groups")
        await wait_until(
            lambda: len(got) >= len(bodies), 30, f"all {len(bodies)} messages consumed"
        )
    finally:
        for c in consumers:
            await c.shutdown()
    assert sorted(got) == sorted(bodies)

    # A pull consumer given g1 reads g2's queues too, naming the group.
    async with AsyncPullConsumer("spread-puller", g1) as puller:
        queues = await puller.fetch_message_queues(TOPIC)
        assert sorted(queues) == sorted(all_queues)
        pulled: list[bytes] = []
        for q in queues:
            r = await puller.pull(TOPIC, q.queue_id, 0, max_nums=64, broker=q.broker)
            pulled += [m.body for m in r.messages]
            await puller.commit_offset(TOPIC, q.queue_id, r.next_begin_offset, broker=q.broker)
            assert (
                await puller.committed_offset(TOPIC, q.queue_id, broker=q.broker)
                == r.next_begin_offset
            )
        assert sorted(pulled) == sorted(bodies)


class Outcomes(TransactionListener):
    """Commit bodies starting with ``c``, roll back ``r``, leave ``u`` unknown (the check-back
    then commits it)."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return {
            "c": LocalTransactionState.COMMIT_MESSAGE,
            "r": LocalTransactionState.ROLLBACK_MESSAGE,
        }.get(text(message.body)[0], LocalTransactionState.UNKNOW)

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(text(message.body))
        return LocalTransactionState.COMMIT_MESSAGE


async def test_transactions_across_groups(make_cluster: Any) -> None:
    """Single-message transactions land in both groups and each decision reaches the group
    holding its half (rolled back ones never appear); unknown ones are checked by the group
    that holds them and committed through that group; a multi-message transaction keeps its
    halves in one group and commits or rolls back as one."""
    bc, g1, g2 = await two_groups(make_cluster)
    listener = Outcomes()
    async with AsyncTransactionProducer("spread-tx", listener, g1) as tx:
        results = []
        for i in range(8):
            for kind in "cru":
                body = f"{kind}-{i}".encode()
                results.append((body, await tx.send_message_in_transaction(Message(TOPIC, body))))
        assert {r.broker_name for _, r in results} == {"g1", "g2"}
        unknown_groups = {r.broker_name for b, r in results if b.startswith(b"u")}
        assert unknown_groups == {"g1", "g2"}, "unknown transactions should be in both groups"

        async with tx.transaction() as txn:
            sent = [await txn.send(Message(TOPIC, f"multi-c-{i}".encode())) for i in range(4)]
        assert {s.broker_name for s in sent} == {txn.broker}
        with pytest.raises(RuntimeError):
            async with tx.transaction() as txn2:
                for i in range(4):
                    await txn2.send(Message(TOPIC, f"multi-r-{i}".encode()))
                raise RuntimeError("local transaction failed")

        expected = sorted(
            [b for b, _ in results if not b.startswith(b"r")]
            + [f"multi-c-{i}".encode() for i in range(4)]
        )

        async def delivered() -> bool:
            stored = await stored_bodies(g1, TOPIC, 2) + await stored_bodies(g2, TOPIC, 2)
            return sorted(stored) == expected

        await bc.wait(delivered, 40, "committed and checked transactions delivered once each")
    # Every unknown transaction was asked about (a check may repeat until its answer lands).
    assert set(listener.checked) == {text(b) for b, _ in results if b.startswith(b"u")}


async def test_producer_follows_a_groups_new_leader(make_cluster: Any) -> None:
    """g2's leader is killed: sends go on (to g1, and to g2's new leader once elected), each
    acknowledged message stored exactly once."""
    bc, g1, _ = await two_groups(make_cluster, g2_replicas=2)
    old = await bc.wait_leader("g2")
    acked: list[tuple[bytes, str]] = []
    async with AsyncProducer("spread-failover", g1, request_timeout=5.0) as producer:
        for i in range(10):
            r = await producer.send(Message(TOPIC, f"before-{i}".encode()))
            acked.append((f"before-{i}".encode(), r.broker_name))
        bc.kill("g2", old.replica)
        new = await bc.wait_leader("g2", not_replica=old.replica)
        i = 0

        async def reached_new_leader() -> bool:
            nonlocal i
            body = f"after-{i}".encode()
            i += 1
            r = await producer.send(Message(TOPIC, body))
            acked.append((body, r.broker_name))
            return r.broker_name == "g2"

        await bc.wait(reached_new_leader, 60, "a send stored by g2's new leader")
    stored = await stored_bodies(g1, TOPIC, 2) + await stored_bodies(new.addr, TOPIC, 2)
    counts = collections.Counter(stored)
    assert all(counts[b] == 1 for b, _ in acked), [b for b, _ in acked if counts[b] != 1]
