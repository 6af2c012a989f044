"""Rebalance and connection-state callbacks, against real brokers: a second member joining the
group, and a broker restarted on the same port."""

from __future__ import annotations

from collections.abc import Callable

from tests.client.helpers import FAST_CLIENT, topic_and_group, wait_until
from tests.support.brokers import restart_on, start_broker
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPushConsumer,
    ConnectionState,
    Message,
    MessageExt,
    MessageQueue,
)


async def test_on_rebalance_reports_queues_taken_and_given_up(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "rebalance", "g", 4)
    events: dict[str, list[tuple[list[MessageQueue], list[MessageQueue]]]] = {"a": [], "b": []}

    def on_message(msg: MessageExt) -> None:
        pass

    def member(name: str) -> AsyncPushConsumer:
        def on_rebalance(assigned: list[MessageQueue], revoked: list[MessageQueue]) -> None:
            events[name].append((assigned, revoked))

        consumer = AsyncPushConsumer(
            group, broker=broker.address, config=FAST_CLIENT, on_rebalance=on_rebalance
        )
        consumer.subscribe(topic, "*", on_message)
        return consumer

    a, b = member("a"), member("b")

    def held(name: str) -> set[tuple[str, int]]:
        queues: set[tuple[str, int]] = set()
        for assigned, revoked in events[name]:
            queues |= {(q.topic, q.queue_id) for q in assigned}
            queues -= {(q.topic, q.queue_id) for q in revoked}
        return {q for q in queues if q[0] == topic}

    try:
        await a.start()
        await wait_until(lambda: len(held("a")) == 4, what="a holding the four queues")
        first_assigned, first_revoked = events["a"][0]
        assert first_revoked == [] and all(isinstance(q, MessageQueue) for q in first_assigned)
        assert held("a") == {q for q in a.assignment() if q[0] == topic}
        await b.start()  # the broker tells a that the group changed: it gives up two queues
        await wait_until(
            lambda: len(held("a")) == 2 and len(held("b")) == 2, what="the queues shared"
        )
        assert held("a") | held("b") == {(topic, q) for q in range(4)}
        assert any(revoked for _, revoked in events["a"])
        await b.shutdown()
        await wait_until(lambda: len(held("a")) == 4, what="a taking b's queues back")
    finally:
        await b.shutdown()
        await a.shutdown()


async def test_on_connection_state_across_a_broker_restart(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    config = make_broker_config()
    first = await start_broker(config)
    topic = unique("state")
    states: list[tuple[str, ConnectionState]] = []

    def failing_hook(address: str, state: ConnectionState) -> None:
        raise RuntimeError("a faulty hook must not break the client")

    producer = AsyncProducer(
        "p",
        broker=first.address,
        config=FAST_CLIENT,
        on_connection_state=lambda address, state: states.append((address, state)),
    )
    other = AsyncProducer("p2", broker=first.address, on_connection_state=failing_hook)
    second: BrokerController | None = None
    try:
        await producer.start()
        await other.start()
        assert states == [(first.address, ConnectionState.CONNECTED)]
        await first.shutdown()
        await wait_until(
            lambda: (first.address, ConnectionState.LOST) in states, what="the loss reported"
        )
        second = await restart_on(config, first.port)
        await wait_until(
            lambda: (first.address, ConnectionState.RECONNECTED) in states,
            what="the reconnect reported",
        )
        assert [s for _, s in states] == ["connected", "lost", "reconnected"]
        assert (await producer.send(Message(topic, b"after"))).queue_offset >= 0
        await wait_until(lambda: other.connection.connected, what="the other client back")
    finally:
        await producer.shutdown()
        await other.shutdown()
        if second is not None:
            await second.shutdown()
        await first.shutdown()
