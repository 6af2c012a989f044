"""Messages: property keys, sysFlag bits, the stored-message layout, and message ids.

Stored-message layout (RocketMQ's ``MessageDecoder.encode``, IPv4 hosts, big-endian); PULL
bodies and CHECK_TRANSACTION_STATE bodies carry messages in this form, and the broker's commit
log stores them in it::

    off  size  field
    0    4     TOTALSIZE                 whole record, this field included
    4    4     MAGICCODE                 MESSAGE_MAGIC_CODE (V1)
    8    4     BODYCRC                   CRC32 of the body
    12   4     QUEUEID
    16   4     FLAG                      user flag
    20   8     QUEUEOFFSET               offset in the consume queue
    28   8     PHYSICALOFFSET            offset in the commit log
    36   4     SYSFLAG
    40   8     BORNTIMESTAMP             ms, producer's clock
    48   8     BORNHOST                  IPv4 (4) + port (i32)
    56   8     STORETIMESTAMP            ms, broker's clock
    64   8     STOREHOST                 IPv4 (4) + port (i32)
    72   4     RECONSUMETIMES
    76   8     PREPARED_TRANSACTION_OFFSET
    84   4+n   BODY                      length i32 + bytes
    ..   1+n   TOPIC                     length i8 + UTF-8 (V1) or length i16 + UTF-8 (V2)
    ..   2+n   PROPERTIES                length i16 + properties string

The magic code says how wide the topic length is: ``MESSAGE_MAGIC_CODE`` (V1) has one byte,
which Java reads as signed, so V1 carries topics up to 127 bytes; longer topics (retry and DLQ
topics may reach 255) are written with ``MESSAGE_MAGIC_CODE_V2`` and a two-byte length, as
RocketMQ's ``CommitLog`` does (``autoMessageVersionOnTopicLen``).

Properties string: ``key \\x01 value \\x02`` repeated.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Final

from mypy_extensions import mypyc_attr

from .errors import ProtocolError

MESSAGE_MAGIC_CODE = -626843481
#: Magic code of records whose topic is longer than 127 bytes (two-byte topic length).
MESSAGE_MAGIC_CODE_V2 = -626843477
#: Longest topic a V1 record can carry (its length is a signed byte in Java).
V1_MAX_TOPIC_LENGTH = 127
FORMAT_VERSION = 1

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class MessageConst:
    """Property keys (RocketMQ's ``MessageConst``)."""

    KEYS: Final = "KEYS"
    TAGS: Final = "TAGS"
    WAIT_STORE_MSG_OK: Final = "WAIT"
    DELAY: Final = "DELAY"
    RETRY_TOPIC: Final = "RETRY_TOPIC"
    REAL_TOPIC: Final = "REAL_TOPIC"
    REAL_QID: Final = "REAL_QID"
    TRAN_MSG: Final = "TRAN_MSG"
    PGROUP: Final = "PGROUP"
    MIN_OFFSET: Final = "MIN_OFFSET"
    MAX_OFFSET: Final = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
    TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    TRAN_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
    UNIQ_KEY: Final = "UNIQ_KEY"
    TRANSACTION_ID: Final = "__transactionId__"
    MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME: Final = "CONSUME_START_TIME"
    #: txmq: the batch a Spark sink transaction belongs to (see TXMQ_DECIDE_BATCH).
    TXMQ_BATCH_KEY: Final = "TXMQ_BATCH_KEY"
    #: txmq: ``"1"`` on the halves of a transaction an outside coordinator decides (two-phase
    #: commit: prepared, then committed or rolled back by its handle).
    TXMQ_2PC: Final = "TXMQ_2PC"

    #: Keys the system sets; ``MessageExt.user_properties`` leaves them out.
    SYSTEM_KEYS: Final = frozenset(
        {
            KEYS,
            TAGS,
            WAIT_STORE_MSG_OK,
            DELAY,
            RETRY_TOPIC,
            REAL_TOPIC,
            REAL_QID,
            TRAN_MSG,
            PGROUP,
            MIN_OFFSET,
            MAX_OFFSET,
            ORIGIN_MESSAGE_ID,
            TRANSACTION_CHECK_TIMES,
            CHECK_IMMUNITY_TIME_IN_SECONDS,
            TRAN_PREPARED_QUEUE_OFFSET,
            UNIQ_KEY,
            TRANSACTION_ID,
            MAX_RECONSUME_TIMES,
            CONSUME_START_TIME,
            TXMQ_BATCH_KEY,
            TXMQ_2PC,
        }
    )


class MessageSysFlag:
    COMPRESSED: Final = 0x1
    #: Which codec compressed the body (bits 8-10; RocketMQ 5); 0 from older clients = zlib.
    COMPRESSION_TYPE_MASK: Final = 0x7 << 8
    COMPRESSION_ZLIB_TYPE: Final = 0x3 << 8
    MULTI_TAGS: Final = 0x2
    TRANSACTION_NOT_TYPE: Final = 0x0
    TRANSACTION_PREPARED_TYPE: Final = 0x4
    TRANSACTION_COMMIT_TYPE: Final = 0x8
    TRANSACTION_ROLLBACK_TYPE: Final = 0xC
    TRANSACTION_MASK: Final = 0xC
    BORNHOST_V6: Final = 0x10
    STOREHOST_V6: Final = 0x20

    @staticmethod
    def transaction_value(flag: int) -> int:
        return flag & MessageSysFlag.TRANSACTION_MASK

    @staticmethod
    def reset_transaction_value(flag: int, tx: int) -> int:
        return (flag & ~MessageSysFlag.TRANSACTION_MASK) | tx


# --- properties -------------------------------------------------------------------------------


def properties_to_string(props: dict[str, str]) -> str:
    if not props:
        return ""
    try:
        # One pass in C; a separator inside a name or value shows up as an extra one.
        s = PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items()))
    except TypeError:
        s = ""  # not all strings: the loop below says which
    n = len(props)
    if s.count(NAME_VALUE_SEPARATOR) != n or s.count(PROPERTY_SEPARATOR) != n - 1:
        for k, v in props.items():
            for x in (k, v):
                if NAME_VALUE_SEPARATOR in x or PROPERTY_SEPARATOR in x:
                    raise ProtocolError(f"property {k!r} contains a reserved separator character")
        return "".join(
            f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items()
        )
    return s + PROPERTY_SEPARATOR


def string_to_properties(s: str | None) -> dict[str, str]:
    if not s:
        return {}
    items = s.split(PROPERTY_SEPARATOR)
    if not items[-1]:
        items.pop()
    try:
        # Every item ``name<sep>value``: one dict() in C (a later duplicate wins, as below).
        return dict([item.split(NAME_VALUE_SEPARATOR, 1) for item in items])
    except ValueError:  # an empty item or one without a separator: skip those
        pass
    out: dict[str, str] = {}
    for item in items:
        if not item:
            continue
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[k] = v
    return out


# --- hosts and ids ----------------------------------------------------------------------------


_LOOPBACK = b"\x7f\x00\x00\x01"


@functools.lru_cache(maxsize=256)
def _ip4_bytes(host: str) -> bytes:
    """The 4 bytes of an IPv4 address; anything else (a host name, an IPv6 peer) is stored as
    127.0.0.1.  No name lookup here: this module does no I/O, so whoever holds a host name
    resolves it first (the broker resolves ``brokerIP1`` at start)."""
    try:
        return ipaddress.IPv4Address(host).packed
    except ValueError:
        return _LOOPBACK


def pack_host(host: tuple[str, int]) -> bytes:
    try:
        return _packed_host(host)  # a handful of peers: cached
    except TypeError:  # not hashable
        return _ip4_bytes(host[0]) + struct.pack(">i", host[1])


@functools.lru_cache(maxsize=1024)
def _packed_host(host: tuple[str, int]) -> bytes:
    return _ip4_bytes(host[0]) + struct.pack(">i", host[1])


_HOST_PORT = struct.Struct(">i")


@functools.lru_cache(maxsize=1024)
def _dotted(ip4: bytes) -> str:
    return f"{ip4[0]}.{ip4[1]}.{ip4[2]}.{ip4[3]}"


@functools.lru_cache(maxsize=1024)
def _unpacked_host(b: bytes) -> tuple[str, int]:
    """:func:`unpack_host` of the 8 bytes a stored message holds (a handful of hosts)."""
    return unpack_host(b)


def unpack_host(b: bytes) -> tuple[str, int]:
    # Twice for every message a consumer decodes: the dotted quads are cached (a handful of
    # hosts), which is faster than formatting them each time.
    return (_dotted(bytes(b[:4])), _HOST_PORT.unpack_from(b, 4)[0])


def create_offset_msg_id(store_host: tuple[str, int], commit_log_offset: int) -> str:
    """RocketMQ's ``MessageDecoder.createMessageId``: store host + commit-log offset, 32 hex."""
    return (pack_host(store_host) + struct.pack(">q", commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """The (store host, commit-log offset) an offsetMsgId names."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ProtocolError(f"not an offsetMsgId: {msg_id!r}") from None
    if len(raw) != 16:
        raise ProtocolError(f"not an offsetMsgId: {msg_id!r}")
    return unpack_host(raw[:8]), struct.unpack(">q", raw[8:])[0]


class UniqIdGenerator:
    """Client-made message ids (RocketMQ's ``MessageClientIDSetter``).

    ``IP (4) + pid (2) + per-process value (4)`` as a fixed 20-hex prefix, then
    ``ms since the start of the month (4) + counter (2)``: 32 hex characters in all.
    """

    def __init__(self, ip: str = "127.0.0.1") -> None:
        """``ip``: this host's address (the SDK passes the one it uses for outgoing
        traffic)."""
        ip_bytes = _ip4_bytes(ip)
        pid = os.getpid() & 0xFFFF
        salt = int.from_bytes(os.urandom(4), "big")
        self._prefix = (ip_bytes + struct.pack(">HI", pid, salt)).hex().upper()
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._month_start = 0.0
        self._next_month = 0.0

    def _roll_month(self, now: float) -> None:
        t = time.localtime(now)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        y, m = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        self._month_start = start
        self._next_month = time.mktime((y, m, 1, 0, 0, 0, 0, 0, -1))

    def next_id(self) -> str:
        now = time.time()
        if now >= self._next_month:
            with self._lock:
                if now >= self._next_month:
                    self._roll_month(now)
        counter = next(self._counter) & 0xFFFF  # one C call: atomic under the GIL
        diff = int((now - self._month_start) * 1000) & 0xFFFFFFFF
        return f"{self._prefix}{diff:08X}{counter:04X}"

    def next_ids(self, n: int) -> list[str]:
        """``n`` ids at once (one clock reading for all)."""
        now = time.time()
        if now >= self._next_month:
            with self._lock:
                if now >= self._next_month:
                    self._roll_month(now)
        head = f"{self._prefix}{int((now - self._month_start) * 1000) & 0xFFFFFFFF:08X}"
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n)]


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (the consume queue's tag code, as RocketMQ computes it)."""
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        code = ord(ch)
        if code > 0xFFFF:  # surrogate pair, as Java sees it
            code -= 0x10000
            for unit in (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)):
                h = (31 * h + unit) & 0xFFFFFFFF
        else:
            h = (31 * h + code) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    return java_string_hash(tags) if tags else 0


# --- subscriptions ----------------------------------------------------------------------------

SUB_ALL = "*"


def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """``*`` (or empty) -> None (everything); ``TagA || TagB`` -> the set of tags."""
    if expression is None or expression.strip() in ("", SUB_ALL):
        return None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return tags or None


# --- messages ---------------------------------------------------------------------------------


@mypyc_attr(allow_interpreted_subclasses=True)  # an application's own kind of message
@dataclass
class Message:
    """A message to send.

    Args:
        topic: destination topic.
        body: payload bytes (``str`` is encoded as UTF-8).
        tags: one tag used for filtering on the consumer side.
        keys: business key(s), space separated, e.g. an order id.
        properties: user properties (string to string).
        flag: a user flag carried as is.
        delay_level: deliver later (RocketMQ's delay levels); a transactional message that
            long after its commit.
        msg_id: the message's id (RocketMQ's UNIQ_KEY); None: the producer makes a new one for
            each send.  Set it to make a resend of your own idempotent (after a restart of the
            producer, say): the broker answers a message id it stored within its duplicate
            window (``duplicateWindowSeconds``) with the first send's result.
    """

    topic: str
    body: bytes | str = b""
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0
    msg_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")

    @property
    def payload(self) -> bytes:
        """The body as bytes (a ``str`` body was encoded as UTF-8 when the message was made)."""
        body = self.body
        return body.encode("utf-8") if isinstance(body, str) else bytes(body)

    def wire_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[MessageConst.TAGS] = self.tags
        if self.keys:
            props[MessageConst.KEYS] = self.keys
        if self.delay_level > 0:
            props[MessageConst.DELAY] = str(self.delay_level)
        return props


class MessageExt:
    """A stored message, as consumers and check-back listeners see it.

    Built with the fields below (all but ``topic`` and ``body`` optional, in this order).  A
    decoded message keeps its properties in wire form until ``properties`` is first read, so a
    consumer that reads only bodies does not pay for parsing them; ``wire_properties`` (the
    ``key\\x01value\\x02`` string) gives them that way, and is ignored when ``properties`` is
    given.
    """

    #: The fields, in constructor order (what ``==``, ``repr`` and :meth:`copy` go by).
    FIELDS = (
        "topic",
        "body",
        "queue_id",
        "flag",
        "queue_offset",
        "commit_log_offset",
        "sys_flag",
        "born_timestamp",
        "born_host",
        "store_timestamp",
        "store_host",
        "reconsume_times",
        "prepared_transaction_offset",
        "properties",
        "body_crc",
        "store_size",
    )
    # ``properties`` is a property over ``_properties`` (parsed from ``_wire_properties``).
    __slots__ = (*(f if f != "properties" else "_properties" for f in FIELDS), "_wire_properties")

    def __init__(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        flag: int = 0,
        queue_offset: int = 0,
        commit_log_offset: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        store_timestamp: int = 0,
        store_host: tuple[str, int] = ("127.0.0.1", 0),
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        properties: dict[str, str] | None = None,
        body_crc: int = 0,
        store_size: int = 0,
        wire_properties: str | None = None,
    ) -> None:
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_timestamp = store_timestamp
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        if properties is None and wire_properties is None:
            properties = {}
        self._properties = properties
        self._wire_properties = wire_properties if properties is None else None
        self.body_crc = body_crc
        self.store_size = store_size

    @property
    def properties(self) -> dict[str, str]:
        props = self._properties
        if props is None:
            props = self._properties = string_to_properties(self._wire_properties)
            self._wire_properties = None
        return props

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        self._properties = value
        self._wire_properties = None

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (``properties`` parsed), in constructor order."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, MessageExt)
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"MessageExt({fields})"

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(MessageConst.KEYS)

    @property
    def offset_msg_id(self) -> str:
        return create_offset_msg_id(self.store_host, self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """The id users see: UNIQ_KEY when the client set one, else the offsetMsgId."""
        return self.properties.get(MessageConst.UNIQ_KEY) or self.offset_msg_id

    @property
    def transaction_id(self) -> str | None:
        return self.properties.get(MessageConst.TRANSACTION_ID) or self.properties.get(
            MessageConst.UNIQ_KEY
        )

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in MessageConst.SYSTEM_KEYS}

    def get_property(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a constructor call: a compiled (native) class has no __dict__ to restore
        return (MessageExt, self._values())

    def copy(self, **changes: Any) -> MessageExt:
        """A copy with ``changes`` (field names as in the constructor); the properties are
        copied too, unless given."""
        values = self.to_dict()
        values["properties"] = dict(self.properties)
        values.update(changes)
        return MessageExt(**values)


_FIXED = struct.Struct(">iiiiiqqiq8sq8siqi")  # up to and including the body length
_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
FIXED_SIZE = _FIXED.size  # 88
_V6_HOSTS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
#: The fixed head of a stored message, TOTALSIZE to the body length, in field order.
STORED_HEAD = _FIXED
#: Byte positions the broker patches when it stores a message.
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_STORE_TIMESTAMP = 56
#: Where a committed message names its half (PREPAREDTRANSACTIONOFFSET).
POS_PREPARED_TRANSACTION_OFFSET = 76
#: Most bytes a stored message's properties string takes (its length is a signed 16-bit field).
MAX_PROPERTIES_BYTES = 32767


@functools.lru_cache(maxsize=1024)
def stored_topic_part(topic: str) -> tuple[int, bytes]:
    """(magic code, topic length + topic bytes) of a stored record for ``topic``.

    Raises:
        ProtocolError: the topic is longer than 255 bytes.
    """
    raw = topic.encode("utf-8")
    if len(raw) > 255:
        raise ProtocolError(f"topic longer than 255 bytes: {topic!r}")
    if len(raw) <= V1_MAX_TOPIC_LENGTH:
        return MESSAGE_MAGIC_CODE, _U8.pack(len(raw)) + raw
    return MESSAGE_MAGIC_CODE_V2, _I16.pack(len(raw)) + raw


def encode_tail(m: MessageExt) -> tuple[int, bytes]:
    """``(magic code, tail)`` of ``m``'s stored form: the tail is what follows the body (topic
    length, topic, properties length, properties).  The fixed head is ``STORED_HEAD`` packed with
    the record's fields, the magic code and the body's length (see :func:`encode_message`).

    Raises:
        ProtocolError: the topic or the properties are too long, or a property holds a
            separator.
    """
    return encode_tail_of(m.topic, m.properties)


def encode_tail_of(topic: str, properties: dict[str, str]) -> tuple[int, bytes]:
    """:func:`encode_tail` of a message of ``topic`` with ``properties``."""
    magic, topic_part = stored_topic_part(topic)
    props = properties_to_string(properties).encode("utf-8")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ProtocolError("properties longer than 32767 bytes")
    return magic, topic_part + _I16.pack(len(props)) + props


def encode_message(m: MessageExt) -> bytes:
    """Encode in the stored-message layout (``TOTALSIZE`` computed here)."""
    magic, tail = encode_tail(m)
    body = bytes(m.body)
    total = FIXED_SIZE + len(body) + len(tail)
    sys_flag = m.sys_flag & ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)
    return b"".join(
        (
            _FIXED.pack(
                total,
                magic,
                zlib.crc32(body) & 0x7FFFFFFF,
                m.queue_id,
                m.flag,
                m.queue_offset,
                m.commit_log_offset,
                sys_flag,
                m.born_timestamp,
                pack_host(m.born_host),
                m.store_timestamp,
                pack_host(m.store_host),
                m.reconsume_times,
                m.prepared_transaction_offset,
                len(body),
            ),
            body,
            tail,
        )
    )


def decode_message(buf: bytes | bytearray | memoryview, pos: int = 0) -> MessageExt:
    """Decode one stored message starting at ``pos``; raises ProtocolError if it is not one."""
    return _decode_at(buf if isinstance(buf, bytes) else memoryview(buf), pos)


def decode_messages(buf: bytes | bytearray | memoryview) -> list[MessageExt]:
    """Decode a PULL body: stored messages back to back.

    The records of a pull are read here in one loop (what :func:`_decode_at` does for one,
    without a call per record); a record this loop does not take as it is (a RocketMQ 5
    two-byte topic length, anything malformed) is decoded by :func:`_decode_at`, which gives
    the same message or raises the same error.  ``tests/protocol/test_pull_decoding.py``
    compares the two.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)  # one copy here rather than one per field
    out: list[MessageExt] = []
    append = out.append
    unpack = _FIXED.unpack_from
    unpack16 = _I16.unpack_from
    host = _unpacked_host
    topics: dict[bytes, str] = {}
    pos = 0
    n = len(buf)
    fixed = FIXED_SIZE
    while pos < n:
        try:
            (
                total,
                magic,
                body_crc,
                queue_id,
                flag,
                queue_offset,
                phys,
                sys_flag,
                born_ts,
                born_host,
                store_ts,
                store_host,
                reconsume,
                prepared,
                body_len,
            ) = unpack(buf, pos)
            end = pos + total
            p = pos + fixed + body_len
            if (
                magic != MESSAGE_MAGIC_CODE
                or sys_flag & _V6_HOSTS
                or total < fixed
                or end > n
                or body_len < 0
                or p >= end
            ):
                raise ValueError
            tlen = buf[p]
            raw_topic = buf[p + 1 : p + 1 + tlen]
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = str(raw_topic, "utf-8")
            p += 1 + tlen
            (plen,) = unpack16(buf, p)
            p += 2
            if p + plen != end or plen < 0:
                raise ValueError
            props = str(buf[p:end], "utf-8")
        except (struct.error, IndexError, UnicodeDecodeError, ValueError):
            m = _decode_at(buf, pos)  # the general decoder: its message, or its error
            append(m)
            pos += m.store_size
            continue
        m = MessageExt(
            topic,
            buf[pos + fixed : pos + fixed + body_len],
            queue_id,
            flag,
            queue_offset,
            phys,
            sys_flag,
            born_ts,
            host(born_host),
            store_ts,
            host(store_host),
            reconsume,
            prepared,
            None,
            body_crc,
            total,
            props,
        )
        append(m)
        pos = end
    return out


def topic_span(buf: bytes | bytearray | memoryview, p: int, magic: int) -> tuple[int, int]:
    """Where a stored record's topic starts and how many bytes it has, ``p`` being just past
    the body: a one-byte length in RocketMQ 4's records, two bytes in 5's (MESSAGE_MAGIC_CODE
    tells them apart).

    Raises:
        ProtocolError: a negative length.
    """
    if magic == MESSAGE_MAGIC_CODE:
        return p + 1, buf[p]
    (tlen,) = _I16.unpack_from(buf, p)
    if tlen < 0:
        raise ProtocolError("negative topic length")
    return p + 2, tlen


def _decode_at(buf: bytes | memoryview, pos: int) -> MessageExt:
    # Hot on the consumer side (every pulled message): one unpack of the fixed head, slices of
    # ``buf`` (bytes for bytes), positional construction, properties left in wire form.
    try:
        (
            total,
            magic,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            phys,
            sys_flag,
            born_ts,
            born_host,
            store_ts,
            store_host,
            reconsume,
            prepared,
            body_len,
        ) = _FIXED.unpack_from(buf, pos)
        if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
            raise ProtocolError(f"bad message magic code {magic}")
        if sys_flag & _V6_HOSTS:
            raise ProtocolError("IPv6 hosts are not supported")
        end = pos + total
        if total < FIXED_SIZE or end > len(buf) or body_len < 0:
            raise ProtocolError("message record is truncated")
        p = pos + FIXED_SIZE + body_len
        body = bytes(buf[pos + FIXED_SIZE : p])
        p, tlen = topic_span(buf, p, magic)
        topic = str(buf[p : p + tlen], "utf-8")
        p += tlen
        (plen,) = _I16.unpack_from(buf, p)
        p += 2
        if p + plen != end or plen < 0:
            raise ProtocolError("message record size does not match its fields")
        props = str(buf[p:end], "utf-8")
    except ProtocolError:
        raise
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"cannot decode stored message: {exc}") from None
    return MessageExt(
        topic,
        body,
        queue_id,
        flag,
        queue_offset,
        phys,
        sys_flag,
        born_ts,
        _unpacked_host(born_host),
        store_ts,
        _unpacked_host(store_host),
        reconsume,
        prepared,
        None,
        body_crc,
        total,
        props,
    )


# --- compression ------------------------------------------------------------------------------

#: The sys flag bits of a zlib-compressed body.
ZLIB_COMPRESSED = MessageSysFlag.COMPRESSED | MessageSysFlag.COMPRESSION_ZLIB_TYPE


def compress_body(body: bytes, level: int = 5) -> bytes:
    """zlib-compress a body, as RocketMQ's clients do; set :data:`ZLIB_COMPRESSED` in its sys
    flag."""
    return zlib.compress(body, level)


def inflate_body(m: MessageExt) -> bool:
    """Undo a producer's compression (sys flag bit 0) in place and clear the flag.

    zlib is the codec of every RocketMQ client before 5.x (no codec bits) and of 5.x's default
    (``ZLIB``).  A body in another codec (LZ4, ZSTD) or one that does not inflate is left as it
    is, flag included, and False is returned, so the caller can say so.
    """
    if not m.sys_flag & MessageSysFlag.COMPRESSED:
        return True
    codec = m.sys_flag & MessageSysFlag.COMPRESSION_TYPE_MASK
    if codec not in (0, MessageSysFlag.COMPRESSION_ZLIB_TYPE):
        return False
    try:
        m.body = zlib.decompress(m.body)
    except zlib.error:
        return False
    m.sys_flag &= ~ZLIB_COMPRESSED
    return True


# --- batches ----------------------------------------------------------------------------------
# SEND_BATCH_MESSAGE body (RocketMQ's MessageDecoder.encodeMessages): per message
#   TOTALSIZE i32 | MAGICCODE i32 (0) | BODYCRC i32 (0) | FLAG i32 | BODY len i32 + bytes |
#   PROPERTIES len i16 + string
# RocketMQ writes 0 in both MAGICCODE and BODYCRC here (the broker computes each message's CRC
# when it stores it), so txmq does the same and ignores both fields when decoding.


_BATCH_ENTRY_HEAD = struct.Struct(">iiiii")
_BATCH_PROPS_LEN = struct.Struct(">h")
#: A SEND_BATCH_MESSAGE entry's head: TOTALSIZE, MAGICCODE, BODYCRC, FLAG, body length.
BATCH_ENTRY_HEAD = _BATCH_ENTRY_HEAD
#: Bytes a batch entry takes besides its body and properties (head and properties length).
BATCH_ENTRY_OVERHEAD = _BATCH_ENTRY_HEAD.size + _BATCH_PROPS_LEN.size


class BatchBody:
    """A SEND_BATCH_MESSAGE body built one entry at a time: the parts are kept, not copied,
    until :meth:`encode` joins them once (a body is copied only there).

    Attributes:
        parts: the encoded pieces, in order.
        count: entries added.
        size: bytes the encoded body takes.
    """

    __slots__ = ("parts", "count", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.count = 0
        self.size = 0

    def add(self, body: bytes, properties: bytes, flag: int = 0) -> int:
        """Append one entry and return the bytes it takes.

        Args:
            body: the message body.
            properties: the properties string in wire form (:func:`properties_to_string`,
                UTF-8), at most 32767 bytes.
            flag: the user flag.

        Raises:
            struct.error: the properties are longer than 32767 bytes.
        """
        blen = len(body)
        plen = len(properties)
        size = BATCH_ENTRY_OVERHEAD + blen + plen
        self.parts += (
            _BATCH_ENTRY_HEAD.pack(size, 0, 0, flag, blen),
            body,
            _BATCH_PROPS_LEN.pack(plen),
            properties,
        )
        self.count += 1
        self.size += size
        return size

    def encode(self) -> bytes:
        """The body: every entry added so far, back to back."""
        return b"".join(self.parts)


def encode_batch(messages: list[tuple[bytes, int, dict[str, str]]]) -> bytes:
    """Encode (body, flag, properties) triples as a SEND_BATCH_MESSAGE body."""
    batch = BatchBody()
    add = batch.add
    for body, flag, props in messages:
        add(body, properties_to_string(props).encode("utf-8"), flag)
    return batch.encode()


def batch_entry_at(body: bytes, pos: int, max_body: int) -> tuple[int, int, bytes, int, int] | None:
    """The SEND_BATCH_MESSAGE entry at ``pos`` as ``(size, flag, body, properties start,
    properties end)``, or None when it is not well formed or its body is over ``max_body``
    bytes (for fast paths that leave such batches to :func:`decode_batch`'s errors).

    Raises:
        struct.error: the entry's head is cut short.
    """
    total, _magic, _crc, flag, blen = _BATCH_ENTRY_HEAD.unpack_from(body, pos)
    if blen < 0 or blen > max_body or total < BATCH_ENTRY_OVERHEAD or pos + total > len(body):
        return None
    p = pos + _BATCH_ENTRY_HEAD.size + blen
    (plen,) = _BATCH_PROPS_LEN.unpack_from(body, p)
    p += 2
    end = p + plen
    if plen < 0 or end - pos != total:
        return None
    return total, flag, body[p - 2 - blen : p - 2], p, end


def decode_batch(buf: bytes) -> list[tuple[bytes, int, dict[str, str]]]:
    out = []
    pos = 0
    try:
        while pos < len(buf):
            total, _magic, _crc, flag, blen = _BATCH_ENTRY_HEAD.unpack_from(buf, pos)
            if total < BATCH_ENTRY_OVERHEAD or pos + total > len(buf) or blen < 0:
                raise ProtocolError("batch entry is truncated")
            p = pos + _BATCH_ENTRY_HEAD.size
            body = bytes(buf[p : p + blen])
            p += blen
            (plen,) = struct.unpack_from(">h", buf, p)
            p += 2
            props = string_to_properties(bytes(buf[p : p + plen]).decode("utf-8"))
            p += plen
            if p - pos != total:
                raise ProtocolError("batch entry size does not match its fields")
            out.append((body, flag, props))
            pos += total
    except ProtocolError:
        raise
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"cannot decode batch: {exc}") from None
    return out
