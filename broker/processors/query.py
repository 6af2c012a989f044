"""QUERY_MESSAGE (12): stored messages by key or unique key, from the message index
(RocketMQ's ``QueryMessageProcessor.queryMessage``)."""

from __future__ import annotations

from dataclasses import dataclass

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, ServiceNotAvailableError, TopicNotExistError
from txmq.protocol.headers import (
    UNIQUE_MSG_QUERY_FLAG,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
)

from ..context import BrokerContext
from ..messaging.index import MessageIndexService
from .paging import LIST_PAGE_BYTES

#: What a query by unique key returns at most (RocketMQ's ``defaultQueryMaxNum``).
DEFAULT_QUERY_MAX_NUM = 32


def _cursor(after: str) -> int | None:
    """A page's start: below the commit-log offset ``after`` ("": the first page)."""
    if not after:
        return 1 << 62  # past any offset: a paged query from the newest
    try:
        return int(after)
    except ValueError:
        raise InvalidParameterError(
            f"cursor {after!r} is not one a key query answered (a commit-log offset)"
        ) from None


@dataclass(eq=False)
class QueryMessageProcessor:
    ctx: BrokerContext
    #: None when ``messageIndexEnable`` is off.
    index: MessageIndexService | None

    async def query_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Answer: header ``indexLastUpdateTimestamp`` / ``indexLastUpdatePhyoffset``; body: the
        stored messages back to back, as stored (what ``MessageDecoder.decodes`` reads);
        QUERY_NOT_FOUND when none matched.

        With txmq's ``after`` field the answer is a page: the ``maxNum`` newest below the cursor
        (a commit-log offset; "" for the first page), cut at about 4 MiB, and ``nextCursor``
        when more match.  Without it (a stock client) every match up to ``maxNum`` comes in
        one answer, refused with an error naming the frame limit when it would pass it."""
        h = QueryMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        if self.index is None:
            raise ServiceNotAvailableError(
                "the message index is disabled on this broker (messageIndexEnable=false)"
            )
        if not h.key:
            raise InvalidParameterError("QUERY_MESSAGE needs a key")
        if self.ctx.topics.get(h.topic) is None and h.topic not in self.ctx.store.topics():
            raise TopicNotExistError(f"topic[{h.topic}] not exist")
        max_num = h.max_num
        unique = str(cmd.ext_fields.get(UNIQUE_MSG_QUERY_FLAG, "")).lower() == "true"
        if unique:
            max_num = DEFAULT_QUERY_MAX_NUM
        before = _cursor(h.after) if h.after is not None else None
        result = await self.index.query_when_ready(
            h.topic,
            h.key,
            max_num,
            h.begin_timestamp,
            h.end_timestamp,
            unique=unique,
            before=before,
            max_bytes=LIST_PAGE_BYTES,
        )
        header = QueryMessageResponseHeader(
            result.last_update_timestamp, result.last_update_phy_offset
        ).to_ext_fields()
        if result.next_before is not None:
            header["nextCursor"] = str(result.next_before)
        if not result.messages:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                ext_fields=header,
            )
        return cmd.response(ext_fields=header, body=b"".join(result.messages))
