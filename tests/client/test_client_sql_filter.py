"""The SDK's SQL92 filters against a real broker: ``sql(...)`` subscriptions of the push and
orderly consumers, ``pull(..., expression=sql(...))`` of the pull consumer, and an invalid
expression failing at start (push) or at the pull (pull consumer) with the broker's message."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.client.helpers import FAST_CLIENT, create_topic, topic_and_group, wait_until
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    BrokerResponseError,
    Message,
    MessageExt,
    PullStatus,
    sql,
)
from txmq.client.pull_consumer import expression_type, normalize_expression, subscription_data

FILTER = "a > 5 AND region = 'eu' AND TAGS IN ('TagA', 'TagB')"


def wanted(i: int) -> bool:
    return i > 5 and i % 2 == 0 and i % 3 != 2


async def send_numbered(broker: BrokerController, topic: str, n: int) -> None:
    async with AsyncProducer("sql-producer", broker=broker.address, config=FAST_CLIENT) as p:
        for i in range(n):
            m = Message(topic, f"m{i}".encode(), tags=("TagA", "TagB", "TagC")[i % 3])
            m.properties["a"] = str(i)
            m.properties["region"] = "eu" if i % 2 == 0 else "us"
            await p.send(m)


def test_sql_marks_the_expression() -> None:
    e = sql("  a > 5 ")
    assert e == "a > 5" and expression_type(e) == "SQL92"
    assert normalize_expression(e) is e
    data = subscription_data("t", e, 7)
    assert data["expressionType"] == "SQL92" and data["subString"] == "a > 5"
    assert expression_type(normalize_expression("x || y")) == "TAG"
    with pytest.raises(ValueError):
        sql(" ")


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.msgs: list[MessageExt] = []

    def __call__(self, m: MessageExt) -> None:
        with self._lock:
            self.msgs.append(m)

    def bodies(self) -> list[bytes]:
        with self._lock:
            return sorted(m.body for m in self.msgs)


@pytest.mark.parametrize("kind", [AsyncPushConsumer, AsyncOrderlyPushConsumer])
async def test_push_consumers_receive_only_matching_messages(
    broker: BrokerController, unique: Callable[[str], str], kind: Any
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "sqlpush", "sqlg")
    n = 40
    await send_numbered(broker, topic, n)
    expected = sorted(f"m{i}".encode() for i in range(n) if wanted(i))
    inbox = Inbox()
    consumer = kind(group, broker=broker.address, config=FAST_CLIENT, consume_from="first")
    consumer.subscribe(topic, sql(FILTER), inbox)
    async with consumer:
        await wait_until(lambda: inbox.bodies() == expected, what="the matching messages")

        # The broker filtered: what the consumer pulled is what it consumed.
        async def committed_at_end() -> bool:
            async with AsyncPullConsumer(group, broker=broker.address, config=FAST_CLIENT) as pc:
                for q in range(4):
                    if await pc.committed_offset(topic, q) != await pc.max_offset(topic, q):
                        return False
            return True

        await wait_until(committed_at_end, what="offsets committed past refused messages")
    assert inbox.bodies() == expected
    assert consumer.consumed_count == len(expected)


async def test_push_consumer_with_an_invalid_expression_fails_at_start(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("sqlbad")
    await create_topic(broker.address, topic)
    consumer = AsyncPushConsumer(unique("sqlg"), broker=broker.address, config=FAST_CLIENT)
    consumer.subscribe(topic, sql("a > 5 AND"), Inbox())
    with pytest.raises(BrokerResponseError) as err:
        await consumer.start()
    assert "unexpected end of expression" in str(err.value)
    await consumer.shutdown()


async def test_pull_consumer_pulls_with_sql(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("sqlpull")
    await create_topic(broker.address, topic, queues=1)
    await send_numbered(broker, topic, 30)
    async with AsyncPullConsumer(unique("sqlpg"), broker=broker.address, config=FAST_CLIENT) as pc:
        got: list[bytes] = []
        offset = 0
        while offset < 30:
            r = await pc.pull(topic, 0, offset, expression=sql(FILTER))
            assert r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), r.status
            got += [m.body for m in r.messages]
            assert r.next_begin_offset > offset
            offset = r.next_begin_offset
        assert got == [f"m{i}".encode() for i in range(30) if wanted(i)]
        with pytest.raises(BrokerResponseError) as err:
            await pc.pull(topic, 0, 0, expression=sql("a > 'x'"))
        assert "cannot be compared" in str(err.value)
