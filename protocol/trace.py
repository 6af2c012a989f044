"""Message trace records in RocketMQ's encoding (its client's ``TraceDataEncoder``), sans-IO.

A trace message is stored in ``RMQ_SYS_TRACE_TOPIC``; its body is one or more records, each a
list of fields joined by ``\\x01`` and ended by ``\\x02``; its KEYS property holds the message
ids (and keys) the records are about, separated by spaces, so the message index finds them.

RocketMQ's record types:

* ``Pub``: a message was sent (and stored): ``Pub, timestamp, regionId, group, topic, msgId,
  tags, keys, storeHost, bodyLength, costTime, msgType, offsetMsgId, success[, clientHost]``;
* ``SubBefore``: a consumer is about to process a message: ``SubBefore, timestamp, regionId,
  group, requestId, msgId, retryTimes, keys``;
* ``SubAfter``: it processed it: ``SubAfter, requestId, msgId, costTime, success, keys,
  contextCode[, timestamp, group]``;
* ``EndTransaction``: a transaction's decision: ``EndTransaction, timestamp, regionId, group,
  topic, msgId, tags, keys, storeHost, msgType, transactionId, transactionState,
  fromTransactionCheck``;
* ``Recall``: ``Recall, timestamp, regionId, group, topic, msgId, success``.

txmq adds one type of its own, written only by its broker and never mixed into a trace message
with RocketMQ's types (RocketMQ's readers skip a type they do not know only if it is alone):

* ``TxEvent``: a step of a transaction's life on the broker: ``TxEvent, timestamp, regionId,
  group, topic, msgId, transactionId, event, detail, storeHost``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, fields

__all__ = [
    "CONTENT_SPLITOR",
    "FIELD_SPLITOR",
    "TRACE_TOPIC",
    "MessageType",
    "TraceError",
    "TraceRecord",
    "TraceType",
    "TxEvent",
    "decode",
    "encode",
    "encode_many",
    "keys_of",
]

#: RocketMQ's default trace topic (``TopicValidator.RMQ_SYS_TRACE_TOPIC``).
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
#: Between the fields of a record (``TraceConstants.CONTENT_SPLITOR``).
CONTENT_SPLITOR = "\x01"
#: After each record (``TraceConstants.FIELD_SPLITOR``).
FIELD_SPLITOR = "\x02"
#: RocketMQ's region when none is configured.
DEFAULT_REGION = "DefaultRegion"


class TraceError(ValueError):
    """A trace record that cannot be read."""


class TraceType(enum.StrEnum):
    PUB = "Pub"
    RECALL = "Recall"
    SUB_BEFORE = "SubBefore"
    SUB_AFTER = "SubAfter"
    END_TRANSACTION = "EndTransaction"
    #: txmq's own: a step of a transaction on the broker.
    TX_EVENT = "TxEvent"


class MessageType(enum.IntEnum):
    """RocketMQ's ``MessageType``, encoded by its ordinal."""

    NORMAL = 0
    TRANS_HALF = 1
    TRANS_COMMIT = 2
    DELAY = 3
    ORDER = 4


class TxEvent(enum.StrEnum):
    """The ``event`` of a ``TxEvent`` record."""

    #: A check-back was delivered to a producer (detail: the client id and the check count).
    CHECK_SENT = "check-sent"
    #: The decision was applied (detail: its source: producer, check, operator, batch).
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"
    #: The check budget ran out (detail: why): the halves were parked for an operator.
    TIMED_OUT = "timed-out"
    #: An operator asked for the checks to start over.
    RESUMED = "resumed"


#: LocalTransactionState names (RocketMQ's spelling, UNKNOW included).
TRANSACTION_STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")


@dataclass(slots=True)
class TraceRecord:
    """One record of any type; the fields a type does not carry keep their defaults."""

    type: TraceType
    timestamp: int = 0
    region_id: str = DEFAULT_REGION
    group: str = ""
    topic: str = ""
    msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_time: int = 0
    msg_type: MessageType = MessageType.NORMAL
    offset_msg_id: str = ""
    success: bool = True
    client_host: str = ""
    request_id: str = ""
    retry_times: int = 0
    context_code: int = 0
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False
    event: str = ""
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        """The fields the record's type carries, by RocketMQ's names."""
        d: dict[str, object] = {"type": str(self.type)}
        for name in _FIELDS[self.type]:
            value = getattr(self, name)
            d[_JSON_NAMES.get(name, name)] = (
                int(value) if isinstance(value, enum.IntEnum) else value
            )
        return d


# The message a PUB or END_TRANSACTION record is about: both types start with these fields.
_MESSAGE_FIELDS = (
    "timestamp",
    "region_id",
    "group",
    "topic",
    "msg_id",
    "tags",
    "keys",
    "store_host",
)
# The fields of each type, in wire order after the type.
_FIELDS: dict[TraceType, tuple[str, ...]] = {
    TraceType.PUB: (
        *_MESSAGE_FIELDS,
        "body_length",
        "cost_time",
        "msg_type",
        "offset_msg_id",
        "success",
        "client_host",
    ),
    TraceType.SUB_BEFORE: (
        "timestamp",
        "region_id",
        "group",
        "request_id",
        "msg_id",
        "retry_times",
        "keys",
    ),
    TraceType.SUB_AFTER: (
        "request_id",
        "msg_id",
        "cost_time",
        "success",
        "keys",
        "context_code",
        "timestamp",
        "group",
    ),
    TraceType.END_TRANSACTION: (
        *_MESSAGE_FIELDS,
        "msg_type",
        "transaction_id",
        "transaction_state",
        "from_transaction_check",
    ),
    TraceType.RECALL: ("timestamp", "region_id", "group", "topic", "msg_id", "success"),
    TraceType.TX_EVENT: (
        "timestamp",
        "region_id",
        "group",
        "topic",
        "msg_id",
        "transaction_id",
        "event",
        "detail",
        "store_host",
    ),
}
# Fields a reader may find missing at the end (older encoders, or empty trailing fields that
# Java's String.split drops): every field after the first of these is optional.
_REQUIRED: dict[TraceType, int] = {
    TraceType.PUB: 12,  # up to msgType; offsetMsgId, success, clientHost came later
    TraceType.SUB_BEFORE: 6,  # keys may be empty (dropped)
    TraceType.SUB_AFTER: 4,  # keys, contextCode, timestamp, group may be missing
    TraceType.END_TRANSACTION: 12,
    TraceType.RECALL: 5,
    TraceType.TX_EVENT: 7,
}
_JSON_NAMES = {
    "region_id": "regionId",
    "group": "groupName",
    "msg_id": "msgId",
    "store_host": "storeHost",
    "body_length": "bodyLength",
    "cost_time": "costTime",
    "msg_type": "msgType",
    "offset_msg_id": "offsetMsgId",
    "client_host": "clientHost",
    "request_id": "requestId",
    "retry_times": "retryTimes",
    "context_code": "contextCode",
    "transaction_id": "transactionId",
    "transaction_state": "transactionState",
    "from_transaction_check": "fromTransactionCheck",
}
_TYPES = {f.name: f.type for f in fields(TraceRecord)}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # Java's Boolean.toString
    if isinstance(value, enum.IntEnum):
        return str(int(value))
    return str(value)


def encode(record: TraceRecord) -> str:
    """One record in RocketMQ's encoding, its ``\\x02`` included.

    A Pub record is written as RocketMQ 5.3's client writes it (without clientHost unless one
    is set); the other types with all their fields."""
    names = _FIELDS[record.type]
    if record.type is TraceType.PUB and not record.client_host:
        names = names[:-1]
    parts = [str(record.type)]
    parts.extend(_text(getattr(record, n)) for n in names)
    for part in parts:
        if CONTENT_SPLITOR in part or FIELD_SPLITOR in part:
            raise TraceError(f"a trace field holds a separator: {part!r}")
    return CONTENT_SPLITOR.join(parts) + FIELD_SPLITOR


def encode_many(records: Iterable[TraceRecord]) -> str:
    """Records one after the other: the body of one trace message."""
    return "".join(map(encode, records))


def _value(name: str, raw: str) -> object:
    kind = _TYPES[name]
    if kind == "int":
        return int(raw)
    if kind == "bool":
        return raw.lower() == "true"  # Java's Boolean.parseBoolean
    if kind == "MessageType":
        return MessageType(int(raw))
    return raw


def decode(data: str | bytes) -> list[TraceRecord]:
    """The records of a trace message body.  Records of a type this reader does not know are
    skipped (a newer writer's); a record of a known type that cannot be read raises.

    Raises:
        TraceError: a record is malformed (too few fields, a number that is not one).
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    out: list[TraceRecord] = []
    for chunk in text.split(FIELD_SPLITOR):
        if not chunk.strip():
            continue
        line = chunk.split(CONTENT_SPLITOR)
        try:
            kind = TraceType(line[0])
        except ValueError:
            continue
        names = _FIELDS[kind]
        values = line[1:]
        if len(values) < _REQUIRED[kind]:
            raise TraceError(
                f"a {kind} record has {len(values)} fields, at least {_REQUIRED[kind]} expected"
            )
        if kind is TraceType.PUB and len(values) == 12:
            # RocketMQ's older writers: success right after msgType, no offsetMsgId
            names = (*names[:11], "success")
        rec = TraceRecord(kind)
        try:
            for name, raw in zip(names, values, strict=False):
                setattr(rec, name, _value(name, raw))
        except ValueError as exc:
            raise TraceError(f"a {kind} record has a bad field: {exc}") from None
        out.append(rec)
    return out


def keys_of(records: Iterable[TraceRecord]) -> str:
    """The KEYS property of a trace message holding ``records``: each record's message id,
    its keys and (txmq) its transaction id, once each, separated by spaces (RocketMQ's
    ``AsyncTraceDispatcher`` puts the message ids and keys)."""
    seen: dict[str, None] = {}
    for r in records:
        for k in (r.msg_id, *r.keys.split(" "), r.transaction_id):
            if k:
                seen[k] = None
    return " ".join(seen)
