"""AsyncProducer and AsyncPullConsumer against a real broker on a real TCP port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests.client.helpers import FAST_CLIENT, create_topic, send_numbered, wait_until
from tests.support.brokers import started
from tests.support.waiting import parked_pulls
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    ClientStateError,
    ConnectionClosedError,
    InvalidMessageError,
    Message,
    PullStatus,
    SendStatus,
    TopicNotExistError,
)
from txmq.protocol.errors import MessageIllegalError


@pytest.fixture
async def producer(broker: BrokerController) -> AsyncIterator[AsyncProducer]:
    async with AsyncProducer("test-producer", broker=broker.address, config=FAST_CLIENT) as p:
        yield p


@pytest.fixture
async def puller(broker: BrokerController) -> AsyncIterator[AsyncPullConsumer]:
    async with AsyncPullConsumer("test-puller", broker=broker.address, config=FAST_CLIENT) as c:
        yield c


async def test_send_then_pull_keeps_everything(
    producer: AsyncProducer, puller: AsyncPullConsumer, unique: Callable[[str], str]
) -> None:
    topic = unique("orders")
    before = int(time.time() * 1000)
    result = await producer.send(
        Message(topic, b"order body", tags="created", keys="order-1", properties={"region": "eu"})
    )
    assert result.status is SendStatus.SEND_OK
    assert len(result.msg_id) == 32 and result.msg_ids == [result.msg_id]
    assert len(result.offset_msg_id) == 32 and result.offset_msg_id != result.msg_id
    assert result.topic == topic and 0 <= result.queue_id < 4 and result.queue_offset == 0

    pr = await puller.pull(topic, result.queue_id, 0)
    assert pr.status is PullStatus.FOUND and pr.next_begin_offset == 1 and pr.max_offset == 1
    [m] = pr.messages
    assert (m.topic, m.body, m.tags, m.keys) == (topic, b"order body", "created", "order-1")
    assert m.user_properties == {"region": "eu"}
    assert m.msg_id == result.msg_id and m.offset_msg_id == result.offset_msg_id
    assert (m.queue_id, m.queue_offset, m.reconsume_times) == (result.queue_id, 0, 0)
    assert before <= m.born_timestamp <= m.store_timestamp + 1000


async def test_unknown_topic_is_created_on_first_send_then_routed(
    producer: AsyncProducer, puller: AsyncPullConsumer, unique: Callable[[str], str]
) -> None:
    topic = unique("fresh")
    with pytest.raises(TopicNotExistError):
        await puller.fetch_queues(topic)
    results = [await producer.send(Message(topic, f"m{i}".encode())) for i in range(8)]
    assert await puller.fetch_queues(topic) == [0, 1, 2, 3]
    # Round robin over the four queues once the route is known.
    assert {r.queue_id for r in results[1:5]} == {0, 1, 2, 3}
    total = sum([await puller.max_offset(topic, q) for q in range(4)])
    assert total == 8


async def test_send_batch_stores_consecutive_messages_in_one_queue(
    producer: AsyncProducer, puller: AsyncPullConsumer, unique: Callable[[str], str]
) -> None:
    topic = unique("batch")
    await producer.send(Message(topic, b"first"), queue_id=1)
    msgs = [
        Message(topic, f"item-{i}".encode(), tags="bulk", keys=f"k{i}", properties={"i": str(i)})
        for i in range(5)
    ]
    result = await producer.send_batch(msgs, queue_id=1)
    assert result.status is SendStatus.SEND_OK
    assert result.queue_id == 1 and result.queue_offset == 1
    assert len(result.msg_ids) == 5 and len(set(result.msg_ids)) == 5
    assert result.msg_id == ",".join(result.msg_ids)
    assert len(result.offset_msg_ids) == 5
    pr = await puller.pull(topic, 1, 1)
    assert [m.body for m in pr.messages] == [f"item-{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in pr.messages] == [1, 2, 3, 4, 5]
    assert [m.msg_id for m in pr.messages] == result.msg_ids
    assert [m.offset_msg_id for m in pr.messages] == result.offset_msg_ids
    assert [m.user_properties["i"] for m in pr.messages] == ["0", "1", "2", "3", "4"]
    assert {m.tags for m in pr.messages} == {"bulk"}


async def test_send_batch_refuses_bad_batches(producer: AsyncProducer) -> None:
    with pytest.raises(InvalidMessageError, match="at least one"):
        await producer.send_batch([])
    with pytest.raises(InvalidMessageError, match="same topic"):
        await producer.send_batch([Message("a", b"1"), Message("b", b"2")])
    with pytest.raises(InvalidMessageError, match="delay"):
        await producer.send_batch([Message("a", b"1", delay_level=2)])
    with pytest.raises(InvalidMessageError, match="over the limit"):
        await producer.send_batch(
            [Message("a", b"x" * (3 * 1024 * 1024)), Message("a", b"y" * (3 * 1024 * 1024))]
        )


async def test_send_oneway_arrives(
    producer: AsyncProducer, puller: AsyncPullConsumer, unique: Callable[[str], str]
) -> None:
    topic = unique("oneway")
    await create_topic(producer.broker, topic, 2)
    await producer.send_oneway(Message(topic, b"fire and forget", keys="ow"), queue_id=1)

    async def arrived() -> bool:
        return (await puller.max_offset(topic, 1)) == 1

    await wait_until(arrived, what="the oneway message")
    [m] = (await puller.pull(topic, 1, 0)).messages
    assert (m.body, m.keys) == (b"fire and forget", "ow")


async def test_sharding_key_keeps_one_key_in_one_queue_in_order(
    producer: AsyncProducer, puller: AsyncPullConsumer, unique: Callable[[str], str]
) -> None:
    topic = unique("ordered")
    await create_topic(producer.broker, topic, 8)
    by_key: dict[str, list[int]] = {}
    for i in range(30):
        key = f"order-{i % 3}"
        r = await producer.send(Message(topic, f"{key}:{i}".encode()), sharding_key=key)
        by_key.setdefault(key, []).append(r.queue_id)
    for key, qids in by_key.items():
        assert len(set(qids)) == 1, key
        [qid] = set(qids)
        bodies = [m.body.decode() for m in (await puller.pull(topic, qid, 0, 64)).messages]
        mine = [int(b.split(":")[1]) for b in bodies if b.startswith(key + ":")]
        assert mine == sorted(mine) and len(mine) == 10


async def test_selector_and_explicit_queue(
    producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic = unique("sel")
    await create_topic(producer.broker, topic, 4)
    seen: list[list[int]] = []

    def last_queue(queue_ids: list[int], msg: Message) -> int:
        seen.append(queue_ids)
        return queue_ids[-1]

    r = await producer.send(Message(topic, b"x"), selector=last_queue)
    assert r.queue_id == 3 and seen == [[0, 1, 2, 3]]
    assert (await producer.send(Message(topic, b"y"), queue_id=2)).queue_id == 2
    with pytest.raises(InvalidMessageError, match="queue 9 does not exist"):
        await producer.send(Message(topic, b"z"), queue_id=9)
    with pytest.raises(InvalidMessageError, match="selector chose queue 7"):
        await producer.send(Message(topic, b"z"), selector=lambda ids, m: 7)
    with pytest.raises(ValueError, match="at most one"):
        await producer.send(Message(topic, b"z"), queue_id=1, sharding_key="k")


async def test_invalid_topic_and_oversized_body_are_refused_clearly(
    producer: AsyncProducer, puller: AsyncPullConsumer
) -> None:
    with pytest.raises(InvalidMessageError, match="'bad topic!' contains characters"):
        await producer.send(Message("bad topic!", b"x"))
    with pytest.raises(InvalidMessageError, match=r"4194305 bytes, over the limit of 4194304"):
        await producer.send(Message("big", b"x" * (4 * 1024 * 1024 + 1)))
    with pytest.raises(InvalidMessageError, match="empty"):
        await producer.send(Message("big", b""))
    # Nothing reached the broker.
    with pytest.raises(TopicNotExistError):
        await puller.fetch_queues("big")


async def test_broker_side_limit_surfaces_as_its_error(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    async with started(make_broker_config(max_message_size=1024)) as controller:
        async with AsyncProducer(
            "p", broker=controller.address, config=FAST_CLIENT, max_message_size=4096
        ) as p:
            with pytest.raises(MessageIllegalError, match="exceeds the limit"):
                await p.send(Message(unique("t"), b"x" * 2000))


async def test_pull_consumer_offsets_filters_and_long_poll(
    broker: BrokerController,
    producer: AsyncProducer,
    puller: AsyncPullConsumer,
    unique: Callable[[str], str],
) -> None:
    topic = unique("pull")
    await create_topic(producer.broker, topic, 2)
    for i in range(10):
        await producer.send(
            Message(topic, f"m{i}".encode(), tags="even" if i % 2 == 0 else "odd"), queue_id=0
        )
    assert await puller.fetch_queues(topic) == [0, 1]
    assert (await puller.min_offset(topic, 0), await puller.max_offset(topic, 0)) == (0, 10)

    first = await puller.pull(topic, 0, 0, max_nums=4)
    assert first.status is PullStatus.FOUND
    assert [m.body for m in first.messages] == [b"m0", b"m1", b"m2", b"m3"]
    assert first.next_begin_offset == 4 and (first.min_offset, first.max_offset) == (0, 10)

    odd = await puller.pull(topic, 0, 0, max_nums=32, expression="odd")
    assert [m.body for m in odd.messages] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    assert odd.next_begin_offset == 10

    empty = await puller.pull(topic, 0, 10)
    assert empty.status is PullStatus.NO_NEW_MSG and empty.next_begin_offset == 10
    moved = await puller.pull(topic, 0, 1000)
    assert moved.status is PullStatus.OFFSET_ILLEGAL and moved.next_begin_offset == 10

    assert await puller.committed_offset(topic, 0) is None
    await puller.commit_offset(topic, 0, 7)
    assert await puller.committed_offset(topic, 0) == 7

    # Long poll: the pull waits at the end of the queue and returns when a message lands.
    waiting = asyncio.ensure_future(puller.pull(topic, 1, 0, long_poll=30.0))
    await wait_until(lambda: parked_pulls(broker, topic, 1) == 1, 10, "the pull to be parked")
    assert not waiting.done()
    await producer.send(Message(topic, b"late"), queue_id=1)
    late = await asyncio.wait_for(waiting, 10.0)
    assert late.status is PullStatus.FOUND and [m.body for m in late.messages] == [b"late"]


async def test_offset_for_timestamp(
    shifted_broker: tuple[BrokerController, list[float]], unique: Callable[[str], str]
) -> None:
    broker, shift = shifted_broker
    topic = unique("ts")
    await create_topic(broker.address, topic, 1)
    async with (
        AsyncProducer("test-producer", broker=broker.address, config=FAST_CLIENT) as producer,
        AsyncPullConsumer("test-puller", broker=broker.address, config=FAST_CLIENT) as puller,
    ):
        await send_numbered(producer, topic, "old", 3)
        # The broker's clock jumps a minute ahead: the cut lies 30 s after the "old" store
        # times and 30 s before the "new" ones, however slow the machine.
        shift[0] = 60.0
        cut = int((time.time() + 30) * 1000)
        await send_numbered(producer, topic, "new", 2)
        assert await puller.offset_for_timestamp(topic, 0, cut) == 3


async def test_lifecycle_errors(broker: BrokerController) -> None:
    p = AsyncProducer("p", broker=broker.address, config=FAST_CLIENT)
    with pytest.raises(ClientStateError, match="not started"):
        await p.send(Message("t", b"x"))
    await p.start()
    await p.shutdown()
    await p.shutdown()  # idempotent
    with pytest.raises(ClientStateError, match="shut down"):
        await p.start()
    with pytest.raises(ConnectionClosedError, match="cannot connect"):
        await AsyncProducer("p", broker="127.0.0.1:1", config=FAST_CLIENT).start()


async def test_flush_disk_timeout_is_a_status_not_a_resend(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    controller = BrokerController(
        make_broker_config(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=0)
    )
    await controller.start()
    topic = unique("sync")
    try:
        async with (
            AsyncProducer("p", broker=controller.address, config=FAST_CLIENT) as p,
            AsyncPullConsumer("c", broker=controller.address, config=FAST_CLIENT) as c,
        ):
            await create_topic(controller.address, topic, 1)
            result = await p.send(Message(topic, b"stored, not yet fsynced"))
            assert result.status is SendStatus.FLUSH_DISK_TIMEOUT
            assert result.queue_offset == 0 and len(result.offset_msg_id) == 32
            assert await c.max_offset(topic, 0) == 1  # stored once: no resend
    finally:
        await controller.shutdown()
