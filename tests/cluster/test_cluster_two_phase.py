"""Two-phase transactions in a cluster: a handle names the broker group holding its halves, so a
fresh producer connected to another group decides it there, and ``recover()`` asks every group.
Real etcd members, real broker processes (g1 holds ``xa``, g2 holds ``xb``)."""

from __future__ import annotations

from typing import Any

from tests.cluster.test_cluster_xgroup_txn import consumed, start_groups
from txmq.client import AsyncTransactionProducer, Message, RollbackOnCheck

GROUP = "coordinated-cluster"


async def test_handles_name_their_group_and_recover_asks_every_group(make_cluster: Any) -> None:
    bc = await start_groups(make_cluster, 1)
    seeds = bc.seeds("g1")
    async with AsyncTransactionProducer(GROUP, RollbackOnCheck(), seeds) as first:
        handles = {}
        for topic in ("xa", "xb"):
            async with first.transaction(two_phase=True) as txn:
                await txn.send(Message(topic, f"prepared-{topic}".encode()))
                handles[topic] = await txn.prepare()
    assert (handles["xa"].broker, handles["xb"].broker) == ("g1", "g2")
    # a fresh producer, connected through g1's seeds, with only the handles' text
    async with AsyncTransactionProducer(GROUP, RollbackOnCheck(), seeds) as coordinator:
        found = await coordinator.recover()
        assert sorted(found, key=lambda h: h.broker) == [handles["xa"], handles["xb"]]
        assert await coordinator.recover(["g2"]) == [handles["xb"]]
        await coordinator.commit(str(handles["xb"]))
        await coordinator.commit(str(handles["xb"]))
        await coordinator.rollback(str(handles["xa"]))
        assert await coordinator.recover() == []
    await bc.wait(
        lambda: _read(seeds),
        30,
        "the committed half read in xb, the rolled-back one nowhere",
    )


async def _read(seeds: str) -> bool:
    return await consumed(seeds, "xb") == ["prepared-xb"] and await consumed(seeds, "xa") == []
