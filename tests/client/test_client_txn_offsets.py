"""Consumer offsets committed inside a producer's transaction, against a real broker: a commit
moves them with the outputs, a rollback or an abandoned transaction leaves them, a stale
generation is fenced (outputs not delivered, offsets not moved, the whole transaction rolled
back), and a repeated attempt whose base offset moved is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.client.helpers import FAST_CLIENT, create_topic, wait_until
from tests.support.brokers import started
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.store.fileio import with_checksum
from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncTransaction,
    AsyncTransactionProducer,
    FencedError,
    LocalTransactionState,
    Message,
    MessageExt,
    RollbackOnCheck,
)
from txmq.client.remoting import BrokerConnection
from txmq.protocol.codes import RequestCode
from txmq.protocol.headers import GetConsumerListByGroupRequestHeader


@pytest.fixture
async def broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[BrokerController]:
    """A broker that checks transactions only after 10 s: no check-back races the commits."""
    async with started(make_broker_config(transaction_time_out=10_000)) as controller:
        yield controller


async def outputs(address: str, topic: str, queues: int = 1) -> list[MessageExt]:
    """Every message of ``topic``."""
    out: list[MessageExt] = []
    async with AsyncPullConsumer("eos-reader", broker=address, config=FAST_CLIENT) as pc:
        for q in range(queues):
            offset = await pc.min_offset(topic, q)
            end = await pc.max_offset(topic, q)
            while offset < end:
                r = await pc.pull(topic, q, offset, 32)
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out


async def committed(address: str, group: str, topic: str, queue_id: int = 0) -> int | None:
    async with AsyncPullConsumer(group, broker=address, config=FAST_CLIENT) as pc:
        return await pc.committed_offset(topic, queue_id)


async def generation(address: str, group: str) -> int:
    conn = BrokerConnection(address, FAST_CLIENT)
    await conn.start()
    try:
        resp = await conn.invoke(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            GetConsumerListByGroupRequestHeader(consumer_group=group),
        )
    finally:
        await conn.close()
    return int(json.loads(resp.body)["generation"])


def consumer(broker: BrokerController, group: str, **kw: Any) -> AsyncOrderlyPushConsumer:
    kw.setdefault("lock_interval", 0.5)
    kw.setdefault("suspend_interval", 0.05)
    return AsyncOrderlyPushConsumer(
        group,
        broker=broker.address,
        consume_from="first",
        transactional_offsets=True,
        config=FAST_CLIENT,
        **kw,
    )


@pytest.fixture
async def txp(broker: BrokerController) -> AsyncIterator[AsyncTransactionProducer]:
    async with AsyncTransactionProducer(
        "eos-producer", RollbackOnCheck(), broker=broker.address, config=FAST_CLIENT
    ) as p:
        yield p


async def fill(broker: BrokerController, topic: str, n: int) -> list[str]:
    async with AsyncProducer("eos-input", broker=broker.address, config=FAST_CLIENT) as p:
        return [
            (await p.send(Message(topic, f"in-{i}".encode()), queue_id=0)).msg_id for i in range(n)
        ]


async def in_and_out(
    broker: BrokerController, unique: Callable[[str], str], n: int
) -> tuple[str, str, str, list[str]]:
    """A new input topic holding ``n`` messages, a new output topic and a new group (one
    queue each): ``(input, output, group, the input's ids)``."""
    a, b, group = unique("eos-a"), unique("eos-b"), unique("eos-g")
    await create_topic(broker.address, a, 1)
    await create_topic(broker.address, b, 1)
    return a, b, group, await fill(broker, a, n)


async def bump_generation(broker: BrokerController, group: str, join: Any) -> None:
    """``await join()`` makes a member join ``group``: wait until its generation moved on."""
    before = await generation(broker.address, group)
    await join()
    await wait_until(
        lambda: _gt(generation(broker.address, group), before), what="the generation bumped"
    )


@contextlib.contextmanager
def noting_fenced(fenced: list[FencedError]) -> Iterator[None]:
    """Add a :class:`FencedError` the block raises to ``fenced``, and let it go on."""
    try:
        yield
    except FencedError as exc:
        fenced.append(exc)
        raise


async def test_commit_moves_offsets_with_the_outputs(
    broker: BrokerController, txp: AsyncTransactionProducer, unique: Callable[[str], str]
) -> None:
    a, b, group, ids = await in_and_out(broker, unique, 5)
    c = consumer(broker, group)

    async def transform(msg: MessageExt) -> None:
        async with txp.transaction() as txn:
            await txn.send(Message(b, msg.msg_id.encode()), queue_id=0)
            txn.send_offsets(c, msg)

    c.subscribe(a, "*", transform)
    async with c:
        await wait_until(lambda: committed(broker.address, group, a), what="offsets committed")
        await wait_until(
            lambda: _eq(committed(broker.address, group, a), 5), what="offset 5 committed"
        )
    got = [m.body.decode() for m in await outputs(broker.address, b)]
    assert got == ids
    assert broker.transactions.txn_offsets.applied == 5
    # nothing was committed by the consumer itself: the offsets topic holds one record each
    assert broker.store.get_max_offset_in_queue("TXMQ_SYS_TXN_OFFSETS", 0) == 5


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_rollback_leaves_offsets_and_outputs(
    broker: BrokerController, txp: AsyncTransactionProducer, unique: Callable[[str], str]
) -> None:
    a, b, group, ids = await in_and_out(broker, unique, 3)
    attempts: dict[str, int] = {}
    c = consumer(broker, group)

    async def transform(msg: MessageExt) -> None:
        n = attempts[msg.msg_id] = attempts.get(msg.msg_id, 0) + 1
        async with txp.transaction() as txn:
            await txn.send(Message(b, f"{msg.msg_id}#{n}".encode()), queue_id=0)
            txn.send_offsets(c, msg)
            if n == 1:
                raise RuntimeError("first attempt fails after its output and offsets")

    c.subscribe(a, "*", transform)
    async with c:
        await wait_until(
            lambda: _eq(committed(broker.address, group, a), 3), what="offset 3 committed"
        )
    got = [m.body.decode() for m in await outputs(broker.address, b)]
    assert got == [f"{i}#2" for i in ids]
    assert broker.transactions.txn_offsets.applied == 3
    assert broker.transactions.summary()["rolledBack"] == 3


async def _held_input(
    broker: BrokerController, unique: Callable[[str], str]
) -> tuple[str, str, str, list[MessageExt], AsyncOrderlyPushConsumer]:
    """An input topic holding one message, an output topic, and a consumer (not started) of a
    new group whose callback keeps failing, so the message stays unconsumed and is delivered
    again in place: ``(input, output, group, the deliveries, the consumer)``."""
    a, b, group, _ = await in_and_out(broker, unique, 1)
    seen: list[MessageExt] = []
    c = consumer(broker, group)

    async def hold(msg: MessageExt) -> None:
        seen.append(msg)
        raise RuntimeError("not now")  # retried in place: keeps the queue

    c.subscribe(a, "*", hold)
    return a, b, group, seen, c


async def test_abandoned_transaction_leaves_offsets_and_is_rolled_back_by_check(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    async with started(make_broker_config()) as controller:  # checks after 300 ms
        a, b, group, seen, c = await _held_input(controller, unique)
        async with (
            AsyncTransactionProducer(
                "eos-abandon", RollbackOnCheck(), broker=controller.address, config=FAST_CLIENT
            ) as p,
            c,
        ):
            await wait_until(lambda: seen, what="the input delivered")
            txn = AsyncTransaction(p, "abandoned-1")
            await txn.send(Message(b, b"out"), queue_id=0)
            txn.send_offsets(c, seen[0])
            await txn._send_offsets_half()  # stored, never decided: the producer "died"
            await wait_until(
                lambda: controller.transactions.summary()["rolledBack"] == 1,
                what="the abandoned transaction rolled back by the check-back",
            )
            assert await committed(controller.address, group, a) == 0
            assert await outputs(controller.address, b) == []


async def test_a_stale_generation_is_fenced(
    broker: BrokerController, txp: AsyncTransactionProducer, unique: Callable[[str], str]
) -> None:
    a, b, group, _ = await in_and_out(broker, unique, 1)
    c = consumer(broker, group)
    other = consumer(broker, group)
    other.subscribe(a, "*", lambda m: None)
    fenced: list[FencedError] = []
    gate = asyncio.Event()

    async def transform(msg: MessageExt) -> None:
        if fenced:
            await gate.wait()  # hold the queue: nothing else may commit meanwhile
            raise RuntimeError("stop after the fenced attempt")
        with noting_fenced(fenced):
            async with txp.transaction() as txn:
                await txn.send(Message(b, b"fenced-output"), queue_id=0)
                txn.send_offsets(c, msg)
                # a member joins: the group's generation moves on
                await bump_generation(broker, group, other.start)

    c.subscribe(a, "*", transform)
    try:
        async with c:
            await wait_until(lambda: fenced, what="the commit fenced")
            assert "fenced: generation" in str(fenced[0])
            assert "is stale" in str(fenced[0])
            assert await committed(broker.address, group, a) == 0
            assert await outputs(broker.address, b) == []
            assert broker.transactions.summary()["rolledBack"] == 1
            assert broker.transactions.summary()["committed"] == 0
            gate.set()
    finally:
        await other.shutdown()


async def _gt(value: Any, bound: int) -> bool:
    return bool(await value > bound)


async def test_a_repeated_attempt_from_an_old_base_offset_is_refused(
    broker: BrokerController, txp: AsyncTransactionProducer, unique: Callable[[str], str]
) -> None:
    """Two attempts at one input that both start from committed offset 0 (a retry after a lost
    answer, or a zombie): the second commit is refused, so one output exists."""
    a, b, group, _ = await in_and_out(broker, unique, 1)
    seen: list[MessageExt] = []
    gate = asyncio.Event()
    c = consumer(broker, group)

    async def hold(msg: MessageExt) -> None:
        seen.append(msg)
        await gate.wait()

    c.subscribe(a, "*", hold)
    async with c:
        await wait_until(lambda: seen, what="the input delivered")
        first = AsyncTransaction(txp, "attempt-1")
        second = AsyncTransaction(txp, "attempt-2")
        for t in (first, second):
            await t.send(Message(b, t.transaction_id.encode()), queue_id=0)
            t.send_offsets(c, seen[0])
        await first.commit()
        with pytest.raises(FencedError, match="committed offset of .* is 1, not 0"):
            await second.commit()
        gate.set()
    assert await committed(broker.address, group, a) == 1
    assert [m.body for m in await outputs(broker.address, b)] == [b"attempt-1"]


async def test_send_offsets_needs_a_transactional_consumer(
    broker: BrokerController, txp: AsyncTransactionProducer
) -> None:
    from txmq.client import ClientStateError

    c = AsyncOrderlyPushConsumer("plain", broker=broker.address, config=FAST_CLIENT)
    txn = AsyncTransaction(txp, "t")
    with pytest.raises(ClientStateError, match="transactional_offsets=True"):
        txn.send_offsets(c, MessageExt(topic="x", body=b""))


class CommitOnCheck(RollbackOnCheck):
    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


@pytest.mark.parametrize("member_left", [False, True])
async def test_a_commit_decided_by_check_back_is_applied_and_fenced_the_same_way(
    make_broker_config: Callable[..., BrokerConfig],
    unique: Callable[[str], str],
    member_left: bool,
) -> None:
    """The producer never sends its decision; the broker's check gets COMMIT.  With the
    consumer still the queue's owner the offsets move with the output; once it has left the
    group the check's commit is fenced and the transaction rolled back."""
    async with started(make_broker_config()) as controller:  # checks after 300 ms
        a, b, group, seen, c = await _held_input(controller, unique)
        async with AsyncTransactionProducer(
            "eos-check", CommitOnCheck(), broker=controller.address, config=FAST_CLIENT
        ) as p:
            await c.start()
            try:
                await wait_until(lambda: seen, what="the input delivered")
                txn = AsyncTransaction(p, unique("undecided"))
                await txn.send(Message(b, b"out"), queue_id=0)
                txn.send_offsets(c, seen[0])
                if member_left:
                    await c.shutdown()
                await txn._send_offsets_half()  # stored, never decided by the producer
                summary = controller.transactions.summary
                await wait_until(
                    lambda: summary()["committed"] + summary()["rolledBack"] == 1,
                    what="the check-back decided the transaction",
                )
            finally:
                await c.shutdown()
        outs = await outputs(controller.address, b)
        if member_left:
            assert summary()["rolledBack"] == 1
            assert outs == []
            assert await committed(controller.address, group, a) == 0
        else:
            assert summary()["committed"] == 1
            assert [m.body for m in outs] == [b"out"]
            assert await committed(controller.address, group, a) == 1


async def test_fenced_attempts_do_not_count_towards_the_dead_letter_queue(
    broker: BrokerController, txp: AsyncTransactionProducer, unique: Callable[[str], str]
) -> None:
    """With no retries allowed (``max_reconsume_times=0``), a commit fenced because a member
    joined does not send the message to the dead-letter queue: the member rebalances (keeping
    the queue: the joiner's id sorts after its own) and commits the message once."""
    a, b, group, _ = await in_and_out(broker, unique, 1)
    c = consumer(broker, group, max_reconsume_times=0)
    joiner = BrokerConnection(broker.address, FAST_CLIENT, client_id="~joiner-sorts-last")
    joiner.register_consumer(
        group,
        lambda: {
            "groupName": group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING",
            "subscriptionDataSet": [{"topic": a, "subString": "*"}],
        },
    )
    fenced: list[FencedError] = []

    async def transform(msg: MessageExt) -> None:
        with noting_fenced(fenced):
            async with txp.transaction() as txn:
                await txn.send(Message(b, b"fenced" if not fenced else b"ok"), queue_id=0)
                txn.send_offsets(c, msg)
                if not fenced:

                    async def join() -> None:  # a member joins mid-transaction
                        await joiner.start()
                        await joiner.send_heartbeat()

                    await bump_generation(broker, group, join)

    c.subscribe(a, "*", transform)
    try:
        async with c:
            await wait_until(
                lambda: _eq(committed(broker.address, group, a), 1), what="offset 1 committed"
            )
    finally:
        await joiner.close()
    assert len(fenced) == 1
    assert [m.body for m in await outputs(broker.address, b)] == [b"ok"]
    assert c.dead_lettered_count == 0


async def test_an_applied_position_past_the_commit_log_is_reset_at_start(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    """An offset file that claims more applied records than the commit log holds (written
    before a crash cut the log's tail) does not stop later commits from being applied."""
    config = make_broker_config(transaction_time_out=10_000)
    a, b, group = unique("eos-a"), unique("eos-b"), unique("eos-g")

    async def process(controller: BrokerController, upto: int) -> None:
        async with AsyncTransactionProducer(
            "eos-reset", RollbackOnCheck(), broker=controller.address, config=FAST_CLIENT
        ) as p:
            c = consumer(controller, group)

            async def transform(msg: MessageExt) -> None:
                async with p.transaction() as txn:
                    await txn.send(Message(b, msg.body), queue_id=0)
                    txn.send_offsets(c, msg)

            c.subscribe(a, "*", transform)
            async with c:
                await wait_until(
                    lambda: _eq(committed(controller.address, group, a), upto),
                    what=f"offset {upto} committed",
                )

    async with started(config) as first:
        await create_topic(first.address, a, 1)
        await create_topic(first.address, b, 1)
        await fill(first, a, 2)
        await process(first, 2)
    path = os.path.join(config.store_path_root_dir, "config", "consumerOffset.json")
    with open(path) as f:
        doc = json.load(f)
    key = "TXMQ_SYS_TXN_OFFSETS@TXMQ_SYS_TXN_OFFSETS_APPLIED"
    assert doc["offsetTable"][key] == {"0": 2}
    doc["offsetTable"][key] = {"0": 99}
    with open(path, "w") as f:
        json.dump(with_checksum(doc), f)  # a file the broker wrote, checksum and all
    async with started(config) as second:
        await fill(second, a, 1)
        await process(second, 3)
        assert [m.body for m in await outputs(second.address, b)] == [b"in-0", b"in-1", b"in-0"]
