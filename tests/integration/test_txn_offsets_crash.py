"""Consumer offsets committed inside a transaction survive SIGKILL of the broker right after
the commit answer: the offset file is written only every ``flushConsumerOffsetInterval``, so
a restart re-applies the committed offsets records from the commit log."""

from __future__ import annotations

import json
import os

import pytest

from tests.client.helpers import FAST_CLIENT, create_topic, wait_until
from tests.support.process import BrokerProcess
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


async def test_offsets_survive_sigkill_right_after_the_commit_answer(tmp_path) -> None:
    store = str(tmp_path / "store")
    # The offset table is written once an hour: only the commit log has the offsets.
    bp = BrokerProcess(
        store,
        settings={"flushConsumerOffsetInterval": 3_600_000, "transactionTimeOut": 60_000},
    )
    address = bp.start()
    a, b, group = "eos-crash-a", "eos-crash-b", "eos-crash-g"
    try:
        await create_topic(address, a, 1)
        await create_topic(address, b, 1)
        async with AsyncProducer("eos-input", broker=address, config=FAST_CLIENT) as p:
            for i in range(3):
                await p.send(Message(a, f"in-{i}".encode()), queue_id=0)
        c = AsyncOrderlyPushConsumer(
            group,
            broker=address,
            consume_from="first",
            transactional_offsets=True,
            lock_interval=0.5,
            config=FAST_CLIENT,
        )
        done: list[int] = []
        async with AsyncTransactionProducer(
            "eos-crash-p", RollbackOnCheck(), broker=address, config=FAST_CLIENT
        ) as txp:

            async def transform(msg: MessageExt) -> None:
                async with txp.transaction() as txn:
                    await txn.send(Message(b, msg.body), queue_id=0)
                    txn.send_offsets(c, msg)
                done.append(msg.queue_offset)
                if len(done) == 3:
                    bp.kill()  # right after the third commit was answered

            c.subscribe(a, "*", transform)
            await c.start()
            try:
                await wait_until(lambda: len(done) == 3, 60, "three committed transactions")
            finally:
                await c.shutdown()
        # the file on disk holds at most the pinned start, not the committed offsets
        path = os.path.join(store, "config", "consumerOffset.json")
        if os.path.exists(path):
            with open(path) as f:
                table = json.load(f)["offsetTable"]
            assert table.get(f"{a}@{group}", {}).get("0", 0) < 3
        bp.port = int(address.rpartition(":")[2])
        address = bp.start()
        async with AsyncPullConsumer(group, broker=address, config=FAST_CLIENT) as pc:
            assert await pc.committed_offset(a, 0) == 3
            assert await pc.max_offset(b, 0) == 3
        replayed = [line for line in bp.log_lines if line.get("event") == "transactions_recovered"]
        assert replayed and replayed[-1]["offsetsReplayed"] >= 3
    finally:
        bp.stop_quietly()
