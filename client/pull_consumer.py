"""Pulling and consumer offsets: the requests both consumers use, and :class:`AsyncPullConsumer`
for applications that want to choose queues and offsets themselves.

PULL_MESSAGE's ``sysFlag`` bits (RocketMQ's ``PullSysFlag``): ``0x1`` the broker stores
``commitOffset`` for the group, ``0x2`` the broker may hold the pull up to
``suspendTimeoutMillis`` while nothing is there (long polling), ``0x4`` the request carries its
subscription expression.  The broker filters by tag hash; the SDK filters again by the exact tag,
since two tags can share a hash.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, TopicNotExistError, error_for_code
from txmq.protocol.headers import (
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetOffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from txmq.protocol.message import (
    MessageExt,
    MessageSysFlag,
    decode_messages,
    inflate_body,
    parse_subscription,
    tags_code,
)

from ._validation import validate_topic
from .filter import SqlExpression
from .lifecycle import ConnectedClient
from .logs import get_logger
from .remoting import BrokerConnection
from .route import MessageQueue, fetch_route

log = get_logger(__name__)

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


class PullStatus(enum.Enum):
    """How a pull ended (RocketMQ's PullStatus)."""

    #: Messages were found (``messages`` may still be empty after the exact-tag filter).
    FOUND = "FOUND"
    #: Nothing at or after the offset yet.
    NO_NEW_MSG = "NO_NEW_MSG"
    #: Messages were there, but none matched the expression; ``next_begin_offset`` skips them.
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    #: The offset is outside the queue; continue from ``next_begin_offset``.
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass
class PullResult:
    """One pull's answer.

    Attributes:
        status: see :class:`PullStatus`.
        messages: the messages that matched (exact tags).
        next_begin_offset: the offset to pull next.
        min_offset: the queue's smallest offset.
        max_offset: the queue's next free offset (one past the last message).
    """

    status: PullStatus
    messages: list[MessageExt] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0


_STATUS_BY_CODE: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def expression_type(expression: str) -> str:
    """RocketMQ's expressionType of an expression: SQL92 for :func:`~txmq.client.sql`'s."""
    return "SQL92" if isinstance(expression, SqlExpression) else "TAG"


def subscription_data(topic: str, expression: str, sub_version: int) -> dict[str, Any]:
    """RocketMQ's SubscriptionData as the heartbeat carries it."""
    if isinstance(expression, SqlExpression):
        return {
            "topic": topic,
            "subString": str(expression),
            "tagsSet": [],
            "codeSet": [],
            "subVersion": sub_version,
            "expressionType": "SQL92",
            "classFilterMode": False,
        }
    tags = parse_subscription(expression)
    tag_list = sorted(tags) if tags else []
    return {
        "topic": topic,
        "subString": "*" if tags is None else " || ".join(tag_list),
        "tagsSet": tag_list,
        "codeSet": [tags_code(t) for t in tag_list],
        "subVersion": sub_version,
        "expressionType": "TAG",
        "classFilterMode": False,
    }


def normalize_expression(expression: str | None) -> str:
    """``None``/empty -> ``*``; tags are stripped and joined with `` || ``; a SQL92 expression
    is kept as it is."""
    if isinstance(expression, SqlExpression):
        return expression
    tags = parse_subscription(expression)
    return "*" if tags is None else " || ".join(sorted(tags))


async def check_client_config(
    conn: BrokerConnection, group: str, topic: str, expression: str
) -> None:
    """CHECK_CLIENT_CONFIG: ask the broker whether it can serve ``expression`` (a SQL92 one is
    compiled there) before consuming by it.

    Raises:
        TxmqError: the broker refused it; its message says why (and where in the expression).
    """
    body = {
        "clientId": conn.client_id,
        "group": group,
        "subscriptionData": subscription_data(topic, expression, 0),
    }
    resp = await conn.request(
        RemotingCommand.request(
            RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode("utf-8")
        )
    )
    if resp.code != ResponseCode.SUCCESS:
        raise error_for_code(resp.code, f"subscription {topic!r} {expression!r}: {resp.remark}")


async def pull_messages(
    conn: BrokerConnection,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_nums: int = 32,
    expression: str = "*",
    sub_version: int = 0,
    suspend: float = 0.0,
    commit_offset: int | None = None,
    timeout: float | None = None,
) -> PullResult:
    """One PULL_MESSAGE.

    Args:
        suspend: seconds the broker may hold the pull while nothing is there (0: answer now).
        commit_offset: also store this offset for the group (ignored unless positive).
        timeout: seconds to wait for the answer *beyond* ``suspend``.

    Raises:
        TxmqError: the request failed or the broker answered with an error.
    """
    sys_flag = FLAG_SUBSCRIPTION
    if suspend > 0:
        sys_flag |= FLAG_SUSPEND
    if commit_offset is not None and commit_offset > 0:
        sys_flag |= FLAG_COMMIT_OFFSET
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=max_nums,
        sys_flag=sys_flag,
        commit_offset=commit_offset if commit_offset and commit_offset > 0 else 0,
        suspend_timeout_millis=int(suspend * 1000),
        subscription=expression,
        sub_version=sub_version,
        expression_type=expression_type(expression),
    )
    wait = (conn.config.request_timeout if timeout is None else timeout) + suspend
    resp = await conn.request(
        RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext_fields()), wait
    )
    status = _STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise error_for_code(resp.code, resp.remark)
    try:
        rh = PullMessageResponseHeader.from_ext_fields(resp.ext_fields)
        next_offset, min_offset, max_offset = rh.next_begin_offset, rh.min_offset, rh.max_offset
    except InvalidParameterError:
        if status is PullStatus.FOUND:
            raise
        next_offset, min_offset, max_offset = offset, 0, 0
    messages: list[MessageExt] = []
    if status is PullStatus.FOUND:
        messages = decode_messages(resp.body)
        for m in messages:
            if m.sys_flag & MessageSysFlag.COMPRESSED and not inflate_body(m):
                log.warning(
                    "message_body_not_inflated",
                    topic=m.topic,
                    msg_id=m.msg_id,
                    sys_flag=m.sys_flag,
                    reason="not zlib, or corrupt",
                )
        # The exact tags (the broker compared their hash codes); a SQL92 filter was applied
        # by the broker in full.
        tags = None if isinstance(expression, SqlExpression) else parse_subscription(expression)
        if tags is not None:
            messages = [m for m in messages if m.tags in tags]
    return PullResult(status, messages, next_offset, min_offset, max_offset)


async def query_committed_offset(
    conn: BrokerConnection, group: str, topic: str, queue_id: int
) -> int | None:
    """The group's committed offset for a queue; None when it has none."""
    resp = await conn.invoke(
        RequestCode.QUERY_CONSUMER_OFFSET,
        QueryConsumerOffsetRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, set_zero_if_not_found=False
        ),
        accept=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
    )
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    offset = QueryConsumerOffsetResponseHeader.from_ext_fields(resp.ext_fields).offset
    return offset if offset >= 0 else None


async def update_committed_offset(
    conn: BrokerConnection, group: str, topic: str, queue_id: int, offset: int
) -> None:
    """Store the group's offset for a queue (the next offset to consume)."""
    await conn.invoke(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, commit_offset=offset
        ),
    )


async def get_max_offset(conn: BrokerConnection, topic: str, queue_id: int) -> int:
    """The queue's next free offset (one past its last message)."""
    resp = await conn.invoke(
        RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
    )
    return GetOffsetResponseHeader.from_ext_fields(resp.ext_fields).offset


async def get_min_offset(conn: BrokerConnection, topic: str, queue_id: int) -> int:
    """The queue's smallest offset still stored."""
    resp = await conn.invoke(
        RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic=topic, queue_id=queue_id)
    )
    return GetOffsetResponseHeader.from_ext_fields(resp.ext_fields).offset


def timestamp_ms(when: int | float | datetime) -> int:
    """Milliseconds since the epoch (an aware or naive-local datetime, or a number of ms)."""
    if isinstance(when, datetime):
        return int(when.timestamp() * 1000)
    return int(when)


async def search_offset(
    conn: BrokerConnection, topic: str, queue_id: int, when: int | float | datetime
) -> int:
    """The first offset of a message stored at or after ``when`` (ms or datetime)."""
    resp = await conn.invoke(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        SearchOffsetRequestHeader(topic=topic, queue_id=queue_id, timestamp=timestamp_ms(when)),
    )
    return GetOffsetResponseHeader.from_ext_fields(resp.ext_fields).offset


class AsyncPullConsumer(ConnectedClient):
    """Pull messages from queues and offsets the application chooses; every method is a
    coroutine.

    Args:
        group: the consumer group whose offsets :meth:`commit_offset` stores.
        broker: ``"host:port"`` of the broker.
        config: client settings; ``**settings`` override single fields.
    """

    _kind = "pull consumer"

    async def _start(self) -> None:
        """Connect to the broker.

        Raises:
            ConnectionClosedError: the broker cannot be reached.
        """
        # The group is not announced in heartbeats: a pull consumer chooses its queues itself
        # and must not take a share in a push consumer group's rebalance.
        conn = BrokerConnection(self.broker, self.config)
        await conn.start()
        self._conn = conn

    async def _shutdown(self) -> None:
        """Close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def fetch_queues(self, topic: str) -> list[int]:
        """The readable queue ids of ``topic`` (of a single broker, or of a topic that lives
        in one broker group of a cluster; see :meth:`fetch_message_queues`).

        Raises:
            TopicNotExistError: the topic does not exist.
        """
        return [q.queue_id for q in await self.fetch_message_queues(topic)]

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` in every broker group that has it: pass a queue's
        ``broker`` along with its ``queue_id`` to the other methods.

        Raises:
            TopicNotExistError: the topic does not exist.
        """
        validate_topic(topic)
        route = await fetch_route(self.connection, topic)
        if route is None:
            raise TopicNotExistError(f"topic {topic!r} does not exist")
        return list(route.read_queues) if route.readable else []

    async def _group(self, topic: str, broker: str | None) -> BrokerConnection:
        """The connection to the group holding the queue (``broker``, a route's group name;
        None: the connected broker)."""
        conn = self.connection
        if broker is None or conn.group_name is None or broker == conn.group_name:
            return conn
        if broker not in conn.group_addresses:
            await self.fetch_message_queues(topic)
        return await conn.for_group(broker)

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        timeout: float | None = None,
        long_poll: float = 0.0,
        *,
        broker: str | None = None,
    ) -> PullResult:
        """Read up to ``max_nums`` messages of one queue from ``offset`` on.

        Args:
            expression: ``*``, ``"TagA || TagB"`` or a SQL92 filter, ``sql("a > 5")``.
            timeout: seconds to wait for the answer (default ``request_timeout``).
            long_poll: when nothing is there, let the broker wait this many seconds for a
                message before answering NO_NEW_MSG.
            broker: the queue's broker group (from :meth:`fetch_message_queues`) when the topic
                lives in several groups of a cluster.

        Raises:
            TxmqError: the request failed.
        """
        return await pull_messages(
            await self._group(topic, broker),
            self.group,
            topic,
            queue_id,
            offset,
            max_nums=max_nums,
            expression=normalize_expression(expression),
            suspend=long_poll,
            timeout=timeout,
        )

    async def commit_offset(
        self, topic: str, queue_id: int, offset: int, *, broker: str | None = None
    ) -> None:
        """Store the group's offset for a queue: the next offset to consume."""
        conn = await self._group(topic, broker)
        await update_committed_offset(conn, self.group, topic, queue_id, offset)

    async def committed_offset(
        self, topic: str, queue_id: int, *, broker: str | None = None
    ) -> int | None:
        """The group's stored offset for a queue, or None when there is none."""
        conn = await self._group(topic, broker)
        return await query_committed_offset(conn, self.group, topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        """The queue's next free offset."""
        return await get_max_offset(await self._group(topic, broker), topic, queue_id)

    async def min_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        """The queue's smallest stored offset."""
        return await get_min_offset(await self._group(topic, broker), topic, queue_id)

    async def offset_for_timestamp(
        self,
        topic: str,
        queue_id: int,
        ts_ms: int | float | datetime,
        *,
        broker: str | None = None,
    ) -> int:
        """The first offset of a message stored at or after ``ts_ms`` (ms or a datetime)."""
        return await search_offset(await self._group(topic, broker), topic, queue_id, ts_ms)
