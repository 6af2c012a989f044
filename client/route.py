"""Topic routes: which queues of a topic can be written and read.

Every broker answers GET_ROUTEINFO_BY_TOPIC with RocketMQ's TopicRouteData as JSON: for a single
broker its own queues; in a cluster the queues of every broker group that has the topic, each
group named (``brokerName``) with its replicas' addresses (its leader as broker id 0).  A queue is
therefore a group and a queue id in it (RocketMQ's MessageQueue); with one group, the queue ids
alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import ProtocolError
from txmq.protocol.headers import GetRouteInfoRequestHeader

from .remoting import BrokerConnection

#: RocketMQ's PermName bits.
PERM_READ = 0x4
PERM_WRITE = 0x2


class MessageQueue(NamedTuple):
    """One queue of a topic: the broker group holding it and its id there (RocketMQ's
    MessageQueue).  Sorting orders by topic, group, then queue id."""

    topic: str
    broker: str
    queue_id: int


@dataclass(frozen=True)
class TopicRoute:
    """What the SDK knows about one topic's queues.

    Attributes:
        topic: the topic.
        write_queue_nums: how many queues producers write to (over all groups).
        read_queue_nums: how many queues consumers read (over all groups).
        perm: PermName bits (4 read, 2 write), or-ed over the groups.
        exists: False for the provisional route used before a topic is auto-created.
        fetched_at: ``time.monotonic()`` of the answer.
        write_queues: the writable queues, by group name then queue id.
        read_queues: the readable queues, ordered alike.
        brokers: each group's replica addresses, its leader first.
    """

    topic: str
    write_queue_nums: int
    read_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    exists: bool = True
    fetched_at: float = field(default_factory=time.monotonic)
    write_queues: tuple[MessageQueue, ...] = ()
    read_queues: tuple[MessageQueue, ...] = ()
    brokers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def groups(self) -> list[str]:
        """The broker groups holding the topic, by name."""
        return sorted(self.brokers)

    @property
    def write_queue_ids(self) -> list[int]:
        """Queue ids to write to when the topic lives in one group (or a single broker)."""
        return list(range(self.write_queue_nums))

    @property
    def read_queue_ids(self) -> list[int]:
        """Queue ids to read when the topic lives in one group (or a single broker)."""
        return list(range(self.read_queue_nums))


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """Read RocketMQ's TopicRouteData JSON: each group's queues and replicas (counts summed,
    permissions or-ed over the groups).

    Raises:
        ProtocolError: the body is not a route.
    """
    try:
        doc: dict[str, Any] = json.loads(body.decode("utf-8"))
        # A follower's write-only entry (``replicaOf`` its group) is for stock producers: the
        # SDK follows each group's leader itself.
        replicas = {b.get("brokerName") for b in doc.get("brokerDatas") or [] if b.get("replicaOf")}
        queue_datas = [
            q for q in doc.get("queueDatas") or [] if q.get("brokerName") not in replicas
        ]
        perm = 0
        write_queues: list[MessageQueue] = []
        read_queues: list[MessageQueue] = []
        for q in queue_datas:
            qperm = int(q.get("perm", PERM_READ | PERM_WRITE))
            perm |= qperm
            name = str(q.get("brokerName") or "")
            if qperm & PERM_WRITE:
                write_queues += [
                    MessageQueue(topic, name, i) for i in range(int(q.get("writeQueueNums", 0)))
                ]
            if qperm & PERM_READ:
                read_queues += [
                    MessageQueue(topic, name, i) for i in range(int(q.get("readQueueNums", 0)))
                ]
        brokers: dict[str, tuple[str, ...]] = {}
        for b in doc.get("brokerDatas") or []:
            if b.get("brokerName") in replicas:
                continue
            addrs = {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()}
            brokers[str(b.get("brokerName") or "")] = tuple(addrs[k] for k in sorted(addrs))
        for q in write_queues + read_queues:
            brokers.setdefault(q.broker, ())
        write = sum(int(q.get("writeQueueNums", 0)) for q in queue_datas)
        read = sum(int(q.get("readQueueNums", 0)) for q in queue_datas)
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"cannot read the route of topic {topic!r}: {exc}") from None
    return TopicRoute(
        topic,
        write_queue_nums=write,
        read_queue_nums=read,
        perm=perm,
        write_queues=tuple(sorted(write_queues)),
        read_queues=tuple(sorted(read_queues)),
        brokers=brokers,
    )


async def fetch_route(
    conn: BrokerConnection, topic: str, timeout: float | None = None
) -> TopicRoute | None:
    """Ask the broker for ``topic``'s route; None when the topic does not exist.

    Raises:
        TxmqError: the request failed.
    """
    resp = await conn.invoke(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        GetRouteInfoRequestHeader(topic=topic),
        timeout=timeout,
        accept=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST),
    )
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    route = parse_route(topic, resp.body)
    conn.group_addresses.update(route.brokers)
    return route
