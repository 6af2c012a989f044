"""Batches stored straight from the request body: the one seam of the broker's fast paths.

The generic path of a SEND_BATCH_MESSAGE (:func:`~txmq.protocol.message.decode_batch`, a
:class:`~txmq.protocol.message.MessageExt` per entry, its properties parsed into a dict and
written back into a string, ``put_messages``) costs several microseconds a message.  Entries
that a producer sends in bulk differ only in their UNIQ_KEY: what comes before and after it is
the same.  Here those parts are judged once per request -- one template per distinct
``(before, after)`` -- and each entry is stored as ``head + UNIQ_KEY + tail`` of its template:

* **plain messages**: stored with their properties as sent (only canonical ones qualify, the
  form the generic path writes back);
* **the halves of one transaction** whose UNIQ_KEY leads their properties (the Spark sink's,
  the SDK's batched transactions): prepared once as the generic path prepares each half
  (:meth:`TransactionalMessageService.prepare_half`), their committed messages built at the same
  time for the commit to come.

Anything else -- a delay, a second UNIQ_KEY, non-canonical or non-UTF-8 properties, a
malformed entry, an oversized body, plain messages mixed with halves -- makes
:func:`parse_batch` return None before a byte is stored, and the generic path stores the batch
or gives its error.  Both paths store the same bytes and answer the same (the differential
tests prove it); ``batchFastPathEnable`` turns this seam off, and the counter
``txmq_batch_path_total{path}`` tells which path each batch took.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from txmq.protocol.errors import ProtocolError, TxmqError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    pack_host,
    properties_to_string,
    stored_topic_part,
    string_to_properties,
)

from ..delivery import TIMER_DEL_UNIQKEY, TIMER_PROPERTIES
from ..store import AppendResult, EncodedMessage
from ..store.tags import tags_code_of

if TYPE_CHECKING:
    from ..context import BrokerContext


class HalfBook(Protocol):
    """What the halves fast path needs of the transaction service."""

    def prepare_half(self, msg: MessageExt, header_group: str) -> None: ...

    @staticmethod
    def transaction_id_of(props: dict[str, str]) -> str | None: ...

    def on_fast_halves_stored(self, batch: FastBatch, res: AppendResult) -> None: ...


_I16 = struct.Struct(">h")
#: A SEND_BATCH_MESSAGE entry's head (total size, magic, CRC, flag, body length) and its
#: properties length (:class:`~txmq.protocol.message.BatchBody`'s layout).
_ENTRY_HEAD = struct.Struct(">iiiii")
_ENTRY_HEAD_SIZE = _ENTRY_HEAD.size
_ENTRY_OVERHEAD = _ENTRY_HEAD_SIZE + _I16.size
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
#: The sys flag bits the stored form drops (IPv6 hosts are stored as IPv4).
_HOST_V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
#: Properties of a half that its committed message does not carry.
HALF_ONLY_PROPERTIES = (
    MessageConst.REAL_TOPIC,
    MessageConst.REAL_QID,
    MessageConst.TRAN_MSG,
    MessageConst.TRANSACTION_CHECK_TIMES,
    MessageConst.TXMQ_BATCH_KEY,
)

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

#: Which path a batch took (the ``path`` label of ``txmq_batch_path_total``).
PATH_PLAIN, PATH_HALVES, PATH_GENERIC, PATH_DISABLED = "plain", "halves", "generic", "disabled"


def committed_properties(props: dict[str, str]) -> dict[str, str]:
    """A half's properties without the half-only ones (order kept)."""
    out = dict(props)
    pop = out.pop
    for key in HALF_ONLY_PROPERTIES:
        pop(key, None)
    return out


def committed_sys_flag(sys_flag: int) -> int:
    return MessageSysFlag.reset_transaction_value(
        sys_flag & ~_HOST_V6_BITS, MessageSysFlag.TRANSACTION_COMMIT_TYPE
    )


def check_immunity_ms(props: dict[str, str]) -> int | None:
    """A half's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` in ms (None: absent or not a number)."""
    immunity = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
    try:
        return int(float(immunity) * 1000) if immunity else None
    except ValueError:
        return None


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


@dataclass(slots=True)
class FastBatch:
    """A batch parsed by :func:`parse_batch`: its records, the UNIQ_KEY of each, and for the
    halves of a transaction, each half's template."""

    #: What the store appends: for plain messages the fields of an :class:`EncodedMessage`
    #: in a plain tuple (the store only unpacks them), for halves EncodedMessages (their
    #: commit reads them by name).
    records: list[EncodedMessage]
    uniq_keys: list[str]
    halves: list[HalfTemplate] | None = None
    #: Each half's UNIQ_KEY as sent (bytes), for its committed record.
    raw_uniqs: list[bytes] | None = None

    @property
    def txid(self) -> str | None:
        return self.halves[0].txid if self.halves else None


@dataclass(slots=True)
class PlainSend:
    """A SEND_MESSAGE (or _V2) of one plain message, read straight from its header: what its
    topic lookup, its store and its duplicate check need (see :meth:`FastPaths.parse_one`)."""

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


class FastPaths:
    """The entry point: :meth:`parse` says whether a fast path can store a batch (else the
    caller takes the generic path), :meth:`store` stores it; behind ``batchFastPathEnable``."""

    def __init__(self, ctx: BrokerContext, tx: HalfBook) -> None:
        self.ctx = ctx
        self.tx = tx
        self.enabled = ctx.config.batch_fast_path_enable
        counter = ctx.metrics.batch_path
        self._counted = {
            path: counter.labels(path)
            for path in (PATH_PLAIN, PATH_HALVES, PATH_GENERIC, PATH_DISABLED)
        }

        self._one_forms: dict[tuple[str, int, bytes, bytes], StoredForm | None] = {}
        #: Single sends stored from their header (:meth:`store_one`).
        self.direct_sends = 0

    def count(self, path: str) -> None:
        self._counted[path].inc()

    def parse_one(self, v2: bool, ext: dict[str, Any], body: bytes) -> PlainSend | None:
        """A SEND_MESSAGE(_V2) request's plain message, when it can be stored from its header
        as it is: every header field present with its native type, a UNIQ_KEY, canonical
        properties with no transaction, delay or delivery time, a body within
        ``maxMessageSize``.  None: the generic path reads it (and gives any error)."""
        if not self.enabled or body.__class__ is not bytes:
            return None
        vals = header_values(v2, ext)
        if vals is None:
            return None
        (group, topic, _dt, nums, qid, sys_flag, born_ts, flag, props, reconsume) = vals[:10]
        if group is None or topic is None or props is None or vals[12]:
            return None
        if sys_flag is None:
            sys_flag = 0
        elif sys_flag & _TX_MASK:
            return None  # the generic path judges (and refuses) a transaction flag
        if len(body) > self.ctx.config.max_message_size:
            return None
        try:
            raw = props.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if raw.startswith(_UNIQ):
            at = 0
        else:
            at = raw.find(_UNIQ_INSIDE) + 1
            if at == 0:
                return None
        sep = raw.find(_SEP, at + len(_UNIQ))
        if sep < 0:
            return None
        uniq_raw = raw[at + len(_UNIQ) : sep]
        if not uniq_raw or _KV in uniq_raw:
            return None
        before, after = raw[:at], raw[sep:]
        key = (topic, sys_flag, before, after)
        forms = self._one_forms
        form = forms.get(key, _MISSING)
        if form is _MISSING:
            if len(forms) >= _ONE_FORMS_MAX:
                forms.clear()
            form = forms[key] = _plain_form(topic, sys_flag, before, after)
        if form is None:
            return None
        head = form.head(len(uniq_raw))
        if head is None:
            return None
        return PlainSend(
            topic,
            group,
            -1 if qid is None else qid,
            4 if nums is None else nums,
            body,
            uniq_raw.decode("utf-8"),
            uniq_raw,
            head,
            form,
            0 if flag is None else flag,
            0 if born_ts is None else born_ts,
            0 if reconsume is None else reconsume,
        )

    def store_one(self, record: tuple[Any, ...]) -> AppendResult:
        """Store the record of a :class:`PlainSend` (through the write path)."""
        self.direct_sends += 1
        return self.ctx.write.put_encoded([record])  # type: ignore[list-item]

    def _half_template(
        self, rest: bytes, h: SendMessageRequestHeader, queue_id: int
    ) -> HalfTemplate | None:
        return make_half_template(
            rest, h, queue_id, self.tx.prepare_half, self.tx.transaction_id_of
        )

    def parse(
        self, h: SendMessageRequestHeader, queue_id: int, body: bytes, born_host: tuple[str, int]
    ) -> FastBatch | None:
        """The batch's records if a fast path can store it; None: the generic path takes it
        (counted here as ``generic`` or ``disabled``)."""
        if not self.enabled:
            self._counted[PATH_DISABLED].inc()
            return None
        batch = parse_batch(
            h, queue_id, body, born_host, self.ctx.config.max_message_size, self._half_template
        )
        if batch is None:
            self._counted[PATH_GENERIC].inc()
        return batch

    def store(self, batch: FastBatch) -> AppendResult:
        """Store a parsed batch: its records, and for halves the transaction table and the
        committed copies to come, exactly as the generic path makes them."""
        # A batch's records share their topic, queue and sys flag (see parse_batch).
        res = self.ctx.write.put_encoded(batch.records, one_run=True)
        if batch.halves is not None:
            self.tx.on_fast_halves_stored(batch, res)
            self._counted[PATH_HALVES].inc()
        else:
            self._counted[PATH_PLAIN].inc()
        return res


def parse_batch(
    h: SendMessageRequestHeader,
    queue_id: int,
    body: bytes,
    born_host: tuple[str, int],
    max_body: int,
    half_template: Callable[[bytes, SendMessageRequestHeader, int], HalfTemplate | None],
) -> FastBatch | None:
    """The records the generic path would store for this SEND_BATCH_MESSAGE (byte for byte),
    or None when the batch does not qualify or anything in it is amiss.

    ``half_template(rest, h, queue_id)``: the :class:`HalfTemplate` of halves whose properties
    after their UNIQ_KEY are ``rest``, or None when they do not qualify."""
    if body.__class__ is not bytes or not body:
        return None
    size = len(body)
    unpack_head = _ENTRY_HEAD.unpack_from
    unpack_plen = _I16.unpack_from
    hsize = _ENTRY_HEAD_SIZE
    overhead = _ENTRY_OVERHEAD
    find = body.find
    startswith = body.startswith
    ulen = len(_UNIQ)
    crc32 = zlib.crc32
    join = b"".join
    host = pack_host(born_host)
    born_ts = h.born_timestamp
    reconsume = h.reconsume_times or 0
    templates: dict[tuple[bytes, bytes], Template] = {}
    t: Template | None = None
    last_before = last_after = b""
    halves: list[HalfTemplate] | None = None
    kind: type | None = None  # StoredForm or HalfTemplate: a batch is all of one
    records: list[Any] = []  # EncodedMessage, or for plain messages its fields in a tuple
    append = records.append
    uniqs: list[bytes] = []
    add_uniq = uniqs.append
    # The stored form of the current template, in locals: the loop below builds each record
    # inline (a tuple made in C), no call per message but the CRC.
    form: StoredForm | None = None
    heads: dict[int, bytes] = {}
    topic, qid, magic, tail, sys_flag, tags_code = "", 0, 0, b"", 0, 0
    pos = 0
    try:
        while pos < size:
            # The entry at pos, read inline (as batch_entry_at reads it, no call per entry).
            total, _magic, _crc, flag, blen = unpack_head(body, pos)
            if blen < 0 or blen > max_body or total < overhead or pos + total > size:
                return None
            p = pos + hsize + blen
            end = p + 2 + unpack_plen(body, p)[0]
            if end - pos != total or end < p + 2:
                return None
            b = body[pos + hsize : p]
            p += 2
            if startswith(_UNIQ, p, end):
                at = p
            else:
                at = find(_UNIQ_INSIDE, p, end) + 1
                if at == 0:
                    return None
            sep = find(_SEP, at + ulen, end)
            if sep < 0:
                return None
            before = body[p:at]
            after = body[sep:end]
            if t is None or before != last_before or after != last_after:
                key = (before, after)
                t = templates.get(key)
                if t is None:
                    t = _template(before, after, h, queue_id, half_template)
                    if t is None:
                        return None
                    if kind is None:
                        kind = t.__class__
                        if kind is HalfTemplate:
                            halves = []
                    elif t.__class__ is not kind:
                        return None  # plain messages and halves mixed
                    elif halves and t.txid != halves[0].txid:  # type: ignore[union-attr]
                        return None  # halves of two transactions
                    templates[key] = t
                last_before, last_after = before, after
                form = t.half if halves is not None else t  # type: ignore[union-attr,assignment]
                heads = form.heads  # type: ignore[union-attr]
                topic, qid, magic = form.topic, form.queue_id, form.magic  # type: ignore[union-attr]
                tail, sys_flag, tags_code = form.tail, form.sys_flag, form.tags_code  # type: ignore[union-attr]
            u = body[at + ulen : sep]
            head = heads.get(len(u))
            if head is None:
                head = form.head(len(u))  # type: ignore[union-attr]
                if head is None:
                    return None
            rec = (
                topic,
                qid,
                magic,
                crc32(b) & 0x7FFFFFFF,
                b,
                join((head, u, tail)),
                flag,
                sys_flag,
                born_ts,
                host,
                reconsume,
                0,
                tags_code,
            )
            # A plain batch's records go to the store only, which unpacks them: plain tuples in
            # the EncodedMessage's order; the halves' are read by name for their commit.
            append(rec if halves is None else _new_tuple(EncodedMessage, rec))
            if halves is not None:
                halves.append(t)  # type: ignore[arg-type]
            add_uniq(u)
            pos += total
    except struct.error:
        return None
    # The UNIQ_KEYs: free of separators (\x02 ends each, and none may hold \x01) and UTF-8.
    joined = _SEP.join(uniqs)
    if _KV in joined:
        return None
    try:
        texts = joined.decode("utf-8").split("\x02")
    except UnicodeDecodeError:
        return None
    return FastBatch(records, texts, halves, uniqs if halves is not None else None)


def _template(
    before: bytes,
    after: bytes,
    h: SendMessageRequestHeader,
    queue_id: int,
    half_template: Callable[[bytes, SendMessageRequestHeader, int], HalfTemplate | None],
) -> Template | None:
    """The template of entries whose properties are ``before`` + UNIQ_KEY + ``after``."""
    rest = after[1:]
    if not before and rest.find(b"TRAN_MSG\x01") >= 0:
        return half_template(rest, h, queue_id)
    try:
        text = (before + rest).decode("utf-8")
        props = string_to_properties(text)
        if properties_to_string(props) != text:
            return None  # not canonical: stored as sent it would differ from the generic path
    except (UnicodeDecodeError, ProtocolError):
        return None
    if any(k in props for k in _NOT_PLAIN):
        return None
    try:
        return stored_form(
            h.topic, queue_id, before, after, h.sys_flag & ~0xC, props.get(MessageConst.TAGS)
        )
    except ProtocolError:
        return None


_MISSING: Any = object()


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


__all__ = [
    "FastBatch",
    "FastPaths",
    "HalfTemplate",
    "PATH_DISABLED",
    "PATH_GENERIC",
    "PATH_HALVES",
    "PATH_PLAIN",
    "PlainSend",
    "StoredForm",
    "check_immunity_ms",
    "committed_properties",
    "committed_sys_flag",
    "make_half_template",
    "parse_batch",
]
