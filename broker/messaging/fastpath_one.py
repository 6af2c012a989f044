"""The direct paths of a SEND_MESSAGE(_V2) (``one_plain`` and ``one_half``, :mod:`.fastpath`):
the header read by position, the message sent (:class:`PlainSend`, :class:`HalfSend`) and how a
half's shape is stored around its UNIQ_KEY and transaction id (:class:`HalfForm`)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    MessageSysFlag,
    string_to_properties,
)

from ..delivery import TIMER_PROPERTIES
from ..store import EncodedMessage
from .fastpath_forms import _I16, _UNIQ, StoredForm, _new_tuple

#: A SEND_MESSAGE header's fields with their wire names (SEND_MESSAGE_V2's single letters, the
#: long ones) and the one native type each may have here (anything else, and any other key: the
#: generic path reads the header): producerGroup, topic, defaultTopic, defaultTopicQueueNums,
#: queueId, sysFlag, bornTimestamp, flag, properties, reconsumeTimes, unitMode,
#: maxReconsumeTimes, batch, brokerName.
_ONE_FIELDS = (
    ("a", "producerGroup", str),
    ("b", "topic", str),
    ("c", "defaultTopic", str),
    ("d", "defaultTopicQueueNums", int),
    ("e", "queueId", int),
    ("f", "sysFlag", int),
    ("g", "bornTimestamp", int),
    ("h", "flag", int),
    ("i", "properties", str),
    ("j", "reconsumeTimes", int),
    ("k", "unitMode", bool),
    ("l", "maxReconsumeTimes", int),
    ("m", "batch", bool),
    ("n", "brokerName", str),
)
#: wire key -> (field index, type), for SEND_MESSAGE_V2 and for SEND_MESSAGE.
_ONE_V2 = {v2: (i, tp) for i, (v2, _, tp) in enumerate(_ONE_FIELDS)}
_ONE_V1 = {name: (i, tp) for i, (_, name, tp) in enumerate(_ONE_FIELDS)}
_ONE_V2_KEYS = frozenset(_ONE_V2)
_ONE_V1_KEYS = frozenset(_ONE_V1)
#: Forms of plain messages kept (per topic, sys flag and properties around the UNIQ_KEY).
_ONE_FORMS_MAX = 4096
_TX_MASK = MessageSysFlag.TRANSACTION_MASK

#: A half's transaction id property, as it follows another property.
_TXID = f"\x02{MessageConst.TRANSACTION_ID}\x01".encode()
#: What stands for the transaction id while a half's shape is prepared (no separator, never
#: sent: a shape that holds it is left to the generic path).
_STAND_IN = "\x00txid\x00"
_STAND_IN_B = _STAND_IN.encode()
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
#: Properties that send a half sent alone to the generic path (it judges them against its
#: clock or the batch table).
_NOT_HERE = frozenset(
    (MessageConst.DELAY, MessageConst.TXMQ_BATCH_KEY, MessageConst.TXMQ_2PC, *TIMER_PROPERTIES)
)
#: Shapes of halves sent alone kept (per topic, queue, sys flag, header group and the
#: properties around the two values).
_SHAPES_MAX = 4096


@dataclass(slots=True)
class PlainSend:
    """A SEND_MESSAGE (or _V2) of one plain message, read straight from its header: what its
    topic lookup, its store and its duplicate check need (see :meth:`FastPaths.read_one`)."""

    topic: str
    group: str
    #: the queue asked for (-1: any) and the queues a topic created by this send gets
    queue_id: int
    queue_nums: int
    body: bytes
    #: the UNIQ_KEY, as text and as sent
    uniq: str
    uniq_raw: bytes
    #: topic, properties length and properties up to the UNIQ_KEY's value; the rest
    head: bytes
    form: StoredForm
    flag: int
    born_timestamp: int
    reconsume_times: int

    def trace_fields(self) -> tuple[str, str, str]:
        """Its ``PGROUP``, ``TAGS`` and ``KEYS`` properties ('' when absent), for the message
        trace: the same for every send of its form, so read once per form."""
        form = self.form
        got = form.trace_fields
        if got is None:
            props = string_to_properties(
                b"".join((form.before, _UNIQ, self.uniq_raw, form.tail)).decode("utf-8")
            )
            get = props.get
            got = form.trace_fields = (
                get(MessageConst.PGROUP, ""),
                get(MessageConst.TAGS, ""),
                get(MessageConst.KEYS, ""),
            )
        return got

    def record(self, queue_id: int, born_host: bytes) -> tuple[Any, ...]:
        """The fields of its :class:`EncodedMessage`, as the generic path encodes it."""
        form = self.form
        body = self.body
        return (
            self.topic,
            queue_id,
            form.magic,
            zlib.crc32(body) & 0x7FFFFFFF,
            body,
            b"".join((self.head, self.uniq_raw, form.tail)),
            self.flag,
            form.sys_flag,
            self.born_timestamp,
            born_host,
            self.reconsume_times,
            0,
            form.tags_code,
        )


@dataclass(slots=True)
class HalfForm:
    """How one shape's record is stored: ``topic_part + plen + UNIQ_KEY<01> + uniq + a +
    txid + b`` for the properties, the other fields fixed."""

    topic: str
    queue_id: int
    magic: int
    topic_part: bytes
    a: bytes
    b: bytes
    sys_flag: int
    tags_code: int

    def props(self, uniq: bytes, txid: bytes) -> bytes | None:
        plen = len(_UNIQ) + len(uniq) + len(self.a) + len(txid) + len(self.b)
        if plen > MAX_PROPERTIES_BYTES:
            return None
        return b"".join((self.topic_part, _I16.pack(plen), _UNIQ, uniq, self.a, txid, self.b))


@dataclass(slots=True)
class _Shape:
    group: str
    real_topic: str
    real_queue_id: int
    immunity_ms: int | None
    half: HalfForm
    committed: HalfForm


@dataclass(slots=True)
class HalfSend:
    """A SEND_MESSAGE(_V2) of one half, read from its header (see :meth:`FastPaths.read_one`)."""

    topic: str
    #: the header's producer group (the half's group when it has no PGROUP property)
    group: str
    queue_id: int
    queue_nums: int
    body: bytes
    sys_flag: int
    uniq: str
    uniq_raw: bytes
    txid: str
    txid_raw: bytes
    #: the properties between the UNIQ_KEY's value and the transaction id's, and after it
    mid: bytes
    after: bytes
    flag: int
    born_timestamp: int
    reconsume_times: int


def _split(form: Any, real_topic: str | None = None) -> HalfForm | None:
    """A :class:`StoredForm` made with the stand-in, cut around it."""
    tail: bytes = form.tail
    at = tail.find(_STAND_IN_B)
    if at < 0 or tail.find(_STAND_IN_B, at + 1) >= 0 or form.before:
        return None
    return HalfForm(
        form.topic,
        form.queue_id,
        form.magic,
        form.topic_part,
        tail[:at],
        tail[at + len(_STAND_IN_B) :],
        form.sys_flag,
        form.tags_code,
    )


def committed_record(
    form: HalfForm, p: HalfSend, crc: int, host: bytes, phy: int
) -> EncodedMessage | None:
    """The committed copy of the half ``p`` stored at ``phy`` (None: its properties are too
    long; the commit reads it back and refuses it, as the generic path)."""
    props = form.props(p.uniq_raw, p.txid_raw)
    if props is None:
        return None
    return _new_tuple(
        EncodedMessage,
        (
            form.topic,
            form.queue_id,
            form.magic,
            crc,
            p.body,
            props,
            p.flag,
            form.sys_flag,
            p.born_timestamp,
            host,
            p.reconsume_times,
            phy,
            form.tags_code,
        ),
    )


def header_values(v2: bool, ext: dict[str, Any]) -> list[Any] | None:
    """The fields of a SEND_MESSAGE(_V2) header by position (``_ONE_V1``/``_ONE_V2``), when
    every field is one the direct paths know and has its native type; None otherwise (the
    generic path reads the request)."""
    if v2:
        if not _ONE_V2_KEYS.issuperset(ext):
            return None
        fields = _ONE_V2
    else:
        if not _ONE_V1_KEYS.issuperset(ext):
            return None
        fields = _ONE_V1
    vals: list[Any] = [None] * 14
    for k, v in ext.items():
        if v is None:
            continue
        i, tp = fields[k]
        if v.__class__ is not tp:
            return None
        vals[i] = v
    return vals


#: What :meth:`FastPaths.read_one` reads: one plain message or one half.
OneSend = PlainSend | HalfSend
