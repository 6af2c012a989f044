"""mqadmin clusterList and the dashboard's cluster page against a cluster: every replica, leader
or follower, answers as a name server with every broker group and its replicas (the leader as
broker id 0), and a follower answers its own runtime figures.  Real processes, real etcd."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster, Replica
from tests.support.raw import connected
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType

pytestmark = pytest.mark.slow


async def _call(r: Replica, code: int, ext: dict[str, Any] | None = None) -> bytes:
    async with connected(r.addr) as c:
        resp = await c.call(code, ext, st=SerializeType.JSON)
    assert resp.code == ResponseCode.SUCCESS, (r.addr, code, resp.code, resp.remark)
    return bytes(resp.body)


async def test_every_replica_lists_every_group(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster(groups={"g1": 2, "g2": 1}, settings={"minInSyncReplicas": 1})
    l1 = await bc.start_group("g1")
    l2 = await bc.start_group("g2")
    (f1,) = [r for r in bc.replicas.values() if r.group == "g1" and r is not l1]
    for leader in (l1, l2):
        await _call(
            leader,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": f"orders-{leader.group}", "readQueueNums": 2, "writeQueueNums": 2},
        )

    expected = (
        f'{{"brokerAddrTable":{{'
        f'"g1":{{"brokerAddrs":{{0:"{l1.addr}",1:"{f1.addr}"}},"brokerName":"g1",'
        f'"cluster":"{bc.name}","enableActingMaster":false}},'
        f'"g2":{{"brokerAddrs":{{0:"{l2.addr}"}},"brokerName":"g2",'
        f'"cluster":"{bc.name}","enableActingMaster":false}}}},'
        f'"clusterAddrTable":{{"{bc.name}":["g1","g2"]}}}}'
    ).encode()
    # every topic the leaders published, the auto-create template among them
    topics = json.dumps({"topicList": ["TBW102", "orders-g1", "orders-g2"]}, separators=(",", ":"))

    async def listed() -> bool:
        for r in (l1, f1, l2):
            info = await _call(r, RequestCode.GET_BROKER_CLUSTER_INFO)
            names = await _call(r, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            if (info, names) != (expected, topics.encode()):
                return False
        return True

    await bc.wait(listed, 30, f"not all replicas answered {expected!r} and {topics}")
    by_cluster = await _call(f1, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": bc.name})
    assert by_cluster == topics.encode()
    system = json.loads(await _call(f1, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS))
    assert system == {"brokerAddr": l1.addr, "topicList": sorted([bc.name, "g1", "g2"])}

    # clusterList asks each address for its runtime figures: a follower answers its own
    leader_table = json.loads(await _call(l1, RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    follower_table = json.loads(await _call(f1, RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    assert leader_table["brokerActive"] == "true"
    assert follower_table["brokerActive"] == "false"
    for table in (leader_table, follower_table):
        assert all(isinstance(v, str) for v in table.values())
        assert len(table["putTps"].split(" ")) == 3
        assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
        int(table["msgPutTotalTodayNow"])
