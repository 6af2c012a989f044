"""The operator's views of groups and clients, at the wire in RocketMQ's encodings (what
mqadmin's consumerProgress / consumerConnection / producerConnection / deleteSubGroup /
getBrokerConfig decode), and through the SDK's admin client and the CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner

from tests.conftest import BrokerThread
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_all_consumed
from txmq.broker.server import BrokerController
from txmq.cli import main
from txmq.client import AsyncProducer, AsyncPushConsumer, Message
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.fastjson import ObjectKeyMap, loads

#: A Java client's consumer heartbeat, as RocketMQ's HeartbeatData is written.
CONSUMER_DATA = {
    "groupName": "billing",
    "consumeType": "CONSUME_PASSIVELY",
    "messageModel": "CLUSTERING",
    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
    "subscriptionDataSet": [{"topic": "orders", "subString": "created || paid"}],
}


async def _heartbeat(c: RawClient, producer: str | None, consumer: dict[str, Any] | None) -> None:
    data = {
        "clientID": c.client_id,
        "producerDataSet": [{"groupName": producer}] if producer else [],
        "consumerDataSet": [consumer] if consumer else [],
    }
    resp = await c.call(
        RequestCode.HEART_BEAT, body=json.dumps(data).encode(), st=SerializeType.JSON
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_views_at_the_wire_in_rocketmq_encodings(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await c.create_topic("orders", 2)
        for i in range(5):
            RawClient.send_header(await c.send("orders", b"m%d" % i, queue_id=i % 2))
        await _heartbeat(c, "orders-producer", CONSUMER_DATA)
        resp = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "billing", "topic": "orders", "queueId": 0, "commitOffset": 2},
        )
        assert resp.code == ResponseCode.SUCCESS

        # consumerProgress: a ConsumeStats with MessageQueue objects as keys, as fastjson writes
        resp = await c.call(
            RequestCode.GET_CONSUME_STATS,
            {"consumerGroup": "billing", "topic": "orders"},
            st=SerializeType.JSON,
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert resp.body.startswith(b'{"offsetTable":{{"brokerName":'), resp.body[:60]
        stats = loads(resp.body)
        assert isinstance(stats["offsetTable"], ObjectKeyMap)
        assert isinstance(stats["consumeTps"], float)
        by_queue = {mq["queueId"]: (mq, w) for mq, w in stats["offsetTable"]}
        assert sorted(by_queue) == [0, 1]
        mq, w = by_queue[0]
        assert mq == {"brokerName": broker.ctx.config.broker_name, "queueId": 0, "topic": "orders"}
        assert set(w) == {"brokerOffset", "consumerOffset", "pullOffset", "lastTimestamp"}
        assert (w["brokerOffset"], w["consumerOffset"]) == (3, 2)
        assert w["lastTimestamp"] > 0  # store time of the message at offset 1
        assert (by_queue[1][1]["brokerOffset"], by_queue[1][1]["consumerOffset"]) == (2, 0)
        assert by_queue[1][1]["lastTimestamp"] == 0

        # consumerConnection
        resp = await c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "billing"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        cc = loads(resp.body)
        (conn,) = cc["connectionSet"]
        assert conn["clientId"] == c.client_id and conn["language"] == "PYTHON"  # its header
        assert cc["messageModel"] == "CLUSTERING" and cc["consumeType"] == "CONSUME_PASSIVELY"
        assert cc["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
        sub = cc["subscriptionTable"]["orders"]
        assert sub["subString"] == "created || paid" and sub["tagsSet"] == ["created", "paid"]
        resp = await c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nobody"})
        assert resp.code == 206 and "nobody" in (resp.remark or "")  # CONSUMER_NOT_ONLINE

        # producerConnection
        resp = await c.call(
            RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "orders-producer"}
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [x["clientId"] for x in loads(resp.body)["connectionSet"]] == [c.client_id]
        resp = await c.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "none"})
        assert resp.code == ResponseCode.SYSTEM_ERROR and "not exist" in (resp.remark or "")

        # the groups the broker knows
        resp = await c.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        table = loads(resp.body)["subscriptionGroupTable"]
        assert table["billing"]["groupName"] == "billing"

        # getBrokerConfig: key=value lines with RocketMQ's names, and a version header
        resp = await c.call(RequestCode.GET_BROKER_CONFIG)
        assert resp.code == ResponseCode.SUCCESS and "version" in resp.ext_fields
        lines = dict(x.split("=", 1) for x in resp.body.decode().splitlines())
        assert lines["brokerName"] == broker.ctx.config.broker_name
        assert lines["flushDiskType"] == broker.ctx.config.flush_disk_type

        # deleteSubGroup: refused while a consumer is online, then the offsets are gone
        resp = await c.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "billing"})
        assert resp.code == ResponseCode.SYSTEM_ERROR and "live consumers" in (resp.remark or "")
        assert broker.ctx.offsets.query("billing", "orders", 0) == 2
        unregister = {"clientID": c.client_id, "consumerGroup": "billing"}
        resp = await c.call(RequestCode.UNREGISTER_CLIENT, unregister)
        assert resp.code == ResponseCode.SUCCESS
        resp = await c.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "billing"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert broker.ctx.offsets.query("billing", "orders", 0) == -1
        resp = await c.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "billing"})
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


def test_group_commands_of_the_cli(broker_thread_factory: Callable[..., BrokerThread]) -> None:
    bt = broker_thread_factory()
    assert bt.controller is not None
    addr = bt.controller.address
    runner = CliRunner()

    def cli(*args: str) -> str:
        res = runner.invoke(main, [*args, "-b", addr], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.output

    async def traffic() -> None:
        producer = AsyncProducer("views-producer", addr)
        await producer.start()
        consumer = AsyncPushConsumer("views", addr, consume_from="first")
        got: list[bytes] = []
        consumer.subscribe("views-topic", "*", lambda m: got.append(m.body))
        try:
            for i in range(6):
                await producer.send(Message("views-topic", b"v%d" % i))
            await consumer.start()
            await wait_all_consumed(
                addr, got, 6, "views", "views-topic", "the group's offsets reach the end (lag 0)"
            )
            await consumer.shutdown()
            for i in range(6, 9):  # not consumed: the group's lag is 3
                await producer.send(Message("views-topic", b"v%d" % i))
            # while the producer is connected: the connections view lists it
            out = await asyncio.to_thread(cli, "connections", "-p", "views-producer", "-o", "json")
            assert [(r["role"], r["group"]) for r in json.loads(out)] == [
                ("producer", "views-producer")
            ]
            # without a group: every group the broker knows of
            out = await asyncio.to_thread(cli, "connections", "-o", "json")
            assert ("producer", "views-producer") in {
                (r["role"], r["group"]) for r in json.loads(out)
            }
        finally:
            await consumer.shutdown()
            await producer.shutdown()

    asyncio.run(traffic())
    groups = {g["group"]: g for g in json.loads(cli("group", "list", "-o", "json"))}
    # the group's own topic and its retry topic (whose offsets the consumer commits too)
    assert groups["views"]["lag"] == 3
    assert groups["views"]["topics"] == ["%RETRY%views", "views-topic"]
    assert groups["views"]["consumers"] == 0
    shown = json.loads(cli("group", "show", "views", "-o", "json"))
    assert sum(q["lag"] for q in shown["queues"]) == 3
    table = cli("group", "show", "views")
    assert "total lag: 3" in table and "consumers online: 0" in table
    assert "views" in cli("group", "list")
    assert json.loads(cli("config", "get", "brokerName", "-o", "json")) == [
        {"key": "brokerName", "value": bt.controller.ctx.config.broker_name}
    ]
    bad = runner.invoke(main, ["config", "get", "noSuchKey", "-b", addr])
    assert bad.exit_code != 0 and "no such setting: noSuchKey" in bad.output
    assert "deleted" in cli("group", "delete", "views", "--yes")
    assert "views" not in {g["group"] for g in json.loads(cli("group", "list", "-o", "json"))}
