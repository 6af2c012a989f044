"""Dead-letter queues for operators: read the messages of ``%DLQ%<group>`` and send them back
to the topics they were first sent to (``txmq dlq list`` / ``txmq dlq resend``).

A dead-lettered message is the broker's copy of the message a consumer gave up on: its
``RETRY_TOPIC`` property names the original topic, ``reconsumeTimes`` how often it was tried,
and it keeps the original's message id (UNIQ_KEY), body, tags, keys and user properties.

A resend is a new message in the original topic with that body, tags, keys and user
properties.  Its message id is derived from the dead-lettered message's id
(:func:`resend_msg_id`), so running the same resend again within the broker's duplicate window
(``duplicateWindowSeconds``, 120 s by default) is answered with the first resend's result
instead of storing a second copy.  After the window a repeated resend stores another copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from txmq.protocol.message import Message, MessageConst, MessageExt
from txmq.protocol.topics import dlq_topic

from .config import ClientConfig
from .producer import AsyncProducer
from .pull_consumer import AsyncPullConsumer, PullStatus

#: The group the reads are made under (pulls only, no offsets are committed).
READER_GROUP = "txmq-cli-dlq"
#: The producer group resends are sent from.
RESEND_GROUP = "txmq-cli-dlq-resend"


def original_topic(msg: MessageExt) -> str | None:
    """The topic a dead-lettered message was first sent to (None when it does not say)."""
    return msg.properties.get(MessageConst.RETRY_TOPIC)


def resend_msg_id(msg: MessageExt) -> str:
    """The message id of the resend of ``msg``: the same for every resend of one dead-lettered
    message, different from the original's (which the broker may still hold in its duplicate
    window for the original topic), 32 hex digits like any UNIQ_KEY."""
    return (
        hashlib.md5(f"dlq-resend:{msg.msg_id}".encode(), usedforsecurity=False).hexdigest().upper()
    )


#: Dead-lettered messages read for one page.
DLQ_PAGE = 1000


async def read_dlq(
    group: str, broker: str, config: ClientConfig | None = None, limit: int = 10_000
) -> list[MessageExt]:
    """The messages stored in ``%DLQ%<group>`` (oldest first, at most ``limit``); an empty list
    when the group never dead-lettered anything."""
    msgs, _ = await read_dlq_page(group, broker, config, limit=limit)
    return msgs


async def iter_dlq(
    group: str,
    broker: str,
    config: ClientConfig | None = None,
    *,
    page: int = DLQ_PAGE,
    after: str | None = None,
) -> AsyncIterator[MessageExt]:
    """Every message stored in ``%DLQ%<group>`` (after cursor ``after``), oldest first per
    queue, a page of ``page`` read at a time."""
    while True:
        msgs, after = await read_dlq_page(group, broker, config, limit=page, after=after)
        for m in msgs:
            yield m
        if after is None:
            return


async def read_dlq_page(
    group: str,
    broker: str,
    config: ClientConfig | None = None,
    *,
    limit: int = DLQ_PAGE,
    after: str | None = None,
) -> tuple[list[MessageExt], str | None]:
    """One page of ``%DLQ%<group>``: the first ``limit`` messages after cursor ``after`` (None:
    from the first), queue by queue, oldest first in each, and the cursor of the next page
    (None: this was the last).  A cursor (``<broker>/<queue id>/<offset>``) is the position of
    the next message to read, so messages dead-lettered between two pages are listed too."""
    from txmq.protocol.errors import TopicNotExistError

    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    start = _dlq_cursor(after) if after else None
    topic = dlq_topic(group)
    out: list[MessageExt] = []
    consumer = AsyncPullConsumer(READER_GROUP, broker=broker, config=config)
    await consumer.start()
    try:
        try:
            queues = sorted(await consumer.fetch_message_queues(topic))
        except TopicNotExistError:
            return [], None
        for q in queues:
            if start is not None and (q.broker, q.queue_id) < start[:2]:
                continue
            offset = await consumer.min_offset(topic, q.queue_id, broker=q.broker)
            if start is not None and (q.broker, q.queue_id) == start[:2]:
                offset = max(offset, start[2])
            end = await consumer.max_offset(topic, q.queue_id, broker=q.broker)
            while offset < end:
                if len(out) >= limit:
                    return out, f"{q.broker}/{q.queue_id}/{offset}"
                want = min(32, limit - len(out))
                res = await consumer.pull(topic, q.queue_id, offset, want, "*", broker=q.broker)
                if res.status is PullStatus.OFFSET_ILLEGAL:
                    offset = res.min_offset
                    continue
                if not res.messages or res.next_begin_offset <= offset:
                    break
                taken = res.messages[:want]
                out.extend(taken)
                offset = (
                    res.next_begin_offset
                    if len(taken) == len(res.messages)
                    else taken[-1].queue_offset + 1
                )
    finally:
        await consumer.shutdown()
    return out, None


def _dlq_cursor(cursor: str) -> tuple[str, int, int]:
    broker, _, rest = cursor.rpartition("/")
    broker, _, queue = broker.rpartition("/")
    try:
        if not broker:
            raise ValueError(cursor)
        return broker, int(queue), int(rest)
    except ValueError:
        raise ValueError(
            f"cursor {cursor!r} is not one a DLQ page answered (<broker>/<queue id>/<offset>)"
        ) from None


@dataclass(frozen=True)
class Resent:
    """One dead-lettered message sent back: its id, the topic, and the new message's id."""

    dlq_msg_id: str
    topic: str
    msg_id: str
    status: str


def resend_message(msg: MessageExt) -> Message:
    """The message a resend of ``msg`` sends (its original topic, body, tags, keys, user
    properties and the derived message id).

    Raises:
        ValueError: ``msg`` does not name its original topic.
    """
    topic = original_topic(msg)
    if not topic:
        raise ValueError(f"message {msg.msg_id} does not name its original topic (RETRY_TOPIC)")
    return Message(
        topic=topic,
        body=msg.body,
        tags=msg.tags,
        keys=msg.keys,
        properties=dict(msg.user_properties),
        msg_id=resend_msg_id(msg),
    )


async def resend(
    msgs: list[MessageExt], broker: str, config: ClientConfig | None = None
) -> list[Resent]:
    """Send each of ``msgs`` back to its original topic; what was sent, in order."""
    done: list[Resent] = []
    async with AsyncProducer(RESEND_GROUP, broker=broker, config=config) as producer:
        for m in msgs:
            out = resend_message(m)
            result = await producer.send(out)
            done.append(Resent(m.msg_id, out.topic, result.msg_id, result.status.name))
    return done
