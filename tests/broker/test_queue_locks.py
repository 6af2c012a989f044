"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ on the wire against a real broker: grants, refusals,
renewals, unlocks, expiry (through the broker's clock seam), and locks ending with their
connection (closed, or scanned out for missing heartbeats)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.messaging.locks import LOCK_MAX_LIVE_S, QueueLockTable
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType

GROUP = "orderly-group"


@pytest.fixture
async def clocked(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[tuple[BrokerController, list[float]]]:
    """A broker whose clock runs ``shift[0]`` seconds ahead of the wall clock."""
    shift = [0.0]
    async with started(make_broker_config(), clock=lambda: time.time() + shift[0]) as controller:
        yield controller, shift


#: The broker, its clock shift, and two connected clients (closed after the test).
Pair = tuple[BrokerController, list[float], RawClient, RawClient]


@pytest.fixture
async def pair(clocked: tuple[BrokerController, list[float]]) -> AsyncIterator[Pair]:
    broker, shift = clocked
    a = await RawClient.connect(broker.address)
    b = await RawClient.connect(broker.address)
    try:
        yield broker, shift, a, b
    finally:
        await a.close()
        await b.close()


def mq(queue_id: int, topic: str = "orders", broker: str = "broker-a") -> dict[str, Any]:
    return {"brokerName": broker, "queueId": queue_id, "topic": topic}


def body(client_id: str, *queues: dict[str, Any], group: str = GROUP) -> bytes:
    doc = {"clientId": client_id, "consumerGroup": group, "mqSet": list(queues)}
    return json.dumps(doc).encode()


async def lock(
    c: RawClient, *queues: dict[str, Any], st: SerializeType = SerializeType.JSON
) -> list[dict[str, Any]]:
    resp = await c.call(RequestCode.LOCK_BATCH_MQ, body=body(c.client_id, *queues), st=st)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    doc = json.loads(resp.body)
    assert list(doc) == ["lockOKMQSet"]
    return sorted(doc["lockOKMQSet"], key=lambda q: (q["topic"], q["queueId"]))


async def unlock(c: RawClient, *queues: dict[str, Any]) -> None:
    resp = await c.call(
        RequestCode.UNLOCK_BATCH_MQ, body=body(c.client_id, *queues), st=SerializeType.JSON
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_a_lock_is_granted_to_one_client_and_renewed_by_it(
    pair: Pair,
) -> None:
    broker, _, a, b = pair
    got = await lock(a, mq(0), mq(1))
    assert got == [mq(0), mq(1)]
    # RocketMQ's MessageQueue JSON, fields in fastjson's order.
    resp = await a.call(RequestCode.LOCK_BATCH_MQ, body=body(a.client_id, mq(0)))
    assert resp.body == b'{"lockOKMQSet":[{"brokerName":"broker-a","queueId":0,"topic":"orders"}]}'
    # Held by a live other client: not granted; the free queue is.
    assert await lock(b, mq(0), mq(1), mq(2)) == [mq(2)]
    # The holder renews.
    assert await lock(a, mq(0), mq(1)) == [mq(0), mq(1)]
    # The same queue of another topic or group is another lock.
    assert await lock(b, mq(0, topic="other")) == [mq(0, topic="other")]
    resp = await b.call(
        RequestCode.LOCK_BATCH_MQ,
        body=body(b.client_id, mq(0), group="another-group"),
        st=SerializeType.JSON,
    )
    assert json.loads(resp.body)["lockOKMQSet"] == [mq(0)]
    assert broker.locks.holder(GROUP, ("orders", "broker-a", 0)) == a.client_id


async def test_unlock_frees_only_the_callers_locks(
    pair: Pair,
) -> None:
    broker, _, a, b = pair
    assert await lock(a, mq(0), mq(1)) == [mq(0), mq(1)]
    await unlock(b, mq(0), mq(1))  # not b's: nothing changes
    assert await lock(b, mq(0), mq(1)) == []
    await unlock(a, mq(0))
    assert await lock(b, mq(0), mq(1)) == [mq(0)]
    await unlock(a, mq(5))  # never locked: answered all the same


async def test_a_lock_expires_unless_renewed(
    pair: Pair,
) -> None:
    broker, shift, a, b = pair
    assert await lock(a, mq(0), mq(1)) == [mq(0), mq(1)]
    shift[0] = LOCK_MAX_LIVE_S - 1
    assert await lock(b, mq(0), mq(1)) == [], "still alive just before the lifetime"
    assert await lock(a, mq(1)) == [mq(1)]  # renews queue 1 only
    shift[0] = LOCK_MAX_LIVE_S + 1
    # Queue 0 was not renewed for over 60 s: b takes it; queue 1 was renewed 2 s ago.
    assert await lock(b, mq(0), mq(1)) == [mq(0)]
    assert broker.locks.holder(GROUP, ("orders", "broker-a", 0)) == b.client_id
    assert broker.locks.holder(GROUP, ("orders", "broker-a", 1)) == a.client_id
    # a lost queue 0: asking again does not take it back while b's lock lives.
    assert await lock(a, mq(0), mq(1)) == [mq(1)]


async def test_a_closed_connection_loses_its_locks(
    clocked: tuple[BrokerController, list[float]],
) -> None:
    broker, _ = clocked
    a = await RawClient.connect(broker.address)
    async with connected(broker.address) as b:
        assert await lock(a, mq(0), mq(1)) == [mq(0), mq(1)]
        assert await lock(b, mq(2)) == [mq(2)]
        await a.close()
        await wait_until(
            lambda: broker.locks.holder(GROUP, ("orders", "broker-a", 0)) is None,
            what="a's locks released when its connection closed",
        )
        assert await lock(b, mq(0), mq(1)) == [mq(0), mq(1)]
        assert broker.locks.holder(GROUP, ("orders", "broker-a", 2)) == b.client_id


async def test_a_client_scanned_out_for_missing_heartbeats_loses_its_locks(
    pair: Pair,
) -> None:
    broker, _, a, b = pair
    await a.heartbeat(consumer_groups={GROUP: {"orders": "*"}})
    assert await lock(a, mq(0)) == [mq(0)]
    assert await lock(b, mq(0)) == []
    # What housekeeping does to a channel silent for channelExpiredTimeout (b never sent a
    # heartbeat, so only a is a registered channel).
    expired = broker.clients.expire(0.0)
    assert [ch.client_id for ch in expired] == [a.client_id]
    await wait_until(
        lambda: broker.locks.holder(GROUP, ("orders", "broker-a", 0)) is None,
        what="the scanned-out client's lock released",
    )
    assert await lock(b, mq(0)) == [mq(0)]


async def test_bodies_as_the_stock_clients_write_them(
    clocked: tuple[BrokerController, list[float]],
) -> None:
    broker, _ = clocked
    async with connected(broker.address) as c:
        # The C++ client: jsoncpp's FastWriter (trailing newline), no mqSet when it is empty.
        resp = await c.call(
            RequestCode.LOCK_BATCH_MQ,
            body=b'{"clientId":"cpp@1","consumerGroup":"g"}\n',
            st=SerializeType.JSON,
        )
        assert (resp.code, json.loads(resp.body)) == (ResponseCode.SUCCESS, {"lockOKMQSet": []})
        # The Java client: fastjson (fields sorted, onlyThisBroker), its ROCKETMQ header.
        java = (
            b'{"clientId":"java@1","consumerGroup":"g","mqSet":[{"brokerName":"broker-a",'
            b'"queueId":3,"topic":"t"}],"onlyThisBroker":false}'
        )
        resp = await c.call(RequestCode.LOCK_BATCH_MQ, body=java, st=SerializeType.ROCKETMQ)
        assert json.loads(resp.body) == {"lockOKMQSet": [mq(3, topic="t")]}
        resp = await c.call(RequestCode.UNLOCK_BATCH_MQ, body=java, st=SerializeType.ROCKETMQ)
        assert resp.code == ResponseCode.SUCCESS
        assert broker.locks.holder("g", ("t", "broker-a", 3)) is None


@pytest.mark.parametrize(
    "bad, says",
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"clientId":"x"}', "consumerGroup"),
        (b'{"consumerGroup":"g"}', "clientId"),
        (b'{"clientId":"x","consumerGroup":"g","mqSet":[{"topic":"t","queueId":-1}]}', "queueId"),
        (b'{"clientId":"x","consumerGroup":"g","mqSet":{"topic":"t"}}', "mqSet"),
    ],
)
async def test_a_malformed_body_is_refused_saying_why(
    clocked: tuple[BrokerController, list[float]], bad: bytes, says: str
) -> None:
    broker, _ = clocked
    async with connected(broker.address) as c:
        for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            resp = await c.call(code, body=bad, st=SerializeType.JSON)
            assert resp.code == ResponseCode.INVALID_PARAMETER, (code, resp.remark)
            assert says in (resp.remark or "")
        assert broker.locks.held() == 0


def test_the_lock_table_on_a_fake_clock() -> None:
    now = [1000.0]
    table = QueueLockTable(lambda: now[0], max_live_s=10.0)
    q0, q1 = ("t", "b", 0), ("t", "b", 1)
    conn_a, conn_b = object(), object()
    assert table.try_lock_batch("g", [q0, q1], "a", conn_a) == {q0, q1}
    assert table.try_lock_batch("g", [q0], "b", conn_b) == set()
    now[0] += 10.0  # exactly the lifetime: still held (expiry is strictly after it)
    assert table.try_lock_batch("g", [q0], "b", conn_b) == set()
    now[0] += 0.001
    assert table.try_lock_batch("g", [q0], "b", conn_b) == {q0}
    # a renewed q1 on conn_a long ago; closing conn_b frees only what b took on it.
    assert table.connection_closed(conn_b) == 1
    assert table.holder("g", q0) is None
    assert table.holder("g", q1) is None  # expired, though still in the table
    assert table.held() == 1
    assert table.connection_closed(conn_a) == 1
    assert table.held() == 0
