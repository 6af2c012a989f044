"""The sync facade (Producer, PushConsumer, PullConsumer) against a broker running in a
background thread, used from plain blocking code as an application would."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.client.helpers import FAST_CLIENT, order_message, wait_until_sync
from txmq.broker.server import BrokerController
from txmq.client import (
    ClientStateError,
    InvalidMessageError,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
)


def test_sync_round_trip(broker_thread: BrokerController, unique: Callable[[str], str]) -> None:
    topic, group = unique("orders"), unique("billing")
    address = broker_thread.address
    received: list[MessageExt] = []
    threads: set[str] = set()
    lock = threading.Lock()

    def on_message(msg: MessageExt) -> None:
        with lock:
            received.append(msg)
            threads.add(threading.current_thread().name)

    with Producer("orders-producer", broker=address, config=FAST_CLIENT) as producer:
        warm = producer.send(Message(topic, b"warm-up", tags="other"))
        assert warm.status is SendStatus.SEND_OK
        consumer = PushConsumer(group, broker=address, config=FAST_CLIENT)
        consumer.subscribe(topic, "created || paid", on_message)
        consumer.start()
        try:
            assert len([q for t, q in consumer.assignment() if t == topic]) == 4
            assert consumer.client_id and "@" in consumer.client_id
            results = {}
            for i, tag in enumerate(["created", "paid", "shipped", "created"]):
                r = producer.send(order_message(topic, i, tag, f"order-{i}".encode()))
                results[r.msg_id] = (i, tag, r)
            wait_until_sync(lambda: len(received) >= 3, what="three deliveries")
        finally:
            consumer.shutdown()
    assert sorted(m.body for m in received) == [b"order-0", b"order-1", b"order-3"]
    for m in received:
        i, tag, r = results[m.msg_id]
        assert (m.topic, m.tags, m.keys) == (topic, tag, f"order-{i}")
        assert m.user_properties == {"region": "eu"}
        assert (m.queue_id, m.queue_offset, m.offset_msg_id) == (
            r.queue_id,
            r.queue_offset,
            r.offset_msg_id,
        )
    assert all(name.startswith("txmq-consume-") for name in threads)


def test_sync_batch_oneway_and_pull_consumer(
    broker_thread: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("sync-pull")
    address = broker_thread.address
    with (
        Producer("p", broker=address, config=FAST_CLIENT) as producer,
        PullConsumer("reader", broker=address, config=FAST_CLIENT) as reader,
    ):
        first = producer.send(Message(topic, b"single"), queue_id=0)
        batch = producer.send_batch(
            [Message(topic, f"b{i}".encode()) for i in range(3)], queue_id=0
        )
        assert batch.queue_offset == first.queue_offset + 1 == 1
        producer.send_oneway(Message(topic, b"oneway"), queue_id=0)
        wait_until_sync(lambda: reader.max_offset(topic, 0) == 5, what="the oneway message")
        assert reader.fetch_queues(topic) == [0, 1, 2, 3]
        result = reader.pull(topic, 0, 0, max_nums=10)
        assert result.status is PullStatus.FOUND
        assert [m.body for m in result.messages] == [b"single", b"b0", b"b1", b"b2", b"oneway"]
        assert [m.msg_id for m in result.messages[1:4]] == batch.msg_ids
        assert reader.pull(topic, 0, 5).status is PullStatus.NO_NEW_MSG
        reader.commit_offset(topic, 0, 5)
        assert reader.committed_offset(topic, 0) == 5
        assert reader.committed_offset(topic, 1) is None
        assert reader.min_offset(topic, 0) == 0
        with pytest.raises(InvalidMessageError, match="characters"):
            producer.send(Message("no spaces please", b"x"))


def test_sync_client_cannot_be_used_from_its_own_loop(
    broker_thread: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = unique("reentrant"), unique("g")
    errors: list[BaseException] = []
    with Producer("p", broker=broker_thread.address, config=FAST_CLIENT) as producer:
        producer.send(Message(topic, b"create"))

        async def on_message(msg: MessageExt) -> None:  # runs on the facade's loop
            try:
                producer.send(Message(topic, b"from the loop"))
            except ClientStateError as exc:
                errors.append(exc)

        consumer = PushConsumer(
            group, broker=broker_thread.address, config=FAST_CLIENT, consume_from="first"
        )
        consumer.subscribe(topic, "*", on_message)
        consumer.start()
        try:
            wait_until_sync(lambda: len(errors) == 1, what="the refusal")
        finally:
            consumer.shutdown()
    assert "Async" in str(errors[0])
