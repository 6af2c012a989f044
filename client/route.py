"""Topic routes: which queues of a topic can be written and read.

The broker answers GET_ROUTEINFO_BY_TOPIC itself (one process is a whole deployment), with
RocketMQ's TopicRouteData as JSON.  The SDK talks to the broker it was given, so only the queue
counts and permissions matter here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import ProtocolError
from txmq.protocol.headers import GetRouteInfoRequestHeader

from .remoting import BrokerConnection

#: RocketMQ's PermName bits.
PERM_READ = 0x4
PERM_WRITE = 0x2


@dataclass(frozen=True)
class TopicRoute:
    """What the SDK knows about one topic's queues.

    Attributes:
        topic: the topic.
        write_queue_nums: producers spread messages over queue ids ``0..write_queue_nums-1``.
        read_queue_nums: consumers read queue ids ``0..read_queue_nums-1``.
        perm: PermName bits (4 read, 2 write).
        exists: False for the provisional route used before a topic is auto-created.
        fetched_at: ``time.monotonic()`` of the answer.
    """

    topic: str
    write_queue_nums: int
    read_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    exists: bool = True
    fetched_at: float = field(default_factory=time.monotonic)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def write_queue_ids(self) -> list[int]:
        return list(range(self.write_queue_nums))

    @property
    def read_queue_ids(self) -> list[int]:
        return list(range(self.read_queue_nums))


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """Read RocketMQ's TopicRouteData JSON (queue counts summed over brokers, permissions
    or-ed).

    Raises:
        ProtocolError: the body is not a route.
    """
    try:
        doc: dict[str, Any] = json.loads(body.decode("utf-8"))
        queue_datas = doc.get("queueDatas") or []
        write = sum(int(q.get("writeQueueNums", 0)) for q in queue_datas)
        read = sum(int(q.get("readQueueNums", 0)) for q in queue_datas)
        perm = 0
        for q in queue_datas:
            perm |= int(q.get("perm", PERM_READ | PERM_WRITE))
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"cannot read the route of topic {topic!r}: {exc}") from None
    return TopicRoute(topic, write_queue_nums=write, read_queue_nums=read, perm=perm)


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
    return parse_route(topic, resp.body)
