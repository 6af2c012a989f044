"""AsyncOrderlyPushConsumer against a real broker: order per sharding key, one callback at a
time per queue, retry in place then the dead-letter queue, queues consumed only once locked,
and two members handing queues over mid-stream without a message of one key handled out of
order or by both at once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.client.helpers import (
    FAST_CLIENT,
    settled,
    topic_and_group,
    wait_until,
    wait_until_sync,
)
from tests.support.raw import RawClient
from txmq.broker.messaging.locks import LOCK_MAX_LIVE_S
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    Message,
    MessageExt,
    OrderlyPushConsumer,
    Producer,
    PushConsumer,
)
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.locks import LockBatchRequest, decode_lock_response


@dataclass(frozen=True)
class Handled:
    key: str
    seq: int
    consumer: str
    queue_id: int
    start: float
    end: float


class Journal:
    """What the callbacks did: (key, seq, consumer, queue, start, end) per call, and how many
    callbacks ran on one queue at the same moment (at most one, for an orderly consumer)."""

    def __init__(self) -> None:
        self.calls: list[Handled] = []
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}
        self.most_at_once = 0

    def begin(self, msg: MessageExt) -> float:
        with self._lock:
            n = self._running[msg.queue_id] = self._running.get(msg.queue_id, 0) + 1
            self.most_at_once = max(self.most_at_once, n)
        return time.monotonic()

    def finish(self, msg: MessageExt, consumer: str, start: float) -> None:
        key, seq = str(msg.keys).split(":")
        with self._lock:
            self._running[msg.queue_id] -= 1
            self.calls.append(
                Handled(key, int(seq), consumer, msg.queue_id, start, time.monotonic())
            )

    def count(self, consumer: str | None = None) -> int:
        with self._lock:
            return sum(1 for c in self.calls if consumer is None or c.consumer == consumer)

    def by_key(self) -> dict[str, list[Handled]]:
        with self._lock:
            calls = sorted(self.calls, key=lambda c: c.start)
        out: dict[str, list[Handled]] = {}
        for c in calls:
            out.setdefault(c.key, []).append(c)
        return out


def check_order(journal: Journal, keys: list[str], per_key: int) -> None:
    """Each key's messages handled once each, in the order sent, never two at once."""
    by_key = journal.by_key()
    assert sorted(by_key) == sorted(keys)
    for key, calls in by_key.items():
        seqs = [c.seq for c in calls]
        assert seqs == list(range(per_key)), f"key {key} handled out of order: {seqs}"
        for before, after in zip(calls, calls[1:], strict=False):
            assert after.start >= before.end, (
                f"key {key}: seq {after.seq} on {after.consumer} started before seq "
                f"{before.seq} on {before.consumer} ended"
            )
    assert journal.most_at_once == 1


@pytest.fixture
async def producer(broker: BrokerController) -> AsyncIterator[AsyncProducer]:
    async with AsyncProducer("orderly-producer", broker=broker.address, config=FAST_CLIENT) as p:
        yield p


def orderly(broker: BrokerController, group: str, **kw: Any) -> AsyncOrderlyPushConsumer:
    kw.setdefault("consume_from", "first")
    kw.setdefault("lock_interval", 0.5)
    kw.setdefault("suspend_interval", 0.05)
    return AsyncOrderlyPushConsumer(group, broker=broker.address, config=FAST_CLIENT, **kw)


async def send_keys(producer: AsyncProducer, topic: str, keys: list[str], per_key: int) -> None:
    """``per_key`` messages per key, keys interleaved, each key to its own queue by hash."""
    for seq in range(per_key):
        for key in keys:
            await producer.send(Message(topic, b"x", keys=f"{key}:{seq}"), sharding_key=key)


async def test_each_key_is_handled_in_order_one_callback_at_a_time_per_queue(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "ledger", "orderly")
    keys, per_key = [f"acct-{i}" for i in range(8)], 25
    journal = Journal()

    def on_message(msg: MessageExt) -> None:  # sync: runs in the consumer's threads
        start = journal.begin(msg)
        time.sleep(random.uniform(0, 0.003))
        journal.finish(msg, "a", start)

    consumer = orderly(broker, group)
    consumer.subscribe(topic, "*", on_message)
    await consumer.start()
    try:
        assert sorted(consumer.assignment()) == [(f"%RETRY%{group}", 0)] + [
            (topic, q) for q in range(4)
        ]
        for q in range(4):
            assert broker.locks.holder(group, (topic, broker.config.broker_name, q)) == (
                consumer.client_id
            )
        await send_keys(producer, topic, keys, per_key)
        await wait_until(lambda: journal.count() >= len(keys) * per_key, what="every message")
        await settled(broker.address, group, {topic: 4})
    finally:
        await consumer.shutdown()
    check_order(journal, keys, per_key)
    assert len({c.queue_id for c in journal.calls}) > 1, "the keys spread over the queues"
    # Shut down: the member gave its locks back.
    assert broker.locks.held() == 0


async def test_a_failure_is_retried_in_place_then_parked_in_the_dlq(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "ledger", "orderly", 1)
    calls: list[tuple[str, int]] = []
    failures_left = {"k:2": 1}

    async def on_message(msg: MessageExt) -> None:
        key = str(msg.keys)
        calls.append((key, msg.reconsume_times))
        await asyncio.sleep(0)
        if key == "k:1":
            raise RuntimeError("poison")
        if failures_left.get(key, 0) > 0:
            failures_left[key] -= 1
            raise RuntimeError("not yet")

    consumer = orderly(broker, group, max_reconsume_times=2)
    consumer.subscribe(topic, "*", on_message)
    await consumer.start()
    try:
        for seq in range(4):
            await producer.send(Message(topic, f"body-{seq}".encode(), keys=f"k:{seq}"))
        await wait_until(lambda: ("k:3", 0) in calls, what="the last message handled")
        await settled(broker.address, group, {topic: 1})
    finally:
        await consumer.shutdown()
    # k:1 three times (1 + max_reconsume_times) in place, nothing behind it meanwhile; then
    # k:2 fails once, is retried, and k:3 follows.
    assert calls == [
        ("k:0", 0),
        ("k:1", 0),
        ("k:1", 1),
        ("k:1", 2),
        ("k:2", 0),
        ("k:2", 1),
        ("k:3", 0),
    ]
    assert consumer.dead_lettered_count == 1
    async with AsyncPullConsumer(group + "-reader", broker=broker.address) as pc:
        dlq = await pc.pull(f"%DLQ%{group}", 0, 0)
    assert [m.body for m in dlq.messages] == [b"body-1"]
    assert dlq.messages[0].properties.get("ORIGIN_MESSAGE_ID") is not None


@dataclass
class Contested:
    """An orderly consumer of a new group on a new two-queue topic (not started; what it
    handles, by key, in ``got``), and another client that can lock queue 0 away from it."""

    topic: str
    group: str
    name: str
    got: list[str]
    consumer: AsyncOrderlyPushConsumer
    other: RawClient

    def _request(self) -> bytes:
        return LockBatchRequest(
            self.group, "someone-else", frozenset({(self.topic, self.name, 0)})
        ).encode()

    async def take_queue_0(self) -> None:
        """The other client locks queue 0 (granted)."""
        resp = await self.other.call(
            RequestCode.LOCK_BATCH_MQ, body=self._request(), st=SerializeType.JSON
        )
        assert decode_lock_response(resp.body) == {(self.topic, self.name, 0)}

    async def free_queue_0(self) -> None:
        """The other client unlocks queue 0."""
        resp = await self.other.call(
            RequestCode.UNLOCK_BATCH_MQ, body=self._request(), st=SerializeType.JSON
        )
        assert resp.code == ResponseCode.SUCCESS


@contextlib.asynccontextmanager
async def contested(
    broker: BrokerController, unique: Callable[[str], str], **kw: Any
) -> AsyncIterator[Contested]:
    """:class:`Contested` (``kw``: the consumer's settings), both clients closed at the end."""
    topic, group = await topic_and_group(broker.address, unique, "ledger", "orderly", 2)
    got: list[str] = []
    consumer = orderly(broker, group, **kw)
    consumer.subscribe(topic, "*", lambda m: got.append(str(m.keys)))
    other = await RawClient.connect(broker.address)
    try:
        yield Contested(topic, group, broker.config.broker_name, got, consumer, other)
    finally:
        await consumer.shutdown()
        await other.close()


async def test_a_queue_locked_by_another_client_is_not_consumed_until_it_is_free(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    async with contested(broker, unique) as ct:
        topic, got, consumer = ct.topic, ct.got, ct.consumer
        await ct.take_queue_0()
        await consumer.start()
        await producer.send(Message(topic, b"x", keys="q0"), queue_id=0)
        await producer.send(Message(topic, b"x", keys="q1"), queue_id=1)
        await wait_until(lambda: "q1" in got, what="queue 1's message")
        # Queue 0's lock is someone else's: not taken, its message not handled.
        assert (topic, 0) not in consumer.assignment()
        assert got == ["q1"]
        await ct.free_queue_0()
        await wait_until(lambda: "q0" in got, what="queue 0's message once its lock was free")
        assert (topic, 0) in consumer.assignment()


async def test_a_lock_lost_to_another_client_stops_the_queue_until_it_is_granted_again(
    shifted_broker: tuple[BrokerController, list[float]], unique: Callable[[str], str]
) -> None:
    broker, shift = shifted_broker
    async with (
        contested(broker, unique, lock_interval=2.0) as ct,
        AsyncProducer("orderly-producer", broker=broker.address) as producer,
    ):
        topic, group, got, consumer = ct.topic, ct.group, ct.got, ct.consumer
        await consumer.start()
        assert [q for q in consumer.assignment() if q[0] == topic] == [(topic, 0), (topic, 1)]
        # The broker's clock jumps past the locks' lifetime (the member renews every 2 s):
        # another client takes queue 0.
        shift[0] = LOCK_MAX_LIVE_S + 1
        await ct.take_queue_0()
        # The member's next renewal is refused for queue 0 (granted again for queue 1):
        # it gives queue 0 up.
        await wait_until(
            lambda: (topic, 0) not in consumer.assignment(),
            what="queue 0 given up once its renewal was refused",
        )
        assert (topic, 1) in consumer.assignment()
        await producer.send(Message(topic, b"x", keys="q0"), queue_id=0)
        await producer.send(Message(topic, b"x", keys="q1"), queue_id=1)
        await wait_until(lambda: "q1" in got, what="queue 1's message")
        assert got == ["q1"]
        await ct.free_queue_0()
        await wait_until(lambda: "q0" in got, what="queue 0's message once granted again")
        assert broker.locks.holder(group, (topic, ct.name, 0)) == consumer.client_id


async def test_after_a_reconnect_a_queue_is_consumed_only_once_locked_again(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    async with contested(broker, unique, lock_interval=5.0) as ct:
        topic, group, name, got, consumer = ct.topic, ct.group, ct.name, ct.got, ct.consumer
        await consumer.start()
        assert broker.locks.holder(group, (topic, name, 0)) == consumer.client_id
        # The broker drops the member's connection: its locks end with it, and another client
        # takes queue 0 before the member is back.
        for conn in list(broker._connections):
            if conn.context.get("client_id") == consumer.client_id:
                conn.close()
        await wait_until(
            lambda: broker.locks.holder(group, (topic, name, 0)) is None,
            what="the member's locks freed with its connection",
        )
        await ct.take_queue_0()
        await wait_until(lambda: consumer.connection.reconnects >= 1, what="the member back")
        # Its locks from before the reconnect are void: queue 0 is not consumed (its lock is
        # someone else's), queue 1 once locked again.
        await producer.send(Message(topic, b"x", keys="q0"), queue_id=0)
        await producer.send(Message(topic, b"x", keys="q1"), queue_id=1)
        await wait_until(lambda: "q1" in got, what="queue 1's message")
        await wait_until(lambda: (topic, 0) not in consumer.assignment(), what="queue 0 given up")
        assert got == ["q1"]
        assert broker.locks.holder(group, (topic, name, 1)) == consumer.client_id
        await ct.free_queue_0()
        await wait_until(lambda: "q0" in got, what="queue 0's message once granted again")


async def test_two_members_hand_queues_over_mid_stream_without_breaking_order(
    broker: BrokerController, producer: AsyncProducer, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "ledger", "orderly")
    keys, per_key = [f"acct-{i}" for i in range(8)], 50
    journal = Journal()

    def recorder(name: str) -> Callable[[MessageExt], Any]:
        async def on_message(msg: MessageExt) -> None:
            start = journal.begin(msg)
            await asyncio.sleep(random.uniform(0.002, 0.008))
            journal.finish(msg, name, start)

        return on_message

    a, b = orderly(broker, group), orderly(broker, group)
    a.subscribe(topic, "*", recorder("a"))
    b.subscribe(topic, "*", recorder("b"))
    sending: asyncio.Task[None] | None = None
    try:
        await a.start()

        async def paced() -> None:
            for seq in range(per_key):
                for key in keys:
                    await producer.send(Message(topic, b"x", keys=f"{key}:{seq}"), sharding_key=key)
                await asyncio.sleep(0.02)

        sending = asyncio.ensure_future(paced())
        await wait_until(lambda: journal.count("a") >= 60, what="a consuming")
        await b.start()  # a gives up half of its queues, each after its running callback
        await wait_until(
            lambda: len([q for q in b.assignment() if q[0] == topic]) == 2,
            what="b holding two of the topic's queues",
        )
        await wait_until(lambda: journal.count("b") >= 30, what="b consuming")
        assert len([q for q in a.assignment() if q[0] == topic]) == 2
        await a.shutdown()  # b takes every queue
        await wait_until(
            lambda: len([q for q in b.assignment() if q[0] == topic]) == 4,
            what="b holding every queue",
        )
        await sending
        await wait_until(lambda: journal.count() >= len(keys) * per_key, what="every message")
        await settled(broker.address, group, {topic: 4})
    finally:
        if sending is not None:
            sending.cancel()
        await a.shutdown()
        await b.shutdown()
    check_order(journal, keys, per_key)
    moved = {c.key for c in journal.calls if c.consumer == "a"} & {
        c.key for c in journal.calls if c.consumer == "b"
    }
    assert moved, "some key was handled by a, then by b"


def test_the_sync_facade_consumes_in_order(
    broker_thread: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = unique("ledger"), unique("orderly")
    got: list[str] = []
    with Producer("orderly-sync-producer", broker=broker_thread.address) as p:
        for seq in range(10):
            p.send(Message(topic, b"x", keys=f"k:{seq}"), sharding_key="k")
    consumer = OrderlyPushConsumer(
        group, broker=broker_thread.address, consume_from="first", config=FAST_CLIENT
    )
    assert isinstance(consumer, PushConsumer)
    consumer.subscribe(topic, "*", lambda m: got.append(str(m.keys)))
    consumer.start()
    try:
        wait_until_sync(lambda: len(got) >= 10, what="ten messages")
    finally:
        consumer.shutdown()
    assert got == [f"k:{seq}" for seq in range(10)]
