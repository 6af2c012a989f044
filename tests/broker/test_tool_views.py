"""What RocketMQ's admin tools (mqadmin clusterList, topicList, brokerStatus, consumerProgress,
statsAll) and rocketmq-dashboard ask first, at the wire: the bodies exactly as RocketMQ's
serializer writes them (fastjson: fields sorted, nulls left out, ``{0:"addr"}`` for a map keyed
by broker id), and the runtime figures parsed the way those tools parse them."""

from __future__ import annotations

import json
import time
from datetime import date
from typing import Any

from tests.support.raw import RawClient, connected
from txmq.broker.server import BrokerController
from txmq.broker.stats import BrokerStats, Counts, human_bytes, runtime_text
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.fastjson import ObjectKeyMap, loads
from txmq.protocol.topics import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
)

R = RequestCode

#: The runtime keys the tools read, and how they parse them (Java's Long.parseLong,
#: Double.parseDouble of the first of a TPS triple, Boolean.parseBoolean).
CLUSTER_LIST_LONGS = (
    "msgPutTotalYesterdayMorning",
    "msgPutTotalTodayMorning",
    "msgPutTotalTodayNow",
    "msgGetTotalYesterdayMorning",
    "msgGetTotalTodayMorning",
    "msgGetTotalTodayNow",
    "earliestMessageTimeStamp",
    "timerReadBehind",
    "timerOffsetBehind",
    "timerCongestNum",
    "sendThreadPoolQueueSize",
    "pullThreadPoolQueueSize",
    "sendThreadPoolQueueHeadWaitTimeMills",
    "pullThreadPoolQueueHeadWaitTimeMills",
    "pageCacheLockTimeMills",
)
TPS_TRIPLES = ("putTps", "getTransferredTps", "getTotalTps", "getFoundTps", "getMissTps")


async def _ok(c: RawClient, code: int, ext: dict[str, Any] | None = None) -> bytes:
    resp = await c.call(code, ext, st=SerializeType.JSON)
    assert resp.code == ResponseCode.SUCCESS, (code, resp.code, resp.remark)
    return bytes(resp.body)


async def _setup(c: RawClient) -> None:
    await c.create_topic("orders", 2)
    for i in range(5):
        RawClient.send_header(await c.send("orders", b"m%d" % i, queue_id=i % 2))
    await c.heartbeat(consumer_groups={"billing": {"orders": "*"}})
    resp = await c.call(
        R.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "audit", "topic": "orders", "queueId": 1, "commitOffset": 1},
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_name_server_views_at_the_wire(broker: BrokerController) -> None:
    cfg = broker.config
    bn, cl, addr = cfg.broker_name, cfg.broker_cluster_name, broker.advertised_address
    async with connected(broker.address) as c:
        await _setup(c)

        # clusterList, brokerStatus -c, the dashboard's cluster page: ClusterInfo
        body = await _ok(c, R.GET_BROKER_CLUSTER_INFO)
        assert body.decode() == (
            f'{{"brokerAddrTable":{{"{bn}":{{"brokerAddrs":{{0:"{addr}"}},'
            f'"brokerName":"{bn}","cluster":"{cl}","enableActingMaster":false}}}},'
            f'"clusterAddrTable":{{"{cl}":["{bn}"]}}}}'
        )
        info = loads(body)
        assert info["brokerAddrTable"][bn]["brokerAddrs"] == ObjectKeyMap([(0, addr)])

        # topicList, statsAll, consumerProgress: every topic with a route
        body = await _ok(c, R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        expected = sorted([*broker.ctx.topics.all(), "TBW102"])  # the auto-create template
        assert body == json.dumps({"topicList": expected}, separators=(",", ":")).encode()
        assert {"orders", "%RETRY%billing", RMQ_SYS_TRANS_HALF_TOPIC} <= set(expected)
        assert await _ok(c, R.GET_TOPICS_BY_CLUSTER, {"cluster": cl}) == body
        assert await _ok(c, R.GET_TOPICS_BY_CLUSTER, {"cluster": "Other"}) == b'{"topicList":[]}'
        resp = await c.call(R.GET_TOPICS_BY_CLUSTER)
        assert resp.code == ResponseCode.INVALID_PARAMETER and "cluster" in (resp.remark or "")

        # the dashboard's system topics: the name server's, then the broker it names
        body = await _ok(c, R.GET_SYSTEM_TOPIC_LIST_FROM_NS)
        names = sorted([bn, cl])
        assert (
            body
            == json.dumps({"brokerAddr": addr, "topicList": names}, separators=(",", ":")).encode()
        )
        sys_topics = loads(await _ok(c, R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER))["topicList"]
        assert sys_topics == sorted(sys_topics)
        assert {
            RMQ_SYS_TRANS_HALF_TOPIC,
            RMQ_SYS_TRANS_OP_HALF_TOPIC,
            SCHEDULE_TOPIC,
            "TBW102",
        } <= (set(sys_topics))
        assert "orders" not in sys_topics


async def test_broker_views_at_the_wire(broker: BrokerController) -> None:
    addr = broker.advertised_address
    async with connected(broker.address) as c:
        await _setup(c)

        # topicList -c, statsAll: who consumes a topic (live subscriptions, committed offsets)
        body = await _ok(c, R.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "orders"})
        assert body == b'{"groupList":["audit","billing"]}'
        assert await _ok(c, R.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "none"}) == b'{"groupList":[]}'

        body = await _ok(c, R.QUERY_TOPICS_BY_CONSUMER, {"group": "audit"})
        assert body.decode() == f'{{"brokerAddr":"{addr}","topicList":["orders"]}}'

        # consumerProgress asks each topic's config (for static topics) and fails on an error
        # other than TOPIC_NOT_EXIST
        body = await _ok(c, R.GET_TOPIC_CONFIG, {"topic": "orders"})
        assert body == (
            b'{"attributes":{},"order":false,"perm":6,"readQueueNums":2,'
            b'"topicFilterType":"SINGLE_TAG","topicName":"orders","topicSysFlag":0,'
            b'"writeQueueNums":2}'
        )
        resp = await c.call(R.GET_TOPIC_CONFIG, {"topic": "nowhere"})
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        assert resp.remark == "No topic in this broker. topic: nowhere"

        # topicStatus, the dashboard's topic status: TopicStatsTable (queues as object keys),
        # with txmq's own consumerOffsets and topic beside
        body = await _ok(c, R.GET_TOPIC_STATS_INFO, {"topic": "orders"})
        doc = loads(body)
        last = [w["lastUpdateTimestamp"] for _, w in doc["offsetTable"]]
        assert all(t > 0 for t in last) and doc["topicPutTps"] > 0
        bn = broker.config.broker_name
        queues = ",".join(
            f'{{"brokerName":"{bn}","queueId":{q},"topic":"orders"}}:'
            f'{{"lastUpdateTimestamp":{last[q]},"maxOffset":{n},"minOffset":0}}'
            for q, n in ((0, 3), (1, 2))
        )
        assert body.decode() == (
            f'{{"consumerOffsets":{{"audit":{{"1":1}}}},"offsetTable":{{{queues}}},'
            f'"topic":"orders","topicPutTps":{doc["topicPutTps"]!r}}}'
        )
        async with AsyncAdminClient(broker.address) as admin:
            stats = await admin.topic_stats("orders")
        assert [(q["queueId"], q["minOffset"], q["maxOffset"]) for q in stats["offsetTable"]] == [
            (0, 0, 3),
            (1, 0, 2),
        ]
        assert stats["consumerOffsets"] == {"audit": {"1": 1}}

        # statsAll, the dashboard's topic and consumer figures: BrokerStatsData
        body = await _ok(
            c, R.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "orders"}
        )
        assert body.startswith(b'{"statsDay":{"avgpt":0.0,"sum":5,"tps":'), body
        data = loads(body)
        assert list(data) == ["statsDay", "statsHour", "statsMinute"]
        for window in data.values():
            assert list(window) == ["avgpt", "sum", "tps"]
            assert window["sum"] == 5 and window["tps"] > 0
        pulled = await c.pull_all("orders", 2, group="billing")
        assert len(pulled) == 5
        data = loads(
            await _ok(
                c,
                R.VIEW_BROKER_STATS_DATA,
                {"statsName": "GROUP_GET_NUMS", "statsKey": "orders@billing"},
            )
        )
        assert data["statsMinute"]["sum"] == 5 and data["statsDay"]["sum"] == 5
        # consumerProgress's TPS: the same count over the last minute
        stats = loads(
            await _ok(c, R.GET_CONSUME_STATS, {"consumerGroup": "billing", "topic": "orders"})
        )
        assert stats["consumeTps"] > 0
        idle = loads(
            await _ok(c, R.GET_CONSUME_STATS, {"consumerGroup": "audit", "topic": "orders"})
        )
        assert idle["consumeTps"] == 0.0
        resp = await c.call(
            R.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "nowhere"}
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "The stats <TOPIC_PUT_NUMS> <nowhere> not exist"


async def test_runtime_info_is_a_kv_table_the_tools_parse(broker: BrokerController) -> None:
    before = int(time.time() * 1000)
    async with connected(broker.address) as c:
        await _setup(c)
        await c.pull_all("orders", 2, group="billing")
        body = await _ok(c, R.GET_BROKER_RUNTIME_INFO)
    assert body.startswith(b'{"table":{'), body[:40]
    doc = json.loads(body)
    assert list(doc) == ["table"]
    table = doc["table"]
    # RocketMQ's KVTable is a HashMap<String, String>: every value a string
    assert all(isinstance(v, str) for v in table.values()), {
        k: v for k, v in table.items() if not isinstance(v, str)
    }
    assert list(table) == sorted(table)
    for key in CLUSTER_LIST_LONGS:
        int(table[key])  # Long.parseLong
    for key in TPS_TRIPLES:
        triple = table[key].split(" ")
        assert len(triple) == 3 and all(float(x) >= 0 for x in triple), (key, table[key])
    assert float(table["putTps"].split(" ")[0]) > 0
    assert float(table["getTransferredTps"].split(" ")[0]) > 0
    assert table["brokerActive"] == "true"
    assert table["brokerVersionDesc"].startswith("txmq-")
    assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
    assert int(table["msgPutTotalTodayNow"]) >= 5
    assert int(table["msgGetTotalTodayNow"]) == 5
    assert int(table["msgPutTotalTodayMorning"]) == 0  # no midnight since the start
    assert before - 60_000 <= int(table["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    assert table["brokerName"] == broker.config.broker_name
    assert json.loads(table["uptimeMs"]) >= 0  # txmq's own figures: JSON text

    # the txmq SDK reads its own figures typed again
    async with AsyncAdminClient(broker.address) as admin:
        info = await admin.runtime_info()
    assert isinstance(info["uptimeMs"], int) and isinstance(info["topics"], int)
    assert info["consumerGroups"] == {}  # the raw client left
    assert isinstance(info["store.commit_log_max_offset"], int)
    assert info["store.store_path"] == table["store.store_path"]
    assert len(info["putTps"].split(" ")) == 3  # RocketMQ's figures stay text


def test_stats_windows_and_daily_totals() -> None:
    """The sampled windows: a put shows at once, leaves the minute window after a minute, the
    hour's after an hour; the morning totals roll at midnight."""
    now = [1000.0]
    day = [date(2026, 1, 1)]
    puts = {"t": 0}

    def read() -> Counts:
        return Counts(puts["t"], 2 * puts["t"], 0, 0, dict(puts), {"t@g": 2 * puts["t"]})

    stats = BrokerStats(read, monotonic=lambda: now[0], today=lambda: day[0])
    assert stats.stats_data("TOPIC_PUT_NUMS", "t") is not None
    assert stats.stats_data("TOPIC_PUT_NUMS", "u") is None
    assert stats.stats_data("OTHER", "t") is None

    def advance(seconds: float) -> None:
        for _ in range(int(seconds)):
            now[0] += 1.0
            stats.tick()

    advance(5)
    puts["t"] = 30
    data = stats.stats_data("TOPIC_PUT_NUMS", "t")
    assert data is not None
    assert data["statsMinute"] == {"avgpt": 0.0, "sum": 30, "tps": 30 / 5}
    assert stats.tps(lambda c: c.put) == f"{30 / 5!r} {30 / 5!r} {30 / 5!r}"
    advance(100)
    data = stats.stats_data("GROUP_GET_NUMS", "t@g")
    assert data is not None
    assert data["statsMinute"]["sum"] == 0
    assert data["statsHour"]["sum"] == 60 and data["statsDay"]["sum"] == 60
    assert stats.window(600, lambda c: c.put).sum == 30  # from a sample holding totals only
    # the 10 s tier keeps per-key tables for the last minute or so only
    fine = stats._tiers[0]
    assert len(fine) == 11 and sum(1 for x in fine if x.counts.out_by_key) == 8
    advance(4000)
    data = stats.stats_data("TOPIC_PUT_NUMS", "t")
    assert data is not None
    assert data["statsHour"]["sum"] == 0 and data["statsDay"]["sum"] == 30

    assert (stats.morning_today, stats.morning_yesterday) == ((0, 0), (0, 0))
    day[0] = date(2026, 1, 2)
    advance(1)
    assert (stats.morning_today, stats.morning_yesterday) == ((30, 60), (0, 0))
    puts["t"] = 50
    day[0] = date(2026, 1, 3)
    advance(1)
    assert (stats.morning_today, stats.morning_yesterday) == ((50, 100), (30, 60))


def test_rocketmq_text_forms() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 1024**3)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 GiB",
    ]
    assert runtime_text(90061) == "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"
