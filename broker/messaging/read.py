"""The read side's rules written once for every front end: which messages a consumer's filter
keeps (tags or SQL92), and the checks every read makes (the topic exists and is readable, the
group may consume).  Remoting PULL_MESSAGE and POP_MESSAGE and gRPC ReceiveMessage call these;
each front end maps the errors to its codes."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txmq.protocol.errors import (
    BrokerSystemError,
    InvalidParameterError,
    MessageIllegalError,
    NoPermissionError,
    TopicNotExistError,
)
from txmq.protocol.message import parse_subscription, tags_code

from ..context import BrokerContext
from ..sql_filter import SqlFilterError, StoredFilter, compile_sql
from ..store import GetMessageResult, GetMessageStatus, TopicConfig
from ..topics import PERM_READ

if TYPE_CHECKING:
    from .trace import BrokerTrace

#: The most a long poll is held, whatever the client asks (s).
MAX_SUSPEND_S = 60.0


class FilterNotServedError(BrokerSystemError):
    """A filter type the broker does not serve (SQL92 with ``enablePropertyFilter`` off, or a
    type it does not know): never answered as if it were a tag expression, since the consumer
    would silently receive nothing (RocketMQ's answer with property filtering off)."""


class FilterSyntaxError(InvalidParameterError):
    """A SQL92 expression that does not compile (the error names what and where)."""


@dataclass(frozen=True, slots=True)
class ReadFilter:
    """What a read keeps: ``tags`` (None: every tag) with their consume-queue ``tag_codes``,
    or ``sql`` over stored records."""

    tags: frozenset[str] | None = None
    tag_codes: frozenset[int] | None = None
    sql: StoredFilter | None = None


EVERYTHING = ReadFilter()


def read_filter(kind: str | None, expression: str | None, property_filter: bool) -> ReadFilter:
    """The filter of a ``kind`` (``TAG``, the default, or ``SQL92``) ``expression``.

    Raises:
        FilterNotServedError: SQL92 while ``property_filter`` (``enablePropertyFilter``) is
            off, or an unknown kind.
        FilterSyntaxError: the SQL92 expression does not compile.
    """
    kind = (kind or "TAG").upper()
    if kind == "TAG":
        tags = parse_subscription(expression or "*")
        if tags is None:
            return EVERYTHING
        frozen = frozenset(tags)
        return ReadFilter(frozen, frozenset(tags_code(t) for t in frozen))
    if kind not in ("SQL92", "SQL") or not property_filter:
        raise FilterNotServedError(
            f"The broker does not support consumer to filter message by {kind} "
            "(enablePropertyFilter is off); subscribe by tag"
        )
    try:
        return ReadFilter(sql=compile_sql(expression or "").matches_stored)
    except SqlFilterError as exc:
        raise FilterSyntaxError(str(exc)) from None


def readable_topic(ctx: BrokerContext, topic: str, group: str) -> TopicConfig:
    """The config of ``topic``, checked for a read by ``group``.

    Raises:
        TopicNotExistError: no such topic.
        NoPermissionError: the topic is not readable, or the group may not consume.
    """
    if not ctx.groups.effective(group).consume_enable:
        raise NoPermissionError(f"subscription group no permission, {group}")
    tc = ctx.topics.get(topic)
    if tc is None:
        raise TopicNotExistError(f"topic[{topic}] not exist, apply first please!")
    if not tc.perm & PERM_READ:
        raise NoPermissionError(f"the topic[{topic}] reading is forbidden")
    return tc


class ReadSide:
    """The pull use case (remoting PULL_MESSAGE), and what every read that hands messages out
    counts (metrics, SubBefore trace records)."""

    def __init__(self, ctx: BrokerContext, trace: BrokerTrace | None) -> None:
        self.ctx = ctx
        self.trace = trace

    def delivered(
        self, topic: str, group: str, n: int, raw: bytes | None = None, nbytes: int = 0
    ) -> None:
        """``n`` messages of ``topic`` went to ``group`` (``raw``: their stored records, traced
        when the broker's trace is on; ``nbytes``: their size when ``raw`` is not given)."""
        metrics = self.ctx.metrics
        metrics.messages_pulled.inc(n)
        metrics.bytes_out.inc(len(raw) if raw is not None else nbytes)
        metrics.record_out(topic, group, n)
        if raw is not None and self.trace is not None:
            self.trace.delivered(group, raw)

    async def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        filter: ReadFilter,
        suspend_s: float = 0.0,
        commit_offset: int | None = None,
    ) -> GetMessageResult:
        """Up to ``max_nums`` messages of the queue from ``offset`` that ``filter`` keeps,
        waiting up to ``suspend_s`` (a long poll, when the broker allows it) for one to come.
        ``commit_offset``: the group's progress the consumer reports with the pull.

        Raises:
            TopicNotExistError, NoPermissionError: see :func:`readable_topic`.
            MessageIllegalError: no such queue.
        """
        ctx = self.ctx
        tc = readable_topic(ctx, topic, group)
        if not 0 <= queue_id < tc.read_queue_nums:
            raise MessageIllegalError(
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{tc.read_queue_nums}]"
            )
        if commit_offset is not None and commit_offset > 0:
            ctx.offsets.commit(group, topic, queue_id, commit_offset)
        read = functools.partial(
            ctx.store.get_messages,
            topic,
            queue_id,
            offset,
            max(1, min(max_nums, 1024)),
            filter.tag_codes,
            joined=True,
            message_filter=filter.sql,
            for_consumer=True,
        )
        result = read()
        if (
            suspend_s > 0
            and ctx.config.long_polling_enable
            and result.status
            in (GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.OFFSET_OVERFLOW_ONE)
        ):
            await ctx.hold.wait(topic, queue_id, min(suspend_s, MAX_SUSPEND_S))
            result = read()
        if result.status is GetMessageStatus.FOUND:
            self.delivered(topic, group, result.count, result.joined)
        return result


__all__ = [
    "MAX_SUSPEND_S",
    "ReadSide",
    "EVERYTHING",
    "FilterNotServedError",
    "FilterSyntaxError",
    "ReadFilter",
    "read_filter",
    "readable_topic",
]
