"""Protobuf messages of ``apache.rocketmq.v2`` to txmq's stored messages and back.

What maps to what (the same names RocketMQ's proxy uses, so remoting clients and the txmq SDK
see a 5.x producer's message as they would see it from RocketMQ):

==================================  ===============================================
protobuf (``SystemProperties``)     stored message
==================================  ===============================================
``message_id``                      ``UNIQ_KEY`` property (the id every client shows)
``tag``                             ``TAGS``
``keys``                            ``KEYS`` (space separated)
``message_group``                   ``__SHARDINGKEY``
``delivery_timestamp``              ``TIMER_DELIVER_MS`` + a delay level (``DELAY``)
``orphaned_transaction_recovery``   ``CHECK_IMMUNITY_TIME_IN_SECONDS``
``born_timestamp`` / ``born_host``  born timestamp / born host (port 0)
``user_properties``                 the other properties
==================================  ===============================================
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import zlib
from typing import Any, cast

from txmq.protocol.errors import (
    FlushDiskTimeoutError,
    IllegalOperationError,
    MessageIllegalError,
    NoPermissionError,
    SystemBusyError,
    TopicNotExistError,
    TxmqError,
)
from txmq.protocol.message import MessageConst, MessageExt, MessageSysFlag

from ..messaging.core import TIMER_DELIVER_MS
from ..messaging.pop import ReceiptHandleError
from ..messaging.read import FilterNotServedError, FilterSyntaxError
from .vendor.v2 import definition_pb2 as pb

#: RocketMQ's property for the message group of a FIFO message.
SHARDING_KEY = "__SHARDINGKEY"
#: RocketMQ's property for the delivery time of a timer message (ms).
#: Properties a stored message may carry that are not user properties on the 5.x side.
INTERNAL_KEYS = MessageConst.SYSTEM_KEYS | {
    SHARDING_KEY,
    TIMER_DELIVER_MS,
    "MSG_REGION",
    "TRACE_ON",
    "CLUSTER",
    "TRACE_CONTEXT",
}
#: Longest message group RocketMQ's proxy accepts.
MAX_MESSAGE_GROUP_LENGTH = 64
#: Largest total size of user properties RocketMQ's proxy accepts (bytes).
MAX_PROPERTIES_SIZE = 16 * 1024

Code = pb.Code


class GrpcStatusError(Exception):
    """A request answered with a ``Status`` (not a gRPC error): ``code`` is a ``Code`` value."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    # ``code`` is a ``Code`` value (the codes travel as plain ints in GrpcStatusError)
    return pb.Status(code=cast("pb.Code", code), message=message)


#: The ``Code`` of a broker-side error, the first type that matches (most specific first).
_ERROR_CODES: tuple[tuple[type[TxmqError], int], ...] = (
    (ReceiptHandleError, Code.INVALID_RECEIPT_HANDLE),
    (FilterNotServedError, Code.ILLEGAL_FILTER_EXPRESSION),
    (FilterSyntaxError, Code.ILLEGAL_FILTER_EXPRESSION),
    (TopicNotExistError, Code.TOPIC_NOT_FOUND),
    (NoPermissionError, Code.FORBIDDEN),
    (FlushDiskTimeoutError, Code.MASTER_PERSISTENCE_TIMEOUT),
    # RocketMQ's proxy answers SYSTEM_BUSY (a quota, a full queue) with TOO_MANY_REQUESTS
    (SystemBusyError, Code.TOO_MANY_REQUESTS),
    (IllegalOperationError, Code.PRECONDITION_FAILED),
    (MessageIllegalError, Code.BAD_REQUEST),
    (TxmqError, Code.INTERNAL_SERVER_ERROR),
)


def status_of(exc: BaseException) -> pb.Status:
    """The ``Status`` RocketMQ's proxy answers for a broker-side failure."""
    if isinstance(exc, GrpcStatusError):
        return status(exc.code, exc.message)
    for error_type, code in _ERROR_CODES:
        if isinstance(exc, error_type):
            return status(code, str(exc) or type(exc).__name__)
    return status(Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


# -- time ---------------------------------------------------------------------------------------


def timestamp_ms(ts: Any) -> int:
    """A ``google.protobuf.Timestamp`` in ms.  A seconds field that holds milliseconds (the
    Python 5.x client writes ``delivery_timestamp`` so) is read as milliseconds."""
    seconds = int(ts.seconds)
    if seconds > 100_000_000_000:  # year 5138 in seconds: this is a millisecond value
        return seconds
    return seconds * 1000 + int(ts.nanos) // 1_000_000


def set_timestamp(ts: Any, ms: int) -> None:
    ts.seconds = ms // 1000
    ts.nanos = (ms % 1000) * 1_000_000


def duration_s(d: Any) -> float:
    return int(d.seconds) + int(d.nanos) / 1e9


def set_duration(d: Any, seconds: float) -> None:
    d.seconds = int(seconds)
    d.nanos = int(round((seconds - int(seconds)) * 1e9))


# -- names --------------------------------------------------------------------------------------


def resource_name(r: Any) -> str:
    """RocketMQ's ``NamespaceUtil.wrapNamespace``: ``namespace%name`` when a namespace is set."""
    ns = r.resource_namespace
    return f"{ns}%{r.name}" if ns else r.name


@functools.lru_cache(maxsize=4096)
def born_host_of(text: str, peer_host: str) -> tuple[str, int]:
    """The born host of a message: the client's address if it is an IPv4 literal, else the
    peer's (never a DNS lookup on the broker's loop).  Remembered: a client sends the same
    one with every message."""
    host = text.rsplit(":", 1)[0] if text.count(":") == 1 else text
    for candidate in (host, peer_host):
        try:
            return (str(ipaddress.IPv4Address(candidate)), 0)
        except ValueError:
            continue
    return ("127.0.0.1", 0)


# -- protobuf -> stored -------------------------------------------------------------------------


def check_message(m: Any, max_body: int) -> None:
    """RocketMQ proxy's checks of one message of a SendMessage request."""
    sp = m.system_properties
    if not m.topic.name:
        raise GrpcStatusError(Code.ILLEGAL_TOPIC, "the topic name is empty")
    if not sp.message_id:
        raise GrpcStatusError(Code.ILLEGAL_MESSAGE_ID, "the message id is empty")
    mid = sp.message_id
    if "\x01" in mid or "\x02" in mid:
        raise GrpcStatusError(Code.ILLEGAL_MESSAGE_ID, f"illegal message id {sp.message_id!r}")
    if not m.body:
        raise GrpcStatusError(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(m.body) > max_body:
        raise GrpcStatusError(
            Code.MESSAGE_BODY_TOO_LARGE,
            f"message body size {len(m.body)} exceeds the limit of {max_body} bytes "
            "(maxMessageSize)",
        )
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag or any(c in tag for c in "\x01\x02"):
            raise GrpcStatusError(Code.ILLEGAL_MESSAGE_TAG, f"illegal message tag {tag!r}")
    # (the repeated fields and the map are looked at only when not empty: iterating even an
    # empty one costs a microsecond or two, a good part of these checks)
    keys = sp.keys
    if keys:
        for k in keys:
            if not k.strip() or any(c in k for c in " \x01\x02"):
                raise GrpcStatusError(Code.ILLEGAL_MESSAGE_KEY, f"illegal message key {k!r}")
    if sp.HasField("message_group"):
        g = sp.message_group
        if not g or len(g) > MAX_MESSAGE_GROUP_LENGTH or any(c in g for c in "\x01\x02"):
            raise GrpcStatusError(Code.ILLEGAL_MESSAGE_GROUP, f"illegal message group {g!r}")
    user = m.user_properties
    if user:
        size = 0
        for k, v in user.items():
            if not k or k in INTERNAL_KEYS or any(c in k + v for c in "\x01\x02"):
                raise GrpcStatusError(
                    Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {k!r} is reserved or illegal"
                )
            size += len(k.encode()) + len(v.encode())
        if size > MAX_PROPERTIES_SIZE:
            raise GrpcStatusError(
                Code.MESSAGE_PROPERTIES_TOO_LARGE,
                f"user properties take {size} bytes, more than {MAX_PROPERTIES_SIZE}",
            )
    t = sp.message_type
    has_group = sp.HasField("message_group")
    has_delay = sp.HasField("delivery_timestamp")
    if t == pb.LITE or t == pb.PRIORITY or sp.HasField("lite_topic") or sp.HasField("priority"):
        raise GrpcStatusError(
            Code.UNSUPPORTED, "lite topics and priority messages are not supported"
        )
    conflict = (
        (t == pb.FIFO and (not has_group or has_delay))
        or (t == pb.DELAY and (not has_delay or has_group))
        or (t == pb.TRANSACTION and (has_group or has_delay))
        or (t == pb.NORMAL and (has_group or has_delay))
    )
    if conflict:
        raise GrpcStatusError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message type {pb.MessageType.Name(t)} conflicts with its properties "
            "(message group / delivery timestamp)",
        )


def gunzip_body(data: bytes, max_body: int) -> bytes:
    """A GZIP-encoded body inflated, refused once it grows past ``max_body`` bytes (a few KiB
    of gzip can inflate to gigabytes)."""
    out = bytearray()
    try:
        while True:  # one gzip member after another, as gzip.decompress reads them
            d = zlib.decompressobj(wbits=31)
            out += d.decompress(data, max_body + 1 - len(out))
            if len(out) > max_body:
                raise GrpcStatusError(
                    Code.MESSAGE_BODY_TOO_LARGE,
                    f"message body inflates past the limit of {max_body} bytes (maxMessageSize)",
                )
            if not d.eof:
                raise GrpcStatusError(Code.MESSAGE_CORRUPTED, "body is not gzip: it is cut short")
            data = d.unused_data
            if not data:
                return bytes(out)
    except zlib.error as exc:
        raise GrpcStatusError(Code.MESSAGE_CORRUPTED, f"body is not gzip: {exc}") from None


def to_message_ext(m: Any, topic: str, peer_host: str, now_ms: int, max_body: int) -> MessageExt:
    """A stored message (before the broker picks its queue) from a protobuf ``Message``; a
    GZIP body is inflated up to ``max_body`` bytes."""
    sp = m.system_properties
    body = bytes(m.body)
    if sp.body_encoding == pb.GZIP:
        body = gunzip_body(body, max_body)
    return MessageExt(
        topic=topic,
        body=body,
        born_timestamp=born_timestamp_of(sp, now_ms),
        born_host=born_host_of(sp.born_host, peer_host),
        properties=properties_of(m),
    )


def properties_of(m: Any) -> dict[str, str]:
    """The stored properties of a protobuf ``Message`` (its user properties first)."""
    sp = m.system_properties
    user = m.user_properties
    props: dict[str, str] = dict(user) if user else {}
    props[MessageConst.UNIQ_KEY] = sp.message_id
    if sp.HasField("tag"):
        props[MessageConst.TAGS] = sp.tag
    if sp.keys:
        props[MessageConst.KEYS] = " ".join(sp.keys)
    if sp.HasField("message_group"):
        props[SHARDING_KEY] = sp.message_group
    if sp.HasField("orphaned_transaction_recovery_duration"):
        secs = duration_s(sp.orphaned_transaction_recovery_duration)
        props[MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(1, int(secs)))
    return props


def born_timestamp_of(sp: Any, now_ms: int) -> int:
    """A message's born timestamp (epoch ms): the client's, else ``now_ms``."""
    born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    return born or now_ms


# -- stored -> protobuf -------------------------------------------------------------------------


def message_type_of(m: MessageExt) -> pb.MessageType:
    props = m.properties
    if SHARDING_KEY in props:
        return pb.FIFO
    if (
        MessageSysFlag.transaction_value(m.sys_flag) != MessageSysFlag.TRANSACTION_NOT_TYPE
        or m.prepared_transaction_offset
        or props.get(MessageConst.TRAN_MSG, "").lower() == "true"
    ):
        return pb.TRANSACTION
    if TIMER_DELIVER_MS in props or MessageConst.DELAY in props:
        return pb.DELAY
    return pb.NORMAL


def to_proto(m: MessageExt, store_host: tuple[str, int]) -> Any:
    """A protobuf ``Message`` of a stored message (body inflated, MD5 digest)."""
    body = bytes(m.body)
    if m.sys_flag & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass
    props = m.properties
    out = pb.Message(body=body)
    out.topic.name = m.topic
    for k, v in props.items():
        if k not in INTERNAL_KEYS:
            out.user_properties[k] = v
    sp = out.system_properties
    sp.message_id = m.msg_id
    if m.tags:
        sp.tag = m.tags
    if m.keys:
        sp.keys.extend(k for k in m.keys.split(" ") if k)
    # MD5 in upper-case hex, as RocketMQ's proxy sends it: the one digest every official client
    # checks the same way (their CRC32 strings differ: the Node.js client's is decimal).
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(body, usedforsecurity=False).hexdigest().upper()
    sp.body_encoding = pb.IDENTITY
    sp.message_type = message_type_of(m)
    set_timestamp(sp.born_timestamp, m.born_timestamp)
    sp.born_host = m.born_host[0]
    if m.store_timestamp:
        set_timestamp(sp.store_timestamp, m.store_timestamp)
    sp.store_host = f"{store_host[0]}:{store_host[1]}"
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    if SHARDING_KEY in props:
        sp.message_group = props[SHARDING_KEY]
    deliver = props.get(TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        set_timestamp(sp.delivery_timestamp, int(deliver))
    return out


__all__ = [
    "Code",
    "GrpcStatusError",
    "check_message",
    "status",
    "status_of",
    "to_message_ext",
    "to_proto",
]
