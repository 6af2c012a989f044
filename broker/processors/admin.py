"""Clients, offsets, topics, routes and broker information."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import BrokerSystemError, InvalidParameterError, TopicNotExistError
from txmq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetOffsetResponseHeader,
    GetRouteInfoRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from txmq.protocol.message import encode_message

from ..clients import parse_heartbeat
from ..context import BrokerContext
from ..sql_filter import SUBSCRIPTION_PARSE_FAILED, SqlFilterError, compile_sql
from ..store import TopicConfig
from ..store.errors import StoreIOError
from ..topics import INTERNAL_TOPICS, SYSTEM_TOPICS, retry_topic
from ..transaction.service import TransactionalMessageService
from .paging import json_table, page_by_name, page_request

log = structlog.get_logger(__name__)


def json_body(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


@dataclass(eq=False)
class AdminProcessor:
    ctx: BrokerContext
    transactions: TransactionalMessageService
    advertised_address: str

    # -- clients --------------------------------------------------------------------------------

    async def heart_beat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_heartbeat(cmd.body)
        for c in data.get("consumerDataSet") or []:
            # a broadcasting group sends nothing back: it has no retry topic
            if (
                isinstance(c, dict)
                and c.get("groupName")
                and c.get("messageModel") != "BROADCASTING"
            ):
                self.ctx.topics.ensure(retry_topic(c["groupName"]), 1)
        try:
            await self.ctx.persist_topics()
        except StoreIOError as exc:
            # A full disk must not keep clients out: the group's retry topic exists now and
            # the table is written once there is room (housekeeping tries every second).
            log.warning("topic_table_not_written", error=str(exc), request="HEART_BEAT")
        self.ctx.clients.heartbeat(conn, data, cmd.language, cmd.version)
        return cmd.response()

    async def check_client_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG, which a stock consumer sends at start for a subscription that is
        not a tag expression: a SQL92 property filter is compiled here (an invalid one is
        answered SUBSCRIPTION_PARSE_FAILED saying what is wrong and where), so the consumer
        fails to start; with enablePropertyFilter off it is refused with RocketMQ's message."""
        try:
            doc = json.loads(cmd.body or b"{}")
        except ValueError as exc:
            raise InvalidParameterError(f"CHECK_CLIENT_CONFIG body is not JSON: {exc}") from None
        sub = doc.get("subscriptionData") if isinstance(doc, dict) else None
        kind = str((sub or {}).get("expressionType") or "TAG").upper()
        if kind == "TAG":
            return cmd.response()
        if kind != "SQL92" or not self.ctx.config.enable_property_filter:
            raise BrokerSystemError(
                f"The broker does not support consumer to filter message by {kind}"
            )
        try:
            compile_sql(str((sub or {}).get("subString") or ""))
        except SqlFilterError as exc:
            return cmd.response(SUBSCRIPTION_PARSE_FAILED, str(exc))
        return cmd.response()

    async def unregister_client(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequestHeader.from_ext_fields(cmd.ext_fields)
        self.ctx.clients.unregister(conn, h.producer_group, h.consumer_group)
        return cmd.response()

    async def get_consumer_list_by_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = GetConsumerListByGroupRequestHeader.from_ext_fields(cmd.ext_fields)
        ids = self.ctx.clients.consumer_ids(h.consumer_group)
        if not ids:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {h.consumer_group}"
            )
        gen = self.ctx.clients.generation(h.consumer_group)
        return cmd.response(body=json_body({"consumerIdList": ids, "generation": gen}))

    # -- offsets --------------------------------------------------------------------------------

    async def query_consumer_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = QueryConsumerOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        off = self.ctx.offsets.query(h.consumer_group, h.topic, h.queue_id)
        if off < 0:
            # RocketMQ's answer for a group that has no offset yet: 0 while the queue still
            # holds its first message (a new group of a stock client then reads from the
            # start), unless the client asked not to be given a zero.
            store = self.ctx.store
            if (
                h.set_zero_if_not_found is not False
                and store.get_min_offset_in_queue(h.topic, h.queue_id) <= 0
                and store.get_max_offset_in_queue(h.topic, h.queue_id) > 0
            ):
                off = 0
            else:
                return cmd.response(
                    ResponseCode.QUERY_NOT_FOUND,
                    "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
                )
        return cmd.response(ext_fields=QueryConsumerOffsetResponseHeader(off).to_ext_fields())

    async def update_consumer_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = UpdateConsumerOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        if h.commit_offset < 0:
            raise InvalidParameterError(f"commitOffset {h.commit_offset} is negative")
        self.ctx.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return cmd.response()

    async def get_max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMaxOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        off = self.ctx.store.get_max_offset_in_queue(h.topic, h.queue_id)
        return cmd.response(ext_fields=GetOffsetResponseHeader(off).to_ext_fields())

    async def get_min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMinOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        off = self.ctx.store.get_min_offset_in_queue(h.topic, h.queue_id)
        return cmd.response(ext_fields=GetOffsetResponseHeader(off).to_ext_fields())

    async def search_offset_by_timestamp(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = SearchOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        off = self.ctx.store.get_offset_by_time(h.topic, h.queue_id, h.timestamp)
        return cmd.response(ext_fields=GetOffsetResponseHeader(off).to_ext_fields())

    async def view_message_by_id(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ViewMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        msg = self.ctx.store.lookup_message(h.offset)
        return cmd.response(body=encode_message(msg))

    # -- topics and routes ----------------------------------------------------------------------

    async def update_and_create_topic(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = CreateTopicRequestHeader.from_ext_fields(cmd.ext_fields)
        if h.topic in SYSTEM_TOPICS:
            raise InvalidParameterError(f"the topic[{h.topic}] is conflict with system topic")
        if not (1 <= h.read_queue_nums <= 1024 and 1 <= h.write_queue_nums <= 1024):
            raise InvalidParameterError("queue numbers must be between 1 and 1024")
        self.ctx.topics.create_or_update(
            TopicConfig(
                h.topic,
                read_queue_nums=h.read_queue_nums,
                write_queue_nums=h.write_queue_nums,
                perm=h.perm,
                topic_sys_flag=h.topic_sys_flag,
                order=h.order,
            )
        )
        await self.ctx.persist_topics()
        return cmd.response()

    async def delete_topic_in_broker(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """DELETE_TOPIC_IN_BROKER (mqadmin deleteTopic): the topic's config, consume queues
        (their files) and every group's committed offsets on it go; its messages stay in the
        commit log until retention deletes them.  Refused for the broker's own topics and,
        unlike RocketMQ (which deletes regardless), while a live consumer subscribes to it."""
        topic = DeleteTopicRequestHeader.from_ext_fields(cmd.ext_fields).topic
        if topic in INTERNAL_TOPICS:
            raise InvalidParameterError(
                f"the topic[{topic}] is a system topic and cannot be deleted"
            )
        clients = self.ctx.clients
        live = sorted(g for g in clients.consumer_groups() if clients.subscription(g, topic))
        if live:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"topic {topic!r} has live consumers in group(s) {', '.join(live)}: "
                "stop them (or change their subscriptions) before deleting the topic",
            )
        had_config = self.ctx.topics.delete(topic)
        queues = self.ctx.store.delete_topic(topic)
        groups = self.ctx.offsets.remove_topic(topic)
        if not (had_config or queues or groups):
            raise TopicNotExistError(f"topic[{topic}] not exist")
        await self.ctx.persist_topics()
        await self.ctx.in_background(self.ctx.offsets.persist)
        if queues:
            await self.ctx.in_background(self.ctx.store.flush_consume_queues)
        log.warning(
            "topic_deleted_by_operator",
            topic=topic,
            queues=queues,
            groups=groups,
            peer=f"{conn.peer[0]}:{conn.peer[1]}",
        )
        return cmd.response()

    async def get_all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Every topic's config (``topicConfigTable``), or with txmq's ``after`` field a page of
        them by name and ``nextCursor`` (:mod:`.paging`)."""
        topics = self.ctx.topics.all()
        paging = page_request(cmd.ext_fields)
        if paging is None:
            table = {name: tc.to_json() for name, tc in topics.items()}
            return cmd.response(body=json_body({"topicConfigTable": table}))
        page, cursor = page_by_name(
            topics, paging, lambda name: json.dumps(topics[name].to_json(), separators=(",", ":"))
        )
        resp = cmd.response(body=f'{{"topicConfigTable":{json_table(page)}}}'.encode())
        if cursor is not None:
            resp.ext_fields["nextCursor"] = cursor
        return resp

    async def get_route_info_by_topic(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = GetRouteInfoRequestHeader.from_ext_fields(cmd.ext_fields)
        if self.ctx.cluster is not None:
            cluster_route = self.ctx.cluster.route(h.topic)
            if cluster_route is None:
                raise TopicNotExistError(
                    f"No topic route info in name server for the topic: {h.topic}"
                )
            return cmd.response(body=json_body(cluster_route))
        tc = self.ctx.topics.route_config(h.topic)
        if tc is None:
            raise TopicNotExistError(f"No topic route info in name server for the topic: {h.topic}")
        cfg = self.ctx.config
        route: dict[str, Any] = {
            "orderTopicConf": None,
            "queueDatas": [
                {
                    "brokerName": cfg.broker_name,
                    "readQueueNums": tc.read_queue_nums,
                    "writeQueueNums": tc.write_queue_nums,
                    "perm": tc.perm,
                    "topicSysFlag": tc.topic_sys_flag,
                }
            ],
            "brokerDatas": [
                {
                    "cluster": cfg.broker_cluster_name,
                    "brokerName": cfg.broker_name,
                    "brokerAddrs": {"0": self.advertised_address},
                }
            ],
            "filterServerTable": {},
        }
        return cmd.response(body=json_body(route))

    async def cluster_status(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """``txmq cluster status``: the cluster as this broker sees it (cluster mode only)."""
        if self.ctx.cluster is None:
            return cmd.response(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                "this broker runs as a single node (no etcdEndpoints): there is no cluster",
            )
        return cmd.response(body=json_body(self.ctx.cluster.status()))

    async def get_metrics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.transactions.update_gauges()
        return cmd.response(body=json_body(self.ctx.metrics.snapshot()))
