"""The stored forms of the direct paths (:mod:`.fastpath`): how the messages that share
their properties around the UNIQ_KEY are stored (:class:`StoredForm`), and how the halves of a
transaction that share them are prepared (:class:`HalfTemplate`), judged once per form."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from txmq.protocol.errors import ProtocolError, TxmqError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    MessageExt,
    properties_to_string,
    stored_topic_part,
    string_to_properties,
)

from ..delivery import TIMER_DEL_UNIQKEY, TIMER_PROPERTIES
from ..store import EncodedMessage
from ..store.tags import tags_code_of
from ..transaction.committed import (
    check_immunity_ms,
    committed_properties,
    committed_sys_flag,
)

_I16 = struct.Struct(">h")
_new_tuple = tuple.__new__
_KV = b"\x01"
_SEP = b"\x02"
_UNIQ = f"{MessageConst.UNIQ_KEY}\x01".encode()
_UNIQ_INSIDE = _SEP + _UNIQ
#: Properties a plain entry may not carry here: the generic path judges those (a delay it
#: refuses in a batch; a second UNIQ_KEY; a delivery time, for the timer; a recall marker).
_NOT_PLAIN = (
    MessageConst.TRAN_MSG,
    MessageConst.DELAY,
    MessageConst.UNIQ_KEY,
    TIMER_DEL_UNIQKEY,
    *TIMER_PROPERTIES,
)


@dataclass(slots=True)
class StoredForm:
    """How the entries of one template are stored: every field of the record but the body,
    its CRC and the UNIQ_KEY.  The tail (topic and properties) is ``head(n) + UNIQ_KEY +
    tail`` for a UNIQ_KEY of ``n`` bytes."""

    topic: str
    queue_id: int
    magic: int
    topic_part: bytes
    #: The properties before ``UNIQ_KEY<01>`` (ending in a separator), and from the UNIQ_KEY's
    #: terminator on.
    before: bytes
    tail: bytes
    sys_flag: int
    tags_code: int
    heads: dict[int, bytes] = field(default_factory=dict)
    #: the producer-group property, tags and keys of its entries, for the message trace
    #: (read once per form, when a trace first needs them)
    trace_fields: tuple[str, str, str] | None = None

    def head(self, n: int) -> bytes | None:
        """Topic, properties length, the properties before the UNIQ_KEY and ``UNIQ_KEY<01>``
        for a UNIQ_KEY of ``n`` bytes; None when the properties would be too long (the generic
        path refuses them)."""
        head = self.heads.get(n)
        if head is None:
            plen = len(self.before) + len(_UNIQ) + n + len(self.tail)
            if plen > MAX_PROPERTIES_BYTES:
                return None
            head = self.heads[n] = b"".join((self.topic_part, _I16.pack(plen), self.before, _UNIQ))
        return head

    def record(
        self,
        crc: int,
        body: bytes,
        head: bytes,
        uniq: bytes,
        flag: int,
        born_timestamp: int,
        born_host: bytes,
        reconsume_times: int,
        prepared_offset: int = 0,
    ) -> EncodedMessage:
        """The record of one entry (a half's committed copy; :func:`parse_batch` builds the
        same tuple inline, in C: a NamedTuple's own constructor is a Python call, a cost per
        message there)."""
        return _new_tuple(
            EncodedMessage,
            (
                self.topic,
                self.queue_id,
                self.magic,
                crc,
                body,
                b"".join((head, uniq, self.tail)),
                flag,
                self.sys_flag,
                born_timestamp,
                born_host,
                reconsume_times,
                prepared_offset,
                self.tags_code,
            ),
        )


def stored_form(
    topic: str, queue_id: int, before: bytes, tail: bytes, sys_flag: int, tags: str | None
) -> StoredForm:
    """Raises ProtocolError for a topic that cannot be stored."""
    magic, topic_part = stored_topic_part(topic)
    return StoredForm(
        topic, queue_id, magic, topic_part, before, tail, sys_flag, tags_code_of(tags)
    )


@dataclass(slots=True)
class HalfTemplate:
    """What halves with the same properties after their leading UNIQ_KEY share: how the half
    and its committed message are stored, and what the transaction table needs."""

    txid: str
    group: str
    batch_key: str | None
    real_topic: str
    real_queue_id: int
    immunity_ms: int | None
    half: StoredForm
    committed: StoredForm


#: A template: plain entries are stored as sent (a :class:`StoredForm`), halves as prepared.
Template = StoredForm | HalfTemplate


def _plain_form(topic: str, sys_flag: int, before: bytes, after: bytes) -> StoredForm | None:
    """How a plain message with properties ``before`` + UNIQ_KEY + ``after`` is stored, or
    None when the generic path must judge it (as :func:`_template`, the sys flag as sent)."""
    rest = after[1:]
    try:
        text = (before + rest).decode("utf-8")
        props = string_to_properties(text)
        if properties_to_string(props) != text:
            return None
    except (UnicodeDecodeError, ProtocolError):
        return None
    if any(k in props for k in _NOT_PLAIN):
        return None
    try:
        return stored_form(topic, -1, before, after, sys_flag, props.get(MessageConst.TAGS))
    except ProtocolError:
        return None


def make_half_template(
    rest: bytes,
    h: SendMessageRequestHeader,
    queue_id: int,
    prepare_half: Callable[[MessageExt, str], None],
    transaction_id_of: Callable[[dict[str, str]], str | None],
) -> HalfTemplate | None:
    """The :class:`HalfTemplate` of halves whose properties after their leading UNIQ_KEY are
    ``rest``: parsed and prepared (``prepare_half``) as the generic path does each half; None
    when they do not qualify (not transactional, the transaction id not in a property of its
    own, a UNIQ_KEY further on, anything refused)."""
    try:
        rest_props = string_to_properties(rest.decode("utf-8"))
    except (UnicodeDecodeError, ProtocolError):
        return None
    C = MessageConst
    if (
        C.UNIQ_KEY in rest_props
        or rest_props.get(C.TRAN_MSG, "").lower() != "true"
        or not rest_props.get(C.TRANSACTION_ID)
        or C.TXMQ_2PC in rest_props  # two-phase halves: the generic path marks their record
    ):
        return None
    props = {C.UNIQ_KEY: "", **rest_props}  # the order of the wire
    msg = MessageExt(
        topic=h.topic, body=b"", queue_id=queue_id, sys_flag=h.sys_flag & ~0xC, properties=props
    )
    try:
        prepare_half(msg, h.producer_group)
    except TxmqError:
        return None  # the generic path raises it for the first such half
    committed = committed_properties(props)
    if next(iter(props)) != C.UNIQ_KEY or next(iter(committed)) != C.UNIQ_KEY:
        return None
    del props[C.UNIQ_KEY], committed[C.UNIQ_KEY]
    txid = transaction_id_of(props)
    if not txid or txid != props.get(C.TRANSACTION_ID):
        return None
    immunity_ms = check_immunity_ms(props)
    real_topic = props.get(C.REAL_TOPIC, "")
    tags = props.get(C.TAGS)
    try:
        real_queue_id = int(props.get(C.REAL_QID, "0") or 0)
        half = stored_form(
            msg.topic,
            msg.queue_id,
            b"",
            _SEP + properties_to_string(props).encode("utf-8"),
            msg.sys_flag,
            tags,
        )
        committed_form = stored_form(
            real_topic,
            real_queue_id,
            b"",
            _SEP + properties_to_string(committed).encode("utf-8"),
            committed_sys_flag(msg.sys_flag),
            tags,
        )
    except (ProtocolError, ValueError):
        return None
    return HalfTemplate(
        txid=txid,
        group=props.get(C.PGROUP, ""),
        batch_key=props.get(C.TXMQ_BATCH_KEY),
        real_topic=real_topic,
        real_queue_id=real_queue_id,
        immunity_ms=immunity_ms,
        half=half,
        committed=committed_form,
    )
