"""What the message store takes and answers: a message encoded for the store
(:class:`EncodedMessage`), where an append put it (:class:`PutMessageResult`,
:class:`AppendResult`) and what a read found (:class:`GetMessageResult`)."""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from txmq.protocol.errors import MessageIllegalError, ProtocolError
from txmq.protocol.message import MessageConst, MessageExt, encode_tail, pack_host

from .tags import tags_code_of


class GetMessageStatus(enum.Enum):
    """Outcome of :meth:`MessageStore.get_messages` (RocketMQ's names)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"


@dataclass(frozen=True)
class PutMessageResult:
    """Where a message was stored.

    Attributes:
        commit_log_offset: offset of its record in the commit log (the offsetMsgId's offset).
        size: stored-message bytes.
        queue_offset: its offset in its consume queue (0 for PREPARED/ROLLBACK messages).
        store_timestamp: ms, the store's clock.
        offset_msg_id: RocketMQ's offsetMsgId (store host + commit-log offset).
        end_offset: the commit-log offset a flush must reach for the message to be durable.
    """

    commit_log_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    offset_msg_id: str
    end_offset: int


class EncodedMessage(NamedTuple):
    """A message as the store appends it: every field of its stored form except those the
    store sets (queue offset, commit-log offset, store timestamp, store host), with the body's
    CRC and the tail (topic and properties, :func:`~txmq.protocol.message.encode_tail`)
    encoded.  A tuple: a batch decision makes 100,000s."""

    topic: str
    queue_id: int
    magic: int
    body_crc: int
    body: bytes
    #: topic and properties as stored
    tail: bytes
    flag: int
    sys_flag: int
    born_timestamp: int
    #: :func:`~txmq.protocol.message.pack_host`
    born_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    #: the consume-queue tag code of its TAGS
    tags_code: int


def encode_for_store(m: MessageExt) -> EncodedMessage:
    """The :data:`EncodedMessage` of ``m`` (what :meth:`MessageStore.put_messages` stores).

    Raises:
        MessageIllegalError: the topic or the properties cannot be encoded.
    """
    try:
        magic, tail = encode_tail(m)
    except ProtocolError as exc:
        raise MessageIllegalError(f"cannot store message: {exc}") from None
    body = m.body if m.body.__class__ is bytes else bytes(m.body)
    return EncodedMessage(
        m.topic,
        m.queue_id,
        magic,
        zlib.crc32(body) & 0x7FFFFFFF,
        body,
        tail,
        m.flag,
        m.sys_flag,
        m.born_timestamp,
        pack_host(m.born_host),
        m.reconsume_times,
        m.prepared_transaction_offset,
        tags_code_of(m.properties.get(MessageConst.TAGS)),
    )


@dataclass(slots=True)
class AppendResult:
    """Where :meth:`MessageStore.put_encoded` stored its records.

    Attributes:
        placed: ``(commit-log offset, size, queue offset)`` of each record, in order.
        store_timestamp: ms, the store's clock, the same for every record.
        end_offset: the commit-log offset a flush must reach for all of them to be durable.
        per_destination: ``(topic, queue id) -> records``.
        payload_bytes: stored-message bytes (the records without their 12-byte headers).
    """

    placed: list[tuple[int, int, int]]
    store_timestamp: int
    end_offset: int
    per_destination: dict[tuple[str, int], int]
    payload_bytes: int


def _put_result(
    commit_log_offset: int,
    size: int,
    queue_offset: int,
    store_timestamp: int,
    offset_msg_id: str,
    end_offset: int,
) -> PutMessageResult:
    """A :class:`PutMessageResult` (a batch decision makes 100,000s).  Compiled, the frozen
    dataclass is a native class whose constructor sets its fields directly; as Python, one
    write of ``__dict__`` instead of the frozen dataclass's ``object.__setattr__`` per field."""
    if _NATIVE_RESULT:
        return PutMessageResult(
            commit_log_offset, size, queue_offset, store_timestamp, offset_msg_id, end_offset
        )
    r = object.__new__(PutMessageResult)
    object.__setattr__(
        r,
        "__dict__",
        {
            "commit_log_offset": commit_log_offset,
            "size": size,
            "queue_offset": queue_offset,
            "store_timestamp": store_timestamp,
            "offset_msg_id": offset_msg_id,
            "end_offset": end_offset,
        },
    )
    return r


#: Whether PutMessageResult is a compiled (native) class: one without an instance __dict__.
_NATIVE_RESULT = "__dict__" not in dir(PutMessageResult)


@dataclass
class GetMessageResult:
    """Messages read from one consume queue.

    Attributes:
        status: what happened.
        messages: raw stored messages (RocketMQ's layout, decodable with
            ``txmq.protocol.message.decode_message``), in queue order; empty when they were
            asked for joined.
        next_begin_offset: the offset to ask for next.
        min_offset: the queue's minimum offset.
        max_offset: the queue's next offset to be written.
        joined: the messages back to back in one buffer (a PULL answer's body), when asked for
            so (``get_messages(..., joined=True)``).
        count: how many messages were read.
    """

    status: GetMessageStatus
    messages: list[bytes] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    joined: bytes = b""
    count: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(len(m) for m in self.messages) + len(self.joined)
