"""Receive/ack (RocketMQ 5's SimpleConsumer over remoting POP) and ``async for`` consumption,
against real brokers: acked messages stay acked, the others come back after their invisible
time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.client.helpers import FAST_CLIENT, topic_and_group
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncSimpleConsumer,
    AsyncStreamConsumer,
    Message,
    NoMessageError,
    Producer,
    ReceivedMessage,
    SimpleConsumer,
)


async def _send(address: str, topic: str, bodies: list[bytes]) -> None:
    async with AsyncProducer("p", broker=address, config=FAST_CLIENT) as producer:
        for body in bodies:
            await producer.send(Message(topic, body))


async def _receive_all(
    consumer: AsyncSimpleConsumer, n: int, invisible: float, within: float = 10.0
) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        got += await consumer.receive(n - len(got), invisible, await_duration=0.5)
    return got


async def test_acked_messages_stay_acked_and_the_others_come_back(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "simple", "g", 2)
    await _send(broker.address, topic, [b"a", b"b", b"c"])
    async with AsyncSimpleConsumer(
        group, broker=broker.address, subscriptions={topic: "*"}, config=FAST_CLIENT
    ) as consumer:
        got = await _receive_all(consumer, 3, invisible=1.0)
        by = {m.body: m for m in got}
        assert sorted(by) == [b"a", b"b", b"c"]
        assert all(m.reconsume_times == 0 and m.topic == topic for m in got)
        await consumer.ack(by[b"a"])
        await consumer.ack(by[b"b"])
        # c was not acked: delivered again after its invisible time (1 s), and only c
        again = await _receive_all(consumer, 1, invisible=5.0)
        assert [m.body for m in again] == [b"c"]
        assert again[0].reconsume_times == 1
        with pytest.raises(NoMessageError):
            await consumer.ack(by[b"c"])  # the first delivery's handle was replaced
        await consumer.ack(again[0])
        # nothing is left: a+b acked, c acked on its second delivery
        await asyncio.sleep(1.2)
        assert await consumer.receive(3, 1.0, await_duration=0.3) == []


async def test_change_invisible_duration_hands_a_message_back_or_keeps_it(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "simple-inv", "g", 1)
    await _send(broker.address, topic, [b"x", b"y"])
    async with AsyncSimpleConsumer(
        group, broker=broker.address, subscriptions={topic: "*"}, config=FAST_CLIENT
    ) as consumer:
        got = await _receive_all(consumer, 2, invisible=1.0)
        by = {m.body: m for m in got}
        old = by[b"x"].receipt_handle
        await consumer.change_invisible_duration(by[b"x"], 0)  # back at once
        assert by[b"x"].receipt_handle != old
        await consumer.change_invisible_duration(by[b"y"], 30)  # longer than the 1 s
        again = await _receive_all(consumer, 1, invisible=30.0, within=5.0)
        assert [m.body for m in again] == [b"x"]
        await asyncio.sleep(1.2)  # y's first invisible time is over, the new one is not
        assert await consumer.receive(2, 1.0, await_duration=0.3) == []
        await consumer.ack(by[b"y"])  # the handle given by the change acks it
        await consumer.ack(again[0])


def test_blocking_simple_consumer(
    broker_thread: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = unique("simple-sync"), unique("g")
    with Producer("p", broker=broker_thread.address, config=FAST_CLIENT) as producer:
        for body in (b"s1", b"s2"):
            producer.send(Message(topic, body))
    with SimpleConsumer(group, broker=broker_thread.address, config=FAST_CLIENT) as consumer:
        consumer.subscribe(topic)
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.receive(2, 1.0, await_duration=0.5)
        assert sorted(m.body for m in got) == [b"s1", b"s2"]
        consumer.ack(got[0])
        again: list[ReceivedMessage] = []
        deadline = time.monotonic() + 10
        while not again and time.monotonic() < deadline:
            again = consumer.receive(2, 10.0, await_duration=0.5)
        assert [m.body for m in again] == [got[1].body]  # the unacked one, once more
        consumer.ack(again[0])


async def test_async_for_acks_on_next_and_on_clean_exit(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "stream", "g", 1)
    await _send(broker.address, topic, [f"m{i}".encode() for i in range(5)])
    seen: list[bytes] = []
    async with AsyncStreamConsumer(
        group, topic, broker=broker.address, batch=5, await_duration=0.5, config=FAST_CLIENT
    ) as stream:
        async for msg in stream:
            seen.append(msg.body)
            if len(seen) == 3:
                break  # m2 is acked by the clean exit; m3, m4 are handed back
    assert stream.acked_count == 3
    async with AsyncStreamConsumer(
        group, topic, broker=broker.address, await_duration=0.5, config=FAST_CLIENT
    ) as stream:
        async for msg in stream:  # the rest at once (given back, not waiting 30 s)
            seen.append(msg.body)
            if len(seen) == 5:
                break
    assert seen == [f"m{i}".encode() for i in range(5)]
    async with AsyncSimpleConsumer(
        group, broker=broker.address, subscriptions={topic: "*"}, config=FAST_CLIENT
    ) as check:
        assert await check.receive(5, 1.0, await_duration=0.3) == []  # all acked


async def test_async_for_leaves_a_failed_message_for_redelivery(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "stream-fail", "g", 1)
    await _send(broker.address, topic, [b"ok", b"boom"])

    class Boom(Exception):
        pass

    seen: list[bytes] = []
    with pytest.raises(Boom):
        async with AsyncStreamConsumer(
            group,
            topic,
            broker=broker.address,
            invisible_duration=1.0,
            await_duration=0.5,
            config=FAST_CLIENT,
        ) as stream:
            async for msg in stream:
                seen.append(msg.body)
                if msg.body == b"boom":
                    raise Boom
    assert seen == [b"ok", b"boom"] and stream.acked_count == 1
    async with AsyncStreamConsumer(
        group, topic, broker=broker.address, await_duration=0.5, config=FAST_CLIENT
    ) as stream:
        async for msg in stream:  # after its 1 s invisible time: only the failed one
            assert msg.body == b"boom" and msg.reconsume_times == 1
            break
    assert stream.acked_count == 1


async def test_shutdown_from_another_task_ends_the_loop(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "stream-stop", "g", 1)
    stream = AsyncStreamConsumer(
        group, topic, broker=broker.address, await_duration=0.3, config=FAST_CLIENT
    )
    await stream.start()
    seen: list[bytes] = []

    async def consume() -> None:
        async for msg in stream:
            seen.append(msg.body)

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.5)  # waiting on an empty topic
    await stream.shutdown()
    await asyncio.wait_for(task, 10)
    assert seen == []
