"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService)."""

from __future__ import annotations

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader

from ..context import BrokerContext
from ..messaging.hold import PullRequestHoldService
from ..messaging.read import EVERYTHING, FilterSyntaxError, ReadFilter, ReadSide, read_filter
from ..sql_filter import SUBSCRIPTION_PARSE_FAILED
from ..store import GetMessageResult, GetMessageStatus

__all__ = ["PullMessageProcessor", "PullRequestHoldService"]

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


class PullMessageProcessor:
    """PULL_MESSAGE's header to and from the core's pull (:class:`..messaging.read.ReadSide`):
    the filter is the pull's own expression, else the subscription the heartbeat registered."""

    def __init__(self, ctx: BrokerContext, reads: ReadSide) -> None:
        self.ctx = ctx
        self.reads = reads

    def _filter(self, h: PullMessageRequestHeader) -> ReadFilter:
        expr = h.subscription if h.sys_flag & FLAG_SUBSCRIPTION or h.subscription else None
        if expr is not None:
            return read_filter(h.expression_type, expr, self.ctx.config.enable_property_filter)
        sub = self.ctx.clients.subscription(h.consumer_group, h.topic)
        if sub is None:
            return EVERYTHING
        if sub.sql is not None and self.ctx.config.enable_property_filter:
            return ReadFilter(sql=sub.sql.matches_stored)  # compiled at the heartbeat
        return read_filter(
            sub.expression_type, sub.expression, self.ctx.config.enable_property_filter
        )

    async def pull_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PullMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        try:
            read = self._filter(h)
        except FilterSyntaxError as exc:
            return cmd.response(
                SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {exc}"
            )
        suspend = h.suspend_timeout_millis / 1000.0 if h.sys_flag & FLAG_SUSPEND else 0.0
        result = await self.reads.pull(
            h.consumer_group,
            h.topic,
            h.queue_id,
            h.queue_offset,
            h.max_msg_nums,
            read,
            suspend,
            h.commit_offset if h.sys_flag & FLAG_COMMIT_OFFSET else None,
        )
        return self._response(cmd, h, result)

    def _response(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, r: GetMessageResult
    ) -> RemotingCommand:
        header = PullMessageResponseHeader(
            next_begin_offset=r.next_begin_offset, min_offset=r.min_offset, max_offset=r.max_offset
        )
        s = r.status
        if s is GetMessageStatus.FOUND:
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
