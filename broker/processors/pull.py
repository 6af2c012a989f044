"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    BrokerSystemError,
    MessageIllegalError,
    NoPermissionError,
    TopicNotExistError,
)
from txmq.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader
from txmq.protocol.message import parse_subscription, tags_code

from ..context import BrokerContext
from ..messaging.hold import PullRequestHoldService
from ..messaging.trace import BrokerTrace
from ..sql_filter import SUBSCRIPTION_PARSE_FAILED, SqlFilterError, compile_sql
from ..store import GetMessageResult, GetMessageStatus
from ..topics import PERM_READ

__all__ = ["PullMessageProcessor", "PullRequestHoldService"]

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

#: The most a long poll is held, whatever the client asks (ms).
MAX_SUSPEND_MS = 60_000


class _ParseFailed(Exception):
    """The pull's SQL92 expression does not compile."""


class PullMessageProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.hold = ctx.hold
        #: the broker's message trace (set when ``traceTopicEnable`` is on)
        self.trace: BrokerTrace | None = None

    def _filters(
        self, h: PullMessageRequestHeader
    ) -> tuple[frozenset[int] | None, Callable[[bytes], bool] | None]:
        """(tag codes to keep, SQL92 filter over stored records) for this pull: from the pull's
        own expression, else from the subscription the heartbeat registered."""
        expr = h.subscription if h.sys_flag & FLAG_SUBSCRIPTION or h.subscription else None
        kind = (h.expression_type or "TAG").upper() if expr is not None else "TAG"
        sub = None
        if expr is None:
            sub = self.ctx.clients.subscription(h.consumer_group, h.topic)
            expr = sub.expression if sub else "*"
            kind = sub.expression_type if sub else "TAG"
        if kind == "TAG":
            tags = parse_subscription(expr)
            return (None if tags is None else frozenset(tags_code(t) for t in tags)), None
        if kind != "SQL92" or not self.ctx.config.enable_property_filter:
            # Never answer a property filter as if it were a tag expression (the consumer
            # would silently receive nothing): RocketMQ's answer with property filtering off.
            raise BrokerSystemError(
                f"The broker does not support consumer to filter message by {kind} "
                f"(group {h.consumer_group}, topic {h.topic}); subscribe by tag"
            )
        if sub is not None and sub.sql is not None:
            return None, sub.sql.matches_stored
        try:
            return None, compile_sql(expr).matches_stored
        except SqlFilterError as exc:
            raise _ParseFailed(str(exc)) from None

    async def pull_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PullMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        if not self.ctx.groups.effective(h.consumer_group).consume_enable:
            raise NoPermissionError(f"subscription group no permission, {h.consumer_group}")
        tc = self.ctx.topics.get(h.topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist, apply first please!")
        if not tc.perm & PERM_READ:
            raise NoPermissionError(f"the topic[{h.topic}] pulling message is forbidden")
        if not 0 <= h.queue_id < tc.read_queue_nums:
            raise MessageIllegalError(
                f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] topicConfig.readQueueNums:"
                f"[{tc.read_queue_nums}]"
            )
        if h.sys_flag & FLAG_COMMIT_OFFSET and h.commit_offset > 0:
            self.ctx.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        try:
            tag_codes, sql = self._filters(h)
        except _ParseFailed as exc:
            return cmd.response(
                SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {exc}"
            )
        max_nums = max(1, min(h.max_msg_nums, 1024))
        read = functools.partial(
            self.ctx.store.get_messages,
            h.topic,
            h.queue_id,
            h.queue_offset,
            max_nums,
            tag_codes,
            joined=True,
            message_filter=sql,
            for_consumer=True,
        )
        result = read()
        suspend = (
            h.sys_flag & FLAG_SUSPEND
            and self.ctx.config.long_polling_enable
            and h.suspend_timeout_millis > 0
        )
        if suspend and result.status in (
            GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            GetMessageStatus.OFFSET_OVERFLOW_ONE,
        ):
            timeout = min(h.suspend_timeout_millis, MAX_SUSPEND_MS) / 1000.0
            await self.hold.wait(h.topic, h.queue_id, timeout)
            result = read()
        return self._response(cmd, h, result)

    def _response(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, r: GetMessageResult
    ) -> RemotingCommand:
        header = PullMessageResponseHeader(
            next_begin_offset=r.next_begin_offset, min_offset=r.min_offset, max_offset=r.max_offset
        )
        s = r.status
        if s is GetMessageStatus.FOUND:
            self.ctx.metrics.messages_pulled.inc(r.count)
            self.ctx.metrics.record_out(h.topic, h.consumer_group, r.count)
            if self.trace is not None:
                self.trace.delivered(h.consumer_group, r.joined)
            return cmd.response(ResponseCode.SUCCESS, None, header.to_ext_fields(), r.joined)
        if s is GetMessageStatus.NO_MATCHED_MESSAGE or s is GetMessageStatus.OFFSET_FOUND_NULL:
            return cmd.response(
                ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", header.to_ext_fields()
            )
        if s in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
            return cmd.response(
                ResponseCode.PULL_OFFSET_MOVED,
                f"offset {h.queue_offset} is out of range [{r.min_offset}, {r.max_offset}]",
                header.to_ext_fields(),
            )
        if s is GetMessageStatus.NO_MESSAGE_IN_QUEUE and h.queue_offset != r.next_begin_offset:
            return cmd.response(
                ResponseCode.PULL_OFFSET_MOVED,
                f"offset {h.queue_offset} is out of range of an empty queue",
                header.to_ext_fields(),
            )
        return cmd.response(ResponseCode.PULL_NOT_FOUND, "no new message", header.to_ext_fields())
