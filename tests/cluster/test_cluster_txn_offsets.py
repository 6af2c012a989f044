"""Consumer offsets committed inside transactions survive a failover exactly: a group of
three replicas, a consume-transform-produce step commits ten inputs, the leader is SIGKILLed
right after the tenth commit answer, and the new leader has the group's offset at ten and the
ten outputs.  Real etcd members and real broker processes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.client.helpers import create_topic
from tests.support.cluster import BrokerCluster
from tests.support.waiting import wait_until
from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncTransactionProducer,
    Message,
    MessageExt,
    RollbackOnCheck,
)

pytestmark = pytest.mark.slow

A, B, GROUP = "eos-fo-a", "eos-fo-b", "eos-fo-g"


async def test_transactional_offsets_survive_a_failover(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster(groups={"g1": 3})
    bc.start_all()
    old = await bc.wait_leader("g1")
    await bc.wait_in_sync("g1", [0, 1, 2])
    await create_topic(old.addr, A, 1)
    await create_topic(old.addr, B, 1)
    async with AsyncProducer("eos-fo-input", old.addr) as p:
        for i in range(20):
            await p.send(Message(A, f"in-{i}".encode()), queue_id=0)
    done: list[int] = []
    consumer = AsyncOrderlyPushConsumer(
        GROUP, old.addr, consume_from="first", transactional_offsets=True, lock_interval=0.5
    )
    async with AsyncTransactionProducer(
        "eos-fo-producer", RollbackOnCheck(), old.addr, request_timeout=3.0
    ) as txp:

        async def transform(msg: MessageExt) -> None:
            if len(done) >= 10:
                raise RuntimeError("the leader is gone")
            async with txp.transaction() as txn:
                await txn.send(Message(B, msg.body), queue_id=0)
                txn.send_offsets(consumer, msg)
            done.append(msg.queue_offset)
            if len(done) == 10:
                bc.kill("g1", old.replica)  # right after the tenth commit answer

        consumer.subscribe(A, "*", transform)
        await consumer.start()
        try:
            await wait_until(lambda: len(done) == 10, 60, "ten committed transactions")
        finally:
            await consumer.shutdown()
    new = await bc.wait_leader("g1", not_replica=old.replica)

    async def offset_at_ten() -> bool:
        try:
            async with AsyncPullConsumer(GROUP, new.addr) as pc:
                return await pc.committed_offset(A, 0) == 10
        except Exception:
            return False

    await bc.wait(offset_at_ten, 60, "the new leader has the group's offset at 10")
    async with AsyncPullConsumer("eos-fo-reader", new.addr) as pc:
        r = await pc.pull(B, 0, 0, 32)
        assert [m.body for m in r.messages] == [f"in-{i}".encode() for i in range(10)]
