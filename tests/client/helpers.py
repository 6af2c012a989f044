"""Helpers for the SDK tests: fast client timers, waiting, and topic creation through the
broker's own admin request (no broker internals)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.support.waiting import wait_until, wait_until_sync
from txmq.client import AsyncProducer, ClientConfig, Message
from txmq.client.remoting import BrokerConnection
from txmq.protocol.codes import RequestCode
from txmq.protocol.headers import CreateTopicRequestHeader

#: Client timers for tests: quick rebalance, commits and reconnects; short long-polls so that a
#: stopping broker is never held up.
FAST_CLIENT = ClientConfig(
    request_timeout=3.0,
    heartbeat_interval=1.0,
    reconnect_backoff_initial=0.05,
    reconnect_backoff_max=0.5,
    rebalance_interval=1.0,
    persist_offset_interval=0.2,
    long_poll_timeout=2.0,
    pull_backoff_on_error=0.1,
    send_back_retry_delay=0.2,
    shutdown_timeout=5.0,
)


async def create_topic(address: str, topic: str, queues: int = 4, **header: Any) -> None:
    """Create a topic with UPDATE_AND_CREATE_TOPIC, as an operator tool would."""
    conn = BrokerConnection(address, FAST_CLIENT)
    await conn.start()
    try:
        await conn.invoke(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            CreateTopicRequestHeader(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues, **header
            ),
        )
    finally:
        await conn.close()


__all__ = ["FAST_CLIENT", "create_topic", "wait_until", "wait_until_sync"]


async def settled(address: str, group: str, queues: dict[str, int]) -> None:
    """Wait until ``group``'s committed offset is at the end of every queue of the topics in
    ``queues`` (topic -> queue count): every message the group pulled was consumed and
    acknowledged, so a duplicate (a message pulled again from an earlier offset, or a failed
    delivery sent back) would already be in.  What "no duplicate shows up" waits on, instead
    of a fixed time."""
    from txmq.client import AsyncPullConsumer

    async with AsyncPullConsumer(group, broker=address, config=FAST_CLIENT) as pc:

        async def at_end() -> bool:
            for topic, n in queues.items():
                for q in range(n):
                    if await pc.committed_offset(topic, q) != await pc.max_offset(topic, q):
                        return False
            return True

        await wait_until(at_end, what=f"{group}'s committed offsets at the end of {queues}")


async def json_bodies(address: str, topic: str, queues: int, reader: str) -> list[Any]:
    """Every message body of ``topic``'s ``queues`` queues, read as JSON by the pull consumer
    group ``reader`` (nothing committed), queue by queue."""
    from txmq.client import AsyncPullConsumer

    out: list[Any] = []
    async with AsyncPullConsumer(reader, broker=address, config=FAST_CLIENT) as pc:
        for q in range(queues):
            offset, end = await pc.min_offset(topic, q), await pc.max_offset(topic, q)
            while offset < end:
                r = await pc.pull(topic, q, offset, 64)
                out.extend(json.loads(m.body) for m in r.messages)
                offset = r.next_begin_offset
    return out


async def send_numbered(producer: AsyncProducer, topic: str, prefix: str, n: int) -> list[bytes]:
    """Send ``n`` messages to ``topic`` one after another, bodies ``<prefix>0`` ... (``prefix``
    carries any separator), and return their bodies in order."""
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    for body in bodies:
        await producer.send(Message(topic, body))
    return bodies


def order_message(topic: str, i: int, tag: str, body: bytes) -> Message:
    """Order ``i``'s message: ``tag``, the key ``order-<i>`` and the property region=eu (what
    the round-trip tests check comes back)."""
    return Message(topic, body, tags=tag, keys=f"order-{i}", properties={"region": "eu"})


async def topic_and_group(
    address: str, unique: Callable[[str], str], topic: str, group: str, queues: int = 4
) -> tuple[str, str]:
    """A new topic named after ``topic`` with ``queues`` queues, created on the broker, and a
    new group name after ``group``."""
    t, g = unique(topic), unique(group)
    await create_topic(address, t, queues)
    return t, g
