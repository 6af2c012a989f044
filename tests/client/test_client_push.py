"""AsyncPushConsumer against a real broker: delivery, filtering, rebalance, retries, offsets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.client.helpers import (
    FAST_CLIENT,
    order_message,
    send_numbered,
    settled,
    topic_and_group,
    wait_until,
)
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    ClientStateError,
    Message,
    MessageExt,
)


class Inbox:
    """Collects deliveries from callbacks running in worker threads or on the loop."""

    def __init__(self) -> None:
        self.msgs: list[MessageExt] = []
        self._lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> None:
        with self._lock:
            self.msgs.append(msg)

    @property
    def bodies(self) -> list[bytes]:
        with self._lock:
            return [m.body for m in self.msgs]

    def count(self) -> int:
        with self._lock:
            return len(self.msgs)


@pytest.fixture
async def producer(broker: BrokerController) -> AsyncIterator[AsyncProducer]:
    async with AsyncProducer("push-test-producer", broker=broker.address, config=FAST_CLIENT) as p:
        yield p


def consumer_for(broker: BrokerController, group: str, **kw: Any) -> AsyncPushConsumer:
    return AsyncPushConsumer(group, broker=broker.address, config=FAST_CLIENT, **kw)


async def test_round_trip_with_tags_keys_properties_and_ids(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "orders", "billing")
    inbox = Inbox()
    consumer = consumer_for(broker, group)
    consumer.subscribe(topic, "created || paid", inbox)
    await consumer.start()
    try:
        # The heartbeat registered the member, its subscription and the group's retry topic.
        assert broker.clients.consumer_ids(group) == [consumer.client_id]
        sub = broker.clients.subscription(group, topic)
        assert sub is not None and sub.tags == frozenset({"created", "paid"})
        assert broker.clients.subscription(group, f"%RETRY%{group}") is not None
        assert sorted(consumer.assignment()) == [(f"%RETRY%{group}", 0)] + [
            (topic, q) for q in range(4)
        ]
        sent = {}
        for i, tag in enumerate(["created", "paid", "created"]):
            r = await producer.send(order_message(topic, i, tag, f"body-{i}".encode()))
            sent[r.msg_id] = (r, i, tag)
        await wait_until(lambda: inbox.count() == 3, what="three deliveries")
    finally:
        await consumer.shutdown()
    assert broker.clients.consumer_ids(group) == []  # unregistered
    for m in inbox.msgs:
        r, i, tag = sent[m.msg_id]
        assert (m.topic, m.body, m.tags, m.keys) == (topic, f"body-{i}".encode(), tag, f"order-{i}")
        assert m.user_properties == {"region": "eu"} and m.properties["region"] == "eu"
        assert (m.queue_id, m.queue_offset) == (r.queue_id, r.queue_offset)
        assert m.offset_msg_id == r.offset_msg_id and m.reconsume_times == 0
        assert m.born_timestamp > 0 and m.store_timestamp > 0


async def test_tag_filter_delivers_only_matching_tags(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "tags", "g", 1)
    inbox = Inbox()
    consumer = consumer_for(broker, group, consume_from="first")
    consumer.subscribe(topic, "a || b", inbox)
    for i, tag in enumerate(["a", "c", "b", None, "ab", "a", "B"]):
        await producer.send(Message(topic, f"{tag}-{i}".encode(), tags=tag))
    await consumer.start()
    try:
        await wait_until(lambda: inbox.count() >= 3, what="the matching messages")
        async with AsyncPullConsumer(group, broker=broker.address, config=FAST_CLIENT) as pc:
            # Every message was looked at: the group's offset reached the end of the queue.
            async def all_seen() -> bool:
                return await pc.committed_offset(topic, 0) == 7

            await wait_until(all_seen, what="the committed offset to reach the end")
    finally:
        await consumer.shutdown()
    assert sorted(inbox.bodies) == [b"a-0", b"a-5", b"b-2"]


async def test_async_callbacks_work_too(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "async-cb", "g", 2)
    got: list[bytes] = []

    async def on_message(msg: MessageExt) -> None:
        await asyncio.sleep(0)
        got.append(msg.body)

    consumer = consumer_for(broker, group, consume_from="first")
    consumer.subscribe(topic, "*", on_message)
    async with consumer:
        await send_numbered(producer, topic, "", 20)
        await wait_until(lambda: len(got) == 20, what="20 deliveries")
    assert sorted(int(b) for b in got) == list(range(20))


async def test_two_consumers_split_queues_and_rebalance_when_one_leaves(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "split", "workers", 4)
    inbox_a, inbox_b = Inbox(), Inbox()
    a = consumer_for(broker, group, consume_from="first")
    a.subscribe(topic, "*", inbox_a)
    b = consumer_for(broker, group, consume_from="first")
    b.subscribe(topic, "*", inbox_b)
    await a.start()
    await b.start()
    try:

        def split() -> bool:
            qa = {q for t, q in a.assignment() if t == topic}
            qb = {q for t, q in b.assignment() if t == topic}
            return len(qa) == 2 and len(qb) == 2 and not qa & qb

        await wait_until(split, what="a 2/2 split of the queues")

        await send_numbered(producer, topic, "one-", 40)
        await wait_until(lambda: inbox_a.count() + inbox_b.count() >= 40, what="phase one")
        assert inbox_a.count() > 0 and inbox_b.count() > 0

        await b.shutdown()
        await wait_until(
            lambda: len([q for t, q in a.assignment() if t == topic]) == 4,
            what="the survivor to take every queue",
        )
        await send_numbered(producer, topic, "two-", 40)
        await wait_until(lambda: inbox_a.count() + inbox_b.count() >= 80, what="phase two")
        await settled(broker.address, group, {topic: 4})  # a duplicate would have shown by now
    finally:
        await a.shutdown()
        await b.shutdown()
    counts = Counter(inbox_a.bodies + inbox_b.bodies)
    expected = {f"one-{i}".encode() for i in range(40)} | {f"two-{i}".encode() for i in range(40)}
    assert set(counts) == expected
    assert [body for body, n in counts.items() if n > 1] == []  # every message exactly once
    assert not {b for b in inbox_b.bodies if b.startswith(b"two-")}


async def test_a_failing_callback_gets_the_message_again(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "flaky", "g", 2)
    deliveries: list[MessageExt] = []
    lock = threading.Lock()

    def on_message(msg: MessageExt) -> None:
        with lock:
            deliveries.append(msg)
        if msg.reconsume_times == 0:
            raise RuntimeError("not today")

    consumer = consumer_for(broker, group)
    consumer.subscribe(topic, "*", on_message)
    await consumer.start()
    try:
        await wait_until(lambda: len(consumer.assignment()) >= 2, what="assignment")
        sent = await producer.send(
            Message(topic, b"retry me", tags="t", keys="k", properties={"p": "v"})
        )
        await wait_until(lambda: len(deliveries) >= 2, what="the redelivery")
        # Both the original and the retry topic acknowledged: a third delivery would have
        # been sent back (or pulled again) before the offsets reached their ends.
        await settled(broker.address, group, {topic: 2, f"%RETRY%{group}": 1})
    finally:
        await consumer.shutdown()
    assert len(deliveries) == 2
    first, again = deliveries
    assert first.reconsume_times == 0 and again.reconsume_times == 1
    for m in (first, again):
        assert (m.topic, m.body, m.tags, m.keys) == (topic, b"retry me", "t", "k")
        assert m.msg_id == sent.msg_id and m.user_properties == {"p": "v"}


async def test_a_message_that_keeps_failing_ends_in_the_dead_letter_queue(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "poison", "g", 1)
    attempts: list[int] = []

    def on_message(msg: MessageExt) -> None:
        attempts.append(msg.reconsume_times)
        raise ValueError("poison")

    consumer = consumer_for(broker, group, max_reconsume_times=2)
    consumer.subscribe(topic, "*", on_message)
    await consumer.start()
    try:
        await wait_until(lambda: len(consumer.assignment()) >= 1, what="assignment")
        sent = await producer.send(Message(topic, b"poison pill"))
        async with AsyncPullConsumer("dlq-reader", broker=broker.address, config=FAST_CLIENT) as pc:

            async def dead() -> bool:
                try:
                    return await pc.max_offset(f"%DLQ%{group}", 0) == 1
                except Exception:
                    return False

            await wait_until(dead, what="the dead-letter queue")
            [m] = (await pc.pull(f"%DLQ%{group}", 0, 0)).messages
    finally:
        await consumer.shutdown()
    assert attempts == [0, 1, 2]
    assert m.body == b"poison pill" and m.msg_id == sent.msg_id


async def test_restart_resumes_from_the_committed_offset(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "resume", "g", 4)
    await send_numbered(producer, topic, "first-", 12)
    inbox1 = Inbox()
    c1 = consumer_for(broker, group, consume_from="first")
    c1.subscribe(topic, "*", inbox1)
    async with c1:
        await wait_until(lambda: inbox1.count() == 12, what="the first twelve")
    await send_numbered(producer, topic, "second-", 5)
    inbox2 = Inbox()
    c2 = consumer_for(broker, group, consume_from="first")
    c2.subscribe(topic, "*", inbox2)
    async with c2:
        await wait_until(lambda: inbox2.count() >= 5, what="the next five")
        await settled(broker.address, group, {topic: 4})  # a repeat of "first-*" would be in by now
    assert sorted(inbox1.bodies) == sorted(f"first-{i}".encode() for i in range(12))
    assert sorted(inbox2.bodies) == sorted(f"second-{i}".encode() for i in range(5))


@pytest.mark.parametrize("where", ["first", "last", "timestamp"])
async def test_consume_from(
    shifted_broker: tuple[BrokerController, list[float]],
    unique: Callable[[str], str],
    where: str,
) -> None:
    broker, shift = shifted_broker
    topic, group = await topic_and_group(broker.address, unique, "from", "g", 2)
    inbox = Inbox()
    async with AsyncProducer(
        "push-test-producer", broker=broker.address, config=FAST_CLIENT
    ) as producer:
        await send_numbered(producer, topic, "old-", 4)
        # The cut lies 30 s after the "old" store times and 30 s before the later ones: the
        # broker's clock jumps a minute ahead, so no machine is too slow (or too fast) for it.
        shift[0] = 60.0
        cut = int((time.time() + 30) * 1000)
        await send_numbered(producer, topic, "mid-", 3)
        consume_from: object = cut if where == "timestamp" else where
        consumer = consumer_for(broker, group, consume_from=consume_from)
        consumer.subscribe(topic, "*", inbox)
        await consumer.start()
        try:
            await wait_until(
                lambda: len([q for t, q in consumer.assignment() if t == topic]) == 2,
                what="assignment",
            )
            await send_numbered(producer, topic, "new-", 2)
            expected = {
                "first": [f"old-{i}" for i in range(4)] + [f"mid-{i}" for i in range(3)],
                "last": [],
                "timestamp": [f"mid-{i}" for i in range(3)],
            }[where] + [f"new-{i}" for i in range(2)]
            await wait_until(
                lambda: inbox.count() >= len(expected), what=f"{len(expected)} messages"
            )
            # every queue consumed to its end: anything before the start would be in by now
            await settled(broker.address, group, {topic: 2})
        finally:
            await consumer.shutdown()
    assert sorted(b.decode() for b in inbox.bodies) == sorted(expected)


async def test_a_topic_created_after_the_consumer_started_is_consumed_from_its_start(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = unique("later"), unique("g")
    inbox = Inbox()
    consumer = consumer_for(broker, group)  # consume_from="last"
    consumer.subscribe(topic, "*", inbox)
    await consumer.start()
    try:
        assert [t for t, _ in consumer.assignment()] == [f"%RETRY%{group}"]
        await send_numbered(producer, topic, "early-", 3)  # the first send creates the topic
        await wait_until(lambda: inbox.count() >= 3, what="the first messages of the new topic")
    finally:
        await consumer.shutdown()
    assert sorted(inbox.bodies) == [b"early-0", b"early-1", b"early-2"]


async def test_start_needs_a_subscription(broker: BrokerController) -> None:
    consumer = consumer_for(broker, "g")
    with pytest.raises(ClientStateError, match="no subscription"):
        await consumer.start()
    with pytest.raises(ValueError, match="retry topic"):
        consumer.subscribe("%RETRY%g", "*", print)
