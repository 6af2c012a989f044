"""What RocketMQ's admin tools (``mqadmin clusterList``, ``topicList``, ``brokerStatus``,
``consumerProgress``, ``statsAll``) and rocketmq-dashboard ask before anything else, in the
encodings RocketMQ's serializer writes (fastjson: bean fields sorted, null fields left out, a
``Map<Long, String>`` with bare numbers as keys).

A txmq broker is its own name server, so it answers the name server's views too:
GET_BROKER_CLUSTER_INFO (``ClusterInfo``: every broker group, its leader as broker id 0 and its
followers 1, 2, ... in cluster mode, as routes give them), GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
GET_TOPICS_BY_CLUSTER and GET_SYSTEM_TOPIC_LIST_FROM_NS (``TopicList``).  And one broker's:
GET_BROKER_RUNTIME_INFO (``KVTable``, string values, RocketMQ's keys and txmq's own),
GET_SYSTEM_TOPIC_LIST_FROM_BROKER, QUERY_TOPIC_CONSUME_BY_WHO (``GroupList``),
QUERY_TOPICS_BY_CONSUMER, VIEW_BROKER_STATS_DATA (``BrokerStatsData``), GET_TOPIC_CONFIG
(``TopicConfigAndQueueMapping``) and GET_TOPIC_STATS_INFO (``TopicStatsTable``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from txmq import __version__
from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, QueryNotFoundError, TopicNotExistError
from txmq.protocol.fastjson import ObjectKeyMap, dumps
from txmq.protocol.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    INTERNAL_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
)

from ..config import BrokerConfig
from ..context import BrokerContext
from ..stats import MINUTE, BrokerStats, boot_millis, human_bytes, runtime_text
from ..store import MessageStore
from ..transaction.service import TransactionalMessageService

#: What ``brokerVersionDesc`` says (RocketMQ writes ``V5_3_2``; the tools only print it).
VERSION_DESC = f"txmq-{__version__}"

#: Runtime figures of RocketMQ's thread pools, which txmq (one event loop) does not have:
#: always ``0``.
_NO_POOLS = {
    f"{pool}{suffix}": "0"
    for pool in ("sendThreadPool", "pullThreadPool", "litePullThreadPool", "queryThreadPool")
    for suffix in ("QueueSize", "QueueHeadWaitTimeMills")
} | {
    "ackThreadPoolQueueSize": "0",
    "ackThreadPoolQueueHeadWaitTimeMills": "0",
    "EndTransactionQueueSize": "0",
    "dispatchBehindBytes": "0",
    "pageCacheLockTimeMills": "0",
    "startAcceptSendRequestTimeStamp": "0",
    "remainTransientStoreBufferNumbs": "0",
}


def cluster_info_body(cluster: str, groups: dict[str, dict[int, str]]) -> bytes:
    """RocketMQ's ``ClusterInfo`` of broker groups ``{name: {brokerId: address}}``."""
    table = {
        name: {
            "brokerAddrs": ObjectKeyMap(sorted(addrs.items())),
            "brokerName": name,
            "cluster": cluster,
            "enableActingMaster": False,
        }
        for name, addrs in sorted(groups.items())
    }
    doc = {"brokerAddrTable": table, "clusterAddrTable": {cluster: sorted(groups)}}
    return dumps(doc).encode()


def topic_list_body(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    """RocketMQ's ``TopicList`` (``brokerAddr`` left out when null)."""
    doc: dict[str, Any] = {}
    if broker_addr is not None:
        doc["brokerAddr"] = broker_addr
    doc["topicList"] = sorted(set(topics))
    return dumps(doc).encode()


def system_topics() -> list[str]:
    """The topics a broker keeps for itself (GET_SYSTEM_TOPIC_LIST_FROM_BROKER)."""
    return sorted(INTERNAL_TOPICS | {AUTO_CREATE_TOPIC_KEY_TOPIC})


def _disk_ratio(path: str) -> str:
    """RocketMQ's ``commitLogDiskRatio``: space in use over the partition's size, 0 to 1."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return "-1.0"
    return repr(usage.used / usage.total if usage.total else 0.0)


def _capacity(path: str) -> str:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return ""
    return f"Total : {human_bytes(usage.total)}, Free : {human_bytes(usage.free)}."


def follower_runtime_table(config: BrokerConfig, store: MessageStore) -> dict[str, str]:
    """What a following replica answers GET_BROKER_RUNTIME_INFO with: it serves no clients, so
    its traffic figures are zero and ``brokerActive`` false; its store's figures are its own."""
    st = store.stats()
    table = {
        "brokerActive": "false",
        "brokerVersionDesc": VERSION_DESC,
        "brokerVersion": __version__,
        "brokerName": config.broker_name,
        "putTps": "0.0 0.0 0.0",
        "getTransferredTps": "0.0 0.0 0.0",
        "getTotalTps": "0.0 0.0 0.0",
        "commitLogDiskRatio": _disk_ratio(config.store_path_root_dir),
        "commitLogMinOffset": str(st["commit_log_min_offset"]),
        "commitLogMaxOffset": str(st["commit_log_max_offset"]),
        **_NO_POOLS,
    }
    for key in ("Put", "Get"):
        for when in ("YesterdayMorning", "TodayMorning", "TodayNow"):
            table[f"msg{key}Total{when}"] = "0"
    return dict(sorted(table.items()))


def _field(cmd: RemotingCommand, name: str) -> str:
    value = cmd.ext_fields.get(name)
    if value is None or value == "":
        raise InvalidParameterError(f"the custom field <{name}> is null")
    return str(value)


@dataclass(eq=False)
class ToolViewProcessor:
    ctx: BrokerContext
    transactions: TransactionalMessageService
    advertised_address: str
    stats: BrokerStats
    started_monotonic: float = field(init=False, default_factory=time.monotonic)

    # -- the name server's views ---------------------------------------------------------------

    def _groups(self) -> dict[str, dict[int, str]]:
        if self.ctx.cluster is not None:
            return self.ctx.cluster.broker_addrs()
        return {self.ctx.config.broker_name: {0: self.advertised_address}}

    def _topics(self) -> set[str]:
        """Every topic with a route: the auto-create template too while it serves one."""
        if self.ctx.cluster is not None:
            return self.ctx.cluster.topic_names()
        names = set(self.ctx.topics.all())
        if self.ctx.topics.route_config(AUTO_CREATE_TOPIC_KEY_TOPIC) is not None:
            names.add(AUTO_CREATE_TOPIC_KEY_TOPIC)
        return names

    async def get_broker_cluster_info(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        body = cluster_info_body(self.ctx.config.broker_cluster_name, self._groups())
        return cmd.response(body=body)

    async def get_all_topic_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=topic_list_body(self._topics()))

    async def get_topics_by_cluster(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """A cluster's topics (none for a cluster this broker is not in, as RocketMQ's name
        server answers an unknown cluster)."""
        cluster = _field(cmd, "cluster")
        known = cluster == self.ctx.config.broker_cluster_name
        return cmd.response(body=topic_list_body(self._topics() if known else ()))

    async def get_system_topic_list_from_ns(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """As RocketMQ's name server: the cluster's and the broker groups' names (topics
        RocketMQ's brokers create), and one broker to ask for its own system topics."""
        groups = self._groups()
        leader = next((a[0] for _, a in sorted(groups.items()) if 0 in a), None)
        names = [self.ctx.config.broker_cluster_name, *groups]
        return cmd.response(body=topic_list_body(names, leader))

    # -- one broker's views --------------------------------------------------------------------

    async def get_system_topic_list_from_broker(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        return cmd.response(body=topic_list_body(system_topics()))

    async def query_topic_consume_by_who(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """The groups that consume ``topic``: live consumers subscribed to it, and groups
        with offsets committed on it."""
        topic = _field(cmd, "topic")
        clients, offsets = self.ctx.clients, self.ctx.offsets
        groups = {g for g in clients.consumer_groups() if clients.subscription(g, topic)}
        groups.update(g for g in offsets.groups() if offsets.offsets(g, topic))
        return cmd.response(body=dumps({"groupList": sorted(groups)}).encode())

    async def query_topics_by_consumer(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """The topics ``group`` has committed offsets on, and this broker's address."""
        group = _field(cmd, "group")
        topics = self.ctx.offsets.topics_of(group)
        return cmd.response(body=topic_list_body(topics, self.advertised_address))

    async def view_broker_stats_data(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        name, key = _field(cmd, "statsName"), _field(cmd, "statsKey")
        data = self.stats.stats_data(name, key)
        if data is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return cmd.response(body=dumps(data).encode())

    async def get_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's ``TopicConfigAndQueueMapping``: the topic's config (txmq has no static
        topics, so no ``mappingDetail``)."""
        topic = _field(cmd, "topic")
        tc = self.ctx.topics.get(topic)
        if tc is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"
            )
        doc = dict(sorted({**tc.to_json(), "attributes": {}}.items()))
        return cmd.response(body=dumps(doc).encode())

    async def get_topic_stats_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's ``TopicStatsTable`` (mqadmin topicStatus, the dashboard's topic status):
        per queue its first and next offset and the store time of its last message, and the
        topic's stores per second over the last minute.  Beside them, txmq's own
        ``consumerOffsets`` (group -> queue -> committed offset) and ``topic``, which the txmq
        SDK reads and RocketMQ's tools pass over."""
        topic = _field(cmd, "topic")
        tc = self.ctx.topics.get(topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{topic}] not exist")
        store, name = self.ctx.store, self.ctx.config.broker_name
        table = ObjectKeyMap()
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            low = max(0, store.get_min_offset_in_queue(topic, qid))
            high = max(0, store.get_max_offset_in_queue(topic, qid))
            last = store.store_time_at(topic, qid, high - 1) if high > 0 else None
            mq = {"brokerName": name, "queueId": qid, "topic": topic}
            table.append(
                (mq, {"lastUpdateTimestamp": last or 0, "maxOffset": high, "minOffset": low})
            )
        offsets = self.ctx.offsets
        groups = {}
        for g in sorted(offsets.groups()):
            committed = offsets.offsets(g, topic)
            if committed:
                groups[g] = {str(q): o for q, o in sorted(committed.items())}
        doc = {
            "consumerOffsets": groups,
            "offsetTable": table,
            "topic": topic,
            "topicPutTps": self.stats.window(MINUTE, lambda c: c.put_by_topic.get(topic, 0)).tps,
        }
        return cmd.response(body=dumps(doc).encode())

    async def get_broker_runtime_info(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        return cmd.response(body=dumps({"table": self.runtime_table()}).encode())

    def runtime_table(self) -> dict[str, str]:
        """RocketMQ's runtime figures (what ``clusterList``, ``brokerStatus`` and the
        dashboard read; those txmq has no counterpart of are ``0``), then txmq's own."""
        b, stats = self.ctx, self.stats
        cfg = b.config
        st = b.store.stats()
        counts = stats.read()
        uptime = time.monotonic() - self.started_monotonic
        table: dict[str, str] = {
            "brokerActive": "true",
            "brokerVersionDesc": VERSION_DESC,
            "bootTimestamp": str(boot_millis(self.started_monotonic)),
            "runtime": runtime_text(uptime),
            "msgPutTotalYesterdayMorning": str(stats.morning_yesterday[0]),
            "msgPutTotalTodayMorning": str(stats.morning_today[0]),
            "msgPutTotalTodayNow": str(counts.put),
            "msgGetTotalYesterdayMorning": str(stats.morning_yesterday[1]),
            "msgGetTotalTodayMorning": str(stats.morning_today[1]),
            "msgGetTotalTodayNow": str(counts.out),
            "putTps": stats.tps(lambda c: c.put),
            "getTransferredTps": stats.tps(lambda c: c.out),
            "getFoundTps": stats.tps(lambda c: c.get_found),
            "getMissTps": stats.tps(lambda c: c.get_miss),
            "getTotalTps": stats.tps(lambda c: c.get_found + c.get_miss),
            "putMessageTimesTotal": str(counts.put),
            "putMessageSizeTotal": str(st["put_bytes_total"]),
            "commitLogDiskRatio": _disk_ratio(cfg.store_path_root_dir),
            "consumeQueueDiskRatio": _disk_ratio(cfg.store_path_root_dir),
            "commitLogDirCapacity": _capacity(cfg.store_path_root_dir),
            "commitLogMinOffset": str(st["commit_log_min_offset"]),
            "commitLogMaxOffset": str(st["commit_log_max_offset"]),
            "remainHowManyDataToFlush": human_bytes(int(st["commit_log_unflushed_bytes"])),
            "earliestMessageTimeStamp": str(self._earliest_store_time()),
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
            **_NO_POOLS,
        }
        own: dict[str, Any] = {
            "brokerName": cfg.broker_name,
            "brokerVersion": __version__,
            "address": self.advertised_address,
            "uptimeMs": int(uptime * 1000),
            "flushDiskType": cfg.flush_disk_type,
            "storePathRootDir": cfg.store_path_root_dir,
            "topics": len(
                [
                    t
                    for t in b.topics.all()
                    if t not in INTERNAL_TOPICS and not t.startswith(RETRY_GROUP_TOPIC_PREFIX)
                ]
            ),
            "connections": b.clients.channel_count,
            "producerGroups": b.clients.producer_groups(),
            "consumerGroups": b.clients.consumer_groups(),
        }
        own.update({f"store.{k}": v for k, v in st.items()})
        own.update({f"txn.{k}": v for k, v in self.transactions.summary().items()})
        for key, value in own.items():
            table[key] = value if isinstance(value, str) else json.dumps(value)
        return dict(sorted(table.items()))

    def _earliest_store_time(self) -> int:
        """The store time of the oldest message in the commit log; -1 when it holds none (as
        RocketMQ's ``getEarliestMessageTime``)."""
        store = self.ctx.store
        st = store.stats()
        low, high = int(st["commit_log_min_offset"]), int(st["commit_log_max_offset"])
        if high <= low:
            return -1
        try:
            return int(store.lookup_message(low).store_timestamp)
        except (QueryNotFoundError, OSError):
            return -1
