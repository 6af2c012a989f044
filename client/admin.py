"""Administrative requests: topics, broker status, metrics and transactions (what the
``txmq`` command line and dashboards use)."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from txmq.protocol import fastjson
from txmq.protocol.acl import Credentials
from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    BrokerSystemError,
    ProtocolError,
    QueryNotFoundError,
    SubscriptionGroupNotExistError,
    error_for_code,
)
from txmq.protocol.headers import (
    UNIQUE_MSG_QUERY_FLAG,
    CreateTopicRequestHeader,
    DecideBatchRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    ForceDecideRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetRouteInfoRequestHeader,
    GetTransactionRequestHeader,
    ListPageRequestHeader,
    ListTransactionsRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ResetOffsetRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
    ViewMessageRequestHeader,
)
from txmq.protocol.message import (
    MessageExt,
    decode_messages,
    decode_offset_msg_id,
    inflate_body,
)
from txmq.protocol.topics import INTERNAL_TOPICS

#: RocketMQ's ``SubscriptionGroupConfig`` defaults, for a group the broker does not know yet.
GROUP_CONFIG_DEFAULTS: dict[str, Any] = {
    "attributes": {},
    "brokerId": 0,
    "consumeBroadcastEnable": True,
    "consumeEnable": True,
    "consumeFromMinEnable": True,
    "consumeMessageOrderly": False,
    "consumeTimeoutMinute": 15,
    "groupRetryPolicy": {"type": "CUSTOMIZED"},
    "groupSysFlag": 0,
    "notifyConsumerIdsChangedEnable": True,
    "retryMaxTimes": 16,
    "retryQueueNums": 1,
    "whichBrokerWhenConsumeSlowly": 1,
}

COMMIT = 0x8
ROLLBACK = 0xC


@dataclass(frozen=True)
class QueryResult:
    """What QUERY_MESSAGE found: the messages (newest first) and how far the broker's index had
    got (the store timestamp of the newest message indexed and the commit-log offset it reached:
    a message stored after that may not be found yet)."""

    messages: list[MessageExt]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


def to_millis(value: int | float | datetime | None, default: int) -> int:
    """A time bound for a query in ms since the epoch: ms as given, a datetime converted
    (naive means local time), None the default."""
    if value is None:
        return default
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _queue_id(item: tuple[dict[str, Any], int]) -> int:
    return int(item[0]["queueId"])


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"broker address must be host:port, got {address!r}")
    return host, int(port)


#: Topics :meth:`AsyncAdminClient.find_message` looks through for a message id without a topic.
FIND_TOPICS_MAX = 500

#: Transactions asked for in one answer (a transaction of 100 messages is about 30 KB of JSON).
TRANSACTION_PAGE = 200
#: Topics or consumer groups asked for in one answer.
LIST_PAGE = 1000
#: Messages asked for in one answer of a key query (the broker's cap).
MESSAGE_PAGE = 64

T = TypeVar("T")


async def _pages(
    fetch: Callable[[str | None], Awaitable[tuple[list[T], str | None]]], after: str | None
) -> AsyncIterator[T]:
    """Every entry of a paged listing from cursor ``after`` on: ``fetch(cursor)`` answers a
    page and the next page's cursor (None after the last)."""
    while True:
        page, after = await fetch(after)
        for entry in page:
            yield entry
        if after is None:
            return


def _table_pages(
    list_page: Callable[..., Awaitable[tuple[dict[str, dict[str, Any]], str | None]]],
    page: int,
    after: str | None,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(name, entry)`` of every entry of a listing by name, ``list_page(limit=, after=)``
    answering a page of ``page`` at a time as a table by name and the next page's cursor."""

    async def fetch(cursor: str | None) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        table, nxt = await list_page(limit=page, after=cursor)
        return list(table.items()), nxt

    return _pages(fetch, after)


def _next_cursor(resp: RemotingCommand) -> str | None:
    cursor = resp.ext_fields.get("nextCursor")
    return str(cursor) if cursor else None


class AsyncAdminClient:
    """One connection to a broker for operator requests.  Use as ``async with``.

    With the broker's ACL on, give an admin account's ``access_key`` and ``secret_key``: every
    request is signed with them.  ``tls`` is as in
    :attr:`txmq.client.config.ClientConfig.tls`: True or an :class:`ssl.SSLContext`.
    """

    def __init__(
        self,
        broker: str = "127.0.0.1:10911",
        timeout: float = 5.0,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | ssl.SSLContext = False,
    ) -> None:
        self.broker = broker
        self._ssl: ssl.SSLContext | None = (
            tls
            if isinstance(tls, ssl.SSLContext)
            else ssl.create_default_context()
            if tls
            else None
        )
        self.timeout = timeout
        if bool(access_key) != bool(secret_key):
            raise ValueError("access_key and secret_key must be given together")
        self._credentials = (
            Credentials(access_key, secret_key) if access_key and secret_key else None
        )
        self._conn: Connection | None = None

    async def start(self) -> None:
        """Connect (``async with`` does it); a second call does nothing."""
        if self._conn is not None:
            return
        host, port = split_address(self.broker)
        signer = self._credentials.sign if self._credentials is not None else None
        self._conn = await open_connection(
            host, port, timeout=self.timeout, signer=signer, ssl=self._ssl
        )

    async def shutdown(self) -> None:
        """Close the connection (``async with`` does it).  Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()

    async def __aenter__(self) -> AsyncAdminClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _call(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        remark: str | None = None,
        *,
        also: int | None = None,
    ) -> RemotingCommand:
        """The answer to one request; an error is raised unless it is SUCCESS (or ``also``)."""
        assert self._conn is not None, "use 'async with AsyncAdminClient(...)'"
        cmd = RemotingCommand.request(code, ext, body)
        cmd.remark = remark
        resp = await self._conn.request(cmd, self.timeout)
        if resp.code != ResponseCode.SUCCESS and resp.code != also:
            raise error_for_code(resp.code, resp.remark)
        return resp

    async def _json(self, code: int, ext: dict[str, Any] | None = None) -> Any:
        """The JSON body of a successful answer (None for an empty one)."""
        resp = await self._call(code, ext)
        return json.loads(resp.body) if resp.body else None

    # -- broker ---------------------------------------------------------------------------------

    async def runtime_info(self) -> dict[str, Any]:
        """The broker's runtime table.  On the wire every value is a string (RocketMQ's
        ``KVTable``); txmq's own figures (``uptimeMs``, ``store.*``, ``txn.*``, ...) are JSON
        text there and are given back typed."""
        doc = await self._json(RequestCode.GET_BROKER_RUNTIME_INFO)
        return {k: _typed(k, v) for k, v in dict(doc["table"]).items()}

    async def cluster_status(self) -> dict[str, Any]:
        """Cluster mode: groups, leaders, in-sync sets, lag and epochs as this broker sees
        them."""
        return dict(await self._json(RequestCode.TXMQ_CLUSTER_STATUS))

    async def metrics(self) -> dict[str, float]:
        return dict(await self._json(RequestCode.TXMQ_GET_METRICS))

    # -- topics ---------------------------------------------------------------------------------

    async def create_topic(
        self, topic: str, queues: int = 4, perm: int = 6, order: bool = False
    ) -> None:
        h = CreateTopicRequestHeader(
            topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm, order=order
        )
        await self._call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())

    async def update_topic(
        self,
        topic: str,
        *,
        perm: int | None = None,
        read_queues: int | None = None,
        write_queues: int | None = None,
    ) -> dict[str, Any]:
        """Change an existing topic's permission (``PERM_READ`` 4 | ``PERM_WRITE`` 2) or queue
        counts, keeping what is not given; the config as it is now.

        Raises:
            TopicNotExistError: no such topic.
        """
        from txmq.protocol.errors import TopicNotExistError

        current = (await self.list_topics()).get(topic)
        if current is None:
            raise TopicNotExistError(f"topic[{topic}] not exist")
        h = CreateTopicRequestHeader(
            topic=topic,
            read_queue_nums=read_queues if read_queues is not None else current["readQueueNums"],
            write_queue_nums=(
                write_queues if write_queues is not None else current["writeQueueNums"]
            ),
            perm=perm if perm is not None else current["perm"],
            order=bool(current.get("order", False)),
        )
        await self._call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
        return dict((await self.list_topics())[topic])

    async def delete_topic(self, topic: str) -> None:
        """Delete ``topic``: its config, consume queues and committed offsets (its messages
        stay in the commit log until retention).  Refused for the broker's own topics and
        while live consumers subscribe to it."""
        await self._call(
            RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic).to_ext_fields()
        )

    async def list_topics(self) -> dict[str, dict[str, Any]]:
        """Every topic's config by name, asked for a page of :data:`LIST_PAGE` at a time (so
        no answer passes the frame limit however many there are)."""
        return {name: tc async for name, tc in self.iter_topics()}

    async def list_topics_page(
        self, *, limit: int = LIST_PAGE, after: str | None = None
    ) -> tuple[dict[str, dict[str, Any]], str | None]:
        """One page of :meth:`list_topics`: the first ``limit`` topics by name after cursor
        ``after`` (None: from the first), and the cursor of the next page (None: this was the
        last).  A broker without paging answers every topic and no cursor."""
        ext = ListPageRequestHeader(after=after or "", limit=limit).to_ext_fields()
        resp = await self._call(RequestCode.GET_ALL_TOPIC_CONFIG, ext)
        return dict(json.loads(resp.body)["topicConfigTable"]), _next_cursor(resp)

    async def iter_topics(
        self, *, page: int = LIST_PAGE, after: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(name, config)`` of every topic by name (after cursor ``after``), a page of
        ``page`` asked for at a time."""

        async for entry in _table_pages(self.list_topics_page, page, after):
            yield entry

    async def topic_stats(self, topic: str) -> dict[str, Any]:
        """``topic``, ``offsetTable`` (per queue: ``queueId``, ``minOffset``, ``maxOffset``,
        ``lastUpdateTimestamp``), ``consumerOffsets`` (group -> queue id as text -> committed
        offset) and ``topicPutTps``.  The broker answers RocketMQ's ``TopicStatsTable``
        (queues as object keys); this gives the queues as a list, by queue id."""
        resp = await self._call(
            RequestCode.GET_TOPIC_STATS_INFO, GetRouteInfoRequestHeader(topic).to_ext_fields()
        )
        doc = dict(fastjson.loads(resp.body))
        table = doc.get("offsetTable") or []
        if isinstance(table, fastjson.ObjectKeyMap | dict):  # {MessageQueue: TopicOffset}
            pairs = table.items() if isinstance(table, dict) else table
            queues = [{"queueId": mq["queueId"], **dict(offsets)} for mq, offsets in pairs]
            doc["offsetTable"] = sorted(queues, key=lambda q: int(q["queueId"]))
        return doc

    async def route(self, topic: str) -> dict[str, Any] | None:
        """The broker's route answer for ``topic`` (RocketMQ's TopicRouteData: ``queueDatas``,
        ``brokerDatas``), or None when it knows no such topic."""
        resp = await self._call(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            GetRouteInfoRequestHeader(topic).to_ext_fields(),
            also=ResponseCode.TOPIC_NOT_EXIST,
        )
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        return dict(json.loads(resp.body))

    # -- consumer groups and clients -----------------------------------------------------------

    async def consumer_groups(self) -> list[str]:
        """Every consumer group the broker knows (settings, committed offsets or live
        consumers), by name; asked for a page of :data:`LIST_PAGE` at a time."""
        return sorted([name async for name, _ in self.iter_groups()])

    async def list_groups_page(
        self, *, limit: int = LIST_PAGE, after: str | None = None
    ) -> tuple[dict[str, dict[str, Any]], str | None]:
        """One page of the consumer groups: the first ``limit`` by name after cursor ``after``
        (None: from the first) with their settings (as :meth:`group_config`), and the cursor
        of the next page (None: this was the last)."""
        ext = ListPageRequestHeader(after=after or "", limit=limit).to_ext_fields()
        resp = await self._call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, ext)
        try:
            doc = json.loads(resp.body)  # txmq's answer is plain JSON, and json reads it fast
        except ValueError:
            doc = fastjson.loads(resp.body)  # fastjson's own forms (a RocketMQ broker's)
        table = doc["subscriptionGroupTable"]
        return {str(k): dict(v) for k, v in dict(table).items()}, _next_cursor(resp)

    async def iter_groups(
        self, *, page: int = LIST_PAGE, after: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(name, settings)`` of every consumer group by name (after cursor ``after``), a page
        of ``page`` asked for at a time."""

        async for entry in _table_pages(self.list_groups_page, page, after):
            yield entry

    async def consume_stats(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """The group's progress per queue (of ``topic``, or of every topic it consumed):
        ``topic``, ``queueId``, ``brokerOffset`` (the queue's end), ``consumerOffset``
        (committed), ``lag`` (messages not consumed yet) and ``lastTimestamp`` (store time in
        ms of the last consumed message, 0 when none)."""
        header = GetConsumeStatsRequestHeader(group, topic)
        resp = await self._call(RequestCode.GET_CONSUME_STATS, header.to_ext_fields())
        rows = []
        for mq, w in fastjson.loads(resp.body)["offsetTable"] or []:
            lag = max(0, w["brokerOffset"] - w["consumerOffset"])
            rows.append({"topic": mq["topic"], "queueId": mq["queueId"], **w, "lag": lag})
        return sorted(rows, key=lambda r: (r["topic"], r["queueId"]))

    async def consumer_connections(self, group: str) -> dict[str, Any]:
        """The group's live consumers (``connectionSet``: clientId, clientAddr, language,
        version), its subscriptions and consume settings.

        Raises:
            BrokerResponseError: code 206 when no consumer of the group is online.
        """
        header = GetConsumerConnectionListRequestHeader(group)
        resp = await self._call(RequestCode.GET_CONSUMER_CONNECTION_LIST, header.to_ext_fields())
        return dict(fastjson.loads(resp.body))

    async def producer_connections(self, group: str) -> list[dict[str, Any]]:
        """The producer group's live connections (an empty list when none is online)."""
        header = GetProducerConnectionListRequestHeader(group)
        try:
            resp = await self._call(
                RequestCode.GET_PRODUCER_CONNECTION_LIST, header.to_ext_fields()
            )
        except BrokerSystemError as exc:
            if "not exist" in str(exc):  # RocketMQ's answer for a group with no connection
                return []
            raise
        return list(fastjson.loads(resp.body)["connectionSet"])

    async def delete_consumer_group(self, group: str) -> None:
        """Forget a consumer group's committed offsets (refused while it has live consumers)."""
        header = DeleteSubscriptionGroupRequestHeader(group, clean_offset=True)
        await self._call(RequestCode.DELETE_SUBSCRIPTIONGROUP, header.to_ext_fields())

    async def group_config(self, group: str) -> dict[str, Any]:
        """The group's settings, RocketMQ's ``SubscriptionGroupConfig`` (its JSON keys:
        ``consumeEnable``, ``consumeMessageOrderly``, ``retryMaxTimes``, ...).  A group the
        broker knows without settings of its own answers RocketMQ's defaults.

        Raises:
            SubscriptionGroupNotExistError: the broker does not know the group.
        """
        resp = await self._call(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group})
        return dict(fastjson.loads(resp.body))

    async def update_group_config(
        self,
        group: str,
        *,
        orderly: bool | None = None,
        consume_enable: bool | None = None,
        retry_max_times: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Change the group's settings (RocketMQ's updateSubGroup), keeping those not given:
        ``orderly`` (``consumeMessageOrderly``: the group's RocketMQ 5 gRPC consumers consume
        FIFO), ``consume_enable`` (False: the group's pulls and receives are refused),
        ``retry_max_times`` (redeliveries before the dead-letter queue) and ``settings``, any
        other field by its RocketMQ key.  The broker keeps them across restarts.  Returns the
        settings sent.

        Raises:
            InvalidParameterError: a bad group name or field.
        """
        try:
            config = await self.group_config(group)
        except SubscriptionGroupNotExistError:
            config = {**GROUP_CONFIG_DEFAULTS, "groupName": group}
        config.update(settings or {})
        given = (
            ("consumeMessageOrderly", orderly),
            ("consumeEnable", consume_enable),
            ("retryMaxTimes", retry_max_times),
        )
        config.update((key, value) for key, value in given if value is not None)
        config["groupName"] = group
        body = json.dumps(dict(sorted(config.items())), separators=(",", ":")).encode()
        await self._call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        return config

    async def reset_offset(
        self,
        group: str,
        topic: str,
        *,
        timestamp: int | float | datetime | None = None,
        offset: int | None = None,
        force: bool = True,
        queue_id: int | None = None,
    ) -> dict[int, int]:
        """Move ``group``'s offsets on ``topic`` (RocketMQ's resetOffsetByTime): to the first
        message stored at or after ``timestamp`` (ms or a datetime; 0 is the earliest, a time
        ahead the latest), or to ``offset`` (clamped to each queue's range).  Without
        ``force`` a queue only moves back.  Live consumers of the group continue from the new
        offsets at once.  The new offset of each queue by queue id."""
        if (timestamp is None) == (offset is None):
            raise ValueError("give either timestamp or offset")
        h = ResetOffsetRequestHeader(
            topic=topic,
            group=group,
            timestamp=to_millis(timestamp, 0) if timestamp is not None else 0,
            is_force=force,
            queue_id=queue_id,
            offset=offset,
        )
        resp = await self._call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, h.to_ext_fields())
        table = fastjson.loads(resp.body)["offsetTable"] or []
        return {int(mq["queueId"]): int(off) for mq, off in sorted(table, key=_queue_id)}

    async def broker_config(self) -> dict[str, str]:
        """Every setting of the broker, by RocketMQ's key names, as strings."""
        resp = await self._call(RequestCode.GET_BROKER_CONFIG)
        out = {}
        for line in resp.body.decode("utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key] = value
        return out

    async def update_broker_config(self, settings: Mapping[str, Any]) -> None:
        """Change settings while the broker runs (RocketMQ's updateBrokerConfig): only the
        keys the broker lists as changeable at run time (``txmq config set --help``); the
        broker keeps the change across restarts.

        Raises:
            NoPermissionError: a key that cannot change while the broker runs (the message
                lists those that can), or an account that is not an admin.
            InvalidParameterError: an unknown key or a bad value (nothing changed).
        """
        body = "".join(f"{k}={_config_text(v)}\n" for k, v in settings.items())
        await self._call(RequestCode.UPDATE_BROKER_CONFIG, body=body.encode("utf-8"))

    # -- transactions ---------------------------------------------------------------------------

    async def list_transactions(
        self,
        *,
        group: str | None = None,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 1000,
        two_phase: bool = False,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` transactions (PENDING and DISCARDED unless ``state`` names others,
        comma-separated), oldest first; ``two_phase``: only those an outside coordinator
        decides.  Asked for a page of :data:`TRANSACTION_PAGE` at a time, so no answer passes
        the frame limit however many there are."""
        out: list[dict[str, Any]] = []
        after: str | None = None
        while len(out) < limit:
            page, after = await self.list_transactions_page(
                group=group,
                topic=topic,
                state=state,
                limit=min(TRANSACTION_PAGE, limit - len(out)),
                after=after,
                two_phase=two_phase,
            )
            out += page
            if after is None:
                break
        return out

    async def list_transactions_page(
        self,
        *,
        group: str | None = None,
        topic: str | None = None,
        state: str | None = None,
        limit: int = TRANSACTION_PAGE,
        after: str | None = None,
        two_phase: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of :meth:`list_transactions`: the first ``limit`` after cursor ``after``,
        and the cursor of the next page (None: this was the last)."""
        h = ListTransactionsRequestHeader(
            producer_group=group,
            topic=topic,
            state=state,
            limit=limit,
            after=after,
            two_phase=True if two_phase else None,
        )
        resp = await self._call(RequestCode.TXMQ_LIST_TRANSACTIONS, h.to_ext_fields())
        page = list(json.loads(resp.body)) if resp.body else []
        return page, _next_cursor(resp)

    async def iter_transactions(
        self,
        *,
        group: str | None = None,
        topic: str | None = None,
        state: str | None = None,
        two_phase: bool = False,
        page: int = TRANSACTION_PAGE,
        after: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every transaction :meth:`list_transactions` would list, oldest first (after cursor
        ``after``), a page of ``page`` asked for at a time."""

        async def fetch(cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
            return await self.list_transactions_page(
                group=group,
                topic=topic,
                state=state,
                limit=page,
                after=cursor,
                two_phase=two_phase,
            )

        async for entry in _pages(fetch, after):
            yield entry

    async def get_transaction(self, transaction_id: str) -> dict[str, Any]:
        return dict(
            await self._json(
                RequestCode.TXMQ_GET_TRANSACTION,
                GetTransactionRequestHeader(transaction_id).to_ext_fields(),
            )
        )

    async def resume_transaction(self, msg_id: str) -> str:
        resp = await self._call(
            RequestCode.RESUME_CHECK_HALF_MESSAGE,
            ResumeCheckHalfMessageRequestHeader(msg_id).to_ext_fields(),
        )
        return resp.remark or ""

    async def force_decide(self, transaction_id: str, commit: bool, reason: str = "") -> str:
        h = ForceDecideRequestHeader(transaction_id, COMMIT if commit else ROLLBACK)
        resp = await self._call(
            RequestCode.TXMQ_FORCE_DECIDE, h.to_ext_fields(), remark=reason or None
        )
        return resp.remark or ""

    async def abort_batch(self, group: str, batch_key: str) -> dict[str, Any]:
        """Decide batch ``batch_key`` of producer group ``group`` with nothing committed
        (TXMQ_DECIDE_BATCH): its pending transactions are rolled back and no half can join it
        any more.  For the batches of a Spark query that will never run again (its checkpoint
        is lost); a batch decided before keeps its first decision, which is answered."""
        h = DecideBatchRequestHeader(producer_group=group, batch_key=batch_key)
        body = json.dumps({"commit": []}).encode()
        resp = await self._call(RequestCode.TXMQ_DECIDE_BATCH, h.to_ext_fields(), body)
        answer: dict[str, Any] = json.loads(resp.body)
        return answer

    # -- messages -------------------------------------------------------------------------------

    async def view_message(self, msg_id: str, *, topic: str | None = None) -> MessageExt:
        """One stored message by id: an offsetMsgId (VIEW_MESSAGE_BY_ID), or, with ``topic``, a
        message id (UNIQ_KEY) looked up through the broker's index when the offsetMsgId way
        finds nothing.

        Raises:
            QueryNotFoundError: no such message.
        """
        try:
            _host, offset = decode_offset_msg_id(msg_id)
        except ProtocolError:
            offset = -1
        if offset >= 0:
            try:
                resp = await self._call(
                    RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset).to_ext_fields()
                )
                msgs = decode_messages(resp.body)
                if msgs and (topic is None or msgs[0].topic == topic):
                    inflate_body(msgs[0])  # a body the producer zlib-compressed
                    return msgs[0]
            except QueryNotFoundError:
                if topic is None:
                    raise
        if topic is None:
            raise QueryNotFoundError(f"{msg_id!r} is not an offsetMsgId (give the topic)")
        found = await self.query_messages(topic, msg_id, unique=True, max_num=1)
        if not found.messages:
            raise QueryNotFoundError(f"no message {msg_id} in topic {topic}")
        inflate_body(found.messages[0])
        return found.messages[0]

    async def find_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """One stored message by either of its ids, the topic optional: an offsetMsgId is read
        where it points; a message id (what producers and ``txmq consume`` show) is looked up
        by the index in ``topic``, or without it in every topic a client can send to, until
        found (:data:`FIND_TOPICS_MAX` at most).

        Raises:
            QueryNotFoundError: no such message (the answer says where it was looked for).
        """
        if topic is not None:
            return await self.view_message(msg_id, topic=topic)
        try:
            return await self.view_message(msg_id)
        except QueryNotFoundError:
            pass  # not an offsetMsgId, or not one of this broker: a message id
        topics = sorted(t for t in await self.list_topics() if t not in INTERNAL_TOPICS)
        for name in topics[:FIND_TOPICS_MAX]:
            found = await self.query_messages(name, msg_id, unique=True, max_num=1)
            if found.messages:
                inflate_body(found.messages[0])
                return found.messages[0]
        more = f" (the first {FIND_TOPICS_MAX} of {len(topics)}: give the topic)"
        raise QueryNotFoundError(
            f"no message {msg_id}: not an offsetMsgId of this broker, and no message with that "
            f"id in {min(len(topics), FIND_TOPICS_MAX)} topics"
            + (more if len(topics) > FIND_TOPICS_MAX else "")
        )

    async def query_messages(
        self,
        topic: str,
        key: str,
        *,
        unique: bool = False,
        begin: int | float | datetime | None = None,
        end: int | float | datetime | None = None,
        max_num: int = 32,
    ) -> QueryResult:
        """Messages of ``topic`` with ``key`` among their keys or as their message id (only the
        message id with ``unique``), stored between ``begin`` and ``end`` (ms since the epoch or
        datetimes; default: all time), newest first, at most ``max_num`` (the broker caps it at
        64).  None found is an empty result, not an error."""
        result, _ = await self._query(topic, key, unique, begin, end, max_num, None)
        return result

    async def query_messages_page(
        self,
        topic: str,
        key: str,
        *,
        unique: bool = False,
        begin: int | float | datetime | None = None,
        end: int | float | datetime | None = None,
        limit: int = MESSAGE_PAGE,
        after: str | None = None,
    ) -> tuple[QueryResult, str | None]:
        """One page of a key query (as :meth:`query_messages`): the ``limit`` newest (64 at
        most) older than cursor ``after`` (None: from the newest), at most about 4 MiB of
        them, and the cursor of the next page (None: this was the last; a page may be empty).
        A broker without paging answers the first page and no cursor."""
        return await self._query(topic, key, unique, begin, end, limit, after or "")

    async def iter_messages(
        self,
        topic: str,
        key: str,
        *,
        unique: bool = False,
        begin: int | float | datetime | None = None,
        end: int | float | datetime | None = None,
        page: int = MESSAGE_PAGE,
        after: str | None = None,
    ) -> AsyncIterator[MessageExt]:
        """Every message of ``topic`` with ``key``, newest first (after cursor ``after``), a
        page of ``page`` asked for at a time: unlike :meth:`query_messages`, not capped at
        64."""

        async def fetch(cursor: str | None) -> tuple[list[MessageExt], str | None]:
            result, nxt = await self.query_messages_page(
                topic, key, unique=unique, begin=begin, end=end, limit=page, after=cursor
            )
            return result.messages, nxt

        async for msg in _pages(fetch, after):
            yield msg

    async def _query(
        self,
        topic: str,
        key: str,
        unique: bool,
        begin: int | float | datetime | None,
        end: int | float | datetime | None,
        max_num: int,
        after: str | None,
    ) -> tuple[QueryResult, str | None]:
        h = QueryMessageRequestHeader(
            topic=topic,
            key=key,
            max_num=max_num,
            begin_timestamp=to_millis(begin, 0),
            end_timestamp=to_millis(end, int(time.time() * 1000) + 86_400_000),
            after=after,
        )
        ext = h.to_ext_fields()
        if unique:
            ext[UNIQUE_MSG_QUERY_FLAG] = "true"
        resp = await self._call(RequestCode.QUERY_MESSAGE, ext, also=ResponseCode.QUERY_NOT_FOUND)
        rh = QueryMessageResponseHeader.from_ext_fields(resp.ext_fields)
        msgs = decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS else []
        if unique:
            msgs = [m for m in msgs if m.msg_id == key][:max_num]
        result = QueryResult(msgs, rh.index_last_update_timestamp, rh.index_last_update_phyoffset)
        return result, _next_cursor(resp) if after is not None else None

    # -- ACL 2.0: users and policies ------------------------------------------------------------

    async def create_user(
        self, username: str, password: str, *, super_user: bool = False, enabled: bool = True
    ) -> None:
        """AUTH_CREATE_USER (a super user can only be created by a super user)."""
        info = {
            "username": username,
            "password": password,
            "userType": "Super" if super_user else "Normal",
            "userStatus": "enable" if enabled else "disable",
        }
        await self._call(
            RequestCode.AUTH_CREATE_USER, {"username": username}, json.dumps(info).encode()
        )

    async def update_user(
        self,
        username: str,
        *,
        password: str | None = None,
        super_user: bool | None = None,
        enabled: bool | None = None,
    ) -> None:
        """AUTH_UPDATE_USER: what is given changes, the rest stays."""
        info: dict[str, Any] = {"username": username}
        if password is not None:
            info["password"] = password
        if super_user is not None:
            info["userType"] = "Super" if super_user else "Normal"
        if enabled is not None:
            info["userStatus"] = "enable" if enabled else "disable"
        await self._call(
            RequestCode.AUTH_UPDATE_USER, {"username": username}, json.dumps(info).encode()
        )

    async def delete_user(self, username: str) -> None:
        """AUTH_DELETE_USER (its policies go with it)."""
        await self._call(RequestCode.AUTH_DELETE_USER, {"username": username})

    async def get_user(self, username: str) -> dict[str, Any] | None:
        """The user's ``UserInfo`` (no password), None when there is no such user."""
        doc = await self._json(RequestCode.AUTH_GET_USER, {"username": username})
        return dict(doc) if doc else None

    async def list_users(self, filter: str = "") -> list[dict[str, Any]]:
        ext = {"filter": filter} if filter else {}
        return list(await self._json(RequestCode.AUTH_LIST_USER, ext) or [])

    async def create_acl(self, subject: str, policies: list[dict[str, Any]]) -> None:
        """AUTH_CREATE_ACL: ``subject`` is ``User:<name>``; ``policies`` RocketMQ's
        ``PolicyInfo`` (``{"policyType": "Custom", "entries": [{"resource": "Topic:orders",
        "actions": ["Pub"], "sourceIps": [], "decision": "Allow"}]}``).  An entry replaces the
        user's entry of the same resource."""
        body = json.dumps({"subject": subject, "policies": policies}).encode()
        await self._call(RequestCode.AUTH_CREATE_ACL, {"subject": subject}, body)

    async def update_acl(self, subject: str, policies: list[dict[str, Any]]) -> None:
        body = json.dumps({"subject": subject, "policies": policies}).encode()
        await self._call(RequestCode.AUTH_UPDATE_ACL, {"subject": subject}, body)

    async def delete_acl(
        self, subject: str, resource: str | None = None, policy_type: str | None = None
    ) -> None:
        """AUTH_DELETE_ACL: the entries of ``resource`` (all of them when None)."""
        ext = {"subject": subject}
        if resource:
            ext["resource"] = resource
        if policy_type:
            ext["policyType"] = policy_type
        await self._call(RequestCode.AUTH_DELETE_ACL, ext)

    async def get_acl(self, subject: str) -> dict[str, Any] | None:
        doc = await self._json(RequestCode.AUTH_GET_ACL, {"subject": subject})
        return dict(doc) if doc else None

    async def list_acls(
        self, subject_filter: str = "", resource_filter: str = ""
    ) -> list[dict[str, Any]]:
        ext = {}
        if subject_filter:
            ext["subjectFilter"] = subject_filter
        if resource_filter:
            ext["resourceFilter"] = resource_filter
        return list(await self._json(RequestCode.AUTH_LIST_ACL, ext) or [])


def _config_text(value: Any) -> str:
    """A setting as RocketMQ's properties text writes it (``true``, not ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"a setting's value cannot span lines: {text!r}")
    return text


#: The runtime table's keys that are txmq's own typed figures (JSON text on the wire).
_TYPED_KEYS = frozenset({"uptimeMs", "topics", "connections", "producerGroups", "consumerGroups"})
_TYPED_PREFIXES = ("store.", "txn.")


def _typed(key: str, value: Any) -> Any:
    if not isinstance(value, str) or not (key in _TYPED_KEYS or key.startswith(_TYPED_PREFIXES)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value  # a text figure (a path)
