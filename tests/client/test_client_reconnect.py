"""Connections: the SDK reconnects, re-registers and goes on after the broker restarts on the
same port and data directory."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tests.client.helpers import FAST_CLIENT, wait_until
from tests.support.brokers import restart_on, start_broker
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    ConnectionClosedError,
    Message,
    MessageExt,
)


async def test_producer_and_consumer_survive_a_broker_restart(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    config = make_broker_config()
    first = await start_broker(config)
    topic, group = unique("restart"), unique("g")
    received: list[MessageExt] = []
    lock = threading.Lock()

    def on_message(msg: MessageExt) -> None:
        with lock:
            received.append(msg)

    producer = AsyncProducer(
        "p",
        broker=first.address,
        config=FAST_CLIENT,
        request_timeout=0.3,
        retry_times_when_send_failed=1,
    )
    consumer = AsyncPushConsumer(
        group, broker=first.address, config=FAST_CLIENT, consume_from="first"
    )
    consumer.subscribe(topic, "*", on_message)
    second: BrokerController | None = None
    try:
        await producer.start()
        await producer.send(Message(topic, b"before"))
        await consumer.start()
        await wait_until(lambda: len(received) == 1, what="the first message")
        async with AsyncPullConsumer(group, broker=first.address, config=FAST_CLIENT) as observer:

            async def committed() -> bool:
                offsets = [await observer.committed_offset(topic, q) for q in range(4)]
                return sum(o or 0 for o in offsets) == 1

            await wait_until(committed, what="the group's offset commit")

        await first.shutdown()
        await wait_until(lambda: not producer.connection.connected, what="the disconnect")
        with pytest.raises(ConnectionClosedError):
            await producer.send(Message(topic, b"while down"))

        second = await restart_on(config, first.port)
        assert second.port == first.port
        await wait_until(
            lambda: producer.connection.reconnects >= 1 and consumer.connection.reconnects >= 1,
            what="both reconnects",
        )
        result = await producer.send(Message(topic, b"after"))
        assert result.queue_offset >= 0
        await wait_until(lambda: len(received) >= 2, what="the message sent after the restart")
    finally:
        await consumer.shutdown()
        await producer.shutdown()
        if second is not None:
            await second.shutdown()
        else:
            await first.shutdown()
    assert sorted(m.body for m in received) == [b"after", b"before"]


async def test_a_send_waits_for_the_reconnect_within_its_retries(
    make_broker_config: Callable[..., BrokerConfig],
    unique: Callable[[str], str],
) -> None:
    config = make_broker_config()
    first = await start_broker(config)
    topic = unique("bounce")
    producer = AsyncProducer("p", broker=first.address, config=FAST_CLIENT, request_timeout=1.0)
    second: BrokerController | None = None
    try:
        await producer.start()
        before = await producer.send(Message(topic, b"before"), queue_id=0)
        await first.shutdown()
        await wait_until(lambda: not producer.connection.connected, what="the disconnect")
        # The probe: the send asks the connection for a live connection and waits for one,
        # on the connection's event (read, not patched: a compiled BrokerConnection has no
        # attributes to replace).
        conn = producer.connection
        connected = conn._connected
        assert connected is not None
        waiting = len(connected._waiters or ())

        def asked() -> bool:
            return len(connected._waiters or ()) > waiting

        sending = asyncio.ensure_future(producer.send(Message(topic, b"during"), queue_id=0))
        await wait_until(asked, what="the send waiting for the reconnect")
        assert not sending.done(), "the send ended while no broker was up"
        second = await restart_on(config, first.port)
        during = await sending
        assert during.queue_offset == before.queue_offset + 1  # the data dir survived
    finally:
        await producer.shutdown()
        await (second or first).shutdown()
