"""The operator's views of groups and clients, in RocketMQ's encodings so its tools read them:
GET_CONSUME_STATS (mqadmin consumerProgress), GET_CONSUMER_CONNECTION_LIST and
GET_PRODUCER_CONNECTION_LIST (consumerConnection, producerConnection), the consumer group
settings: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (updateSubGroup), GET_SUBSCRIPTIONGROUP_CONFIG,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG and DELETE_SUBSCRIPTIONGROUP (deleteSubGroup), GET_BROKER_CONFIG
(getBrokerConfig) and UPDATE_BROKER_CONFIG (updateBrokerConfig, the keys of
:data:`txmq.broker.runtime_config.RUNTIME_KEYS` only).

Bodies are RocketMQ's ``ConsumeStats``, ``ConsumerConnection``, ``ProducerConnection`` as
fastjson writes them (object-keyed maps included, see :mod:`txmq.protocol.fastjson`); the broker
configuration is ``key=value`` lines, as ``MixAll.properties2String`` writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.codes import LanguageCode, RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, TopicNotExistError, TxmqError
from txmq.protocol.fastjson import ObjectKeyMap, dumps
from txmq.protocol.headers import (
    DeleteSubscriptionGroupRequestHeader,
    GetBrokerConfigResponseHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    ResetOffsetRequestHeader,
)

from ..clients import ClientChannel
from ..config import BrokerConfig, ConfigError
from ..context import BrokerContext
from ..runtime_config import NotRuntimeChangeable, parse_properties
from ..stats import BrokerStats
from ..store.subscription_group import SubscriptionGroupConfig
from .paging import json_table, page_by_name, page_request

log = structlog.get_logger(__name__)

#: RocketMQ's ResponseCode.CONSUMER_NOT_ONLINE.
CONSUMER_NOT_ONLINE = 206
#: RocketMQ's limit on a group name's length (``TopicValidator``).
GROUP_MAX_LENGTH = 255
_GROUP_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def _invalid_group(group: str) -> str | None:
    """RocketMQ's ``TopicValidator.validateGroup``: why ``group`` is not a valid group name,
    None when it is."""
    if not group.strip():
        return "The specified group is blank."
    if not _GROUP_CHARS.match(group):
        return (
            f"The specified group: {group}, contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    if len(group) > GROUP_MAX_LENGTH:
        return f"The specified group: {group}, is longer than group max length: {GROUP_MAX_LENGTH}"
    return None


def _language(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return "OTHER"


def _connection(ch: ClientChannel) -> dict[str, Any]:
    """RocketMQ's ``Connection`` of one client channel."""
    return {
        "clientId": ch.client_id,
        "clientAddr": f"{ch.conn.peer[0]}:{ch.conn.peer[1]}",
        "language": _language(ch.language),
        "version": ch.version,
    }


@dataclass
class GroupViewProcessor:
    ctx: BrokerContext
    #: Applies settings changed at run time (the broker's ``update_config``).
    reconfigure: Callable[[dict[str, str]], Awaitable[BrokerConfig]]
    #: Told of every offset a reset moved (group, topic, queue, offset): POP consumption's live
    #: views start again there (``MessagingCore.pop.reset``).
    on_reset: Callable[[str, str, int, int], None] | None = None
    #: The sampled traffic figures (``consumeTps``); None: 0.0.
    stats: BrokerStats | None = None

    async def get_consume_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """The group's progress per queue: the queue's end (``brokerOffset``), the group's
        committed offset, and the store time of the last consumed message."""
        h = GetConsumeStatsRequestHeader.from_ext_fields(cmd.ext_fields)
        if h.topic_list:
            topics = [t for t in h.topic_list.split(";") if t]
        elif h.topic:
            topics = [h.topic]
        else:
            topics = self.ctx.offsets.topics_of(h.consumer_group)
        store, offsets = self.ctx.store, self.ctx.offsets
        table = ObjectKeyMap()
        for topic in topics:
            tc = self.ctx.topics.get(topic)
            if tc is None:
                continue
            for qid in range(tc.read_queue_nums):
                broker_offset = max(0, store.get_max_offset_in_queue(topic, qid))
                consumer_offset = max(0, offsets.query(h.consumer_group, topic, qid))
                last = (
                    store.store_time_at(topic, qid, consumer_offset - 1)
                    if consumer_offset > 0
                    else None
                )
                mq = {"topic": topic, "brokerName": self.ctx.config.broker_name, "queueId": qid}
                table.append(
                    (
                        mq,
                        {
                            "brokerOffset": broker_offset,
                            "consumerOffset": consumer_offset,
                            "pullOffset": consumer_offset,
                            "lastTimestamp": last or 0,
                        },
                    )
                )
        body = {"offsetTable": table, "consumeTps": self._consume_tps(h.consumer_group, topics)}
        return cmd.response(body=dumps(body).encode())

    def _consume_tps(self, group: str, topics: list[str]) -> float:
        """RocketMQ's ``consumeTps``: the messages per second the group was given from
        ``topics`` over the last minute (its GROUP_GET_NUMS)."""
        if self.stats is None:
            return 0.0
        return sum(self.stats.out_tps(f"{t}@{group}") for t in topics)

    async def get_consumer_connection_list(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = GetConsumerConnectionListRequestHeader.from_ext_fields(cmd.ext_fields)
        channels = self.ctx.clients.consumer_channels(h.consumer_group)
        missing = (CONSUMER_NOT_ONLINE, f"the consumer group[{h.consumer_group}] not online")
        return _connections(
            cmd, channels, missing, **_consumer_settings(h.consumer_group, channels)
        )

    async def get_producer_connection_list(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = GetProducerConnectionListRequestHeader.from_ext_fields(cmd.ext_fields)
        channels = self.ctx.clients.producer_channels(h.producer_group)
        missing = (ResponseCode.SYSTEM_ERROR, f"the producer group[{h.producer_group}] not exist")
        return _connections(cmd, channels, missing)

    async def update_subscription_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (mqadmin updateSubGroup): the body is the group's
        whole ``SubscriptionGroupConfig``; it replaces what the group had and is kept in the
        store before the answer."""
        try:
            config = SubscriptionGroupConfig.from_json(cmd.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            return cmd.response(
                ResponseCode.INVALID_PARAMETER, f"the body is not a SubscriptionGroupConfig: {exc}"
            )
        invalid = _invalid_group(config.group_name)
        if invalid is not None:
            return cmd.response(ResponseCode.INVALID_PARAMETER, invalid)
        groups = self.ctx.groups
        before = groups.get(config.group_name)
        groups.put(config)
        try:
            await self.ctx.in_background(groups.persist)
        except OSError as exc:
            if before is None:
                groups.delete(config.group_name)
            else:
                groups.put(before)
            refused = self.ctx.store.refusal(exc)
            if refused is not None:  # the disk takes no writes: the same answer as a send's
                raise refused from exc
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"the group config could not be kept in the store: {exc}"
            )
        log.warning(
            "subscription_group_updated",
            group=config.group_name,
            orderly=config.consume_message_orderly,
            consume_enable=config.consume_enable,
            retry_max_times=config.retry_max_times,
            peer=f"{conn.peer[0]}:{conn.peer[1]}",
        )
        return cmd.response()

    async def get_subscription_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """GET_SUBSCRIPTIONGROUP_CONFIG (header ``group``): the group's config as RocketMQ
        writes it.  A group known without a stored config (it has committed offsets or live
        consumers; RocketMQ would have created its config then) answers RocketMQ's defaults;
        an unknown group SUBSCRIPTION_GROUP_NOT_EXIST."""
        group = str(cmd.ext_fields.get("group") or "")
        if self.ctx.groups.get(group) is None and group not in self._known_groups():
            return cmd.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "No group in this broker"
            )
        body = dumps(self.ctx.groups.effective(group).to_json())
        return cmd.response(body=body.encode())

    def _known_groups(self) -> set[str]:
        """Groups with committed offsets or live consumers."""
        return set(self.ctx.offsets.groups()) | set(self.ctx.clients.consumer_groups())

    async def get_all_subscription_group_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """Every consumer group the broker knows, RocketMQ's ``SubscriptionGroupWrapper``: the
        stored configs, and RocketMQ's defaults for the groups with committed offsets or live
        consumers but no stored config."""
        groups = self.ctx.groups
        names = self._known_groups() | set(groups.all())
        paging = page_request(cmd.ext_fields)
        if paging is not None:  # txmq's paging (.paging): a page by name and nextCursor
            page, cursor = page_by_name(
                names, paging, lambda g: json.dumps(groups.effective(g).to_json())
            )
            head = dumps({"dataVersion": groups.data_version(), "forbiddenTable": {}})
            body = f'{head[:-1]},"subscriptionGroupTable":{json_table(page)}}}'
            resp = cmd.response(body=body.encode())
            if cursor is not None:
                resp.ext_fields["nextCursor"] = cursor
            return resp
        table = {g: groups.effective(g).to_json() for g in sorted(names)}
        doc = {
            "dataVersion": groups.data_version(),
            "forbiddenTable": {},
            "subscriptionGroupTable": table,
        }
        return cmd.response(body=dumps(doc).encode())

    async def delete_subscription_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """Forget a consumer group: its stored config and its committed offsets (its retry
        topic stays, as in RocketMQ, where ``deleteSubGroup`` leaves topics alone).  Refused
        while the group has live consumers: they would commit offsets again at once."""
        h = DeleteSubscriptionGroupRequestHeader.from_ext_fields(cmd.ext_fields)
        group = h.group_name
        online = self.ctx.clients.consumer_ids(group)
        if online:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"consumer group {group!r} has {len(online)} live consumers "
                f"({', '.join(online)}): stop them before deleting the group",
            )
        removed = self.ctx.offsets.remove_group(group)
        had_config = self.ctx.groups.delete(group)
        if not removed and not had_config:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist",
            )
        await self.ctx.in_background(self.ctx.offsets.persist)
        await self.ctx.in_background(self.ctx.groups.persist)
        log.warning("consumer_group_deleted", group=group, peer=f"{conn.peer[0]}:{conn.peer[1]}")
        return cmd.response()

    async def reset_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET (mqadmin resetOffsetByTime), as RocketMQ's
        ``Broker2Client.resetOffset``: per queue of the topic, the first offset stored at or
        after ``timestamp`` (or RocketMQ 5's exact ``offset``; ``queueId`` narrows it to one
        queue).  Without ``isForce`` a queue only moves back (the group's committed offset is
        kept when it is lower).  The offsets are committed, and every live consumer of the group
        is told (RESET_CONSUMER_CLIENT_OFFSET, oneway, the same ``ResetOffsetBody``), so it
        drops what it pulled and continues from there.  The answer's body is the
        ``ResetOffsetBody``.  Unlike RocketMQ, a group with no live consumer is not refused:
        its offsets are committed for its next start."""
        h = ResetOffsetRequestHeader.from_ext_fields(cmd.ext_fields)
        tc = self.ctx.topics.get(h.topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist")
        store, offsets = self.ctx.store, self.ctx.offsets
        qids = range(tc.read_queue_nums)
        if h.queue_id is not None and h.queue_id >= 0:
            if h.queue_id >= tc.read_queue_nums:
                raise InvalidParameterError(
                    f"queueId {h.queue_id} is not a queue of {h.topic} "
                    f"({tc.read_queue_nums} read queues)"
                )
            qids = range(h.queue_id, h.queue_id + 1)
        table = ObjectKeyMap()
        for qid in qids:
            lo = store.get_min_offset_in_queue(h.topic, qid)
            hi = store.get_max_offset_in_queue(h.topic, qid)
            if h.offset is not None and h.offset >= 0:
                target = min(max(h.offset, lo), hi)
            else:
                target = store.get_offset_by_time(h.topic, qid, h.timestamp)
            current = offsets.query(h.group, h.topic, qid)
            if not h.is_force and 0 <= current < target:
                target = current
            offsets.commit(h.group, h.topic, qid, target)
            if self.on_reset is not None:
                self.on_reset(h.group, h.topic, qid, target)
            mq = {"topic": h.topic, "brokerName": self.ctx.config.broker_name, "queueId": qid}
            table.append((mq, target))
        body = dumps({"offsetTable": table}).encode()
        await self.ctx.in_background(offsets.persist)
        notified = 0
        for ch in self.ctx.clients.consumer_channels(h.group):
            try:
                ch.conn.send_oneway(
                    RemotingCommand.request(
                        RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                        h.to_ext_fields(),
                        body,
                        serialize_type=ch.conn.peer_serialize_type,
                    )
                )
                notified += 1
            except TxmqError as exc:
                log.warning("reset_offset_not_sent", client=ch.client_id, error=str(exc))
        log.warning(
            "consumer_offsets_reset",
            group=h.group,
            topic=h.topic,
            offsets={mq["queueId"]: off for mq, off in table},
            consumers_told=notified,
            peer=f"{conn.peer[0]}:{conn.peer[1]}",
        )
        return cmd.response(body=body)

    async def get_broker_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Every setting as ``key=value`` lines (RocketMQ's names), sorted."""
        settings = self.ctx.config.as_rocketmq_dict()
        body = "".join(f"{k}={_config_value(v)}\n" for k, v in sorted(settings.items()))
        version = json.dumps({"counter": 0, "timestamp": 0})
        return cmd.response(
            ext_fields=GetBrokerConfigResponseHeader(version).to_ext_fields(),
            body=body.encode(),
        )

    async def update_broker_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Change settings while the broker runs: the body is ``key=value`` lines. A key that
        cannot change at run time is refused with NO_PERMISSION (as RocketMQ refuses its
        black-listed keys), a bad value with INVALID_PARAMETER; either way nothing changes."""
        try:
            changes = parse_properties((cmd.body or b"").decode("utf-8"))
            await self.reconfigure(changes)
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.INVALID_PARAMETER, "the body is not UTF-8 text")
        except NotRuntimeChangeable as exc:
            return cmd.response(ResponseCode.NO_PERMISSION, str(exc))
        except ConfigError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        except OSError as exc:
            refused = self.ctx.store.refusal(exc)
            if refused is not None:
                raise refused from exc
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"the change could not be kept in the store: {exc}"
            )
        return cmd.response()


def _connections(
    cmd: RemotingCommand, channels: list[ClientChannel], missing: tuple[int, str], **more: Any
) -> RemotingCommand:
    """RocketMQ's ConsumerConnection / ProducerConnection body: the channels as
    ``connectionSet``, and ``more``; the ``missing`` (code, remark) answer when there are none."""
    if not channels:
        return cmd.response(*missing)
    body = {"connectionSet": [_connection(ch) for ch in channels], **more}
    return cmd.response(body=dumps(body).encode())


def _consumer_settings(group: str, channels: list[ClientChannel]) -> dict[str, Any]:
    """What a ConsumerConnection tells of the group beside its connections: its subscriptions
    and the consume settings its members' heartbeats gave."""
    meta: dict[str, str] = {}
    subscriptions: dict[str, Any] = {}
    for ch in channels:
        meta.update(ch.consumer_meta.get(group, {}))
        for topic, sub in ch.consumer_groups[group].items():
            subscriptions[topic] = {
                "topic": topic,
                "subString": sub.expression,
                "expressionType": sub.expression_type,
                "tagsSet": sorted(sub.tags or ()),
                "classFilterMode": False,
                "subVersion": 0,
            }
    return {
        "subscriptionTable": subscriptions,
        "consumeType": meta.get("consumeType", "CONSUME_PASSIVELY"),
        "messageModel": meta.get("messageModel", "CLUSTERING"),
        "consumeFromWhere": meta.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET"),
    }


def _config_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return ";".join(str(x) for x in v)
    return str(v)
