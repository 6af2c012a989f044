"""Consumer group settings at the wire, as RocketMQ's tools send and read them:
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (mqadmin updateSubGroup), GET_SUBSCRIPTIONGROUP_CONFIG,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG, DELETE_SUBSCRIPTIONGROUP; kept across a restart in
``config/subscriptionGroup.json``; what the broker does with them on the remoting side
(consumeEnable, retryMaxTimes); the admin client and ``txmq group update`` / ``group show``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.broker.test_admin_commands import cli
from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.errors import SubscriptionGroupNotExistError
from txmq.protocol.fastjson import loads
from txmq.protocol.message import MessageConst, decode_offset_msg_id

R = RequestCode

#: What ``mqadmin updateSubGroup -b <broker> -g orders-fifo -o true`` sends (RocketMQ 5.3):
#: request code 200, no header fields, the whole config as fastjson writes it.  The tool's own
#: defaults are consumeBroadcastEnable=false and consumeFromMinEnable=false.
MQADMIN_BODY = (
    b'{"attributes":{},"brokerId":0,"consumeBroadcastEnable":false,"consumeEnable":true,'
    b'"consumeFromMinEnable":false,"consumeMessageOrderly":true,"consumeTimeoutMinute":15,'
    b'"groupName":"orders-fifo","groupRetryPolicy":{"type":"CUSTOMIZED"},"groupSysFlag":0,'
    b'"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,"retryQueueNums":1,'
    b'"whichBrokerWhenConsumeSlowly":1}'
)


async def _update(c: RawClient, body: bytes) -> Any:
    return await c.call(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body, st=SerializeType.JSON)


async def _get(c: RawClient, group: str) -> Any:
    return await c.call(R.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group}, st=SerializeType.JSON)


async def test_mqadmin_update_sub_group_then_get_and_get_all(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        resp = await _update(c, MQADMIN_BODY)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # GET_SUBSCRIPTIONGROUP_CONFIG answers the config in RocketMQ's encoding: the very
        # bytes fastjson writes for it (sorted keys, compact)
        got = await _get(c, "orders-fifo")
        assert got.code == ResponseCode.SUCCESS, got.remark
        assert got.body == MQADMIN_BODY
        # a group known only by its committed offsets: RocketMQ's defaults (it would have
        # created the config when the group first consumed)
        commit = {"consumerGroup": "plain", "topic": "t", "queueId": 0, "commitOffset": 3}
        resp = await c.call(R.UPDATE_CONSUMER_OFFSET, commit)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        plain = loads((await _get(c, "plain")).body)
        assert plain["groupName"] == "plain" and plain["consumeMessageOrderly"] is False
        assert plain["consumeEnable"] is True and plain["retryMaxTimes"] == 16
        assert list(plain) == sorted(plain)
        # an unknown group: RocketMQ's answer
        missing = await _get(c, "nobody")
        assert (missing.code, missing.remark) == (
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            "No group in this broker",
        )
        # GET_ALL: RocketMQ's SubscriptionGroupWrapper with both
        everything = await c.call(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, st=SerializeType.JSON)
        assert everything.code == ResponseCode.SUCCESS, everything.remark
        doc = loads(everything.body)
        assert list(doc) == ["dataVersion", "forbiddenTable", "subscriptionGroupTable"]
        assert doc["dataVersion"]["counter"] == 1 and doc["dataVersion"]["timestamp"] > 0
        table = doc["subscriptionGroupTable"]
        assert sorted(table) == ["orders-fifo", "plain"]
        assert json.dumps(table["orders-fifo"], separators=(",", ":")).encode() == MQADMIN_BODY
        assert table["plain"]["consumeMessageOrderly"] is False


async def test_bad_updates_are_refused_and_change_nothing(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        cases = [
            (b"", "not a SubscriptionGroupConfig"),
            (b"not json", "not a SubscriptionGroupConfig"),
            (b'{"consumeEnable": false}', "groupName"),
            (b'{"groupName": "g", "retryMaxTimes": "many"}', "retryMaxTimes"),
            (b'{"groupName": "g", "consumeEnable": 3}', "consumeEnable"),
            (b'{"groupName": "bad group!"}', "contains illegal characters"),
            (b'{"groupName": "' + b"g" * 256 + b'"}', "longer than group max length: 255"),
        ]
        for body, remark in cases:
            resp = await _update(c, body)
            assert resp.code == ResponseCode.INVALID_PARAMETER, (body, resp.code, resp.remark)
            assert remark in (resp.remark or ""), (body, resp.remark)
        assert broker.ctx.groups.all() == {}
        assert not os.path.exists(broker.ctx.groups.path)


async def test_configs_survive_a_restart_and_delete_removes_them(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    async with started(cfg) as first:
        async with connected(first.address) as c:
            assert (await _update(c, MQADMIN_BODY)).code == ResponseCode.SUCCESS
            body = b'{"groupName":"slow","consumeEnable":false,"retryMaxTimes":2,"future":[1]}'
            assert (await _update(c, body)).code == ResponseCode.SUCCESS
    path = os.path.join(cfg.store_path_root_dir, "config", "subscriptionGroup.json")
    with open(path, encoding="utf-8") as f:
        on_disk = json.load(f)
    assert sorted(on_disk["subscriptionGroupTable"]) == ["orders-fifo", "slow"]
    assert on_disk["dataVersion"]["counter"] == 2

    async with started(cfg) as second:
        async with connected(second.address) as c:
            assert (await _get(c, "orders-fifo")).body == MQADMIN_BODY
            slow = loads((await _get(c, "slow")).body)
            assert slow["consumeEnable"] is False and slow["retryMaxTimes"] == 2
            assert slow["future"] == [1]  # a newer RocketMQ's key is kept as it came
            assert slow["consumeMessageOrderly"] is False  # RocketMQ's default filled in
            # DELETE_SUBSCRIPTIONGROUP removes the config (the group had no offsets)
            resp = await c.call(R.DELETE_SUBSCRIPTIONGROUP, {"groupName": "slow"})
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert (await _get(c, "slow")).code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            again = await c.call(R.DELETE_SUBSCRIPTIONGROUP, {"groupName": "slow"})
            assert again.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    with open(path, encoding="utf-8") as f:
        assert sorted(json.load(f)["subscriptionGroupTable"]) == ["orders-fifo"]


async def test_a_disabled_group_cannot_pull(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        assert (await c.send("pulled", b"m")).code == ResponseCode.SUCCESS
        resp, msgs = await c.pull("pulled", 0, group="off-group")
        assert resp.code == ResponseCode.SUCCESS and len(msgs) == 1, resp.remark
        resp = await _update(c, b'{"groupName":"off-group","consumeEnable":false}')
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp, msgs = await c.pull("pulled", 0, group="off-group")
        assert (resp.code, resp.remark) == (
            ResponseCode.NO_PERMISSION,
            "subscription group no permission, off-group",
        )
        # another group is not affected, and enabling the group again lets it pull
        resp, msgs = await c.pull("pulled", 0, group="other-group")
        assert resp.code == ResponseCode.SUCCESS and len(msgs) == 1
        resp = await _update(c, b'{"groupName":"off-group","consumeEnable":true}')
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp, msgs = await c.pull("pulled", 0, group="off-group")
        assert resp.code == ResponseCode.SUCCESS and len(msgs) == 1


async def _send_back(c: RawClient, group: str, topic: str, offset: int, **ext: Any) -> None:
    resp = await c.call(
        R.CONSUMER_SEND_MSG_BACK,
        {"group": group, "offset": offset, "delayLevel": 0, "originTopic": topic, **ext},
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_send_back_without_max_reconsume_times_uses_the_group_retry_max_times(
    broker: BrokerController,
) -> None:
    """RocketMQ's consumerSendMsgBack: the header's maxReconsumeTimes when the client gives
    one, else the group's retryMaxTimes."""
    async with connected(broker.address) as c:
        resp = await _update(c, b'{"groupName":"brief","retryMaxTimes":0}')
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        props = {MessageConst.UNIQ_KEY: "0A0000000000000000000000000000B1"}
        sent = RawClient.send_header(await c.send("backs", b"x", props=props))
        _host, offset = decode_offset_msg_id(sent.msg_id)
        # no maxReconsumeTimes: the group's 0 applies, the first send-back is a dead letter
        await _send_back(c, "brief", "backs", offset)
        assert broker.store.get_max_offset_in_queue("%DLQ%brief", 0) == 1
        # the header's value wins when given: a retry, not a dead letter
        await _send_back(c, "brief", "backs", offset, maxReconsumeTimes=5)
        assert broker.store.get_max_offset_in_queue("%DLQ%brief", 0) == 1
        assert broker.ctx.topics.get("%RETRY%brief") is not None


async def test_admin_client_and_cli(broker: BrokerController) -> None:
    addr = broker.address
    async with AsyncAdminClient(addr) as admin:
        with pytest.raises(SubscriptionGroupNotExistError):
            await admin.group_config("sdk-group")
        sent = await admin.update_group_config("sdk-group", orderly=True, retry_max_times=3)
        assert sent["consumeMessageOrderly"] is True and sent["retryMaxTimes"] == 3
        got = await admin.group_config("sdk-group")
        assert got["consumeMessageOrderly"] is True and got["retryMaxTimes"] == 3
        assert got["consumeEnable"] is True and got["consumeBroadcastEnable"] is True
        # fields not given are kept
        await admin.update_group_config("sdk-group", consume_enable=False)
        got = await admin.group_config("sdk-group")
        assert (got["consumeMessageOrderly"], got["consumeEnable"], got["retryMaxTimes"]) == (
            True,
            False,
            3,
        )
        assert "sdk-group" in await admin.consumer_groups()

    doc = json.loads(
        await cli("group", "update", "cli-group", "--orderly", "--retry-max-times", "4",
                  "-o", "json", "-b", addr)
    )  # fmt: skip
    assert doc["groupName"] == "cli-group"
    assert (doc["consumeMessageOrderly"], doc["retryMaxTimes"], doc["consumeEnable"]) == (
        True,
        4,
        True,
    )
    out = await cli("group", "update", "cli-group", "--no-orderly", "--consume-disable", "-b", addr)
    assert "consumer group cli-group updated" in out
    assert "consumeMessageOrderly: false" in out and "consumeEnable: false" in out
    stored = broker.ctx.groups.get("cli-group")
    assert stored is not None
    assert (stored.consume_message_orderly, stored.consume_enable, stored.retry_max_times) == (
        False,
        False,
        4,
    )
    shown = json.loads(await cli("group", "show", "cli-group", "-o", "json", "-b", addr))
    assert shown["config"]["retryMaxTimes"] == 4 and shown["config"]["consumeEnable"] is False
    table = await cli("group", "show", "cli-group", "-b", addr)
    assert "settings:" in table and "retryMaxTimes: 4" in table
    assert "give at least one" in await cli("group", "update", "cli-group", "-b", addr, ok=False)


async def test_a_subscription_group_file_from_rocketmq_is_read(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """A broker started on a store whose ``config/subscriptionGroup.json`` RocketMQ wrote
    (its pretty-printed form, with ``forbiddenTable`` and a retry policy of its own)."""
    cfg = make_broker_config()
    path = os.path.join(cfg.store_path_root_dir, "config", "subscriptionGroup.json")
    os.makedirs(os.path.dirname(path))
    rocketmq_file = {
        "dataVersion": {"counter": 7, "stateVersion": 0, "timestamp": 1700000000000},
        "forbiddenTable": {},
        "subscriptionGroupTable": {
            "TOOLS_CONSUMER": {
                "brokerId": 0,
                "consumeBroadcastEnable": True,
                "consumeEnable": True,
                "consumeFromMinEnable": True,
                "consumeMessageOrderly": False,
                "groupName": "TOOLS_CONSUMER",
                "groupRetryPolicy": {"type": "CUSTOMIZED"},
                "groupSysFlag": 0,
                "notifyConsumerIdsChangedEnable": True,
                "retryMaxTimes": 16,
                "retryQueueNums": 1,
                "whichBrokerWhenConsumeSlowly": 1,
            },
            "orders": {
                "attributes": {"+owner": "team-a"},
                "consumeEnable": True,
                "consumeMessageOrderly": True,
                "groupName": "orders",
                "groupRetryPolicy": {
                    "type": "EXPONENTIAL",
                    "exponentialRetryPolicy": {"initial": 1000, "max": 60000, "multiplier": 2},
                },
                "retryMaxTimes": 5,
            },
        },
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rocketmq_file, f, indent=4)
    async with started(cfg) as b:
        async with AsyncAdminClient(b.address) as admin:
            orders = await admin.group_config("orders")
            assert (orders["consumeMessageOrderly"], orders["retryMaxTimes"]) == (True, 5)
            assert orders["groupRetryPolicy"]["exponentialRetryPolicy"]["max"] == 60000
            assert orders["attributes"] == {"+owner": "team-a"}
            assert sorted(await admin.consumer_groups()) == ["TOOLS_CONSUMER", "orders"]
        assert b.ctx.groups.data_version()["counter"] == 7
