"""With enablePropertyFilter off, a SQL92 subscription (RocketMQ's property filter) is refused
with RocketMQ's message -- at CHECK_CLIENT_CONFIG, and on every pull, whether the pull or the
heartbeat carries it -- never served as a tag expression (the consumer would silently get
nothing)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.brokers import started
from tests.support.raw import connected
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.headers import PullMessageRequestHeader

SQL = "a > 5 AND region = 'eu'"


@pytest.fixture
async def broker_off(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[BrokerController]:
    async with started(make_broker_config(enable_property_filter=False)) as controller:
        yield controller


async def test_sql92_subscriptions_are_refused_clearly(broker_off: BrokerController) -> None:
    async with connected(broker_off.address) as c:
        assert (await c.send("filtered", b"m", props={"a": "7"})).code == ResponseCode.SUCCESS
        check = await c.check_client_config("sql-g", "filtered", SQL)
        assert check.code == ResponseCode.SYSTEM_ERROR
        assert "does not support consumer to filter message by SQL92" in (check.remark or "")
        tag_check = await c.call(
            RequestCode.CHECK_CLIENT_CONFIG,
            body=json.dumps(
                {
                    "subscriptionData": {
                        "topic": "filtered",
                        "subString": "*",
                        "expressionType": "TAG",
                    }
                }
            ).encode(),
        )
        assert tag_check.code == ResponseCode.SUCCESS

        # The expression in the pull itself.
        h = PullMessageRequestHeader(
            consumer_group="sql-g",
            topic="filtered",
            queue_id=0,
            queue_offset=0,
            sys_flag=0x4,
            subscription=SQL,
            expression_type="SQL92",
        )
        for qid in range(4):
            h.queue_id = qid
            resp = await c.call(RequestCode.PULL_MESSAGE, h.to_ext_fields())
            assert resp.code == ResponseCode.SYSTEM_ERROR, (qid, resp.code, resp.remark)
            assert "SQL92" in (resp.remark or "")

        # The expression registered by the heartbeat, the pull carrying none.
        await c.heartbeat(consumer_groups={"sql-hb": {"filtered": SQL}}, expression_type="SQL92")
        h2 = PullMessageRequestHeader(
            consumer_group="sql-hb", topic="filtered", queue_id=0, queue_offset=0, sys_flag=0
        )
        resp = await c.call(RequestCode.PULL_MESSAGE, h2.to_ext_fields())
        assert resp.code == ResponseCode.SYSTEM_ERROR and "SQL92" in (resp.remark or "")

        # Tag subscriptions are served as before.
        got = [m.body for m in await c.pull_all("filtered")]
        assert got == [b"m"]
