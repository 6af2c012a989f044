"""The read side's rules written once for every front end: which messages a consumer's filter
keeps (tags or SQL92), and the checks every read makes (the topic exists and is readable, the
group may consume).  Remoting PULL_MESSAGE and POP_MESSAGE and gRPC ReceiveMessage call these;
each front end maps the errors to its codes."""

from __future__ import annotations

from dataclasses import dataclass

from txmq.protocol.errors import (
    BrokerSystemError,
    InvalidParameterError,
    NoPermissionError,
    TopicNotExistError,
)
from txmq.protocol.message import parse_subscription, tags_code

from ..context import BrokerContext
from ..sql_filter import SqlFilterError, StoredFilter, compile_sql
from ..store import TopicConfig
from ..topics import PERM_READ


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


__all__ = [
    "EVERYTHING",
    "FilterNotServedError",
    "FilterSyntaxError",
    "ReadFilter",
    "read_filter",
    "readable_topic",
]
