"""The blocking facade of consume-transform-produce: ``OrderlyPushConsumer(...,
transactional_offsets=True)`` and ``Transaction.send_offsets`` from a sync callback."""

from __future__ import annotations

from collections.abc import Callable

from tests.client.helpers import FAST_CLIENT, wait_until_sync
from tests.conftest import BrokerThread
from txmq.broker.config import BrokerConfig
from txmq.client import (
    Message,
    MessageExt,
    OrderlyPushConsumer,
    Producer,
    PullConsumer,
    RollbackOnCheck,
    TransactionProducer,
)


def test_sync_transform_commits_offsets_with_outputs(
    broker_thread_factory: Callable[..., BrokerThread],
    make_broker_config: Callable[..., BrokerConfig],
    unique: Callable[[str], str],
) -> None:
    bt = broker_thread_factory(make_broker_config(transaction_time_out=10_000))
    address = bt.address
    a, b, group = unique("eos-sync-a"), unique("eos-sync-b"), unique("eos-sync-g")
    with Producer("eos-sync-input", broker=address, config=FAST_CLIENT) as p:
        ids = [p.send(Message(a, f"in-{i}".encode()), queue_id=i % 2).msg_id for i in range(6)]
    failed_once: set[str] = set()
    with TransactionProducer(
        "eos-sync-producer", RollbackOnCheck(), broker=address, config=FAST_CLIENT
    ) as txp:
        consumer = OrderlyPushConsumer(
            group,
            broker=address,
            consume_from="first",
            transactional_offsets=True,
            lock_interval=0.5,
            suspend_interval=0.05,
            config=FAST_CLIENT,
        )

        def transform(msg: MessageExt) -> None:
            with txp.transaction() as txn:
                txn.send(Message(b, msg.msg_id.encode()), queue_id=0)
                txn.send_offsets(consumer, msg)
                if msg.msg_id not in failed_once:  # every first attempt rolls back
                    failed_once.add(msg.msg_id)
                    raise RuntimeError("roll this attempt back")

        consumer.subscribe(a, "*", transform)
        consumer.start()
        try:
            with PullConsumer(group, broker=address, config=FAST_CLIENT) as pc:
                wait_until_sync(
                    lambda: [pc.committed_offset(a, q) for q in (0, 1)] == [3, 3],
                    what="offsets 3 and 3 committed",
                )
                outs: list[str] = []
                offset = pc.min_offset(b, 0)
                while offset < pc.max_offset(b, 0):
                    r = pc.pull(b, 0, offset, 32)
                    outs.extend(m.body.decode() for m in r.messages)
                    offset = r.next_begin_offset
        finally:
            consumer.shutdown()
    assert sorted(outs) == sorted(ids)
