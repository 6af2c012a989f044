"""Both roles of a broker group export what an operator alerts on: the leader its followers' lag
(bytes and seconds) and the in-sync minimum, a follower its own lag behind the leader, and both
the consumer lag (the follower from the offsets it copies) and disk figures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster
from tests.support.raw import connected
from tests.support.scrape import CLUSTER_ONLY, Samples, names, referenced, scrape, value
from txmq.protocol.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.slow

TOPIC = "cluster-metrics"
GROUP = "cluster-metrics-consumers"


async def test_leader_and_follower_export_replication_lag_and_consumer_lag(
    make_cluster: Any,
) -> None:
    bc: BrokerCluster = make_cluster(groups={"g1": 2})
    leader = await bc.start_group("g1")
    follower = next(r for r in bc.replicas.values() if r is not leader)
    async with connected(leader.addr) as c:
        for i in range(5):
            c.send_header(await c.send(TOPIC, b"m%d" % i, queue_id=0))
        r = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 2},
        )
        assert r.code == ResponseCode.SUCCESS, r.remark

    seen: dict[str, Samples] = {}

    async def scraped(name: str, port: int) -> Samples:
        s = seen[name] = await asyncio.to_thread(scrape, port)
        return s

    async def follower_caught_up() -> bool:
        s = await scraped("follower", follower.ops_port)
        return (
            value(s, "txmq_follower_lag_bytes") == 0
            and value(s, "txmq_follower_lag_seconds") == 0
            and value(s, "txmq_consumer_lag_messages", group=GROUP, topic=TOPIC) == 3
        )

    await bc.wait(
        follower_caught_up,
        30,
        "the follower exports 0 lag behind its leader and the group's lag of 3 messages "
        f"(last scrape: {seen.get('follower')})",
    )
    fs = seen["follower"]
    assert (value(fs, "txmq_consumer_lag_seconds", group=GROUP, topic=TOPIC) or 0) > 0
    assert 0 < (value(fs, "txmq_disk_free_ratio") or 0) < 1

    rid = str(follower.replica)

    async def leader_sees_it() -> bool:
        s = await scraped("leader", leader.ops_port)
        return (
            value(s, "txmq_replication_lag_bytes", replica=rid) == 0
            and value(s, "txmq_replication_lag_seconds", replica=rid) == 0
            and value(s, "txmq_in_sync_replicas") == 2
        )

    await bc.wait(
        leader_sees_it,
        30,
        f"the leader exports replica {rid} in sync (last scrape: {seen.get('leader')})",
    )
    ls = seen["leader"]
    assert value(ls, "txmq_min_in_sync_replicas") == 2
    assert value(ls, "txmq_consumer_lag_messages", group=GROUP, topic=TOPIC) == 3
    assert value(ls, "txmq_messages_put_total", topic=TOPIC) == 5

    # the dashboard's and the rules' cluster-only names: exported by one role or the other
    used = set().union(*referenced().values()) & CLUSTER_ONLY
    assert used == CLUSTER_ONLY, CLUSTER_ONLY - used  # the list names nothing unused
    missing = CLUSTER_ONLY - names(ls) - names(fs)
    assert not missing, f"no replica exports {missing}"
